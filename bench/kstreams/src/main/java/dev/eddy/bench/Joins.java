package dev.eddy.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.PriorityQueue;
import java.util.SplittableRandom;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.NullNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/**
 * The join cases: their JSON values, the joiners (written to give exactly the bytes eddy's jq
 * `as` expressions give) and the deterministic input of `Generate --joins`.
 *
 * <p>Topics of one input, all named after a prefix: {@code PREFIX-orders} (stream, key = customer
 * id), {@code PREFIX-customers} (table, same partitions), {@code PREFIX-shipments} (second stream,
 * same partitions), {@code PREFIX-accounts} (second table, same partitions), {@code
 * PREFIX-countries} (global table, its own partition count) and {@code PREFIX-done} (one record:
 * the generator's summary, written last, so that a complete input can be told from a partial one).
 */
final class Joins {
    private Joins() {
    }

    static final String ORDERS = "orders";
    static final String CUSTOMERS = "customers";
    static final String SHIPMENTS = "shipments";
    static final String ACCOUNTS = "accounts";
    static final String COUNTRIES = "countries";
    static final String DONE = "done";

    /** The stream-stream cases' window: records at most 5 min apart, 1 min grace. */
    static final Duration WITHIN = Duration.ofMinutes(5);
    static final Duration GRACE = Duration.ofMinutes(1);

    /** The versioned case's history retention: the customer table keeps 10 min of history. */
    static final Duration HISTORY = Duration.ofMinutes(10);

    // ------------------------------------------------------------------------------ JSON

    static final ObjectMapper MAPPER = new ObjectMapper();

    /**
     * JSON values, parsed once (Jackson tree) and written compact, fields in insertion order: what
     * eddy writes for a jq object literal. A null record value (a tombstone) stays null.
     */
    static final Serde<JsonNode> SERDE = Serdes.serdeFrom(
        (Serializer<JsonNode>) (topic, n) -> {
            if (n == null) {
                return null;
            }
            try {
                return MAPPER.writeValueAsBytes(n);
            } catch (final Exception e) {
                throw new SerializationException("cannot write JSON", e);
            }
        },
        (Deserializer<JsonNode>) (topic, b) -> {
            if (b == null) {
                return null;
            }
            try {
                return MAPPER.readTree(b);
            } catch (final Exception e) {
                throw new SerializationException("join input value is not JSON", e);
            }
        });

    /** jq's `.name` on a value: the field, or null when the value is null or lacks it. */
    static JsonNode field(final JsonNode value, final String name) {
        if (value == null || !value.isObject()) {
            return NullNode.getInstance();
        }
        final JsonNode v = value.get(name);
        return v == null ? NullNode.getInstance() : v;
    }

    /** jq's object literal `{a: x, b: y}`: fields in this order. */
    static ObjectNode object(final String k1, final JsonNode v1, final String k2, final JsonNode v2) {
        final ObjectNode o = MAPPER.createObjectNode();
        o.set(k1, v1);
        o.set(k2, v2);
        return o;
    }

    // The joiners: `as` of each case, `.` the left (stream) value, `$right` the other side's
    // (null on a miss of a left join).

    /** `{order: .order, amount: .amount, name: $right.name}` (stream-table inner and left). */
    static JsonNode orderWithName(final JsonNode order, final JsonNode customer) {
        final ObjectNode o = object("order", field(order, "order"), "amount", field(order, "amount"));
        o.set("name", field(customer, "name"));
        return o;
    }

    /** `{order: .order, country: $right.name}` (global table). */
    static JsonNode orderWithCountry(final JsonNode order, final JsonNode country) {
        return object("order", field(order, "order"), "country", field(country, "name"));
    }

    /** `{order: .order, shipment: $right.shipment}` (stream-stream). */
    static JsonNode orderWithShipment(final JsonNode order, final JsonNode shipment) {
        return object("order", field(order, "order"), "shipment", field(shipment, "shipment"));
    }

    /** `{shipment: .shipment, name: $right.name, tier: $right.tier}` (stream-table-versioned). */
    static JsonNode shipmentWithCustomer(final JsonNode shipment, final JsonNode customer) {
        final ObjectNode o = object("shipment", field(shipment, "shipment"), "name", field(customer, "name"));
        o.set("tier", field(customer, "tier"));
        return o;
    }

    /** `{name: .name, balance: $right.balance}` (table-table). */
    static JsonNode customerWithBalance(final JsonNode customer, final JsonNode account) {
        return object("name", field(customer, "name"), "balance", field(account, "balance"));
    }

    /** The global join's key: `.country`; null (the order is dropped) when it is not a string. */
    static String country(final JsonNode order) {
        final JsonNode c = field(order, "country");
        return c.isTextual() ? c.textValue() : null;
    }

    // ------------------------------------------------------------------------------ the input

    /** Where the generator's records go. */
    interface Sink {
        /** @param value null for a tombstone */
        void send(String topic, String key, String value, long timestamp);
    }

    /** Country codes and names of the global table (non-ASCII on purpose). */
    static final String[][] COUNTRY_NAMES = {
        {"DE", "Germany"}, {"FR", "France"}, {"ES", "España"}, {"IT", "Italia"}, {"NL", "Nederland"},
        {"BE", "Belgique"}, {"PL", "Polska"}, {"SE", "Sverige"}, {"NO", "Norge"}, {"DK", "Danmark"},
        {"FI", "Suomi"}, {"AT", "Österreich"}, {"CH", "Schweiz"}, {"PT", "Portugal"}, {"IE", "Éire"},
        {"GR", "Ελλάδα"}, {"CZ", "Česko"}, {"HU", "Magyarország"}, {"RO", "România"}, {"US", "United States"},
        {"GB", "Great Britain"}, {"JP", "日本"}, {"BR", "Brasil"}, {"IS", "Ísland"},
    };

    /** First names of customers (non-ASCII, an apostrophe and quotes on purpose). */
    static final String[] FIRST_NAMES = {
        "Ana", "Jürgen", "Zoë", "José", "Marie-Claire", "Siobhán", "Łukasz", "Björk", "O'Neil", "Zhang Wei",
        "Ngozi", "Søren", "Ayşe", "François", "Håkon", "Robert \"Bob\"", "Priya", "Mateo", "Yuki", "Olu",
    };

    /** Ticks of 4 ms: orders at tick*4, customers +1, shipments +2, accounts +3 (never equal). */
    static final long TICK_MS = 4;
    static final long MINUTE_TICKS = 60_000 / TICK_MS;

    /** Each customer orders about every 10 min of event time (twice the join window). */
    static final long CUSTOMER_ORDER_GAP_MS = 600_000;

    /** Mean clock ticks between two orders: K customers ordering every 10 min. */
    static long gapTicks(final int keys) {
        return Math.max(1, Math.round(CUSTOMER_ORDER_GAP_MS / (double) TICK_MS / keys));
    }

    /** A shipment waiting for the clock to reach its arrival (its place in the topic). */
    private static final class Pending {
        final long arrival;
        final long seq;
        final long tsTick;
        final String key;
        final String value;

        Pending(final long arrival, final long seq, final long tsTick, final String key, final String value) {
            this.arrival = arrival;
            this.seq = seq;
            this.tsTick = tsTick;
            this.key = key;
            this.value = value;
        }
    }

    /**
     * The join input, from one {@link SplittableRandom}: the same flags give the same records in
     * the same order on every run. See bench/kstreams/README.md "Join input".
     */
    static final class Gen {
        private final SplittableRandom rnd;
        private final String prefix;
        private final long records;
        private final int keys;
        /** Customer ids in [keys, keys + phantom) are ordered from but never exist. */
        private final int phantom;
        private final long base;
        private final long gap;
        private final boolean[] customer;
        private final String[] names;
        private final boolean[] account;
        private final PriorityQueue<Pending> pending = new PriorityQueue<>(
            (a, b) -> a.arrival != b.arrival ? Long.compare(a.arrival, b.arrival) : Long.compare(a.seq, b.seq));
        private long tick;
        private long shipmentNo;
        private long pendingSeq;

        long orders;
        long ordersUnknownCustomer;
        long ordersUnknownCountry;
        long ordersNullCountry;
        long customerPuts;
        long customerDeletes;
        long accountPuts;
        long accountDeletes;
        long countryPuts;
        long countryDeletes;
        long shipmentsAfter;
        long shipmentsBefore;
        long shipmentsOutside;
        long shipmentsLate;
        long shipmentsVeryLate;
        long minTs = Long.MAX_VALUE;
        long maxTs = Long.MIN_VALUE;

        Gen(final long seed, final String prefix, final long records, final int keys, final long baseMs) {
            this.rnd = new SplittableRandom(seed);
            this.prefix = prefix;
            this.records = records;
            this.keys = keys;
            this.phantom = Math.max(1, keys / 10);
            this.base = baseMs;
            this.gap = gapTicks(keys);
            this.customer = new boolean[keys];
            this.names = new String[keys];
            this.account = new boolean[keys];
        }

        String topic(final String suffix) {
            return prefix + "-" + suffix;
        }

        /** Event time the input spans (for choosing a base that keeps every timestamp in the past). */
        static long spanMs(final long records, final int keys) {
            return records * gapTicks(keys) * TICK_MS + 20 * 60_000;
        }

        private void send(final Sink sink, final String suffix, final String key, final String value, final long ts) {
            minTs = Math.min(minTs, ts);
            maxTs = Math.max(maxTs, ts);
            sink.send(topic(suffix), key, value, ts);
        }

        /** The global table, all of it before any other record: two updates of a code and a delete. */
        void countries(final Sink sink) {
            final long t0 = base - 3_600_000;
            int i = 0;
            for (final String[] c : COUNTRY_NAMES) {
                send(sink, COUNTRIES, c[0], "{\"name\":" + Cli.jsonString(c[1]) + "}", t0 + i++);
                countryPuts++;
            }
            send(sink, COUNTRIES, "GB", "{\"name\":\"United Kingdom\"}", t0 + i++);
            countryPuts++;
            // Orders still name AT: the global join misses them.
            send(sink, COUNTRIES, "AT", null, t0 + i);
            countryDeletes++;
        }

        private String customerValue(final int id, final boolean rename) {
            if (rename || names[id] == null) {
                names[id] = FIRST_NAMES[rnd.nextInt(FIRST_NAMES.length)] + " " + id;
            }
            return "{\"name\":" + Cli.jsonString(names[id]) + ",\"tier\":" + (1 + rnd.nextInt(5)) + "}";
        }

        private String accountValue() {
            return "{\"balance\":" + (rnd.nextInt(200_000) - 50_000) + "}";
        }

        /** Customers and accounts that exist before the first order (not all of them). */
        void tables(final Sink sink) {
            for (int id = 0; id < keys; id++) {
                if (rnd.nextInt(100) < 60) {
                    customer[id] = true;
                    send(sink, CUSTOMERS, "c" + id, customerValue(id, true), base - TICK_MS * (keys - id) + 1);
                    customerPuts++;
                }
                if (rnd.nextInt(100) < 50) {
                    account[id] = true;
                    send(sink, ACCOUNTS, "c" + id, accountValue(), base - TICK_MS * (keys - id) + 3);
                    accountPuts++;
                }
            }
        }

        private void schedule(final long arrival, final long tsTick, final String key, final long order) {
            final String value = "{\"shipment\":" + shipmentNo++ + ",\"order\":" + order + "}";
            pending.add(new Pending(arrival, pendingSeq++, tsTick, key, value));
        }

        private void flushShipments(final Sink sink, final long upTo) {
            while (!pending.isEmpty() && pending.peek().arrival <= upTo) {
                final Pending p = pending.poll();
                send(sink, SHIPMENTS, p.key, p.value, base + TICK_MS * p.tsTick + 2);
            }
        }

        private String country() {
            final int r = rnd.nextInt(1000);
            if (r < 5) {
                ordersNullCountry++;
                return null;
            }
            if (r < 40) {
                ordersUnknownCountry++;
                return "XX";
            }
            if (r < 70) {
                ordersUnknownCountry++;
                return "AT";
            }
            return COUNTRY_NAMES[rnd.nextInt(COUNTRY_NAMES.length)][0];
        }

        /** A shipment in the order's window, after it (0-4 min). */
        private void after(final String key, final long order) {
            final long ts = tick + rnd.nextInt((int) (4 * MINUTE_TICKS));
            schedule(ts, ts, key, order);
            shipmentsAfter++;
        }

        /** A shipment in the order's window, before it (up to 4 min), arriving with the order. */
        private void before(final String key, final long order) {
            final long ts = tick - 1 - rnd.nextInt((int) (4 * MINUTE_TICKS));
            schedule(tick, ts, key, order);
            shipmentsBefore++;
        }

        /** Every order, with the table updates and shipments around it. */
        void orders(final Sink sink) {
            for (long i = 0; i < records; i++) {
                tick += 1 + (gap > 1 ? rnd.nextLong(2 * gap - 1) : 0);
                flushShipments(sink, tick);
                final long now = base + TICK_MS * tick;

                final int c = rnd.nextInt(keys + phantom);
                final String key = "c" + c;
                final String country = country();
                final int amount = 1 + rnd.nextInt(1000);
                if (c >= keys) {
                    ordersUnknownCustomer++;
                }
                send(sink, ORDERS, key, "{\"order\":" + i + ",\"customer\":\"" + key + "\",\"amount\":" + amount
                    + ",\"country\":" + (country == null ? "null" : "\"" + country + "\"") + "}", now);
                orders++;

                final int s = rnd.nextInt(100);
                if (s < 50) {
                    after(key, i);
                } else if (s < 60) {
                    before(key, i);
                } else if (s < 67) {
                    // Outside the window (5-8 min after): joins only a later order of the customer.
                    final long ts = tick + 5 * MINUTE_TICKS + 1 + rnd.nextInt((int) (3 * MINUTE_TICKS));
                    schedule(ts, ts, key, i);
                    shipmentsOutside++;
                } else if (s < 74) {
                    // In the window, but arriving 4-6 min after its time: within after + grace.
                    final long ts = tick + rnd.nextInt((int) (4 * MINUTE_TICKS));
                    schedule(ts + 4 * MINUTE_TICKS + rnd.nextInt((int) (2 * MINUTE_TICKS)), ts, key, i);
                    shipmentsLate++;
                } else if (s < 78) {
                    // In the window, but arriving 6-15 min after its time: the order may have been
                    // emitted unjoined already, and the join window store (retention 11 min) may
                    // no longer hold it.
                    final long ts = tick + rnd.nextInt((int) (4 * MINUTE_TICKS));
                    schedule(ts + 6 * MINUTE_TICKS + rnd.nextInt((int) (9 * MINUTE_TICKS)), ts, key, i);
                    shipmentsVeryLate++;
                } else if (s < 86) {
                    after(key, i);
                    before(key, i);
                }

                if (rnd.nextInt(100) < 30) {
                    final int id = rnd.nextInt(keys);
                    if (!customer[id]) {
                        customer[id] = true;
                        send(sink, CUSTOMERS, "c" + id, customerValue(id, true), now + 1);
                        customerPuts++;
                    } else if (rnd.nextInt(100) < 80) {
                        send(sink, CUSTOMERS, "c" + id, customerValue(id, rnd.nextInt(5) == 0), now + 1);
                        customerPuts++;
                    } else {
                        customer[id] = false;
                        send(sink, CUSTOMERS, "c" + id, null, now + 1);
                        customerDeletes++;
                    }
                }
                if (rnd.nextInt(100) < 25) {
                    final int id = rnd.nextInt(keys);
                    if (!account[id] || rnd.nextInt(100) < 85) {
                        account[id] = true;
                        send(sink, ACCOUNTS, "c" + id, accountValue(), now + 3);
                        accountPuts++;
                    } else {
                        account[id] = false;
                        send(sink, ACCOUNTS, "c" + id, null, now + 3);
                        accountDeletes++;
                    }
                }
            }
            flushShipments(sink, Long.MAX_VALUE);
        }

        long shipments() {
            return shipmentsAfter + shipmentsBefore + shipmentsOutside + shipmentsLate + shipmentsVeryLate;
        }

        /** The summary line (also the record of PREFIX-done). */
        String summary() {
            return "{\"prefix\":" + Cli.jsonString(prefix)
                + ",\"records\":" + records
                + ",\"keys\":" + keys
                + ",\"base_ms\":" + base
                + ",\"topics\":{\"orders\":" + orders
                + ",\"customers\":" + (customerPuts + customerDeletes)
                + ",\"shipments\":" + shipments()
                + ",\"accounts\":" + (accountPuts + accountDeletes)
                + ",\"countries\":" + (countryPuts + countryDeletes) + "}"
                + ",\"tombstones\":{\"customers\":" + customerDeletes + ",\"accounts\":" + accountDeletes
                + ",\"countries\":" + countryDeletes + "}"
                + ",\"orders_unknown_customer\":" + ordersUnknownCustomer
                + ",\"orders_unknown_country\":" + ordersUnknownCountry
                + ",\"orders_null_country\":" + ordersNullCountry
                + ",\"shipment_kinds\":{\"after\":" + shipmentsAfter + ",\"before\":" + shipmentsBefore
                + ",\"outside\":" + shipmentsOutside + ",\"late\":" + shipmentsLate
                + ",\"very_late\":" + shipmentsVeryLate + "}"
                + ",\"min_ts\":" + minTs + ",\"max_ts\":" + maxTs + "}";
        }
    }

    /** Topic suffixes and their partition counts: P for all but the global table's G and done's 1. */
    static List<String[]> topics(final int partitions, final int globalPartitions) {
        final List<String[]> t = new ArrayList<>();
        for (final String s : new String[] {ORDERS, CUSTOMERS, SHIPMENTS, ACCOUNTS}) {
            t.add(new String[] {s, Integer.toString(partitions)});
        }
        t.add(new String[] {COUNTRIES, Integer.toString(globalPartitions)});
        t.add(new String[] {DONE, "1"});
        return t;
    }
}

package dev.eddy.bench;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Produces the benchmark input deterministically: the same flags give the same sequence of
 * (key, value) records, partitioned by key with Kafka's default partitioner (murmur2 of the key
 * bytes), so every partition holds the same records in the same order on every run.
 */
public final class Generate {
    static final String PROG = "generate";
    static final String USAGE = String.join("\n",
        "usage: java -cp refapp.jar dev.eddy.bench.Generate --bootstrap HOST:PORT --topic TOPIC",
        "         [--records N (50000)] [--keys K (1000)] [--users U (100)] [--partitions P (12)]",
        "         [--seed S (1)] [--value-bytes B (100)] [--replication-factor R (1)] [--no-create]",
        "  Creates TOPIC with P partitions unless it exists (then P must match), produces N records:",
        "    key   = \"k<i>\", i uniform in [0,K)",
        "    value = {\"user\":\"u<j>\",\"amount\":<1..100>,\"status\":<200|404|500>,\"seq\":<n>,\"pad\":\"x...\"}",
        "            j uniform in [0,U); status 200 with p=0.8, 404 p=0.1, 500 p=0.1; pad fills the",
        "            value up to B bytes (never below the fields); seq = 0..N-1 in production order",
        "  Prints one JSON line: counts and the totals the sum case must reach.",
        "",
        "  --windowed: input of the windowed cases instead (see README \"Windowed input\"):",
        "    key   = \"u<j>\", j uniform in [0,K)   (--users is ignored)",
        "    value = {\"user\":\"u<j>\",\"ts\":<event ms>,\"amount\":<1..100>,\"seq\":<n>,\"kind\":\"in-order|jitter|late|bridge\"}",
        "    event time starts at --base-ms (1700000000000) and advances by a uniform step of mean",
        "    --mean-gap-ms/K per record (so a key recurs every ~4 s); 20% of records are up to 1.5 s",
        "    behind (jitter), 1% are 40-54 s behind (late), 1% fall in the middle of a key's recent",
        "    silence of --session-gap-ms to 2x that (bridge two sessions).",
        "    [--base-ms MS] [--mean-gap-ms MS (4000)] [--session-gap-ms MS (5000)]",
        "",
        "  --joins: input of the join cases instead (see README \"Join input\"); TOPIC is a prefix:",
        "    TOPIC-orders (N orders, key = customer id), TOPIC-customers and TOPIC-accounts (tables with",
        "    deletes, updated between the orders), TOPIC-shipments (out of order), all with P partitions;",
        "    TOPIC-countries (global table, --global-partitions G (3)); TOPIC-done (the summary, last).",
        "    K customers (--keys, default N/10, at least 10); event time = the record timestamps, from",
        "    --base-ms (default: far enough in the past that every timestamp is).",
        "    [--global-partitions G (3)] [--base-ms MS]");

    private static final Set<String> VALUED = Set.of("--bootstrap", "--topic", "--records", "--keys", "--users",
        "--partitions", "--seed", "--value-bytes", "--replication-factor", "--base-ms", "--mean-gap-ms",
        "--session-gap-ms", "--global-partitions");
    private static final Set<String> SWITCHES = Set.of("--no-create", "--help", "--windowed", "--joins");

    public static void main(final String[] args) {
        Cli.main(PROG, USAGE, () -> run(new Cli(PROG, args, VALUED, SWITCHES)));
    }

    /** One generated record. */
    static final class Rec {
        String key;
        String value;
        boolean ok;
        long amount;
    }

    /** The deterministic record stream. */
    static final class Gen {
        private final SplittableRandom rnd;
        private final int keys;
        private final int users;
        private final int valueBytes;
        private long seq;

        Gen(final long seed, final int keys, final int users, final int valueBytes) {
            this.rnd = new SplittableRandom(seed);
            this.keys = keys;
            this.users = users;
            this.valueBytes = valueBytes;
        }

        void next(final Rec r) {
            final int k = rnd.nextInt(keys);
            final int u = rnd.nextInt(users);
            final int amount = 1 + rnd.nextInt(100);
            final int s = rnd.nextInt(10);
            final int status = s < 8 ? 200 : (s == 8 ? 404 : 500);
            final StringBuilder v = new StringBuilder(valueBytes + 16);
            v.append("{\"user\":\"u").append(u).append("\",\"amount\":").append(amount)
                .append(",\"status\":").append(status).append(",\"seq\":").append(seq++).append(",\"pad\":\"");
            final int pad = valueBytes - v.length() - 2;
            for (int i = 0; i < pad; i++) {
                v.append('x');
            }
            v.append("\"}");
            r.key = "k" + k;
            r.value = v.toString();
            r.ok = status == 200;
            r.amount = amount;
        }
    }

    /**
     * The windowed cases' record stream: event time in the value, mostly increasing, some records
     * a little out of order (within every case's grace), some far behind (later than every case's
     * grace), and some that fall into a key's recent silence so that they bridge two sessions.
     */
    static final class WindowedGen {
        private final SplittableRandom rnd;
        private final int keys;
        private final long step;
        private final long base;
        /** Sum of the per-record draws; event time advances by it / keys (exact at any key count). */
        private long advanced;
        private final long sessionGap;
        private final long[] last;
        private long clock;
        private long seq;
        /** Recent silences of a key that one record can bridge: {key, before, after}. */
        private final java.util.ArrayDeque<long[]> silences = new java.util.ArrayDeque<>();
        long inOrder;
        long jitter;
        long late;
        long bridge;
        long minTs = Long.MAX_VALUE;
        long maxTs = Long.MIN_VALUE;

        WindowedGen(final long seed, final int keys, final long baseMs, final long meanGapMs, final long sessionGap) {
            this.rnd = new SplittableRandom(seed);
            this.keys = keys;
            this.step = Math.max(0, 2 * meanGapMs);
            this.sessionGap = sessionGap;
            this.last = new long[keys];
            java.util.Arrays.fill(last, Long.MIN_VALUE);
            this.clock = baseMs;
            this.base = baseMs;
        }

        void next(final Rec r) {
            // A mean step of meanGapMs / keys per record, without rounding it to 0 ms when there
            // are more keys than 2 x meanGapMs.
            advanced += step == 0 ? 0 : rnd.nextLong(step + 1);
            clock = base + advanced / keys;
            int k = rnd.nextInt(keys);
            final int amount = 1 + rnd.nextInt(100);
            final int kind = rnd.nextInt(1000);
            long ts = clock;
            String name = "in-order";
            if (kind < 10) {
                // 40-54 s behind: later than every case's size + grace (35 s at most), and
                // younger than the 1 min retention, so the stores never hide what it could merge with.
                ts = clock - 40_000 - rnd.nextInt(14_000);
                name = "late";
            } else if (kind < 20 && bridgeable()) {
                final long[] s = silences.pollLast();
                k = (int) s[0];
                ts = (s[1] + s[2]) / 2;
                name = "bridge";
            } else if (kind < 220) {
                ts = clock - rnd.nextInt(1500);
                name = "jitter";
            } else if (last[k] != Long.MIN_VALUE && ts - last[k] > sessionGap && ts - last[k] <= 2 * sessionGap) {
                silences.addLast(new long[] {k, last[k], ts});
                if (silences.size() > 64) {
                    silences.pollFirst();
                }
            }
            switch (name) {
                case "late": late++; break;
                case "bridge": bridge++; break;
                case "jitter": jitter++; break;
                default: inOrder++;
            }
            if (!name.equals("late")) {
                last[k] = Math.max(last[k], ts);
            }
            minTs = Math.min(minTs, ts);
            maxTs = Math.max(maxTs, ts);
            r.key = "u" + k;
            r.value = "{\"user\":\"u" + k + "\",\"ts\":" + ts + ",\"amount\":" + amount + ",\"seq\":" + seq++
                + ",\"kind\":\"" + name + "\"}";
            r.ok = true;
            r.amount = amount;
        }

        /** A silence that ended within the last second: its sessions are both still open. */
        private boolean bridgeable() {
            while (!silences.isEmpty() && silences.peekLast()[2] < clock - 1000) {
                silences.pollLast();
            }
            return !silences.isEmpty();
        }
    }

    /** Creates TOPIC with P partitions unless it exists or !create; then its partition count must be P. */
    private static void prepareTopic(final String bootstrap, final String topic, final int partitions, final short rf,
                                     final boolean create) throws Exception {
        final Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            if (create) {
                try {
                    admin.createTopics(List.of(new NewTopic(topic, partitions, rf))).all().get(60, TimeUnit.SECONDS);
                    Cli.log(PROG, "created topic " + topic + " with " + partitions + " partitions");
                } catch (final ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                }
            }
            // A topic just created may not be known to every broker yet: retry for a while.
            Map<String, TopicDescription> d = null;
            for (int attempt = 0; d == null; attempt++) {
                try {
                    d = admin.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS);
                } catch (final ExecutionException e) {
                    if (!(e.getCause() instanceof UnknownTopicOrPartitionException) || attempt >= 100) {
                        throw e;
                    }
                    Thread.sleep(100);
                }
            }
            final int actual = d.get(topic).partitions().size();
            if (actual != partitions) {
                throw new IllegalStateException("topic " + topic + " has " + actual + " partitions, not " + partitions);
            }
        }
    }

    /** acks=all and idempotence (the default): every partition gets its records in send order. */
    private static Properties producerProps(final String bootstrap) {
        final Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        pp.put(ProducerConfig.LINGER_MS_CONFIG, 10);
        pp.put(ProducerConfig.BATCH_SIZE_CONFIG, 128 * 1024);
        pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        pp.put(ProducerConfig.CLIENT_ID_CONFIG, "eddy-bench-generate");
        return pp;
    }

    /**
     * The join cases' input (Joins.Gen): the global table first, then the tables' first rows, then
     * the orders with the updates and shipments between them, and last the summary in TOPIC-done.
     * Record timestamps are set explicitly (they are the event time of every join).
     */
    private static int runJoins(final Cli cli) throws Exception {
        final String bootstrap = cli.required("--bootstrap");
        final String prefix = cli.required("--topic");
        final long records = cli.getLong("--records", 50_000);
        final int keys = (int) cli.getLong("--keys", Math.max(10, records / 10));
        final int partitions = (int) cli.getLong("--partitions", 12);
        final int globalPartitions = (int) cli.getLong("--global-partitions", 3);
        final long seed = cli.getLong("--seed", 1);
        final short rf = (short) cli.getLong("--replication-factor", 1);
        if (records < 0 || keys < 1 || partitions < 1 || globalPartitions < 1) {
            throw new Cli.UsageException("--records >= 0, --keys/--partitions/--global-partitions >= 1");
        }
        // Every timestamp in the past: brokers refuse records too far in the future
        // (log.message.timestamp.after.max.ms), and whole minutes keep the input readable.
        final long now = System.currentTimeMillis();
        final long base = cli.getLong("--base-ms",
            (now - Joins.Gen.spanMs(records, keys) - 3_600_000) / 60_000 * 60_000);
        for (final String[] t : Joins.topics(partitions, globalPartitions)) {
            prepareTopic(bootstrap, prefix + "-" + t[0], Integer.parseInt(t[1]), rf, !cli.has("--no-create"));
        }
        final AtomicReference<Exception> error = new AtomicReference<>();
        final long[] sent = {0};
        final Joins.Gen gen = new Joins.Gen(seed, prefix, records, keys, base);
        final long t0 = System.nanoTime();
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(producerProps(bootstrap), new StringSerializer(), new StringSerializer())) {
            final Joins.Sink sink = (topic, key, value, ts) -> {
                if (error.get() != null) {
                    throw new IllegalStateException("produce failed: " + Cli.describe(error.get()), error.get());
                }
                sent[0]++;
                producer.send(new ProducerRecord<>(topic, null, ts, key, value), (md, e) -> {
                    if (e != null) {
                        error.compareAndSet(null, e);
                    }
                });
            };
            // The global table is complete before anything else is written.
            gen.countries(sink);
            producer.flush();
            gen.tables(sink);
            gen.orders(sink);
            producer.flush();
            if (error.get() == null) {
                // Last: the marker that the input is complete.
                producer.send(new ProducerRecord<>(prefix + "-" + Joins.DONE, "summary", gen.summary())).get(60, TimeUnit.SECONDS);
            }
        }
        if (error.get() != null) {
            throw new IllegalStateException("produce failed: " + Cli.describe(error.get()), error.get());
        }
        final long nanos = System.nanoTime() - t0;
        final String s = gen.summary();
        System.out.println(s.substring(0, s.length() - 1)
            + ",\"partitions\":" + partitions
            + ",\"global_partitions\":" + globalPartitions
            + ",\"seed\":" + seed
            + ",\"sent\":" + sent[0]
            + ",\"seconds\":" + Cli.secs(nanos)
            + ",\"records_per_second\":" + Cli.rate(sent[0], nanos)
            + "}");
        return 0;
    }

    private static int run(final Cli cli) throws Exception {
        if (cli.has("--help")) {
            System.out.println(USAGE);
            return 0;
        }
        if (cli.has("--joins")) {
            return runJoins(cli);
        }
        final String bootstrap = cli.required("--bootstrap");
        final String topic = cli.required("--topic");
        final long records = cli.getLong("--records", 50_000);
        final int keys = (int) cli.getLong("--keys", 1000);
        final int users = (int) cli.getLong("--users", 100);
        final int partitions = (int) cli.getLong("--partitions", 12);
        final long seed = cli.getLong("--seed", 1);
        final int valueBytes = (int) cli.getLong("--value-bytes", 100);
        final short rf = (short) cli.getLong("--replication-factor", 1);
        if (records < 0 || keys < 1 || users < 1 || partitions < 1) {
            throw new Cli.UsageException("--records >= 0, --keys/--users/--partitions >= 1");
        }

        prepareTopic(bootstrap, topic, partitions, rf, !cli.has("--no-create"));

        final Properties pp = producerProps(bootstrap);
        final AtomicReference<Exception> error = new AtomicReference<>();
        final Gen gen = new Gen(seed, keys, users, valueBytes);
        final boolean windowed = cli.has("--windowed");
        final WindowedGen wgen = new WindowedGen(seed, keys, cli.getLong("--base-ms", 1_700_000_000_000L),
            cli.getLong("--mean-gap-ms", 4000), cli.getLong("--session-gap-ms", 5000));
        final Rec r = new Rec();
        long ok = 0;
        long amountOk = 0;
        long bytes = 0;
        final long t0 = System.nanoTime();
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(pp, new StringSerializer(), new StringSerializer())) {
            for (long i = 0; i < records && error.get() == null; i++) {
                if (windowed) {
                    wgen.next(r);
                } else {
                    gen.next(r);
                }
                if (r.ok) {
                    ok++;
                    amountOk += r.amount;
                }
                bytes += r.key.getBytes(StandardCharsets.UTF_8).length + r.value.getBytes(StandardCharsets.UTF_8).length;
                producer.send(new ProducerRecord<>(topic, r.key, r.value), (md, e) -> {
                    if (e != null) {
                        error.compareAndSet(null, e);
                    }
                });
            }
            producer.flush();
        }
        if (error.get() != null) {
            throw new IllegalStateException("produce failed: " + Cli.describe(error.get()), error.get());
        }
        final long nanos = System.nanoTime() - t0;
        System.out.println("{\"topic\":" + Cli.jsonString(topic)
            + ",\"records\":" + records
            + ",\"keys\":" + keys
            + ",\"users\":" + users
            + ",\"partitions\":" + partitions
            + ",\"seed\":" + seed
            + ",\"value_bytes\":" + valueBytes
            + ",\"bytes\":" + bytes
            + ",\"status_200\":" + ok
            + ",\"amount_200_total\":" + amountOk
            + (windowed ? ",\"windowed\":{\"in_order\":" + wgen.inOrder + ",\"jitter\":" + wgen.jitter
                + ",\"late\":" + wgen.late + ",\"bridge\":" + wgen.bridge + ",\"min_ts\":" + wgen.minTs
                + ",\"max_ts\":" + wgen.maxTs + "}" : "")
            + ",\"seconds\":" + Cli.secs(nanos)
            + ",\"records_per_second\":" + Cli.rate(records, nanos)
            + "}");
        return 0;
    }
}

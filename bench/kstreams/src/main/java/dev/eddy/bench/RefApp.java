package dev.eddy.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Optional;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.ListStreamsGroupOffsetsSpec;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyDescription;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * Kafka Streams reference application for eddy: benchmark baseline and correctness oracle.
 * See bench/kstreams/README.md for the exact semantics of each case.
 */
public final class RefApp {
    static final String PROG = "refapp";
    static final String USAGE = String.join("\n",
        "usage: java -jar refapp.jar --bootstrap HOST:PORT --app-id ID --case CASE",
        "         (count|sum|latest, or windowed: tumbling-count|tumbling-suppress|hopping-aggregate|",
        "         sliding-count|session-count|windowed-reduce, or joins: stream-table-inner|stream-table-left|",
        "         global-table|stream-stream|stream-stream-inner|table-table|stream-table-versioned, which also",
        "         take --right TOPIC)",
        "         --guarantee at_least_once|exactly_once_v2 --input TOPIC --output TOPIC --state-dir DIR",
        "         [--expect N | --restore-only] [--timeout-s S (1800)] [--poll-ms MS (100)]",
        "         [--config KEY=VALUE]... [--dump-metrics] [--close-when-processed] [--print-tasks]",
        "  --expect N       exit 0 once all N input records are consumed, processed AND committed",
        "                   (and, for sum, the repartition topic too); print one JSON line",
        "  --close-when-processed  with --expect: close (a clean close commits) as soon as all N records",
        "                   are processed instead of waiting for a committed offset (at_least_once",
        "                   otherwise waits for the 30 s commit interval)",
        "  --expect-repartitioned M  with --expect: the repartition topic must also have been consumed",
        "                   M records before the app counts as done (its producer may still hold",
        "                   some in a batch when the consumer has caught up with what it sent)",
        "  --restore-only   wipe this app id's local state (KafkaStreams#cleanUp), restore it from",
        "                   the changelogs, print one JSON line once RUNNING, close",
        "  --keep-state     with --restore-only: keep the local state (restore only the changelogs'",
        "                   tail past its checkpoint)",
        "  --right TOPIC    joins: the other side (customers, countries, shipments or accounts); with",
        "                   --expect, N counts the records of --input and --right (but a global table's)",
        "  --config K=V     extra/overriding StreamsConfig entry (e.g. commit.interval.ms=1000)",
        "  --print-tasks    without --expect/--restore-only: print a JSON line on stdout whenever this",
        "                   instance's active or standby tasks change (polled every 50 ms)",
        "other mains: java -cp refapp.jar dev.eddy.bench.Generate --help | dev.eddy.bench.Verify --help");

    private static final Set<String> VALUED = Set.of("--bootstrap", "--app-id", "--case", "--guarantee",
        "--input", "--output", "--state-dir", "--expect", "--timeout-s", "--poll-ms", "--config",
        "--expect-repartitioned", "--right");
    private static final Set<String> SWITCHES = Set.of("--restore-only", "--dump-metrics", "--help", "--close-when-processed",
        "--print-tasks", "--keep-state");

    public static void main(final String[] args) {
        Cli.main(PROG, USAGE, () -> new RefApp(new Cli(PROG, args, VALUED, SWITCHES)).run());
    }

    private final Cli cli;
    private KafkaStreams streams;
    private final AtomicReference<Throwable> failure = new AtomicReference<>();
    private final AtomicLong firstRunningNanos = new AtomicLong();
    private final AtomicInteger rebalancesAfterRunning = new AtomicInteger();
    private final AtomicBoolean closed = new AtomicBoolean();
    private final Restores restores = new Restores();

    private RefApp(final Cli cli) {
        this.cli = cli;
    }

    private static void log(final String msg) {
        Cli.log(PROG, msg);
    }

    private int run() throws Exception {
        if (cli.has("--help")) {
            System.out.println(USAGE);
            return 0;
        }
        final String bootstrap = cli.required("--bootstrap");
        final String appId = cli.required("--app-id");
        final String caseName = cli.required("--case");
        final String guarantee = cli.required("--guarantee");
        final String input = cli.required("--input");
        final String output = cli.required("--output");
        final boolean join = JOINS.contains(caseName);
        final String right = join ? cli.required("--right") : null;
        if (!join && cli.has("--right")) {
            throw new Cli.UsageException("--right is for the join cases " + JOINS);
        }
        // The topics whose records --expect counts: the input and a join's other side, unless it
        // is a global table (its records are restored, not processed by the stream thread).
        final Set<String> external = new LinkedHashSet<>();
        external.add(input);
        if (join && !caseName.equals("global-table")) {
            external.add(right);
        }
        final String stateDir = cli.required("--state-dir");
        final boolean restoreOnly = cli.has("--restore-only");
        final long expect = cli.getLong("--expect", -1);
        final long timeoutNanos = TimeUnit.SECONDS.toNanos(cli.getLong("--timeout-s", 1800));
        final long pollMs = Math.max(10, cli.getLong("--poll-ms", 100));
        if (!guarantee.equals(StreamsConfig.AT_LEAST_ONCE) && !guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
            throw new Cli.UsageException("--guarantee must be at_least_once or exactly_once_v2, got '" + guarantee + "'");
        }
        if (restoreOnly && cli.has("--expect")) {
            throw new Cli.UsageException("--expect and --restore-only are exclusive");
        }
        if (cli.has("--expect") && expect < 0) {
            throw new Cli.UsageException("--expect must be >= 0");
        }

        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        if (caseName.startsWith("stream-stream")) {
            // Unjoined left records are emitted when the window closes, but by default at most once
            // per second of wall-clock time, which makes their order among the joined results
            // depend on timing: check on every record instead, so the output is deterministic.
            props.put(EMIT_INTERVAL, 0L);
        }
        for (final String kv : cli.all("--config")) {
            final int eq = kv.indexOf('=');
            if (eq <= 0) {
                throw new Cli.UsageException("--config wants KEY=VALUE, got '" + kv + "'");
            }
            props.put(kv.substring(0, eq).trim(), kv.substring(eq + 1).trim());
        }
        final StreamsConfig config = new StreamsConfig(props);
        final boolean streamsProtocol = "streams".equalsIgnoreCase(config.getString(StreamsConfig.GROUP_PROTOCOL_CONFIG));

        final Topology topology = buildTopology(caseName, input, right, output);
        final TopologyDescription description = topology.describe();
        final List<String> sources = sourceTopics(description, appId, external);
        log("case=" + caseName + " guarantee=" + guarantee + " app-id=" + appId + " source topics=" + sources
            + " commit.interval.ms=" + config.getLong(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG)
            + " statestore.cache.max.bytes=" + config.getLong(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG)
            + " group.protocol=" + config.getString(StreamsConfig.GROUP_PROTOCOL_CONFIG));
        log("topology:\n" + description.toString().trim());

        streams = new KafkaStreams(topology, props);
        streams.setStateListener((next, prev) -> {
            if (next == KafkaStreams.State.RUNNING) {
                firstRunningNanos.compareAndSet(0, System.nanoTime());
            } else if (next == KafkaStreams.State.REBALANCING && firstRunningNanos.get() != 0) {
                rebalancesAfterRunning.incrementAndGet();
            }
            if (next == KafkaStreams.State.ERROR || next == KafkaStreams.State.PENDING_ERROR) {
                log("Kafka Streams state " + prev + " -> " + next);
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            log("stream thread failed, shutting the client down: " + Cli.describe(e));
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        if (restoreOnly) {
            streams.setGlobalStateRestoreListener(restores);
            // Start from an empty local state for this app id so that everything is restored,
            // unless the caller times a restore from an existing checkpoint.
            if (!cli.has("--keep-state")) {
                streams.cleanUp();
            }
        }
        // SIGTERM/SIGINT: close cleanly (commits) and let the JVM exit with the signal's status.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            signalled = true;
            closeStreams();
        }, "refapp-shutdown"));

        final Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        adminProps.put(AdminClientConfig.CLIENT_ID_CONFIG, appId + "-refapp-watcher");
        try (Admin admin = Admin.create(adminProps)) {
            prepareTopics(admin, input, right, output);
            final long t0 = System.nanoTime();
            final long deadline = t0 + timeoutNanos;
            streams.start();
            final long tRunning = waitRunning(deadline);
            if (restoreOnly) {
                return finishRestore(t0, tRunning);
            }
            if (expect < 0) {
                log("RUNNING after " + Cli.secs(tRunning - t0) + " s; no --expect: running until killed");
                final boolean printTasks = cli.has("--print-tasks");
                String last = "";
                long nextCheck = 0;
                while (true) {
                    if (System.nanoTime() >= nextCheck) {
                        checkHealthy();
                        nextCheck = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(500);
                    }
                    if (printTasks) {
                        final String tasks = tasksJson();
                        if (tasks != null && !tasks.equals(last)) {
                            last = tasks;
                            System.out.println("{\"epoch_ms\":" + System.currentTimeMillis() + "," + tasks + "}");
                            System.out.flush();
                        }
                    }
                    Thread.sleep(printTasks ? 50 : 500);
                }
            }
            return benchmark(admin, appId, external, sources, expect, streamsProtocol, t0, tRunning, deadline, pollMs);
        } finally {
            closeStreams();
        }
    }

    /**
     * The input topic must exist. The output topic is created (input's partition count, the broker's
     * default replication factor) if it does not: Kafka Streams never creates sink topics, and
     * against a broker with auto.create.topics.enable=false it would retry the sends forever.
     */
    private static void prepareTopics(final Admin admin, final String input, final String right, final String output)
        throws Exception {
        final Set<String> existing = admin.listTopics().names().get(30, TimeUnit.SECONDS);
        if (!existing.contains(input)) {
            throw new IllegalStateException("input topic " + input + " does not exist");
        }
        if (right != null && !existing.contains(right)) {
            throw new IllegalStateException("--right topic " + right + " does not exist");
        }
        if (!existing.contains(output)) {
            final int partitions = admin.describeTopics(List.of(input)).allTopicNames().get(30, TimeUnit.SECONDS)
                .get(input).partitions().size();
            try {
                admin.createTopics(List.of(new NewTopic(output, Optional.of(partitions), Optional.empty())))
                    .all().get(30, TimeUnit.SECONDS);
                log("created output topic " + output + " with " + partitions + " partitions");
            } catch (final ExecutionException e) {
                if (!(e.getCause() instanceof TopicExistsException)) {
                    throw e;
                }
            }
        }
    }

    // ------------------------------------------------------------------------------ topologies

    /** The windowed cases (input from `Generate --windowed`; see README "Windowed cases"). */
    static final List<String> WINDOWED = List.of("tumbling-count", "tumbling-suppress", "hopping-aggregate",
        "sliding-count", "session-count", "windowed-reduce");

    /** Window stores keep windows one minute (at least size + grace, as Kafka Streams requires). */
    static final Duration RETENTION = Duration.ofMinutes(1);

    /** The input of the windowed cases: user keys, JSON events, event time from `ts`. */
    private static KStream<String, Event> events(final StreamsBuilder builder, final String input) {
        return builder.stream(input, Consumed.with(Serdes.String(), Event.SERDE).withTimestampExtractor(new Event.Time()));
    }

    private static <V> Materialized<String, V, WindowStore<Bytes, byte[]>> windowStore(final String name) {
        return Materialized.<String, V, WindowStore<Bytes, byte[]>>as(name).withRetention(RETENTION);
    }

    private static Produced<org.apache.kafka.streams.kstream.Windowed<String>, Long> timeWindowedLongs(final long sizeMs) {
        return Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, sizeMs), Serdes.Long());
    }

    /** The join cases (input from `Generate --joins`; see README "Join cases"). */
    static final List<String> JOINS = List.of("stream-table-inner", "stream-table-left", "global-table",
        "stream-stream", "stream-stream-inner", "table-table", "stream-table-versioned");

    /** Kafka Streams' internal setting: how often (wall clock) a left join emits unjoined records. */
    static final String EMIT_INTERVAL = "__emit.interval.ms.kstreams.outer.join.spurious.results.fix__";

    /** A join's stream side: customer keys, JSON values, event time = the record's timestamp. */
    private static KStream<String, JsonNode> jsonStream(final StreamsBuilder builder, final String topic) {
        return builder.stream(topic, Consumed.with(Serdes.String(), Joins.SERDE));
    }

    /** A table materialized in the store `name` (RocksDB, record cache: Kafka Streams' defaults). */
    private static KTable<String, JsonNode> jsonTable(final StreamsBuilder builder, final String topic, final String name) {
        return builder.table(topic, Consumed.with(Serdes.String(), Joins.SERDE),
            Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>as(name));
    }

    private static final Produced<String, JsonNode> JSON_OUT = Produced.with(Serdes.String(), Joins.SERDE);

    static Topology buildTopology(final String caseName, final String input, final String right, final String output) {
        final StreamsBuilder builder = new StreamsBuilder();
        switch (caseName) {
            case "stream-table-inner":
                // Orders joined with the customer table by key: an order whose customer the table
                // lacks (never created, or deleted) is dropped.
                jsonStream(builder, input)
                    .join(jsonTable(builder, right, "customers"), Joins::orderWithName)
                    .to(output, JSON_OUT);
                break;
            case "stream-table-left":
                // The same, but a miss is joined with null ("name":null).
                jsonStream(builder, input)
                    .leftJoin(jsonTable(builder, right, "customers"), Joins::orderWithName)
                    .to(output, JSON_OUT);
                break;
            case "global-table":
                // Orders joined with the global country table by `.country`; a miss (or a null
                // country) is dropped.
                jsonStream(builder, input)
                    .join(builder.globalTable(right, Consumed.with(Serdes.String(), Joins.SERDE),
                            Materialized.<String, JsonNode, KeyValueStore<Bytes, byte[]>>as("countries")),
                        (key, order) -> Joins.country(order), Joins::orderWithCountry)
                    .to(output, JSON_OUT);
                break;
            case "stream-stream":
            case "stream-stream-inner": {
                // Orders joined with the shipments of the same customer at most 5 min apart, 1 min
                // grace; left: an order no shipment joins is emitted with null once its window closes.
                final KStream<String, JsonNode> orders = jsonStream(builder, input);
                final KStream<String, JsonNode> shipments = jsonStream(builder, right);
                final JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Joins.WITHIN, Joins.GRACE);
                final StreamJoined<String, JsonNode, JsonNode> joined =
                    StreamJoined.with(Serdes.String(), Joins.SERDE, Joins.SERDE);
                (caseName.equals("stream-stream")
                    ? orders.leftJoin(shipments, Joins::orderWithShipment, windows, joined)
                    : orders.join(shipments, Joins::orderWithShipment, windows, joined))
                    .to(output, JSON_OUT);
                break;
            }
            case "table-table":
                // The customer table left-joined with the account table: an update of either side
                // emits the joined row; deleting a customer emits a tombstone.
                jsonTable(builder, input, "customers")
                    .leftJoin(jsonTable(builder, right, "accounts"), Joins::customerWithBalance)
                    .toStream()
                    .to(output, JSON_OUT);
                break;
            case "stream-table-versioned":
                // Shipments left-joined with the customer table as of each shipment's time: the
                // table keeps 10 min of each customer's history (a versioned store).
                jsonStream(builder, input)
                    .leftJoin(builder.table(right, Consumed.with(Serdes.String(), Joins.SERDE),
                            Materialized.<String, JsonNode>as(
                                Stores.persistentVersionedKeyValueStore("customers", Joins.HISTORY))),
                        Joins::shipmentWithCustomer)
                    .to(output, JSON_OUT);
                break;
            case "count":
                builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .groupByKey()
                    .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
                    .toStream()
                    .to(output, Produced.with(Serdes.String(), Serdes.Long()));
                break;
            case "sum":
                builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .filter((key, value) -> Payment.parseCached(value).counts)
                    .groupBy((key, value) -> Payment.parseCached(value).user,
                        Grouped.with(Serdes.String(), Serdes.String()))
                    .aggregate(
                        () -> 0L,
                        (user, value, sum) -> sum + Payment.parse(value).amount,
                        Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("sums")
                            .withKeySerde(Serdes.String())
                            .withValueSerde(Serdes.Long()))
                    .toStream()
                    .mapValues(sum -> sum == null ? null : Long.toString(sum))
                    .to(output, Produced.with(Serdes.String(), Serdes.String()));
                break;
            case "latest":
                // The latest value per key (the large-state restore benchmark's store: values of
                // a few hundred bytes); the changelog holds each key's value as UTF-8 text.
                builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .groupByKey()
                    .reduce((old, value) -> value,
                        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("latest")
                            .withKeySerde(Serdes.String())
                            .withValueSerde(Serdes.String()))
                    .toStream()
                    .to(output, Produced.with(Serdes.String(), Serdes.String()));
                break;
            case "tumbling-count":
                // Tumbling 10 s windows, 2 s grace: the count per user and window.
                events(builder, input)
                    .groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofSeconds(2)))
                    .count(RefApp.<Long>windowStore("counts"))
                    .toStream()
                    .to(output, timeWindowedLongs(10_000));
                break;
            case "tumbling-suppress":
                // The same, but only each window's final count, once stream time passes its end + grace.
                events(builder, input)
                    .groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofSeconds(2)))
                    .count(RefApp.<Long>windowStore("counts"))
                    .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                    .toStream()
                    .to(output, timeWindowedLongs(10_000));
                break;
            case "hopping-aggregate":
                // Hopping 30 s windows every 10 s, 5 s grace: the sum of `amount`, written as decimal text
                // (eddy's JSON number), like the `sum` case.
                events(builder, input)
                    .groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(30), Duration.ofSeconds(5))
                        .advanceBy(Duration.ofSeconds(10)))
                    .aggregate(() -> 0L, (user, e, sum) -> sum + e.amount,
                        RefApp.<Long>windowStore("sums").withValueSerde(Serdes.Long()))
                    .toStream()
                    .mapValues(sum -> sum == null ? null : Long.toString(sum))
                    .to(output, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, 30_000), Serdes.String()));
                break;
            case "sliding-count":
                // Sliding windows: records at most 10 s apart, 2 s grace (retention >= 2 * 10 s + 2 s).
                events(builder, input)
                    .groupByKey()
                    .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofSeconds(10), Duration.ofSeconds(2)))
                    .count(RefApp.<Long>windowStore("counts"))
                    .toStream()
                    .to(output, timeWindowedLongs(10_000));
                break;
            case "session-count":
                // Sessions with a 5 s inactivity gap, 2 s grace; a merge forwards a tombstone (null value)
                // for every session it replaces.
                events(builder, input)
                    .groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofSeconds(5), Duration.ofSeconds(2)))
                    .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("counts").withRetention(RETENTION))
                    .toStream()
                    .to(output, Produced.with(WindowedSerdes.sessionWindowedSerdeFrom(String.class), Serdes.Long()));
                break;
            case "windowed-reduce":
                // The largest `amount` per user and tumbling 10 s window (2 s grace), as decimal text.
                events(builder, input)
                    .mapValues(e -> e.amount)
                    .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofSeconds(2)))
                    .reduce(Math::max, RefApp.<Long>windowStore("maxes").withValueSerde(Serdes.Long()))
                    .toStream()
                    .mapValues(max -> max == null ? null : Long.toString(max))
                    .to(output, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, 10_000), Serdes.String()));
                break;
            default:
                throw new Cli.UsageException("--case must be count, sum, latest or one of " + WINDOWED + " or "
                    + JOINS + ", got '" + caseName + "'");
        }
        return builder.build();
    }

    /**
     * Every topic a source node reads: the external ones (input, a join's other side) first, then
     * internal (repartition) topics, full names. A global table's topic is not a source here.
     */
    static List<String> sourceTopics(final TopologyDescription description, final String appId, final Set<String> external) {
        final Set<String> out = new LinkedHashSet<>(external);
        final Set<String> internal = new TreeSet<>();
        for (final TopologyDescription.Subtopology st : description.subtopologies()) {
            for (final TopologyDescription.Node node : st.nodes()) {
                if (node instanceof TopologyDescription.Source) {
                    final Set<String> topics = ((TopologyDescription.Source) node).topicSet();
                    if (topics == null) {
                        throw new IllegalStateException("pattern source in topology: " + node);
                    }
                    for (final String t : topics) {
                        if (!external.contains(t)) {
                            internal.add(t.startsWith(appId + "-") ? t : appId + "-" + t);
                        }
                    }
                }
            }
        }
        out.addAll(internal);
        return new ArrayList<>(out);
    }

    // ------------------------------------------------------------------------------ lifecycle

    private volatile boolean signalled;

    private void checkHealthy() throws InterruptedException {
        if (signalled) {
            // The shutdown hook is closing Kafka Streams; the JVM exits when it is done.
            Thread.sleep(Long.MAX_VALUE);
        }
        final Throwable f = failure.get();
        if (f != null) {
            throw new IllegalStateException("Kafka Streams failed: " + Cli.describe(f), f);
        }
        final KafkaStreams.State s = streams.state();
        if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.PENDING_ERROR
            || s == KafkaStreams.State.NOT_RUNNING || s == KafkaStreams.State.PENDING_SHUTDOWN) {
            throw new IllegalStateException("Kafka Streams stopped unexpectedly (state " + s + ")");
        }
    }

    /**
     * This instance's tasks as `"state":"RUNNING","active":["0_1",...],"standby":[...]` (sorted;
     * Kafka Streams lists warm-up replicas among the standbys), or null while Kafka Streams cannot
     * tell (e.g. between states).
     */
    private String tasksJson() {
        final TreeSet<String> active = new TreeSet<>();
        final TreeSet<String> standby = new TreeSet<>();
        try {
            for (final org.apache.kafka.streams.ThreadMetadata t : streams.metadataForLocalThreads()) {
                t.activeTasks().forEach(m -> active.add(m.taskId().toString()));
                t.standbyTasks().forEach(m -> standby.add(m.taskId().toString()));
            }
        } catch (final RuntimeException e) {
            return null;
        }
        return "\"state\":" + Cli.jsonString(streams.state().toString()) + ",\"active\":" + jsonList(active)
            + ",\"standby\":" + jsonList(standby);
    }

    private static String jsonList(final Set<String> items) {
        final StringBuilder b = new StringBuilder("[");
        for (final String i : items) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append(Cli.jsonString(i));
        }
        return b.append(']').toString();
    }

    private long waitRunning(final long deadline) throws InterruptedException {
        while (firstRunningNanos.get() == 0) {
            checkHealthy();
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("not RUNNING before the timeout (state " + streams.state() + ")");
            }
            Thread.sleep(5);
        }
        return firstRunningNanos.get();
    }

    private void closeStreams() {
        if (streams == null || !closed.compareAndSet(false, true)) {
            return;
        }
        final long t = System.nanoTime();
        // Leave the group so that the next run with this app id (e.g. --restore-only) gets its
        // partitions at once instead of waiting for this member's session to time out.
        final boolean ok = streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(60)));
        closeNanos = System.nanoTime() - t;
        if (!ok) {
            log("warning: KafkaStreams#close did not finish within 60 s");
        }
        closeOk = ok;
    }

    private volatile long closeNanos;
    private volatile boolean closeOk;

    // ------------------------------------------------------------------------------ --expect

    private int benchmark(final Admin admin, final String appId, final Set<String> external, final List<String> sources,
                          final long expect, final boolean streamsProtocol, final long t0, final long tRunning,
                          final long deadline, final long pollMs) throws Exception {
        log("RUNNING after " + Cli.secs(tRunning - t0) + " s; waiting for " + expect + " records to be committed");
        final Map<String, TopicDescription> topics = admin.describeTopics(sources).allTopicNames().get(30, TimeUnit.SECONDS);
        final List<TopicPartition> tps = new ArrayList<>();
        for (final String t : sources) {
            topics.get(t).partitions().forEach(p -> tps.add(new TopicPartition(t, p.partition())));
        }
        long tProcessed = 0;
        long tCommitted = 0;
        long nextLog = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        boolean warnedMore = false;
        Map<TopicPartition, Long> ends = Map.of();
        Map<TopicPartition, Long> committed = Map.of();
        while (tCommitted == 0) {
            checkHealthy();
            final long now = System.nanoTime();
            if (now > deadline) {
                throw new IllegalStateException("timed out: committed " + summarize(committed, sources)
                    + " of end offsets " + summarize(ends, sources));
            }
            if (tProcessed == 0 && processedAll(external, sources, expect, cli.getLong("--expect-repartitioned", 0))) {
                tProcessed = now;
            }
            if (tProcessed != 0 && cli.has("--close-when-processed")) {
                tCommitted = tProcessed; // the clean close below commits
                break;
            }
            ends = endOffsets(admin, tps);
            committed = committedOffsets(admin, appId, tps, streamsProtocol);
            final long t = System.nanoTime();
            long inputEnd = 0;
            boolean all = true;
            for (final TopicPartition tp : tps) {
                final long end = ends.getOrDefault(tp, 0L);
                if (external.contains(tp.topic())) {
                    inputEnd += end;
                }
                if (committed.getOrDefault(tp, 0L) < end) {
                    all = false;
                }
            }
            if (inputEnd > expect && !warnedMore) {
                log("warning: input topic holds " + inputEnd + " offsets, more than --expect " + expect);
                warnedMore = true;
            }
            if (all && inputEnd >= expect) {
                tCommitted = t;
                if (tProcessed == 0) {
                    tProcessed = t; // everything committed is processed
                }
                break;
            }
            if (t > nextLog) {
                log("progress after " + Cli.secs(t - tRunning) + " s: committed " + summarize(committed, sources)
                    + " / end " + summarize(ends, sources));
                nextLog = t + TimeUnit.SECONDS.toNanos(5);
            }
            Thread.sleep(pollMs);
        }
        if (cli.has("--dump-metrics")) {
            dumpMetrics();
        }
        log("committed " + summarize(committed, sources) + " = end " + summarize(ends, sources)
            + " after " + Cli.secs(tCommitted - tRunning) + " s; closing");
        final int rebalances = rebalancesAfterRunning.get();
        closeStreams();
        if (!closeOk) {
            throw new IllegalStateException("KafkaStreams#close timed out");
        }
        final Throwable f = failure.get();
        if (f != null) {
            throw new IllegalStateException("Kafka Streams failed: " + Cli.describe(f), f);
        }
        final long seconds = tCommitted - tRunning;
        final long processed = tProcessed - tRunning;
        System.out.println("{\"records\":" + expect
            + ",\"seconds\":" + Cli.secs(seconds)
            + ",\"startup_seconds\":" + Cli.secs(tRunning - t0)
            + ",\"processed_seconds\":" + Cli.secs(processed)
            + ",\"close_seconds\":" + Cli.secs(closeNanos)
            + ",\"records_per_second\":" + Cli.rate(expect, seconds)
            + ",\"processed_records_per_second\":" + Cli.rate(expect, processed)
            + ",\"case\":" + Cli.jsonString(cli.get("--case"))
            + ",\"guarantee\":" + Cli.jsonString(cli.get("--guarantee"))
            + ",\"rebalances_after_running\":" + rebalances
            + ",\"committed_offsets\":" + offsetsJson(committed, sources)
            + "}");
        return 0;
    }

    private static Map<TopicPartition, Long> endOffsets(final Admin admin, final List<TopicPartition> tps) throws Exception {
        final Map<TopicPartition, OffsetSpec> req = new HashMap<>();
        tps.forEach(tp -> req.put(tp, OffsetSpec.latest()));
        final Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> res =
            admin.listOffsets(req).all().get(30, TimeUnit.SECONDS);
        final Map<TopicPartition, Long> out = new HashMap<>();
        res.forEach((tp, info) -> out.put(tp, info.offset()));
        return out;
    }

    private static Map<TopicPartition, Long> committedOffsets(final Admin admin, final String group,
                                                              final List<TopicPartition> tps,
                                                              final boolean streamsProtocol) throws Exception {
        final Map<TopicPartition, OffsetAndMetadata> res;
        if (streamsProtocol) {
            res = admin.listStreamsGroupOffsets(Map.of(group, new ListStreamsGroupOffsetsSpec().topicPartitions(tps)))
                .partitionsToOffsetAndMetadata(group).get(30, TimeUnit.SECONDS);
        } else {
            res = admin.listConsumerGroupOffsets(Map.of(group, new ListConsumerGroupOffsetsSpec().topicPartitions(tps)))
                .partitionsToOffsetAndMetadata(group).get(30, TimeUnit.SECONDS);
        }
        final Map<TopicPartition, Long> out = new HashMap<>();
        res.forEach((tp, om) -> {
            if (om != null) {
                out.put(tp, om.offset());
            }
        });
        return out;
    }

    private static String summarize(final Map<TopicPartition, Long> offsets, final List<String> topics) {
        final StringBuilder b = new StringBuilder("{");
        for (final String t : topics) {
            long sum = 0;
            for (final Map.Entry<TopicPartition, Long> e : offsets.entrySet()) {
                if (e.getKey().topic().equals(t)) {
                    sum += e.getValue();
                }
            }
            if (b.length() > 1) {
                b.append(", ");
            }
            b.append(t).append('=').append(sum);
        }
        return b.append('}').toString();
    }

    private static String offsetsJson(final Map<TopicPartition, Long> offsets, final List<String> topics) {
        final StringBuilder b = new StringBuilder("{");
        for (final String t : topics) {
            long sum = 0;
            for (final Map.Entry<TopicPartition, Long> e : offsets.entrySet()) {
                if (e.getKey().topic().equals(t)) {
                    sum += e.getValue();
                }
            }
            if (b.length() > 1) {
                b.append(',');
            }
            b.append(Cli.jsonString(t)).append(':').append(sum);
        }
        return b.append('}').toString();
    }

    // ------------------------------------------------------------------------------ metrics

    private double metricSum(final String group, final String name, final String tag, final String tagValue) {
        double sum = 0;
        for (final Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            final MetricName m = e.getKey();
            if (!m.group().equals(group) || !m.name().equals(name)) {
                continue;
            }
            if (tag != null) {
                final String v = m.tags().get(tag);
                // Older clients replace '.' with '_' in topic tags.
                if (v == null || !(v.equals(tagValue) || v.equals(tagValue.replace('.', '_')))) {
                    continue;
                }
            }
            final Object value = e.getValue().metricValue();
            if (value instanceof Number) {
                sum += ((Number) value).doubleValue();
            }
        }
        return sum;
    }

    /**
     * Everything consumed and processed (not yet necessarily committed), from the client metrics:
     * the main consumer fetched all `expect` input records, every record the app wrote to a
     * repartition topic was fetched back, and the stream thread processed as many records as were
     * fetched from the source topics.
     */
    private boolean processedAll(final Set<String> external, final List<String> sources, final long expect,
                                 final long expectRepartitioned) {
        double consumed = 0;
        double consumedExternal = 0;
        for (final String t : sources) {
            final double c = metricSum("consumer-fetch-manager-metrics", "records-consumed-total", "topic", t);
            if (external.contains(t)) {
                consumedExternal += c;
            } else if (c < expectRepartitioned
                || c < metricSum("producer-topic-metrics", "record-send-total", "topic", t)) {
                // record-send-total counts batches the producer sent, not records still lingering
                // in one: without the expected count the app could close before reading them.
                return false;
            }
            consumed += c;
        }
        if (consumedExternal < expect) {
            return false;
        }
        final double processed = metricSum("stream-thread-metrics", "process-total", null, null);
        return processed >= consumed && consumed > 0;
    }

    private void dumpMetrics() {
        final List<String> lines = new ArrayList<>();
        for (final Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            final Object v = e.getValue().metricValue();
            if (v instanceof Number && ((Number) v).doubleValue() != 0) {
                lines.add(e.getKey().group() + " " + e.getKey().name() + " " + e.getKey().tags() + " = " + v);
            }
        }
        lines.sort(null);
        lines.forEach(l -> log("metric " + l));
    }

    // ------------------------------------------------------------------------------ --restore-only

    private int finishRestore(final long t0, final long tRunning) {
        final int rebalances = rebalancesAfterRunning.get();
        // JVM (process) start to RUNNING, for comparing with engines timed from process start.
        final double processToRunning = (java.lang.management.ManagementFactory.getRuntimeMXBean().getUptime()
            - (System.nanoTime() - tRunning) / 1e6) / 1000.0;
        final Restores.Snapshot r = restores.snapshot();
        log("RUNNING after " + Cli.secs(tRunning - t0) + " s; restored " + r.records + " records into "
            + r.partitions + " store partitions of " + r.stores);
        closeStreams();
        if (!closeOk) {
            throw new IllegalStateException("KafkaStreams#close timed out");
        }
        final Throwable f = failure.get();
        if (f != null) {
            throw new IllegalStateException("Kafka Streams failed: " + Cli.describe(f), f);
        }
        final StringBuilder stores = new StringBuilder("[");
        for (final String s : r.stores) {
            if (stores.length() > 1) {
                stores.append(',');
            }
            stores.append(Cli.jsonString(s));
        }
        stores.append(']');
        System.out.println("{\"restored_records\":" + r.records
            + ",\"restore_seconds\":" + Cli.secs(r.lastEnd - r.firstStart)
            + ",\"to_running_seconds\":" + Cli.secs(tRunning - t0)
            + ",\"process_to_running_seconds\":" + String.format(java.util.Locale.ROOT, "%.3f", processToRunning)
            + ",\"restored_records_per_second\":" + Cli.rate(r.records, r.lastEnd - r.firstStart)
            + ",\"restored_partitions\":" + r.partitions
            + ",\"stores\":" + stores
            + ",\"case\":" + Cli.jsonString(cli.get("--case"))
            + ",\"guarantee\":" + Cli.jsonString(cli.get("--guarantee"))
            + ",\"rebalances_after_running\":" + rebalances
            + ",\"close_seconds\":" + Cli.secs(closeNanos)
            + "}");
        return 0;
    }

    /** Sums restored records and times first onRestoreStart to last onRestoreEnd/onRestoreSuspended. */
    static final class Restores implements StateRestoreListener {
        private long firstStart;
        private long lastEnd;
        private long records;
        private final Set<String> stores = new TreeSet<>();
        private final Set<TopicPartition> partitions = new LinkedHashSet<>();

        @Override
        public synchronized void onRestoreStart(final TopicPartition tp, final String store, final long start, final long end) {
            final long now = System.nanoTime();
            if (firstStart == 0) {
                firstStart = now;
            }
            stores.add(store);
            partitions.add(tp);
            log("restoring " + store + " from " + tp + " offsets " + start + ".." + end);
        }

        @Override
        public void onBatchRestored(final TopicPartition tp, final String store, final long batchEnd, final long n) {
        }

        @Override
        public synchronized void onRestoreEnd(final TopicPartition tp, final String store, final long total) {
            records += total;
            lastEnd = System.nanoTime();
        }

        @Override
        public synchronized void onRestoreSuspended(final TopicPartition tp, final String store, final long total) {
            records += total;
            lastEnd = System.nanoTime();
        }

        static final class Snapshot {
            long firstStart;
            long lastEnd;
            long records;
            int partitions;
            List<String> stores;
        }

        synchronized Snapshot snapshot() {
            final Snapshot s = new Snapshot();
            s.firstStart = firstStart;
            s.lastEnd = Math.max(lastEnd, firstStart);
            s.records = records;
            s.partitions = partitions.size();
            s.stores = new ArrayList<>(stores);
            return s;
        }
    }
}

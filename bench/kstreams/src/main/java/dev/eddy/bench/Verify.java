package dev.eddy.bench;

import java.io.PrintWriter;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.BiConsumer;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Correctness oracle: recomputes the expected final table of a case from the input topic and
 * compares it with the last value per key in an output topic (written by the reference app or by
 * eddy). Both topics are read with isolation.level=read_committed up to their end (LSO) offsets
 * taken at start, with manual assignment (no consumer group, nothing committed).
 */
public final class Verify {
    static final String PROG = "verify";
    static final String USAGE = String.join("\n",
        "usage: java -cp refapp.jar dev.eddy.bench.Verify --bootstrap HOST:PORT --case count|sum",
        "         --input TOPIC --output TOPIC [--dump FILE] [--timeout-s S (120)]",
        "  count: expected[key] = number of input records with that key and a non-null value;",
        "         output value must be an 8-byte big-endian long",
        "  sum:   expected[user] = sum of amount over input values with status 200 (Payment rules);",
        "         output value must be the UTF-8 decimal text of a long",
        "  Exit 0 iff the output's last value per key equals expected for every key, and it has",
        "  no other keys. Prints one JSON line; lists up to 10 differences on stderr.",
        "  --dump FILE writes the output's final table, sorted, as KEY<TAB>VALUE lines.");

    private static final Set<String> VALUED = Set.of("--bootstrap", "--case", "--input", "--output", "--dump", "--timeout-s");
    private static final Set<String> SWITCHES = Set.of("--help");

    public static void main(final String[] args) {
        Cli.main(PROG, USAGE, () -> run(new Cli(PROG, args, VALUED, SWITCHES)));
    }

    private static int run(final Cli cli) throws Exception {
        if (cli.has("--help")) {
            System.out.println(USAGE);
            return 0;
        }
        final String bootstrap = cli.required("--bootstrap");
        final String caseName = cli.required("--case");
        final String input = cli.required("--input");
        final String output = cli.required("--output");
        final long timeoutMs = cli.getLong("--timeout-s", 120) * 1000;
        if (!caseName.equals("count") && !caseName.equals("sum")) {
            throw new Cli.UsageException("--case must be count or sum");
        }

        final Map<String, Long> expected = new HashMap<>();
        final long[] inputRecords = {0};
        readAll(bootstrap, input, timeoutMs, (k, v) -> {
            inputRecords[0]++;
            if (caseName.equals("count")) {
                // groupByKey().count() (KStreamAggregate) skips records with a null key or value.
                if (k != null && v != null) {
                    expected.merge(new String(k, StandardCharsets.UTF_8), 1L, Long::sum);
                }
            } else {
                // The input key plays no part: the filter reads the value, groupBy re-keys by user.
                final Payment p = Payment.parse(v == null ? null : new String(v, StandardCharsets.UTF_8));
                if (p.counts) {
                    expected.merge(p.user, p.amount, Long::sum);
                }
            }
        });

        final Map<String, Long> actual = new TreeMap<>();
        final List<String> bad = new ArrayList<>();
        final long[] outputRecords = {0};
        readAll(bootstrap, output, timeoutMs, (k, v) -> {
            outputRecords[0]++;
            final String key = k == null ? null : new String(k, StandardCharsets.UTF_8);
            if (key == null) {
                bad.add("null key in output");
                return;
            }
            if (v == null) {
                actual.remove(key); // a tombstone deletes the row
                return;
            }
            if (caseName.equals("count")) {
                if (v.length != 8) {
                    bad.add("key " + key + ": value is " + v.length + " bytes, not an 8-byte long");
                    return;
                }
                actual.put(key, ByteBuffer.wrap(v).getLong());
            } else {
                final String s = new String(v, StandardCharsets.UTF_8);
                try {
                    actual.put(key, Long.parseLong(s));
                } catch (final NumberFormatException e) {
                    bad.add("key " + key + ": value '" + s + "' is not a decimal long");
                }
            }
        });

        if (cli.get("--dump") != null) {
            try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(Path.of(cli.get("--dump")), StandardCharsets.UTF_8))) {
                actual.forEach((k, v) -> w.print(k + "\t" + v + "\n"));
            }
        }

        long missing = 0;
        long wrong = 0;
        long unexpected = 0;
        final List<String> diffs = new ArrayList<>(bad);
        for (final Map.Entry<String, Long> e : new TreeMap<>(expected).entrySet()) {
            final Long a = actual.get(e.getKey());
            if (a == null) {
                missing++;
                diffs.add("key " + e.getKey() + ": missing, expected " + e.getValue());
            } else if (!a.equals(e.getValue())) {
                wrong++;
                diffs.add("key " + e.getKey() + ": got " + a + ", expected " + e.getValue());
            }
        }
        for (final Map.Entry<String, Long> e : actual.entrySet()) {
            if (!expected.containsKey(e.getKey())) {
                unexpected++;
                diffs.add("key " + e.getKey() + ": unexpected, got " + e.getValue());
            }
        }
        diffs.stream().limit(10).forEach(d -> Cli.log(PROG, d));
        long expectedTotal = 0;
        for (final long v : expected.values()) {
            expectedTotal += v;
        }
        long actualTotal = 0;
        for (final long v : actual.values()) {
            actualTotal += v;
        }
        final boolean ok = diffs.isEmpty();
        System.out.println("{\"ok\":" + ok
            + ",\"case\":" + Cli.jsonString(caseName)
            + ",\"input_records\":" + inputRecords[0]
            + ",\"output_records\":" + outputRecords[0]
            + ",\"expected_keys\":" + expected.size()
            + ",\"output_keys\":" + actual.size()
            + ",\"expected_total\":" + expectedTotal
            + ",\"output_total\":" + actualTotal
            + ",\"missing\":" + missing
            + ",\"wrong\":" + wrong
            + ",\"unexpected\":" + unexpected
            + ",\"malformed\":" + bad.size()
            + "}");
        return ok ? 0 : 1;
    }

    /** Reads every committed record of a topic up to its current end offsets, in partition order. */
    private static void readAll(final String bootstrap, final String topic, final long timeoutMs,
                                final BiConsumer<byte[], byte[]> sink) {
        final Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 5000);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "eddy-bench-verify");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            final List<PartitionInfo> infos = c.partitionsFor(topic, Duration.ofMillis(timeoutMs));
            if (infos == null || infos.isEmpty()) {
                throw new IllegalStateException("topic " + topic + " does not exist");
            }
            final List<TopicPartition> tps = new ArrayList<>();
            infos.forEach(i -> tps.add(new TopicPartition(topic, i.partition())));
            c.assign(tps);
            c.seekToBeginning(tps);
            final Map<TopicPartition, Long> end = new HashMap<>(c.endOffsets(tps, Duration.ofMillis(timeoutMs)));
            final long deadline = System.currentTimeMillis() + timeoutMs;
            while (true) {
                end.entrySet().removeIf(e -> c.position(e.getKey()) >= e.getValue());
                if (end.isEmpty()) {
                    return;
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("timed out reading " + topic + "; still behind on " + end.keySet());
                }
                for (final ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    // Only up to the end snapshot, so that the read is well defined if the topic grows.
                    final Long e = end.get(new TopicPartition(r.topic(), r.partition()));
                    if (e != null && r.offset() < e) {
                        sink.accept(r.key(), r.value());
                    }
                }
            }
        }
    }
}

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
        "  Prints one JSON line: counts and the totals the sum case must reach.");

    private static final Set<String> VALUED = Set.of("--bootstrap", "--topic", "--records", "--keys", "--users",
        "--partitions", "--seed", "--value-bytes", "--replication-factor");
    private static final Set<String> SWITCHES = Set.of("--no-create", "--help");

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

    private static int run(final Cli cli) throws Exception {
        if (cli.has("--help")) {
            System.out.println(USAGE);
            return 0;
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

        final Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            if (!cli.has("--no-create")) {
                try {
                    admin.createTopics(List.of(new NewTopic(topic, partitions, rf))).all().get(60, TimeUnit.SECONDS);
                    Cli.log(PROG, "created topic " + topic + " with " + partitions + " partitions");
                } catch (final ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                }
            }
            final Map<String, TopicDescription> d = admin.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS);
            final int actual = d.get(topic).partitions().size();
            if (actual != partitions) {
                throw new IllegalStateException("topic " + topic + " has " + actual + " partitions, not --partitions " + partitions);
            }
        }

        final Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        pp.put(ProducerConfig.LINGER_MS_CONFIG, 10);
        pp.put(ProducerConfig.BATCH_SIZE_CONFIG, 128 * 1024);
        pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
        pp.put(ProducerConfig.CLIENT_ID_CONFIG, "eddy-bench-generate");
        final AtomicReference<Exception> error = new AtomicReference<>();
        final Gen gen = new Gen(seed, keys, users, valueBytes);
        final Rec r = new Rec();
        long ok = 0;
        long amountOk = 0;
        long bytes = 0;
        final long t0 = System.nanoTime();
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(pp, new StringSerializer(), new StringSerializer())) {
            for (long i = 0; i < records && error.get() == null; i++) {
                gen.next(r);
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
            + ",\"seconds\":" + Cli.secs(nanos)
            + ",\"records_per_second\":" + Cli.rate(records, nanos)
            + "}");
        return 0;
    }
}

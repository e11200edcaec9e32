package dev.eddy.bench;

import java.nio.charset.StandardCharsets;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.processor.TimestampExtractor;

/**
 * One input record of the windowed cases: a JSON object with the event time {@code ts}
 * (milliseconds since the epoch, an integral JSON number) and an integral {@code amount}; other
 * fields are ignored. The value serde parses each record once (the timestamp extractor and the
 * aggregators then read the parsed object); a value that is not such an object fails the app
 * (Kafka Streams' default deserialization handler), as the generator never writes one.
 */
final class Event {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    final long ts;
    final long amount;
    final String json;

    private Event(final long ts, final long amount, final String json) {
        this.ts = ts;
        this.amount = amount;
        this.json = json;
    }

    static Event parse(final String json) {
        final JsonNode n;
        try {
            n = MAPPER.readTree(json);
        } catch (final Exception e) {
            throw new SerializationException("windowed input value is not JSON: " + json, e);
        }
        final JsonNode ts = n == null ? null : n.get("ts");
        final JsonNode amount = n == null ? null : n.get("amount");
        if (ts == null || !ts.isIntegralNumber() || !ts.canConvertToLong()
            || amount == null || !amount.isIntegralNumber() || !amount.canConvertToLong()) {
            throw new SerializationException("windowed input value lacks an integral ts or amount: " + json);
        }
        return new Event(ts.longValue(), amount.longValue(), json);
    }

    static final Serde<Event> SERDE = Serdes.serdeFrom(
        (Serializer<Event>) (topic, e) -> e == null ? null : e.json.getBytes(StandardCharsets.UTF_8),
        (Deserializer<Event>) (topic, b) -> b == null ? null : parse(new String(b, StandardCharsets.UTF_8)));

    /** Event time from the value ({@code ts}); a record without a value keeps its own timestamp. */
    static final class Time implements TimestampExtractor {
        @Override
        public long extract(final ConsumerRecord<Object, Object> record, final long partitionTime) {
            final Object v = record.value();
            return v instanceof Event ? ((Event) v).ts : record.timestamp();
        }
    }
}

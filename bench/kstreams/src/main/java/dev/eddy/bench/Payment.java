package dev.eddy.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The fields the `sum` case reads from an input value, and the exact rule for which values count.
 *
 * <p>A value takes part in the sum iff it is a JSON object whose {@code status} is an integral JSON
 * number equal to 200, whose {@code user} is a JSON string and whose {@code amount} is an integral
 * JSON number (fitting a signed 64-bit long). Everything else (null, not JSON, other status,
 * missing or mistyped fields) is dropped by the filter. Extra fields are ignored.
 */
final class Payment {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    final String user;
    final long amount;
    final boolean counts;

    private Payment(final String user, final long amount, final boolean counts) {
        this.user = user;
        this.amount = amount;
        this.counts = counts;
    }

    private static final Payment DROPPED = new Payment(null, 0, false);

    static Payment parse(final String value) {
        if (value == null) {
            return DROPPED;
        }
        final JsonNode n;
        try {
            n = MAPPER.readTree(value);
        } catch (final Exception e) {
            return DROPPED;
        }
        if (n == null || !n.isObject()) {
            return DROPPED;
        }
        final JsonNode status = n.get("status");
        final JsonNode user = n.get("user");
        final JsonNode amount = n.get("amount");
        if (status == null || !status.isIntegralNumber() || !status.canConvertToLong() || status.longValue() != 200) {
            return DROPPED;
        }
        if (user == null || !user.isTextual()) {
            return DROPPED;
        }
        if (amount == null || !amount.isIntegralNumber() || !amount.canConvertToLong()) {
            return DROPPED;
        }
        return new Payment(user.textValue(), amount.longValue(), true);
    }

    // The filter and the groupBy key selector of sub-topology 0 run back to back on the same value
    // object in the same stream thread: remember the last parse so each record is parsed once there.
    private static final ThreadLocal<Object[]> LAST = ThreadLocal.withInitial(() -> new Object[2]);

    static Payment parseCached(final String value) {
        final Object[] last = LAST.get();
        if (value != null && last[0] == value) {
            return (Payment) last[1];
        }
        final Payment p = parse(value);
        last[0] = value;
        last[1] = p;
        return p;
    }
}

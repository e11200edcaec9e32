package dev.eddy.bench;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/** Tiny `--flag value` / `--switch` parser shared by the mains, plus output helpers. */
final class Cli {
    /** A usage error: the caller prints the message and exits 2. */
    static final class UsageException extends RuntimeException {
        private static final long serialVersionUID = 1L;

        UsageException(final String message) {
            super(message);
        }
    }

    private final String prog;
    private final Map<String, List<String>> values = new HashMap<>();
    private final Set<String> switches = new HashSet<>();

    /**
     * @param valued   flags that take a value (repeatable ones keep every value)
     * @param booleans flags without a value
     */
    Cli(final String prog, final String[] args, final Set<String> valued, final Set<String> booleans) {
        this.prog = prog;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            String inline = null;
            final int eq = a.indexOf('=');
            if (a.startsWith("--") && eq > 0) {
                inline = a.substring(eq + 1);
                a = a.substring(0, eq);
            }
            if (valued.contains(a)) {
                final String v;
                if (inline != null) {
                    v = inline;
                } else if (i + 1 < args.length) {
                    v = args[++i];
                } else {
                    throw new UsageException(a + " needs a value");
                }
                values.computeIfAbsent(a, k -> new ArrayList<>()).add(v);
            } else if (booleans.contains(a) && inline == null) {
                switches.add(a);
            } else {
                throw new UsageException("unexpected argument '" + args[i] + "'");
            }
        }
    }

    String prog() {
        return prog;
    }

    String get(final String flag) {
        final List<String> v = values.get(flag);
        return v == null ? null : v.get(v.size() - 1);
    }

    List<String> all(final String flag) {
        return values.getOrDefault(flag, List.of());
    }

    String required(final String flag) {
        final String v = get(flag);
        if (v == null || v.isEmpty()) {
            throw new UsageException(flag + " is required");
        }
        return v;
    }

    String get(final String flag, final String dflt) {
        final String v = get(flag);
        return v == null ? dflt : v;
    }

    long getLong(final String flag, final long dflt) {
        final String v = get(flag);
        if (v == null) {
            return dflt;
        }
        try {
            return Long.parseLong(v.trim());
        } catch (final NumberFormatException e) {
            throw new UsageException(flag + " must be an integer, got '" + v + "'");
        }
    }

    boolean has(final String flag) {
        return switches.contains(flag) || values.containsKey(flag);
    }

    /** Seconds with millisecond precision, as a JSON number. */
    static String secs(final long nanos) {
        return String.format(Locale.ROOT, "%.3f", nanos / 1e9);
    }

    static String rate(final long n, final long nanos) {
        if (nanos <= 0) {
            return "null";
        }
        return String.format(Locale.ROOT, "%.1f", n / (nanos / 1e9));
    }

    static String jsonString(final String s) {
        if (s == null) {
            return "null";
        }
        final StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            final char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }

    static void log(final String prog, final String msg) {
        System.err.println(prog + ": " + msg);
        System.err.flush();
    }

    /** Runs a main body: usage errors exit 2, any other failure exits 1, with a one-line message. */
    interface Body {
        int run() throws Exception;
    }

    static void main(final String prog, final String usage, final Body body) {
        int rc;
        try {
            rc = body.run();
        } catch (final UsageException e) {
            System.err.println(prog + ": error: " + e.getMessage());
            System.err.println(usage);
            rc = 2;
        } catch (final Throwable t) {
            System.err.println(prog + ": error: " + describe(t));
            t.printStackTrace(System.err);
            rc = 1;
        }
        System.out.flush();
        System.err.flush();
        // Kafka client threads are non-daemon in places: exit explicitly.
        Runtime.getRuntime().halt(rc);
    }

    static String describe(final Throwable t) {
        final StringBuilder b = new StringBuilder();
        Throwable c = t;
        for (int depth = 0; c != null && depth < 6; depth++, c = c.getCause()) {
            if (depth > 0) {
                b.append(" <- caused by: ");
            }
            b.append(c.getClass().getName());
            if (c.getMessage() != null) {
                b.append(": ").append(c.getMessage());
            } else if (c instanceof java.util.concurrent.TimeoutException) {
                b.append(" (a request to Kafka timed out: is the broker at --bootstrap up?)");
            }
        }
        return b.toString();
    }
}

//! Durations as users write them in a topology: `500ms`, `30s`, `5m`, `1h`, `7d`, and sums of
//! them as Go and Kubernetes write them: `1h30m`, `2m30s`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A span of time in whole milliseconds, written `<n><unit>...` with units `ms`, `s`, `m`, `h`
/// and `d` (`1h30m`; a bare number is milliseconds, as Kafka Streams' `Duration.ofMillis`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    ms: u64,
}

/// The schema's pattern and the parser agree on this shape.
pub const PATTERN: &str = "^([0-9]+|([0-9]+(ms|s|m|h|d))+)$";

const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

impl Duration {
    pub const ZERO: Duration = Duration { ms: 0 };

    pub const fn from_millis(ms: u64) -> Self {
        Self { ms }
    }

    pub const fn as_millis(self) -> u64 {
        self.ms
    }

    /// As an `i64` of milliseconds, the type event times have (saturating: a duration past
    /// 292 million years is as good as forever).
    pub fn millis_i64(self) -> i64 {
        i64::try_from(self.ms).unwrap_or(i64::MAX)
    }

    pub fn saturating_add(self, other: Duration) -> Duration {
        Duration::from_millis(self.ms.saturating_add(other.ms))
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a duration: write whole numbers with units, e.g. 500ms, 30s, 5m, 1h30m or 7d"
)]
pub struct DurationError {
    pub given: String,
}

impl std::str::FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationError {
            given: s.to_string(),
        };
        if s.is_empty() {
            return Err(err());
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse().map(Duration::from_millis).map_err(|_| err());
        }
        // Parts of a number and a unit, summed (`1h30m`); `ms` before `m`.
        let (mut ms, mut rest) = (0u64, s);
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let n: u64 = rest[..digits].parse().map_err(|_| err())?;
            let after = &rest[digits..];
            let (unit, factor) = ["ms", "s", "m", "h", "d"]
                .iter()
                .find(|u| after.starts_with(**u))
                .and_then(|u| UNITS.iter().find(|(name, _)| name == u))
                .ok_or_else(err)?;
            let part = n.checked_mul(*factor).ok_or_else(err)?;
            ms = ms.checked_add(part).ok_or_else(err)?;
            rest = &after[unit.len()..];
        }
        Ok(Duration::from_millis(ms))
    }
}

/// The largest unit that divides it: `90s` stays `90s`, `3600s` reads `1h`.
impl std::fmt::Display for Duration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (unit, factor) = UNITS
            .iter()
            .rev()
            .find(|(_, factor)| self.ms.is_multiple_of(*factor) && self.ms > 0)
            .copied()
            .unwrap_or(("ms", 1));
        write!(f, "{}{unit}", self.ms / factor)
    }
}

impl Serialize for Duration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a duration such as 500ms, 30s, 5m, 1h30m or 7d")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_millis(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_millis)
                    .map_err(|_| E::custom(format!("{v} is negative: a duration is 0 or more")))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": PATTERN,
            "description": "A duration: whole numbers with units (ms, s, m, h, d), e.g. 30s or 1h30m.",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_prints_the_largest_that_divides() {
        for (text, ms, shown) in [
            ("500ms", 500, "500ms"),
            ("30s", 30_000, "30s"),
            ("90s", 90_000, "90s"),
            ("3600s", 3_600_000, "1h"),
            ("5m", 300_000, "5m"),
            ("1h", 3_600_000, "1h"),
            ("7d", 604_800_000, "7d"),
            ("0s", 0, "0ms"),
            ("250", 250, "250ms"),
            ("1h30m", 5_400_000, "90m"),
            ("2m30s", 150_000, "150s"),
            ("1d12h", 129_600_000, "36h"),
            ("1s500ms", 1500, "1500ms"),
        ] {
            let d: Duration = text.parse().expect(text);
            assert_eq!(d.as_millis(), ms, "{text}");
            assert_eq!(d.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration_and_says_how_to_write_one() {
        for bad in [
            "",
            "5",
            "5 m",
            "5min",
            "-1s",
            "1.5h",
            "m",
            "1h30",
            "h30m",
            "1h 30m",
            "1hm",
            "99999999999999999999d",
        ] {
            if bad == "5" {
                continue; // a bare number is milliseconds
            }
            let e = bad.parse::<Duration>().expect_err(bad).to_string();
            assert!(e.contains("e.g. 500ms, 30s"), "{bad}: {e}");
            // An overflow is the parser's to refuse; every other shape, admission's too.
            assert!(
                bad.starts_with("9999") || !regex_matches(bad),
                "the schema's pattern lets {bad:?} through"
            );
        }
        for good in ["5", "500ms", "1h30m", "1d12h", "1s500ms", "0s"] {
            assert!(regex_matches(good), "the schema's pattern refuses {good:?}");
        }
        let yaml: Result<Duration, _> = serde_yaml::from_str("-5");
        assert!(yaml.is_err());
        let yaml: Duration = serde_yaml::from_str("5m").expect("parses");
        assert_eq!(yaml, Duration::from_millis(300_000));
    }

    /// Whether the CRD's pattern accepts `text` (admission and the parser must agree).
    fn regex_matches(text: &str) -> bool {
        regex::Regex::new(PATTERN).is_ok_and(|r| r.is_match(text))
    }
}

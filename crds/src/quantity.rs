//! Quantities of bytes as Kubernetes writes them: `memory.budget: 1.5Gi`, `512Mi`, `1e9`,
//! `1073741824`. The same grammar and rounding as the API server's `resource.Quantity`
//! (a fraction of a byte rounds up), less what means nothing for bytes: no sign, no
//! milli-bytes. The CRD's schema carries the same pattern, so admission refuses what the
//! parser would.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What admission accepts as a string (an integer is accepted as it is).
pub const PATTERN: &str =
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[kMGTPE]|([eE][+]?[0-9]+))?$";

/// A quantity of bytes, kept as written (an integer is kept as its decimal digits).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(String);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "{0:?} is not a quantity of bytes: write a number and an optional suffix, e.g. 512Mi, 1.5Gi, 2Ti or 500M"
    )]
    Syntax(String),
    #[error("{0:?} is more bytes than this machine can address")]
    TooLarge(String),
}

impl Quantity {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bytes it stands for, rounded up to a whole byte as Kubernetes does.
    pub fn bytes(&self) -> Result<u64, QuantityError> {
        bytes(&self.0)
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a quantity of bytes such as 512Mi, 1.5Gi or 1073741824")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                u64::try_from(v)
                    .map(|v| Quantity(v.to_string()))
                    .map_err(|_| {
                        E::custom(format!("{v} is negative: a quantity of bytes is 0 or more"))
                    })
            }
            // YAML reads an unquoted `1e9` as a float.
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19 {
                    Ok(Quantity(format!("{v:.0}")))
                } else {
                    Err(E::custom(format!(
                        "{v} is not a whole number of bytes: write e.g. 512Mi or 1.5Gi (quoted)"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// An integer or a string of [`PATTERN`] (a pattern applies to strings only). No
    /// `anyOf` of the two types: kube's structural rewrite drops types inside one.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "pattern": PATTERN,
            "x-kubernetes-int-or-string": true,
        })
    }
}

/// Parse `text` as a quantity of bytes (see the module's doc).
pub fn bytes(text: &str) -> Result<u64, QuantityError> {
    let syntax = || QuantityError::Syntax(text.to_string());
    let too_large = || QuantityError::TooLarge(text.to_string());
    let t = text;
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(syntax());
    }
    // The value is mantissa * base^exponent / 10^fraction.len(), computed exactly in u128.
    let (base, exponent): (u128, u32) = match suffix {
        "" => (10, 0),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        s if s.starts_with(['e', 'E']) => {
            let digits = s[1..].strip_prefix('+').unwrap_or(&s[1..]);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            (10, digits.parse().map_err(|_| too_large())?)
        }
        _ => return Err(syntax()),
    };
    if fraction.len() > 30 || whole.len() > 30 {
        return Err(too_large());
    }
    let mantissa: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| too_large())?;
    let scale = base.checked_pow(exponent).ok_or_else(too_large)?;
    let numerator = mantissa.checked_mul(scale).ok_or_else(too_large)?;
    let denominator = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| too_large())?);
    let value = numerator.div_ceil(denominator);
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_quantities_of_bytes() {
        for (text, want) in [
            ("0", 0),
            ("1048576", 1 << 20),
            ("256Mi", 256 << 20),
            ("1.5Gi", 3 << 29),
            ("2Ti", 2 << 40),
            ("500M", 500_000_000),
            ("1e9", 1_000_000_000),
            ("1E+3", 1000),
            (".5Ki", 512),
            ("1.", 1),
            // A fraction of a byte rounds up, as the API server does.
            ("1.0001k", 1001),
            ("0.1", 1),
        ] {
            assert_eq!(bytes(text), Ok(want), "{text}");
        }
        for bad in [
            "", ".", "1.5.5Gi", "-1Gi", "1500m", "1 Gi", "1GB", "Gi", "1e", "1e-3", "1.5gi",
        ] {
            assert_eq!(
                bytes(bad),
                Err(QuantityError::Syntax(bad.into())),
                "{bad:?}"
            );
        }
        assert!(matches!(bytes("16Ei"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(bytes("1e40"), Err(QuantityError::TooLarge(_))));
        assert_eq!(bytes(" 1Gi"), Err(QuantityError::Syntax(" 1Gi".into())));
        // Unquoted in YAML: an integer, a float, a negative number.
        let q = |y: &str| serde_yaml::from_str::<Quantity>(y).map(|q| q.bytes());
        assert_eq!(q("1073741824").ok(), Some(Ok(1 << 30)));
        assert_eq!(q("1e9").ok(), Some(Ok(1_000_000_000)));
        assert!(q("-1").is_err() && q("1.5").is_err());
    }

    /// Admission (the CRD's pattern) and the parser agree on every shape.
    #[test]
    fn the_pattern_and_the_parser_agree() {
        let re = regex::Regex::new(PATTERN).expect("the pattern compiles");
        for text in [
            "0", "256Mi", "1.5Gi", "2Ti", "500M", "1e9", "1E+3", ".5Ki", "1.", "0.1", "", ".",
            "-1Gi", "+1Gi", "1500m", "1 Gi", "1GB", "Gi", "1e", "1e-3", "1.5gi", "1.5.5Gi", "1Ki5",
        ] {
            assert_eq!(re.is_match(text), bytes(text).is_ok(), "{text:?}");
        }
    }
}

//! Records as they flow between processors. Keys and values stay in their wire bytes until
//! a step needs to look inside them, so `from → count → to` never decodes a value.

use crate::expr::Val;
use crate::format::{self, FormatError};
use eddy_crds::Format;
use std::borrow::Cow;
use std::cell::OnceCell;

/// The wall clock in the unit of record timestamps: milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A key or a value: raw bytes in a known format, or a value computed by a jq step.
#[derive(Clone, Debug)]
pub enum Data {
    /// Wire bytes; decoded at most once, when a step first looks inside (a `filter` then a
    /// `groupBy` on the same record share one JSON parse, and the bytes still pass through).
    Raw {
        bytes: Vec<u8>,
        format: Format,
        decoded: OnceCell<Val>,
    },
    Val(Val),
}

impl Data {
    pub fn raw(bytes: &[u8], format: Format) -> Self {
        Data::Raw {
            bytes: bytes.to_vec(),
            format,
            decoded: OnceCell::new(),
        }
    }

    /// The value as jq sees it.
    pub fn to_val(&self) -> Result<Val, FormatError> {
        match self {
            Data::Raw {
                bytes,
                format,
                decoded,
            } => {
                if let Some(v) = decoded.get() {
                    return Ok(v.clone());
                }
                let v = format::decode(*format, bytes)?;
                Ok(decoded.get_or_init(|| v).clone())
            }
            Data::Val(v) => Ok(v.clone()),
        }
    }

    /// The bytes in `target` format; raw bytes already in that format pass through untouched.
    pub fn to_bytes(&self, target: Format) -> Result<Cow<'_, [u8]>, FormatError> {
        match self {
            Data::Raw { bytes, format, .. } if *format == target => Ok(Cow::Borrowed(bytes)),
            Data::Raw { .. } => Ok(Cow::Owned(format::encode(target, &self.to_val()?)?)),
            Data::Val(v) => Ok(Cow::Owned(format::encode(target, v)?)),
        }
    }
}

/// One record: Kafka's null key and null value (tombstone) are `None`.
#[derive(Clone, Debug)]
pub struct Record {
    pub key: Option<Data>,
    pub value: Option<Data>,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// The window of a windowed aggregation's result: `key` is then the inner key.
    pub window: Option<crate::window::Window>,
}

impl Record {
    /// A record outside any window.
    pub fn new(key: Option<Data>, value: Option<Data>, timestamp: i64) -> Self {
        Self {
            key,
            value,
            timestamp,
            window: None,
        }
    }
}

/// Where an input record came from, for error messages and dead letters.
#[derive(Clone, Debug)]
pub struct Origin<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_json_is_decoded_once_and_still_passes_through() {
        let d = Data::raw(br#"{"a":1}"#, Format::Json);
        let first = d.to_val().expect("valid");
        assert_eq!(d.to_val().expect("cached"), first);
        assert!(matches!(&d, Data::Raw { decoded, .. } if decoded.get().is_some()));
        assert_eq!(
            d.to_bytes(Format::Json).expect("bytes").as_ref(),
            br#"{"a":1}"#
        );
        assert!(Data::raw(b"{oops", Format::Json).to_val().is_err());
    }
}

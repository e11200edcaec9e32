//! Records as they flow between processors. Keys and values stay in their wire bytes until
//! a step needs to look inside them, so `from → count → to` never decodes a value.

use crate::expr::Val;
use crate::format::{self, FormatError};
use eddy_crds::Format;
use std::borrow::Cow;

/// A key or a value: raw bytes in a known format, or a value computed by a jq step.
#[derive(Clone, Debug)]
pub enum Data {
    Raw { bytes: Vec<u8>, format: Format },
    Val(Val),
}

impl Data {
    pub fn raw(bytes: &[u8], format: Format) -> Self {
        Data::Raw {
            bytes: bytes.to_vec(),
            format,
        }
    }

    /// The value as jq sees it.
    pub fn to_val(&self) -> Result<Val, FormatError> {
        match self {
            Data::Raw { bytes, format } => format::decode(*format, bytes),
            Data::Val(v) => Ok(v.clone()),
        }
    }

    /// The bytes in `target` format; raw bytes already in that format pass through untouched.
    pub fn to_bytes(&self, target: Format) -> Result<Cow<'_, [u8]>, FormatError> {
        match self {
            Data::Raw { bytes, format } if *format == target => Ok(Cow::Borrowed(bytes)),
            Data::Raw { bytes, format } => Ok(Cow::Owned(format::encode(
                target,
                &format::decode(*format, bytes)?,
            )?)),
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

//! Reading one copy of a store: a snapshot of its task's database (or of the global tables'),
//! or an in-memory store under its lock, decoded into the store's formats. Every read is
//! bounded by a limit.

use super::{Kind, StoreInfo};
use crate::format;
use crate::store::{Entries, StoreError, View};
use crate::window::{self, KeySchema};
use eddy_crds::query::Entry;

/// Entries per page when a request says nothing, and at most.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Bytes in the store that its format cannot read: written by something else.
    #[error("store {store} holds a {what} that is not {format}: {reason}")]
    Corrupt {
        store: String,
        what: &'static str,
        format: &'static str,
        reason: String,
    },
}

/// What to read from one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// One key (a versioned store: its version valid at `as_of`, by default the newest).
    Get { key: Vec<u8>, as_of: Option<i64> },
    /// Keys from `from` (inclusive) to `to` (exclusive, none: the last), key order.
    Range {
        from: Vec<u8>,
        to: Option<Vec<u8>>,
        limit: usize,
    },
    /// One key's windows (sessions) whose time is in `[from, to]`, in time order.
    Windows {
        key: Vec<u8>,
        from: i64,
        to: i64,
        limit: usize,
    },
    /// Every key's windows whose time is in `[from, to]`, after the one that sorts at
    /// `after` (an entry's order).
    AllWindows {
        from: i64,
        to: i64,
        after: Option<Vec<u8>>,
        limit: usize,
    },
}

/// An entry and where it sorts among the store's (its stored bytes).
pub type Ordered = (Vec<u8>, Entry);

/// What one copy answered.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// A single key: its entry if the store has a value for it.
    One(Option<Entry>),
    Many(Vec<Ordered>),
}

/// Read `req` from `info`'s store in `snap`.
pub fn run(info: &StoreInfo, snap: &dyn View, req: &Request) -> Result<Read, ReadError> {
    let store = info.name.as_str();
    match req {
        Request::Get { key, as_of } => {
            if let Kind::Versioned { history } = info.kind {
                return versioned(info, snap, key, as_of.unwrap_or(i64::MAX), history)
                    .map(Read::One);
            }
            match snap.get(store, key)? {
                Some(v) => Ok(Read::One(Some(entry(info, key, &v, None)?))),
                None => Ok(Read::One(None)),
            }
        }
        Request::Range { from, to, limit } => {
            let rows = snap.range(store, from, to.as_deref(), *limit)?;
            many(info, rows, |k| Ok((k.to_vec(), None)))
        }
        Request::Windows {
            key,
            from,
            to,
            limit,
        } => {
            let rows = snap.windows(store, key, *from, *to, *limit)?;
            let schema = schema(info);
            many(info, rows, |k| {
                split(info, schema, k).map(|(_, w)| (k.to_vec(), Some(w)))
            })
        }
        Request::AllWindows {
            from,
            to,
            after,
            limit,
        } => {
            let rows = snap.all_windows(store, *from, *to, after.as_deref(), *limit)?;
            let schema = schema(info);
            many(info, rows, |k| {
                let (_, w) = split(info, schema, k)?;
                Ok((snap.window_order(store, k)?, Some(w)))
            })
        }
    }
}

fn schema(info: &StoreInfo) -> KeySchema {
    match info.kind {
        Kind::Window(s) => s,
        _ => KeySchema::Window { size: 0 },
    }
}

fn split<'k>(
    info: &StoreInfo,
    schema: KeySchema,
    k: &'k [u8],
) -> Result<(&'k [u8], window::Window), ReadError> {
    schema.split(k).ok_or_else(|| ReadError::Corrupt {
        store: info.name.clone(),
        what: "window key",
        format: "a key and its window",
        reason: format!("{} bytes", k.len()),
    })
}

/// Rows read by range into entries; `order` gives each stored key's sort position and window.
fn many(
    info: &StoreInfo,
    rows: Entries,
    order: impl Fn(&[u8]) -> Result<(Vec<u8>, Option<window::Window>), ReadError>,
) -> Result<Read, ReadError> {
    let schema = schema(info);
    rows.into_iter()
        .map(|(k, v)| {
            let (sorted, w) = order(&k)?;
            let inner = match w {
                Some(_) => split(info, schema, &k)?.0,
                None => &k[..],
            };
            Ok((sorted, entry(info, inner, &v, w)?))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Read::Many)
}

/// An entry from a key's and a value's stored bytes.
fn entry(
    info: &StoreInfo,
    key: &[u8],
    value: &[u8],
    w: Option<window::Window>,
) -> Result<Entry, ReadError> {
    let (timestamp, value) = match info.stamped {
        true => {
            let (ts, v) = window::split_timestamp(value).ok_or_else(|| ReadError::Corrupt {
                store: info.name.clone(),
                what: "value",
                format: "a timestamped value",
                reason: format!("{} bytes", value.len()),
            })?;
            (Some(ts), v)
        }
        false => (None, value),
    };
    Ok(Entry {
        key: json(info, "key", info.key_format, key)?,
        value: json(info, "value", info.value_format, value)?,
        start: w.map(|w| w.start),
        end: w.map(|w| w.end),
        timestamp,
        order: None,
    })
}

/// The version of `key` valid at `as_of`, as a versioned store's `get(key, asOf)`.
fn versioned(
    info: &StoreInfo,
    snap: &dyn View,
    key: &[u8],
    as_of: i64,
    history: i64,
) -> Result<Option<Entry>, ReadError> {
    let corrupt = |e: crate::processor::ProcessError| ReadError::Corrupt {
        store: info.name.clone(),
        what: "version",
        format: "a versioned store's entry",
        reason: e.to_string(),
    };
    let stream_time = crate::versioned::stream_time(
        snap.get(&info.name, crate::versioned::STREAM_TIME)?
            .as_deref(),
    )
    .map_err(corrupt)?;
    // Two reads of one entry each, however long the key's history: the last version at or
    // before `as_of`, and whether any came after it.
    let crate::versioned::VersionSplit { from, split, to } =
        crate::versioned::version_split(key, as_of).map_err(corrupt)?;
    let Some((k, v)) = snap.last_in(&info.name, &from, &split)? else {
        return Ok(None);
    };
    let found = crate::versioned::decode_version(&k, &v).map_err(corrupt)?;
    // Before the history retention only the newest version still answers (it never expires).
    let expired = as_of < stream_time.saturating_sub(history);
    if expired && !snap.range(&info.name, &split, Some(&to), 1)?.is_empty() {
        return Ok(None);
    }
    match found {
        (ts, Some(v)) => Ok(Some(Entry {
            key: json(info, "key", info.key_format, key)?,
            value: json(info, "value", info.value_format, &v)?,
            start: None,
            end: None,
            timestamp: Some(ts),
            order: None,
        })),
        _ => Ok(None),
    }
}

/// Stored bytes in `format` as JSON: a string's text, a number, a JSON document, bytes as an
/// array of numbers (as jq sees them).
pub fn json(
    info: &StoreInfo,
    what: &'static str,
    f: eddy_crds::Format,
    bytes: &[u8],
) -> Result<serde_json::Value, ReadError> {
    let corrupt = |reason: String| ReadError::Corrupt {
        store: info.name.clone(),
        what,
        format: super::format_name(f),
        reason,
    };
    if f == eddy_crds::Format::String {
        return std::str::from_utf8(bytes)
            .map(|s| serde_json::Value::String(s.to_string()))
            .map_err(|e| corrupt(e.to_string()));
    }
    let v = format::decode(f, bytes).map_err(|e| corrupt(e.to_string()))?;
    let text = format::encode(eddy_crds::Format::Json, &v).map_err(|e| corrupt(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))
}

/// The stored bytes of a key given as text: a `string` key is the text itself, an `i64` key
/// a decimal number, a `json` key its JSON text exactly (a store keyed as its source topic
/// keeps the producer's bytes; a `groupBy` writes compact JSON), or, for text that is not
/// JSON, that text as a JSON string (`u1` finds `"u1"`); a `bytes` key a JSON array of
/// numbers 0..255, or else the text's UTF-8 bytes.
pub fn key_bytes(f: eddy_crds::Format, text: &str) -> Result<Vec<u8>, String> {
    use eddy_crds::Format;
    match f {
        Format::String => Ok(text.as_bytes().to_vec()),
        Format::I64 => text
            .trim()
            .parse::<i64>()
            .map(|n| n.to_be_bytes().to_vec())
            .map_err(|_| format!("{text:?} is not an i64 (a decimal integer)")),
        Format::Json => match format::decode(Format::Json, text.as_bytes()) {
            Ok(_) => Ok(text.as_bytes().to_vec()),
            Err(_) => format::encode(
                Format::Json,
                &format::Val::utf8_str(text.as_bytes().to_vec()),
            )
            .map_err(|e| e.to_string()),
        },
        Format::Bytes => match format::decode(Format::Json, text.as_bytes()) {
            Ok(v @ format::Val::Arr(_)) => {
                format::encode(Format::Bytes, &v).map_err(|e| e.to_string())
            }
            _ => Ok(text.as_bytes().to_vec()),
        },
        Format::Windowed => {
            Err("a windowed key cannot be looked up; query the window store".into())
        }
    }
}

//! Versioned stores (Kafka Streams' `VersionedKeyValueStore`, KIP-889): each key's values with
//! the time each became valid, kept for a history retention, so that a lookup can ask for the
//! value as of a time.
//!
//! Layout in an ordered key-value store: one entry per version, keyed by the key's length (4
//! bytes, big-endian), the key and the version's time (8 bytes, sign bit flipped so that time
//! orders as bytes do); the value is a tag byte, then the value's bytes (tag 1) or nothing for
//! a tombstone (tag 0). The length prefix keeps one key's versions apart from longer keys that
//! start with it, so a key's history is one contiguous range. The store's observed stream time
//! is kept under the key `stream-time`, shorter than any version's key (12 bytes at least) and
//! outside every key's range (its first byte would be a key length of 1.9 GB), so it survives a
//! restore with the versions.

use crate::processor::{KeyValueStore, ProcessError};

/// Where the observed stream time is kept (not the empty key: a changelog record needs one).
const STREAM_TIME_KEY: &[u8] = b"stream-time";
const TOMBSTONE: u8 = 0;
const VALUE: u8 = 1;

/// What a put did (Kafka Streams' put return codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// Older than the history retention before the observed stream time: dropped.
    Expired,
    /// The key's newest version now.
    Latest,
    /// Inserted into the key's history (an out-of-order update).
    History,
}

/// A versioned store as a processor sees it, over a key-value store declared `ordered`.
pub struct VersionedStore<'a> {
    inner: KeyValueStore<'a>,
    history: i64,
}

/// A version: its time and its value (`None`: the key was deleted then).
pub(crate) type Version = (i64, Option<Vec<u8>>);

fn prefix(key: &[u8]) -> Result<Vec<u8>, ProcessError> {
    let len = u32::try_from(key.len())
        .map_err(|_| ProcessError::BadRecord(format!("a key of {} bytes", key.len())))?;
    let mut p = Vec::with_capacity(4 + key.len() + 8);
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(key);
    Ok(p)
}

fn time_bytes(ts: i64) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

impl<'a> VersionedStore<'a> {
    /// `history`: how far behind the observed stream time a lookup or a put may reach, ms.
    pub fn new(inner: KeyValueStore<'a>, history: i64) -> Self {
        Self { inner, history }
    }

    /// The largest time of a put so far (-1 before the first, as Kafka Streams).
    fn stream_time(&mut self) -> Result<i64, ProcessError> {
        stream_time(self.inner.get(STREAM_TIME_KEY)?.as_deref())
    }

    /// Every version of `key`, oldest first.
    fn versions(&mut self, key: &[u8]) -> Result<Vec<Version>, ProcessError> {
        let (from, to) = version_range(key)?;
        self.inner
            .range(&from, &to)?
            .into_iter()
            .map(|(k, v)| decode_version(&k, &v))
            .collect()
    }

    fn version_key(key: &[u8], ts: i64) -> Result<Vec<u8>, ProcessError> {
        let mut k = prefix(key)?;
        k.extend_from_slice(&time_bytes(ts));
        Ok(k)
    }

    /// `key`'s value as of `as_of` (Kafka Streams' `get(key, asOfTimestamp)`): the version valid
    /// then, `None` if it was deleted or not yet set. Before the history retention only the
    /// newest version still answers (it never expires).
    pub fn get_as_of(&mut self, key: &[u8], as_of: i64) -> Result<Option<Vec<u8>>, ProcessError> {
        let stream_time = self.stream_time()?;
        let versions = self.versions(key)?;
        Ok(as_of_version(versions, as_of, stream_time, self.history).and_then(|(_, v)| v))
    }

    /// Put `key`'s value (`None`: a delete) valid from `ts`, replacing a version of the same
    /// time. As Kafka Streams: a put older than the history retention before the observed
    /// stream time is dropped; an older one within it goes into the key's history. Versions
    /// no lookup can reach any more (valid until before the retention) are removed.
    pub fn put(&mut self, key: &[u8], value: Option<&[u8]>, ts: i64) -> Result<Put, ProcessError> {
        let stream_time = self.stream_time()?;
        if ts < stream_time.saturating_sub(self.history) {
            return Ok(Put::Expired);
        }
        if ts > stream_time {
            self.inner.put(STREAM_TIME_KEY, &ts.to_be_bytes(), ts);
        }
        let cutoff = stream_time.max(ts).saturating_sub(self.history);
        let versions = self.versions(key)?;
        let latest = versions.last().is_none_or(|(t, _)| ts >= *t);
        let mut stored = Vec::with_capacity(1 + value.map_or(0, <[u8]>::len));
        match value {
            Some(v) => {
                stored.push(VALUE);
                stored.extend_from_slice(v);
            }
            None => stored.push(TOMBSTONE),
        }
        self.inner.put(&Self::version_key(key, ts)?, &stored, ts);
        // A version is valid until the next one's time: once that is at or before the cutoff
        // no lookup reaches it (the newest version is never removed; an expired newest
        // tombstone answers as nothing would, so it goes too, with all before it).
        let mut times: Vec<(i64, bool)> = versions.iter().map(|(t, v)| (*t, v.is_none())).collect();
        match times.binary_search_by_key(&ts, |(t, _)| *t) {
            Ok(at) => times[at].1 = value.is_none(),
            Err(at) => times.insert(at, (ts, value.is_none())),
        }
        for (i, (t, tombstone)) in times.iter().enumerate() {
            let gone = match times.get(i + 1) {
                Some((next, _)) => *next <= cutoff,
                None => *tombstone && *t <= cutoff,
            };
            if !gone {
                break;
            }
            self.inner.delete(&Self::version_key(key, *t)?, ts);
        }
        Ok(match latest {
            true => Put::Latest,
            false => Put::History,
        })
    }
}

/// The key the store's observed stream time is kept under.
pub(crate) const STREAM_TIME: &[u8] = STREAM_TIME_KEY;

/// The stream time kept under [`STREAM_TIME`] (-1 when none was).
pub(crate) fn stream_time(stored: Option<&[u8]>) -> Result<i64, ProcessError> {
    Ok(match stored {
        Some(b) => <[u8; 8]>::try_from(b)
            .map(i64::from_be_bytes)
            .map_err(|_| corrupt("its stream time"))?,
        None => -1,
    })
}

/// The store keys `[from, to)` of `key`'s versions.
pub(crate) fn version_range(key: &[u8]) -> Result<(Vec<u8>, Vec<u8>), ProcessError> {
    let p = prefix(key)?;
    let (mut from, mut to) = (p.clone(), p);
    from.extend_from_slice(&[0; 8]);
    to.extend_from_slice(&[0xff; 9]);
    Ok((from, to))
}

/// The store keys of `key`'s versions split at `as_of`: those valid at or before it are in
/// `[from, split)`, the newer ones in `[split, to)` (a version's key is the key's prefix and
/// 8 bytes of time, so the first key after the one of `as_of` is it followed by a zero).
pub(crate) fn version_split(key: &[u8], as_of: i64) -> Result<VersionSplit, ProcessError> {
    let (from, to) = version_range(key)?;
    let mut split = prefix(key)?;
    split.extend_from_slice(&time_bytes(as_of));
    split.push(0);
    Ok(VersionSplit { from, split, to })
}

/// Store keys bounding a key's versions ([`version_split`]).
pub(crate) struct VersionSplit {
    pub from: Vec<u8>,
    pub split: Vec<u8>,
    pub to: Vec<u8>,
}

/// A stored version: its time and value.
pub(crate) fn decode_version(k: &[u8], v: &[u8]) -> Result<Version, ProcessError> {
    let time = k
        .len()
        .checked_sub(8)
        .and_then(|at| <[u8; 8]>::try_from(&k[at..]).ok())
        .map(|b| (u64::from_be_bytes(b) ^ (1 << 63)) as i64)
        .ok_or_else(|| corrupt("a version's key"))?;
    let value = match v.split_first() {
        Some((&VALUE, bytes)) => Some(bytes.to_vec()),
        Some((&TOMBSTONE, [])) => None,
        _ => return Err(corrupt("a version's value")),
    };
    Ok((time, value))
}

/// Of a key's `versions` (oldest first), the one valid at `as_of`: the last one from before
/// it. Before the history retention only the newest version still answers (it never expires).
pub(crate) fn as_of_version(
    mut versions: Vec<Version>,
    as_of: i64,
    stream_time: i64,
    history: i64,
) -> Option<Version> {
    let expired = as_of < stream_time.saturating_sub(history);
    let newest = versions.len();
    let at = versions.iter().rposition(|(t, _)| *t <= as_of)?;
    if expired && at + 1 != newest {
        return None;
    }
    Some(versions.swap_remove(at))
}

fn corrupt(what: &str) -> ProcessError {
    ProcessError::Fatal(format!(
        "a versioned store holds a corrupt entry ({what}): it was written by something else; reset the app's state"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Backend, StoreState};
    use crate::processor::Context;
    use crate::steps::driver::Recorder;
    use crate::store::MemoryStore;
    use crate::topology::StoreDef;
    use eddy_crds::Format;

    const H: i64 = 100;

    /// `f` on a versioned store over an in-memory store and its record cache, as a task has.
    fn with_store<T>(f: impl FnOnce(&mut VersionedStore<'_>) -> T) -> T {
        let def = StoreDef::key_value("v", Format::String, Format::Json).ordered();
        let mut stores = vec![StoreState::for_def(
            &def,
            "test-v-changelog".into(),
            Backend::Memory(MemoryStore::default()),
        )];
        let (mut sink, mut out) = (Recorder::default(), Vec::new());
        let mut ctx = Context {
            stores: &mut stores,
            db: None,
            global: None,
            sink: &mut sink,
            out: &mut out,
            topic: None,
        };
        let mut s = VersionedStore::new(ctx.store("v").expect("store"), H);
        f(&mut s)
    }

    fn s(v: &[u8]) -> Option<Vec<u8>> {
        Some(v.to_vec())
    }

    #[test]
    fn a_lookup_sees_the_version_valid_at_its_time() -> Result<(), ProcessError> {
        with_store(|st| {
            assert_eq!(st.put(b"k", Some(b"a"), 10)?, Put::Latest);
            assert_eq!(st.put(b"k", Some(b"b"), 20)?, Put::Latest);
            assert_eq!(st.put(b"k", None, 30)?, Put::Latest);
            assert_eq!(st.put(b"k", Some(b"c"), 40)?, Put::Latest);
            assert_eq!(st.get_as_of(b"k", 9)?, None);
            assert_eq!(st.get_as_of(b"k", 10)?, s(b"a"));
            assert_eq!(st.get_as_of(b"k", 19)?, s(b"a"));
            assert_eq!(st.get_as_of(b"k", 20)?, s(b"b"));
            assert_eq!(st.get_as_of(b"k", 35)?, None);
            assert_eq!(st.get_as_of(b"k", 1000)?, s(b"c"));
            assert_eq!(st.get_as_of(b"k", i64::MAX)?, s(b"c"), "the newest value");
            // Another key that starts with this one shares none of its versions.
            st.put(b"k1", Some(b"x"), 15)?;
            assert_eq!(st.get_as_of(b"k", 16)?, s(b"a"));
            assert_eq!(st.get_as_of(b"", 16)?, None);
            Ok(())
        })
    }

    #[test]
    fn an_out_of_order_put_goes_into_history_and_one_at_the_same_time_replaces()
    -> Result<(), ProcessError> {
        with_store(|st| {
            st.put(b"k", Some(b"a"), 10)?;
            st.put(b"k", Some(b"c"), 30)?;
            assert_eq!(st.put(b"k", Some(b"b"), 20)?, Put::History);
            assert_eq!(st.get_as_of(b"k", 25)?, s(b"b"));
            assert_eq!(st.put(b"k", None, 25)?, Put::History);
            assert_eq!(st.get_as_of(b"k", 26)?, None);
            assert_eq!(st.get_as_of(b"k", 30)?, s(b"c"));
            assert_eq!(st.put(b"k", Some(b"B"), 20)?, Put::History);
            assert_eq!(st.get_as_of(b"k", 24)?, s(b"B"));
            assert_eq!(st.put(b"k", Some(b"C"), 30)?, Put::Latest);
            assert_eq!(st.get_as_of(b"k", i64::MAX)?, s(b"C"), "the newest value");
            Ok(())
        })
    }

    #[test]
    fn history_beyond_the_retention_is_gone_but_the_newest_version_stays()
    -> Result<(), ProcessError> {
        with_store(|st| {
            st.put(b"old", Some(b"o"), 5)?;
            st.put(b"k", Some(b"a"), 10)?;
            st.put(b"k", Some(b"b"), 50)?;
            // Stream time 500: lookups before 400 see only a newest version older than them,
            // not the history (a is still stored: nothing was put to k since).
            st.put(b"other", Some(b"x"), 500)?;
            assert_eq!(st.get_as_of(b"k", 30)?, None);
            assert_eq!(st.get_as_of(b"k", 399)?, s(b"b"));
            assert_eq!(st.get_as_of(b"k", 400)?, s(b"b"));
            assert_eq!(st.get_as_of(b"old", 6)?, s(b"o"));
            // A put older than the retention is dropped; one within it is kept.
            assert_eq!(st.put(b"k", Some(b"z"), 399)?, Put::Expired);
            assert_eq!(st.get_as_of(b"k", 450)?, s(b"b"));
            assert_eq!(st.put(b"k", Some(b"y"), 400)?, Put::Latest);
            assert_eq!(st.get_as_of(b"k", 450)?, s(b"y"));
            // The versions no lookup reaches were removed from the store.
            assert_eq!(
                st.versions(b"k")?,
                vec![(400, s(b"y"))],
                "a (valid until 50) and b (until 400) are before every lookup that sees history"
            );
            st.put(b"k", None, 450)?;
            st.put(b"other", Some(b"x"), 1000)?;
            st.put(b"k", Some(b"n"), 900)?;
            assert_eq!(st.versions(b"k")?, vec![(900, s(b"n"))]);
            Ok(())
        })
    }
}

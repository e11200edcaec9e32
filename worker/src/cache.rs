//! The record cache in front of each store shard. Updates to one key coalesce here; dirty
//! entries are sent to the changelog (and forwarded downstream) when the task flushes, at
//! commit or when the dirty entries are over the task's share of the byte budget. Entries stay
//! readable until the commit writes them to the store, because the store must only ever hold
//! committed state, and after it, as clean copies of the store, while the cache is within its
//! share: under exactly-once's 100 ms commits a hot key is then read from memory, not RocksDB.

use crate::record::{Data, Record};
use crate::store::{Entries, MemoryStore, StoreError, TaskDb};
use crate::window::Segments;
use eddy_crds::Format;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::Arc;

/// Where a store's committed data lives.
pub enum Backend {
    Rocks,
    Memory(MemoryStore),
}

struct Entry {
    value: Option<Vec<u8>>,
    dirty: bool,
    timestamp: i64,
    /// When it was last put, for flushing ordered stores in update order.
    seq: u64,
}

/// A cached key: one allocation shared by the map and the dirty and flushed lists.
type Key = Arc<[u8]>;

/// The cache's entries: hashed for point reads, or in key order for stores read by range
/// (window and session stores, suppression buffers), which then need no second index.
enum Map {
    Hashed(HashMap<Key, Entry>),
    Ordered(BTreeMap<Key, Entry>),
}

impl Map {
    fn get(&self, key: &[u8]) -> Option<&Entry> {
        match self {
            Map::Hashed(m) => m.get(key),
            Map::Ordered(m) => m.get(key),
        }
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        match self {
            Map::Hashed(m) => m.get_mut(key),
            Map::Ordered(m) => m.get_mut(key),
        }
    }

    fn insert(&mut self, key: Key, e: Entry) {
        match self {
            Map::Hashed(m) => m.insert(key, e),
            Map::Ordered(m) => m.insert(key, e),
        };
    }

    fn retain(&mut self, keep: impl FnMut(&Key, &mut Entry) -> bool) {
        match self {
            Map::Hashed(m) => m.retain(keep),
            Map::Ordered(m) => m.retain(keep),
        }
    }

    /// Empty again, giving back the memory a burst of keys made the map grow to.
    fn clear(&mut self) {
        match self {
            Map::Hashed(m) => *m = HashMap::new(),
            Map::Ordered(m) => m.clear(),
        }
    }

    fn is_ordered(&self) -> bool {
        matches!(self, Map::Ordered(_))
    }
}

/// One store of one task: its cache, its backend and what the topology knows about it.
pub struct StoreState {
    pub name: String,
    pub changelog: String,
    pub backend: Backend,
    /// Index of the processor that receives this store's updates at flush (count/aggregate).
    pub forward_to: Option<usize>,
    pub key_format: Format,
    pub value_format: Format,
    /// A window or session store's segments, retention and key layout.
    pub segments: Option<Segments>,
    /// Values start with an 8-byte timestamp that downstream does not see (a DSL window's
    /// largest record time).
    pub timestamped: bool,
    /// The largest window start put, which expiry counts retention back from.
    observed: Option<i64>,
    entries: Map,
    /// Keys that turned dirty since the last flush, so a flush never scans clean entries.
    dirty: Vec<Key>,
    /// Keys flushed since the last commit: what the commit writes to the store.
    flushed: Vec<Key>,
    /// Key ranges `[from, to)` emptied since the last commit (see [`Self::cleared_range`]).
    cleared: Vec<(Vec<u8>, Vec<u8>)>,
    /// All entries, dirty, flushed or committed.
    bytes: usize,
    /// Entries turned dirty since the last flush.
    dirty_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    /// Puts so far (see [`Entry::seq`]).
    seq: u64,
}

/// A dirty entry on its way to the changelog.
pub struct Dirty {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
}

/// What an entry costs beyond its key and value bytes, charged so that the cache's real
/// memory stays within its share: its slot in the map (twice its size: a hash table is
/// between half and 7/8 full, a B-tree's nodes two thirds), the key's handles in the dirty
/// and flushed lists, and the heap headers of the key and value allocations (16 bytes each
/// in glibc, plus the key's reference counts).
const ENTRY_OVERHEAD: usize =
    2 * size_of::<(Key, Entry)>() + 2 * size_of::<Key>() + 2 * 16 + 2 * size_of::<usize>();

/// Committed changes of one store: `None` deletes the key.
pub type Changes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

impl StoreState {
    pub fn new(
        name: &str,
        changelog: String,
        backend: Backend,
        key_format: Format,
        value_format: Format,
    ) -> Self {
        Self {
            name: name.to_string(),
            changelog,
            backend,
            forward_to: None,
            key_format,
            value_format,
            segments: None,
            timestamped: false,
            observed: None,
            entries: Map::Hashed(HashMap::new()),
            dirty: Vec::new(),
            flushed: Vec::new(),
            cleared: Vec::new(),
            bytes: 0,
            dirty_bytes: 0,
            hits: 0,
            misses: 0,
            seq: 0,
        }
    }

    pub fn get(&mut self, db: Option<&TaskDb>, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(e) = self.entries.get(key) {
            self.hits += 1;
            return Ok(e.value.clone());
        }
        self.misses += 1;
        match &self.backend {
            Backend::Memory(m) => Ok(m.read().map.get(key).cloned()),
            Backend::Rocks => match db {
                Some(db) => db.get(&self.name, key),
                None => Ok(None),
            },
        }
    }

    /// The state of a store the topology defines.
    pub fn for_def(d: &crate::topology::StoreDef, changelog: String, backend: Backend) -> Self {
        let mut s = Self::new(&d.name, changelog, backend, d.key_format, d.value_format);
        s.forward_to = d.forward_to;
        s.segments = d.window.map(|w| w.segments());
        // The DSL's time and sliding window stores (not sessions, nor custom processors'
        // stores) keep the window's largest record time before the value.
        s.timestamped = d.forward_to.is_some()
            && d.window.is_some_and(|w| {
                matches!(
                    w.windows,
                    crate::window::Windows::Time(_) | crate::window::Windows::Sliding { .. }
                )
            });
        if d.ordered || d.window.is_some() {
            s.keep_order();
        }
        s
    }

    /// The record a flushed entry sends downstream: a window store's key is split into the
    /// inner key and the window; a timestamped value loses its timestamp.
    pub fn downstream(&self, d: &Dirty) -> Record {
        let value = d
            .value
            .as_deref()
            .map(|v| match self.timestamped {
                true => crate::window::split_timestamp(v).map_or(&[][..], |(_, v)| v),
                false => v,
            })
            .map(|v| Data::raw(v, self.value_format));
        match self.segments.and_then(|s| s.schema.split(&d.key)) {
            Some((inner, w)) => Record {
                window: Some(w),
                ..Record::new(Some(Data::raw(inner, self.key_format)), value, d.timestamp)
            },
            None => Record::new(Some(Data::raw(&d.key, self.key_format)), value, d.timestamp),
        }
    }

    /// Keep the cache's keys in order, so that [`Self::fetch`] and [`Self::range`] see them.
    pub fn keep_order(&mut self) {
        if let Map::Hashed(m) = &mut self.entries {
            self.entries = Map::Ordered(std::mem::take(m).into_iter().collect());
        }
    }

    /// The windows of `inner` whose time (a window's start, a session's end) is in
    /// `[from, to]`, cache over store, in key order. Empty for a store that is not windowed.
    pub fn fetch(
        &mut self,
        db: Option<&TaskDb>,
        inner: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Entries, StoreError> {
        let Some(schema) = self.segments.map(|s| s.schema) else {
            return Ok(Vec::new());
        };
        let (lo, hi) = schema.bounds(inner, from, to);
        let matches = |k: &[u8]| schema.matches(k, inner, from, to);
        let mut found: BTreeMap<Vec<u8>, Vec<u8>> = match (&self.backend, db) {
            (Backend::Memory(m), _) => m
                .read()
                .map
                .range(lo.clone()..=hi.clone())
                .filter(|(k, _)| matches(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            (Backend::Rocks, Some(db)) => {
                db.fetch(&self.name, inner, from, to)?.into_iter().collect()
            }
            (Backend::Rocks, None) => BTreeMap::new(),
        };
        self.overlay(&mut found, (Included(&lo), Included(&hi)), matches);
        Ok(found.into_iter().collect())
    }

    /// Every window whose time is in `[from, to]`, cache over store, by time then key.
    pub fn fetch_all(
        &mut self,
        db: Option<&TaskDb>,
        from: i64,
        to: i64,
    ) -> Result<Entries, StoreError> {
        let Some(schema) = self.segments.map(|s| s.schema) else {
            return Ok(Vec::new());
        };
        let in_range = |k: &[u8]| schema.time(k).is_some_and(|t| from <= t && t <= to);
        let mut found: BTreeMap<Vec<u8>, Vec<u8>> = match (&self.backend, db) {
            (Backend::Memory(m), _) => m
                .read()
                .map
                .iter()
                .filter(|(k, _)| in_range(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            (Backend::Rocks, Some(db)) => db.fetch_all(&self.name, from, to)?.into_iter().collect(),
            (Backend::Rocks, None) => BTreeMap::new(),
        };
        self.overlay(&mut found, (Unbounded, Unbounded), in_range);
        let mut out: Entries = found.into_iter().collect();
        out.sort_by_key(|(k, _)| schema.time(k));
        Ok(out)
    }

    /// The entries of a key-value store in `[from, to)`, cache over store, in key order.
    pub fn range(
        &mut self,
        db: Option<&TaskDb>,
        from: &[u8],
        to: &[u8],
    ) -> Result<Entries, StoreError> {
        let mut found: BTreeMap<Vec<u8>, Vec<u8>> = match (&self.backend, db) {
            (Backend::Memory(m), _) => m
                .read()
                .map
                .range(from.to_vec()..to.to_vec())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            (Backend::Rocks, Some(db)) => db.range(&self.name, from, to)?.into_iter().collect(),
            (Backend::Rocks, None) => BTreeMap::new(),
        };
        self.overlay(&mut found, (Included(from), Excluded(to)), |_| true);
        Ok(found.into_iter().collect())
    }

    /// Put the cache's entries in `keys` over what the store holds: its writes and deletes are
    /// newer.
    fn overlay(
        &self,
        found: &mut BTreeMap<Vec<u8>, Vec<u8>>,
        keys: (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>),
        keep: impl Fn(&[u8]) -> bool,
    ) {
        let Map::Ordered(entries) = &self.entries else {
            return;
        };
        for (k, e) in entries.range::<[u8], _>(keys).filter(|(k, _)| keep(k)) {
            match &e.value {
                Some(v) => found.insert(k.to_vec(), v.clone()),
                None => found.remove(&k[..]),
            };
        }
    }

    /// Put a value (`None` deletes). In an ordered store the entry keeps the largest
    /// timestamp put since the cache read it, as Kafka Streams' timestamped window stores keep
    /// the latest record's time in a window: stream time downstream (suppression) then sees
    /// every record's time even when a late one updates the window last.
    pub fn put(&mut self, key: &[u8], value: Option<Vec<u8>>, timestamp: i64) {
        let add = value.as_ref().map_or(0, Vec::len);
        self.seq += 1;
        let (seq, ordered) = (self.seq, self.entries.is_ordered());
        match self.entries.get_mut(key) {
            Some(e) => {
                e.seq = seq;
                let timestamp = if ordered {
                    timestamp.max(e.timestamp)
                } else {
                    timestamp
                };
                self.bytes = self.bytes + add - e.value.as_ref().map_or(0, Vec::len);
                e.value = value;
                if !e.dirty {
                    self.dirty.push(Key::from(key));
                    self.dirty_bytes += key.len() + add + ENTRY_OVERHEAD;
                }
                e.dirty = true;
                e.timestamp = timestamp;
            }
            None => {
                self.bytes += key.len() + add + ENTRY_OVERHEAD;
                self.dirty_bytes += key.len() + add + ENTRY_OVERHEAD;
                let key = Key::from(key);
                self.dirty.push(key.clone());
                self.entries.insert(
                    key,
                    Entry {
                        value,
                        dirty: true,
                        timestamp,
                        seq,
                    },
                );
            }
        }
    }

    /// A window whose time (start, or a session's end) is `time` was updated: stream time for
    /// this store's expiry.
    pub fn observe(&mut self, time: i64) {
        self.observed = Some(self.observed.map_or(time, |o| o.max(time)));
    }

    /// For a window store that has seen a window: windows starting before this are past
    /// retention.
    pub fn expired_before(&self) -> Option<i64> {
        Some(self.segments?.expired_before(self.observed?))
    }

    /// Drop expired windows of an in-memory window store (RocksDB ones drop segments).
    pub fn expire_in_memory(&mut self, before: i64) {
        if let (Backend::Memory(m), Some(seg)) = (&self.backend, self.segments) {
            m.write()
                .map
                .retain(|k, _| seg.schema.time(k).is_none_or(|time| time >= before));
        }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the entries turned dirty since the last flush.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Something changed since the last commit.
    pub fn has_uncommitted(&self) -> bool {
        !self.dirty.is_empty() || !self.flushed.is_empty()
    }

    /// Take the dirty entries, marking them clean; they stay readable until
    /// [`Self::take_committed`].
    pub fn take_dirty(&mut self) -> Vec<Dirty> {
        let mut out = Vec::with_capacity(self.dirty.len());
        self.dirty_bytes = 0;
        let mut keys = std::mem::take(&mut self.dirty);
        // Ordered stores flush in the order of their last updates, as Kafka Streams' cache
        // does: a window's final update then never reaches a suppression after a record that
        // came later and closed it.
        if self.entries.is_ordered() {
            let mut by_seq: Vec<(u64, Key)> = keys
                .into_iter()
                .map(|k| (self.entries.get(&k).map_or(0, |e| e.seq), k))
                .collect();
            by_seq.sort_unstable_by_key(|(seq, _)| *seq);
            keys = by_seq.into_iter().map(|(_, k)| k).collect();
        }
        for key in keys {
            if let Some(e) = self.entries.get_mut(&key) {
                e.dirty = false;
                out.push(Dirty {
                    value: e.value.clone(),
                    timestamp: e.timestamp,
                    key: key.to_vec(),
                });
                self.flushed.push(key);
            }
        }
        out
    }

    /// The caller deleted every key in `[from, to)` of this ordered key-value store: the
    /// commit drops the range from the store at once instead of key by key (the changelog
    /// still gets a tombstone per key). Ignored for other stores.
    pub fn cleared_range(&mut self, from: &[u8], to: &[u8]) {
        if !self.entries.is_ordered() || self.segments.is_some() || from >= to {
            return;
        }
        match self.cleared.last_mut() {
            // Touching or overlapping the last range (a buffer emptied in order): one range.
            Some((f, t)) if from <= &t[..] && to >= &f[..] => {
                if from < &f[..] {
                    *f = from.to_vec();
                }
                if to > &t[..] {
                    *t = to.to_vec();
                }
            }
            _ => self.cleared.push((from.to_vec(), to.to_vec())),
        }
    }

    /// The ranges cleared since the last commit, for the store's write batch (before
    /// [`Self::take_committed`]'s changes, which no longer carry their deletes).
    pub fn take_cleared(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        std::mem::take(&mut self.cleared)
    }

    /// Everything flushed since the last commit, to write to the store. The entries stay as
    /// clean copies of the store while the cache holds at most `keep` bytes; past that it
    /// empties (entries still dirty, if any, are kept).
    pub fn take_committed(&mut self, keep: usize) -> Changes {
        let mut changes = Vec::with_capacity(self.flushed.len());
        for key in std::mem::take(&mut self.flushed) {
            if let Some(e) = self.entries.get(&key) {
                let covered = || {
                    let k = &key[..];
                    self.cleared.iter().any(|(f, t)| &f[..] <= k && k < &t[..])
                };
                if e.value.is_some() || !covered() {
                    changes.push((key.to_vec(), e.value.clone()));
                }
            }
        }
        if self.bytes > keep {
            if self.dirty.is_empty() {
                self.entries.clear();
            } else {
                self.entries.retain(|_, e| e.dirty);
            }
            self.bytes = self.dirty_bytes;
        }
        changes
    }

    /// Apply committed changes to an in-memory backend (RocksDB ones go through a batch).
    pub fn apply_in_memory(&mut self, changes: &Changes, mark: crate::store::Mark) {
        if let Backend::Memory(m) = &self.backend {
            m.apply(std::mem::take(&mut self.cleared), changes, mark);
        }
    }

    pub fn is_in_memory(&self) -> bool {
        matches!(self.backend, Backend::Memory(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> StoreState {
        StoreState::new(
            "s",
            "app-s-changelog".into(),
            Backend::Memory(MemoryStore::default()),
            Format::String,
            Format::I64,
        )
    }

    #[test]
    fn coalesces_updates_per_key_and_keeps_them_readable_until_commit() {
        let mut s = store();
        s.put(b"a", Some(vec![1]), 1);
        s.put(b"a", Some(vec![2]), 2);
        s.put(b"b", Some(vec![3]), 3);
        let mut dirty = s.take_dirty();
        dirty.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(dirty.len(), 2, "two keys, two changelog records");
        assert_eq!(dirty[0].value, Some(vec![2]));
        assert_eq!(dirty[0].timestamp, 2);
        assert!(!s.has_dirty());
        assert_eq!(s.get(None, b"a").expect("get"), Some(vec![2]));
        let committed = s.take_committed(0);
        assert_eq!(committed.len(), 2);
        s.apply_in_memory(&committed, crate::store::Mark::from(7));
        assert_eq!(s.bytes(), 0, "over its share: emptied");
        assert!(!s.has_uncommitted());
        assert_eq!(s.get(None, b"a").expect("get"), Some(vec![2]));
        assert_eq!(s.hits, 1);
        assert_eq!(s.misses, 1);
    }

    #[test]
    fn a_cleared_range_replaces_its_deletes_and_keeps_later_puts() {
        let mut s = store();
        s.keep_order();
        for k in [b"a", b"b", b"c", b"d"] {
            s.put(k, Some(vec![1]), 1);
        }
        let _ = s.take_dirty();
        let c = s.take_committed(0);
        s.apply_in_memory(&c, Default::default());
        // A buffer emptied in order, in two steps, then `b` buffered again.
        for k in [b"a", b"b"] {
            s.put(k, None, 2);
        }
        s.cleared_range(b"a", b"b\0");
        s.put(b"c", None, 2);
        s.cleared_range(b"b\0", b"d");
        s.put(b"b", Some(vec![2]), 3);
        let tombstones = s.take_dirty().iter().filter(|d| d.value.is_none()).count();
        assert_eq!(
            tombstones, 2,
            "the changelog still gets a tombstone per key"
        );
        let c = s.take_committed(0);
        assert_eq!(c, vec![(b"b".to_vec(), Some(vec![2]))], "no delete left");
        s.apply_in_memory(&c, Default::default());
        assert_eq!(s.range(None, b"", b"z").expect("range").len(), 2, "b and d");
        assert_eq!(s.get(None, b"b").expect("get"), Some(vec![2]));
        assert_eq!(s.get(None, b"c").expect("get"), None);
    }

    #[test]
    fn committed_entries_stay_readable_within_the_share() {
        let mut s = store();
        s.put(b"a", Some(vec![1]), 1);
        let _ = s.take_dirty();
        assert_eq!(s.take_committed(1 << 20).len(), 1);
        assert!(s.bytes() > 0 && !s.has_uncommitted());
        assert_eq!(s.get(None, b"a").expect("get"), Some(vec![1]));
        assert_eq!((s.hits, s.misses), (1, 0), "served from the cache");
        // Nothing new: the next commit writes nothing.
        assert!(s.take_committed(1 << 20).is_empty());
        s.put(b"a", Some(vec![2]), 2);
        assert_eq!(s.take_dirty()[0].value, Some(vec![2]));
        assert_eq!(
            s.take_committed(1 << 20),
            vec![(b"a".to_vec(), Some(vec![2]))]
        );
    }
}

//! The record cache in front of each store shard. Updates to one key coalesce here; dirty
//! entries are sent to the changelog (and forwarded downstream) when the task flushes, at
//! commit or when the dirty entries are over the task's share of the byte budget. Entries stay
//! readable until the commit writes them to the store, because the store must only ever hold
//! committed state, and after it, as clean copies of the store, while the cache is within its
//! share: under exactly-once's 100 ms commits a hot key is then read from memory, not RocksDB.

use crate::store::{MemoryStore, StoreError, TaskDb};
use crate::window::{Segments, TimeWindows};
use eddy_crds::Format;
use std::collections::HashMap;

/// Where a store's committed data lives.
pub enum Backend {
    Rocks,
    Memory(MemoryStore),
}

struct Entry {
    value: Option<Vec<u8>>,
    dirty: bool,
    timestamp: i64,
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
    /// A window store's windows (keys are then [`crate::window::key`]s).
    pub windows: Option<TimeWindows>,
    /// A window store's segments and retention.
    pub segments: Option<Segments>,
    /// The largest window start put, which expiry counts retention back from.
    observed: Option<i64>,
    entries: HashMap<Vec<u8>, Entry>,
    /// Keys that turned dirty since the last flush, so a flush never scans clean entries.
    dirty: Vec<Vec<u8>>,
    /// Keys flushed since the last commit: what the commit writes to the store.
    flushed: Vec<Vec<u8>>,
    /// All entries, dirty, flushed or committed.
    bytes: usize,
    /// Entries turned dirty since the last flush.
    dirty_bytes: usize,
    pub hits: u64,
    pub misses: u64,
}

/// A dirty entry on its way to the changelog.
pub struct Dirty {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
}

const ENTRY_OVERHEAD: usize = 64;

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
            windows: None,
            segments: None,
            observed: None,
            entries: HashMap::new(),
            dirty: Vec::new(),
            flushed: Vec::new(),
            bytes: 0,
            dirty_bytes: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn get(&mut self, db: Option<&TaskDb>, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(e) = self.entries.get(key) {
            self.hits += 1;
            return Ok(e.value.clone());
        }
        self.misses += 1;
        match &self.backend {
            Backend::Memory(m) => Ok(m.map.get(key).cloned()),
            Backend::Rocks => match db {
                Some(db) => db.get(&self.name, key),
                None => Ok(None),
            },
        }
    }

    pub fn put(&mut self, key: &[u8], value: Option<Vec<u8>>, timestamp: i64) {
        let add = value.as_ref().map_or(0, Vec::len);
        match self.entries.get_mut(key) {
            Some(e) => {
                self.bytes = self.bytes + add - e.value.as_ref().map_or(0, Vec::len);
                e.value = value;
                if !e.dirty {
                    self.dirty.push(key.to_vec());
                    self.dirty_bytes += key.len() + add + ENTRY_OVERHEAD;
                }
                e.dirty = true;
                e.timestamp = timestamp;
            }
            None => {
                self.bytes += key.len() + add + ENTRY_OVERHEAD;
                self.dirty_bytes += key.len() + add + ENTRY_OVERHEAD;
                self.dirty.push(key.to_vec());
                self.entries.insert(
                    key.to_vec(),
                    Entry {
                        value,
                        dirty: true,
                        timestamp,
                    },
                );
            }
        }
    }

    /// A window starting at `start` was updated: stream time for this store's expiry.
    pub fn observe(&mut self, start: i64) {
        self.observed = Some(self.observed.map_or(start, |o| o.max(start)));
    }

    /// For a window store that has seen a window: windows starting before this are past
    /// retention.
    pub fn expired_before(&self) -> Option<i64> {
        Some(self.segments?.expired_before(self.observed?))
    }

    /// Drop expired windows of an in-memory window store (RocksDB ones drop segments).
    pub fn expire_in_memory(&mut self, before: i64) {
        if let Backend::Memory(m) = &mut self.backend {
            m.map
                .retain(|k, _| crate::window::split(k).is_none_or(|(_, start)| start >= before));
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
        for key in std::mem::take(&mut self.dirty) {
            if let Some(e) = self.entries.get_mut(&key) {
                e.dirty = false;
                out.push(Dirty {
                    value: e.value.clone(),
                    timestamp: e.timestamp,
                    key: key.clone(),
                });
                self.flushed.push(key);
            }
        }
        out
    }

    /// Everything flushed since the last commit, to write to the store. The entries stay as
    /// clean copies of the store while the cache holds at most `keep` bytes; past that it
    /// empties (entries still dirty, if any, are kept).
    pub fn take_committed(&mut self, keep: usize) -> Changes {
        let mut changes = Vec::with_capacity(self.flushed.len());
        for key in std::mem::take(&mut self.flushed) {
            if let Some(e) = self.entries.get(&key) {
                changes.push((key, e.value.clone()));
            }
        }
        if self.bytes > keep {
            self.entries.retain(|_, e| e.dirty);
            self.bytes = self.dirty_bytes;
        }
        changes
    }

    /// Apply committed changes to an in-memory backend (RocksDB ones go through a batch).
    pub fn apply_in_memory(&mut self, changes: &Changes, checkpoint: Option<i64>) {
        if let Backend::Memory(m) = &mut self.backend {
            for (k, v) in changes {
                match v {
                    Some(v) => m.map.insert(k.clone(), v.clone()),
                    None => m.map.remove(k),
                };
            }
            if checkpoint.is_some() {
                m.checkpoint = checkpoint;
            }
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
        s.apply_in_memory(&committed, Some(7));
        assert_eq!(s.bytes(), 0, "over its share: emptied");
        assert!(!s.has_uncommitted());
        assert_eq!(s.get(None, b"a").expect("get"), Some(vec![2]));
        assert_eq!(s.hits, 1);
        assert_eq!(s.misses, 1);
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

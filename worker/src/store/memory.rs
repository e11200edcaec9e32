//! In-memory stores (`inMemory: true`): a sorted map per store shard, rebuilt from the
//! changelog at every start. A shard is a shared handle: the task (or the standby following
//! it) writes committed changes into it, and interactive queries read it under the same lock,
//! so an answer and the changelog position it reflects are read together.

use super::{Entries, Mark, StoreError, View};
use crate::window::KeySchema;
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One in-memory store shard. Clones share it: moving it from a task to its standby (or
/// back) keeps it, and so does the query catalog while the copy answers.
#[derive(Clone, Default)]
pub struct MemoryStore(Arc<RwLock<MemoryData>>);

#[derive(Default)]
pub struct MemoryData {
    pub map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The changelog offset the data reflects (the next one to read), once known.
    pub checkpoint: Option<i64>,
    /// When the data was last known to be at its changelog's end, ms since the epoch.
    pub caught_up_at: Option<i64>,
}

impl MemoryData {
    /// The checkpoint with its time, as a store on disk has it.
    pub fn stored_checkpoint(&self) -> Option<super::Checkpoint> {
        Some(super::Checkpoint {
            offset: self.checkpoint?,
            caught_up_at: self.caught_up_at,
        })
    }
}

impl MemoryStore {
    pub fn read(&self) -> RwLockReadGuard<'_, MemoryData> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, MemoryData> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Apply committed changes (`None` deletes), after emptying the `cleared` key ranges
    /// (`[from, to)`), and move the checkpoint and its time as `mark` says: one step for
    /// readers.
    pub fn apply(
        &self,
        cleared: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        changes: &[(Vec<u8>, Option<Vec<u8>>)],
        mark: Mark,
    ) {
        let mut d = self.write();
        for (from, to) in cleared {
            let gone: Vec<Vec<u8>> = d.map.range(from..to).map(|(k, _)| k.clone()).collect();
            for k in gone {
                d.map.remove(&k);
            }
        }
        for (k, v) in changes {
            match v {
                Some(v) => d.map.insert(k.clone(), v.clone()),
                None => d.map.remove(k),
            };
        }
        if mark.offset.is_some() {
            d.checkpoint = mark.offset;
        }
        if mark.caught_up_at.is_some() {
            d.caught_up_at = mark.caught_up_at;
        }
    }

    /// Empty the store, checkpoint included (it rebuilds from its changelog).
    pub fn clear(&self) {
        *self.write() = MemoryData::default();
    }

    /// The store held for reading, as queries read it (`schema`: a window store's key
    /// layout). Its writers wait meanwhile: a query's reads are bounded.
    pub fn view(&self, schema: Option<KeySchema>) -> MemoryView<'_> {
        MemoryView {
            data: self.read(),
            schema,
        }
    }
}

/// An in-memory store held for reading.
pub struct MemoryView<'a> {
    data: RwLockReadGuard<'a, MemoryData>,
    schema: Option<KeySchema>,
}

impl MemoryView<'_> {
    fn schema(&self, store: &str) -> Result<KeySchema, StoreError> {
        self.schema
            .ok_or_else(|| StoreError::Unknown(format!("{store} (not a window store)")))
    }
}

impl View for MemoryView<'_> {
    fn get(&self, _: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.data.map.get(key).cloned())
    }

    fn checkpoint(&self, _: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.data.checkpoint)
    }

    fn range(
        &self,
        _: &str,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        Ok(self.data.range(from, to, limit))
    }

    fn last_in(&self, _: &str, from: &[u8], to: &[u8]) -> Result<Option<super::Entry>, StoreError> {
        if to <= from {
            return Ok(None);
        }
        Ok(self
            .data
            .map
            .range::<[u8], _>((Included(from), Excluded(to)))
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone())))
    }

    fn windows(
        &self,
        store: &str,
        inner: &[u8],
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        Ok(self
            .data
            .windows(self.schema(store)?, inner, from, to, limit))
    }

    fn all_windows(
        &self,
        store: &str,
        from: i64,
        to: i64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        Ok(self
            .data
            .all_windows(self.schema(store)?, from, to, after, limit))
    }

    /// By time, then key.
    fn window_order(&self, store: &str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(MemoryData::window_order(self.schema(store)?, key))
    }
}

impl MemoryData {
    /// Up to `limit` keys and values from `from` (inclusive) to `to` (exclusive; `None`: to
    /// the last key), in key order.
    pub fn range(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Entries {
        let upper = to.map_or(Unbounded, Excluded);
        if to.is_some_and(|to| to <= from) {
            return Vec::new();
        }
        self.map
            .range::<[u8], _>((Included(from), upper))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Up to `limit` windows of `inner` whose time (a window's start, a session's end) is in
    /// `[from, to]`, in time order (the order of their keys).
    pub fn windows(
        &self,
        schema: KeySchema,
        inner: &[u8],
        from: i64,
        to: i64,
        limit: usize,
    ) -> Entries {
        if from > to {
            return Vec::new();
        }
        let (lo, hi) = schema.bounds(inner, from, to);
        self.map
            .range(lo..=hi)
            .filter(|(k, _)| schema.matches(k, inner, from, to))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Up to `limit` windows of every key whose time is in `[from, to]`, in
    /// [`Self::window_order`], after the window that sorts at `after` if given.
    pub fn all_windows(
        &self,
        schema: KeySchema,
        from: i64,
        to: i64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Entries {
        // The `limit` smallest orders after `after`, kept in a bounded heap: one pass over
        // the store, never all of its windows at once.
        let mut kept: std::collections::BinaryHeap<(Vec<u8>, &Vec<u8>, &Vec<u8>)> =
            std::collections::BinaryHeap::with_capacity(limit.min(self.map.len()) + 1);
        for (k, v) in &self.map {
            if !schema.time(k).is_some_and(|t| from <= t && t <= to) {
                continue;
            }
            let order = Self::window_order(schema, k);
            if after.is_some_and(|a| order.as_slice() <= a)
                || (kept.len() == limit && kept.peek().is_some_and(|top| order >= top.0))
            {
                continue;
            }
            kept.push((order, k, v));
            if kept.len() > limit {
                kept.pop();
            }
        }
        kept.into_sorted_vec()
            .into_iter()
            .map(|(_, k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Where a window sorts among every key's windows: by time, then key.
    pub fn window_order(schema: KeySchema, key: &[u8]) -> Vec<u8> {
        let time = schema.time(key).unwrap_or(i64::MIN);
        // The sign bit flipped: negative times sort before positive ones as bytes.
        let mut o = ((time as u64) ^ (1 << 63)).to_be_bytes().to_vec();
        o.extend_from_slice(key);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wkey(inner: &[u8], start: i64) -> Vec<u8> {
        let mut k = inner.to_vec();
        k.extend_from_slice(&start.to_be_bytes());
        k
    }

    #[test]
    fn clones_share_the_data_and_a_change_moves_the_checkpoint_with_it() {
        let s = MemoryStore::default();
        let reader = s.clone();
        s.apply([], &[(b"a".to_vec(), Some(b"1".to_vec()))], Mark::from(5));
        s.apply(
            [(b"a".to_vec(), b"b".to_vec())],
            &[(b"c".to_vec(), Some(b"3".to_vec()))],
            Mark::default(),
        );
        let d = reader.read();
        assert_eq!(d.range(b"", None, 10), vec![(b"c".to_vec(), b"3".to_vec())]);
        assert_eq!(d.checkpoint, Some(5), "no checkpoint given: kept");
        drop(d);
        s.clear();
        assert!(reader.read().map.is_empty() && reader.read().checkpoint.is_none());
    }

    /// A store holding the keys a, b, c and d, each its own value.
    fn abcd() -> MemoryStore {
        let s = MemoryStore::default();
        let changes: Vec<_> = [b"a", b"b", b"c", b"d"]
            .iter()
            .map(|k| (k.to_vec(), Some(k.to_vec())))
            .collect();
        s.apply([], &changes, Mark::default());
        s
    }

    #[test]
    fn the_last_entry_of_a_range_is_read_from_its_end() {
        use crate::store::View as _;
        let s = abcd();
        let v = s.view(None);
        let last = |from: &[u8], to: &[u8]| v.last_in("s", from, to).ok().flatten().map(|e| e.0);
        assert_eq!(
            last(b"a", b"c"),
            Some(b"b".to_vec()),
            "the end is exclusive"
        );
        assert_eq!(last(b"a", b"z"), Some(b"d".to_vec()));
        assert_eq!(last(b"b", b"b"), None);
        assert_eq!(last(b"e", b"z"), None, "nothing from the start on");
        assert_eq!(last(b"c", b"a"), None);
    }

    #[test]
    fn ranges_are_bounded_and_in_key_order() {
        let s = abcd();
        let d = s.read();
        let keys = |e: Entries| e.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            keys(d.range(b"b", Some(b"d"), 10)),
            vec![b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            keys(d.range(b"b", None, 2)),
            vec![b"b".to_vec(), b"c".to_vec()]
        );
        assert!(d.range(b"c", Some(b"a"), 10).is_empty());
    }

    #[test]
    fn windows_of_a_key_and_of_every_key_page_by_time() {
        let schema = KeySchema::Window { size: 10 };
        let s = MemoryStore::default();
        let changes: Vec<_> = [
            (&b"a"[..], 0),
            (b"a", 10),
            (b"ab", 10),
            (b"b", 0),
            (b"a", 20),
        ]
        .iter()
        .map(|(k, t)| (wkey(k, *t), Some(b"v".to_vec())))
        .collect();
        s.apply([], &changes, Mark::default());
        let d = s.read();
        let got = d.windows(schema, b"a", 5, 20, 10);
        assert_eq!(
            got.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            vec![wkey(b"a", 10), wkey(b"a", 20)],
            "not `ab`'s"
        );
        let page = d.all_windows(schema, 0, 10, None, 3);
        let order: Vec<_> = page.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(order, vec![wkey(b"a", 0), wkey(b"b", 0), wkey(b"a", 10)]);
        let after = MemoryData::window_order(schema, &order[2]);
        let rest = d.all_windows(schema, 0, 10, Some(&after), 3);
        assert_eq!(
            rest.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            vec![wkey(b"ab", 10)]
        );
    }
}

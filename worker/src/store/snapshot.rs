//! Reads of one task's stores at one point in time, for interactive queries ([`View`]: a
//! [`Snapshot`] of its database, or an in-memory store held for reading): every read of a
//! [`Snapshot`] sees the same committed state, and the checkpoint it reads is the changelog
//! position that state reflects (a commit writes both in one batch). Queries run on the HTTP
//! server's threads beside the processing thread, so they never use the task's kept
//! iterators ([`TaskDb::with_iterator`]), which a commit on that thread resets.

use super::{
    Entries, META_CF, StoreError, TaskDb, checkpoint_key, partition_checkpoint, scan_all_windows,
    scan_range, scan_windows,
};
use rocksdb::{DB, ReadOptions, SnapshotWithThreadMode};

/// A consistent view of a task's database.
pub struct Snapshot<'a> {
    db: &'a TaskDb,
    snapshot: SnapshotWithThreadMode<'a, DB>,
}

impl TaskDb {
    /// The database as it is now; later writes are not seen through it.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            db: self,
            snapshot: self.db.snapshot(),
        }
    }
}

/// A read of stores at one changelog position: a task database's [`Snapshot`], or an
/// in-memory store held for reading ([`super::memory::MemoryView`]).
pub trait View {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// The changelog offset the store's data reflects (the next offset to read), if any.
    fn checkpoint(&self, store: &str) -> Result<Option<i64>, StoreError>;

    /// Up to `limit` keys and values of a key-value store from `from` (inclusive) to `to`
    /// (exclusive; `None`: to the last key), in key order.
    fn range(
        &self,
        store: &str,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError>;

    /// The last key and value of a key-value store from `from` (inclusive) to `to`
    /// (exclusive), read from the end: one entry however many the range holds.
    fn last_in(
        &self,
        store: &str,
        from: &[u8],
        to: &[u8],
    ) -> Result<Option<super::Entry>, StoreError>;

    /// Up to `limit` windows of `inner` in a window or session store whose time (a window's
    /// start, a session's end) is in `[from, to]`, with their changelog keys, in time order.
    fn windows(
        &self,
        store: &str,
        inner: &[u8],
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Entries, StoreError>;

    /// Up to `limit` windows of every key whose time is in `[from, to]`, in
    /// [`Self::window_order`], after the window that sorts at `after` if given.
    fn all_windows(
        &self,
        store: &str,
        from: i64,
        to: i64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError>;

    /// The order [`Self::all_windows`] lists windows in.
    fn window_order(&self, store: &str, key: &[u8]) -> Result<Vec<u8>, StoreError>;
}

impl Snapshot<'_> {
    /// The checkpoint of one partition of a store fed by several (a global table's).
    pub fn partition_checkpoint(
        &self,
        store: &str,
        partition: i32,
    ) -> Result<Option<i64>, StoreError> {
        self.read_checkpoint(
            store,
            &checkpoint_key(&partition_checkpoint(store, partition)),
        )
    }

    fn read_checkpoint(&self, store: &str, key: &[u8]) -> Result<Option<i64>, StoreError> {
        let meta = self.db.cf(META_CF)?;
        let Some(b) = self.db.rocks(self.snapshot.get_cf(meta, key))? else {
            return Ok(None);
        };
        let arr: [u8; 8] = b
            .as_slice()
            .try_into()
            .map_err(|_| StoreError::Checkpoint {
                store: store.to_string(),
                path: self.db.path.clone(),
            })?;
        Ok(Some(i64::from_be_bytes(arr)))
    }
}

impl View for Snapshot<'_> {
    fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let cf = self.db.cf(store)?;
        self.db
            .rocks(self.snapshot.get_cf(cf, self.db.db_key(store, key)))
    }

    fn checkpoint(&self, store: &str) -> Result<Option<i64>, StoreError> {
        self.read_checkpoint(store, &checkpoint_key(store))
    }

    fn range(
        &self,
        store: &str,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        let mut it = self
            .snapshot
            .raw_iterator_cf_opt(self.db.cf(store)?, ReadOptions::default());
        let mut out = Vec::new();
        scan_range(&mut it, from, to, limit, &mut out);
        self.db.rocks(it.status())?;
        Ok(out)
    }

    fn last_in(
        &self,
        store: &str,
        from: &[u8],
        to: &[u8],
    ) -> Result<Option<super::Entry>, StoreError> {
        let mut it = self
            .snapshot
            .raw_iterator_cf_opt(self.db.cf(store)?, ReadOptions::default());
        it.seek_for_prev(to);
        if it.key() == Some(to) {
            it.prev();
        }
        let last = match (it.key(), it.value()) {
            (Some(k), Some(v)) if k >= from => Some((k.to_vec(), v.to_vec())),
            _ => None,
        };
        self.db.rocks(it.status())?;
        Ok(last)
    }

    fn windows(
        &self,
        store: &str,
        inner: &[u8],
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        let seg = self.db.segments_of(store)?;
        let mut it = self
            .snapshot
            .raw_iterator_cf_opt(self.db.cf(store)?, ReadOptions::default());
        let mut out = Vec::new();
        scan_windows(&seg, &mut it, inner, from, to, limit, &mut out);
        self.db.rocks(it.status())?;
        Ok(out)
    }

    fn all_windows(
        &self,
        store: &str,
        from: i64,
        to: i64,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        let seg = self.db.segments_of(store)?;
        let mut it = self
            .snapshot
            .raw_iterator_cf_opt(self.db.cf(store)?, ReadOptions::default());
        let mut out = Vec::new();
        scan_all_windows(&seg, &mut it, from, to, after, limit, &mut out);
        self.db.rocks(it.status())?;
        Ok(out)
    }

    /// By segment, then key.
    fn window_order(&self, store: &str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(self.db.segments_of(store)?.db_key(key))
    }
}

//! State stores: one RocksDB instance per task, a column family per store plus a metadata
//! family holding each store's changelog checkpoint, so data and checkpoint are written in one
//! atomic batch. Every instance of the process shares one block cache (which also accounts the
//! memtables through a write-buffer manager) and one background thread pool, so memory is
//! bounded per process rather than per shard. In-memory stores ([`memory`]) are a `BTreeMap`
//! restored from the changelog at every start.
//!
//! The families on disk follow the topology, not the other way round: opening a task's
//! database drops the families (and checkpoints) of stores the topology no longer has here, so
//! renaming, removing or moving a store to memory never stops a task from opening.

use crate::window::Segments;

pub mod memory;
pub mod snapshot;
pub use memory::MemoryStore;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBRawIterator, Env, FlushOptions,
    IngestExternalFileOptions, Options, WriteBatch, WriteBufferManager, WriteOptions,
};
pub use snapshot::{Snapshot, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

const META_CF: &str = "eddy-meta";
/// RocksDB's own family, always present: it cannot be dropped, only emptied.
const DEFAULT_CF: &str = rocksdb::DEFAULT_COLUMN_FAMILY_NAME;
const CHECKPOINT_PREFIX: &[u8] = b"checkpoint/";
/// When each checkpoint's store was last known to be at its changelog's end (ms since the
/// epoch), under the checkpoint's own name: a key of its own rather than a wider checkpoint
/// value, so an earlier version still reads the checkpoints of a newer one (it ignores these
/// keys; the times it leaves behind only age, which errs towards a rebuild).
const CAUGHT_UP_PREFIX: &[u8] = b"caught-up/";
/// Segment interval of a window store's family, so a family laid out for another interval
/// (its retention changed) is rebuilt rather than misread.
const SEGMENTS_PREFIX: &[u8] = b"segments/";
/// Subdirectory of a task's database where restore writes SST files before ingesting them.
/// RocksDB ignores directories it did not create, and the name is no file name it parses.
const INGEST_DIR: &str = "eddy-restore";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB at {path}: {cause}")]
    Rocks {
        path: PathBuf,
        cause: rocksdb::Error,
    },
    #[error("state directory {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("store {0:?} is not a store of this task")]
    Unknown(String),
    #[error("corrupt checkpoint for store {store:?} in {path}")]
    Checkpoint { store: String, path: PathBuf },
    #[error("store name {0:?} is reserved for eddy's checkpoints: rename the store")]
    Reserved(String),
}

impl StoreError {
    /// True for I/O errors (a full or failing disk, a lock another process still holds):
    /// they may go away, and the state on disk is still the last commit's.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Rocks { cause: source, .. } => matches!(
                source.kind(),
                rocksdb::ErrorKind::IOError
                    | rocksdb::ErrorKind::Busy
                    | rocksdb::ErrorKind::TryAgain
                    | rocksdb::ErrorKind::TimedOut
                    | rocksdb::ErrorKind::Incomplete
            ),
            StoreError::Io { .. } => true,
            StoreError::Unknown(_) | StoreError::Checkpoint { .. } | StoreError::Reserved(_) => {
                false
            }
        }
    }
}

/// Memory and threads shared by every RocksDB instance of the process.
pub struct StateResources {
    cache: Cache,
    write_buffers: WriteBufferManager,
    env: Env,
}

impl StateResources {
    /// `rocksdb_bytes`: block cache capacity; memtables are charged against it, so it bounds
    /// RocksDB's memory as a whole.
    pub fn new(rocksdb_bytes: usize) -> Result<Self, StoreError> {
        let cache = Cache::new_lru_cache(rocksdb_bytes);
        // Memtables may use half of the budget before RocksDB flushes. No stall: a stalled
        // write waits for memory that only a flush of ANOTHER task's database frees, and a
        // database without writes never flushes, so the processing thread waited forever
        // (facebook/rocksdb#11780; seen at 1M keys). Idle tasks' memtables may then overshoot
        // the bound by up to a write buffer each, until their next commit's writes flush them.
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            rocksdb_bytes / 2,
            false,
            cache.clone(),
        );
        let mut env = Env::new().map_err(|source| StoreError::Rocks {
            path: PathBuf::new(),
            cause: source,
        })?;
        env.set_background_threads(2);
        env.set_high_priority_background_threads(1);
        Ok(Self {
            cache,
            write_buffers,
            env,
        })
    }

    fn db_options(&self) -> Options {
        let mut o = Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        // Families flush together, so files on disk always pair data with the checkpoint of
        // the same commit. The WAL stays on (unsynced: a commit is one sequential append) so a
        // killed process keeps every committed batch and restarts with only the tail to replay.
        o.set_atomic_flush(true);
        o.set_env(&self.env);
        o.set_write_buffer_manager(&self.write_buffers);
        o.set_max_open_files(256);
        o.set_keep_log_file_num(2);
        o
    }

    fn cf_options(&self) -> Options {
        let mut o = Options::default();
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(&self.cache);
        t.set_cache_index_and_filter_blocks(true);
        t.set_bloom_filter(10.0, false);
        o.set_block_based_table_factory(&t);
        o.set_write_buffer_size(16 << 20);
        o.set_max_write_buffer_number(3);
        // A Bloom filter over each memtable's keys: most gets are of keys a store does not
        // hold yet (a new key, a join's first record at a time), and without it each such get
        // searches every memtable's skiplist.
        o.set_memtable_prefix_bloom_ratio(0.02);
        o.set_memtable_whole_key_filtering(true);
        o.set_compression_type(rocksdb::DBCompressionType::Lz4);
        o
    }

    /// A family's options: the metadata family's few keys (checkpoints, always present) and
    /// RocksDB's unused default family gain nothing from a memtable Bloom filter, and each
    /// memtable allocates its filter (~0.3 MiB) when created, empty or not: 21 MiB of the
    /// memtables' share at 64 tasks.
    fn family_options(&self, name: &str) -> Options {
        let mut o = self.cf_options();
        if name == META_CF || name == DEFAULT_CF {
            o.set_memtable_prefix_bloom_ratio(0.0);
            o.set_memtable_whole_key_filtering(false);
        }
        o
    }

    /// Bytes RocksDB holds in the shared cache (blocks and memtables).
    pub fn cache_usage(&self) -> usize {
        self.cache.get_usage()
    }
}

impl crate::metrics::MemoryUse for StateResources {
    fn memory_parts(&self) -> Vec<(&'static str, usize)> {
        // The write-buffer manager charges memtables to the cache, so blocks are the rest
        // (with what its reservation, in 256 KiB steps shrunk lazily, holds beyond them).
        let memtables = self.write_buffers.get_usage();
        let blocks = self.cache.get_usage().saturating_sub(memtables);
        vec![("rocksdb_blocks", blocks), ("rocksdb_memtables", memtables)]
    }
}

/// One task's RocksDB instance.
pub struct TaskDb {
    /// An iterator per family, kept until the next write: the database changes only when a
    /// commit (or a restore) writes, so between writes one iterator serves every range read
    /// and window fetch, where creating one per read cost a stream-stream join ~15 % of its
    /// throughput. An iterator pins the memtables and files it was made over, until that next
    /// write. First field: dropped before `db`, whose C++ object the iterators point into.
    iterators: Mutex<HashMap<String, DBRawIterator<'static>>>,
    db: DB,
    path: PathBuf,
    families: Vec<String>,
    write: WriteOptions,
    /// Window stores' families: their keys are laid out by segment (see [`crate::window`]).
    segments: std::collections::HashMap<String, Segments>,
    /// Per window store, the end of the range [`TaskDb::expire`] last deleted: a commit that
    /// expires nothing new writes no range tombstone (each one slows later reads until
    /// compaction drops it).
    expired_to: Mutex<HashMap<String, Vec<u8>>>,
    /// The families' options, for SST files built outside the database (see
    /// [`TaskDb::ingest`]) so they have the same format as RocksDB's own.
    sst_options: Options,
    /// The same without compression, for data that does not compress.
    plain_sst_options: Options,
}

/// Keys and values read by range, in key order.
pub type Entries = Vec<Entry>;
/// A stored key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A change to apply at commit: `None` deletes the key.
pub struct Change<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// What a write says of a store's place in its changelog (see [`crate::checkpoint`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The changelog offset the store's data reflects from now on (the next one to read);
    /// None: as it was.
    pub offset: Option<i64>,
    /// When the store was last known to be at its changelog's end, in ms since the epoch;
    /// None: as it was.
    pub caught_up_at: Option<i64>,
}

impl From<i64> for Mark {
    /// A new offset, with the time the store was last caught up left as it was.
    fn from(offset: i64) -> Self {
        Mark {
            offset: Some(offset),
            caught_up_at: None,
        }
    }
}

/// A store's checkpoint as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The changelog offset the data reflects (the next one to read).
    pub offset: i64,
    /// When the store was last known to be at its changelog's end, ms since the epoch. None
    /// only for a checkpoint nothing dated, which counts as too old to trust.
    pub caught_up_at: Option<i64>,
}

/// What opening a task's database changed so that its families match the topology.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Stores that had a family but are no longer persistent stores of this task (removed,
    /// renamed or now in memory): their family and checkpoint are gone.
    pub dropped: Vec<String>,
    /// Stores whose family held data without a checkpoint (a drop interrupted by a crash, the
    /// store added back before the next start finished it): emptied, so they restore their
    /// whole changelog.
    pub cleared: Vec<String>,
    /// Checkpoints written by a version that recorded no time with them (by checkpoint name),
    /// now dated by the database's newest data file (see [`TaskDb::open`]).
    pub dated: Vec<String>,
}

impl TaskDb {
    /// Open (or create) a task's database with a family for each of `stores`, dropping the
    /// families of stores that are no longer there.
    pub fn open(
        res: &StateResources,
        path: &Path,
        stores: &[String],
    ) -> Result<(Self, Reconciled), StoreError> {
        if let Some(s) = stores.iter().find(|s| *s == META_CF) {
            return Err(StoreError::Reserved(s.clone()));
        }
        std::fs::create_dir_all(path).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            cause: source,
        })?;
        // Before RocksDB opens it: opening writes files of its own.
        let written_at = newest_data_file(path);
        let existing = existing_families(res, path)?;
        // RocksDB refuses to open a database without naming every family it has.
        let mut names: Vec<&str> = stores.iter().map(String::as_str).collect();
        names.push(META_CF);
        for e in &existing {
            if !names.contains(&e.as_str()) {
                names.push(e);
            }
        }
        let cfs = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(*n, res.family_options(n)));
        let db = DB::open_cf_descriptors(&res.db_options(), path, cfs).map_err(|source| {
            StoreError::Rocks {
                path: path.to_path_buf(),
                cause: source,
            }
        })?;
        let mut db = Self {
            iterators: Mutex::default(),
            db,
            path: path.to_path_buf(),
            families: stores
                .iter()
                .cloned()
                .chain([META_CF.to_string()])
                .collect(),
            write: WriteOptions::default(),
            segments: Default::default(),
            expired_to: Default::default(),
            sst_options: res.cf_options(),
            plain_sst_options: {
                let mut o = res.cf_options();
                // The SST writer takes the bottommost level's compression first.
                o.set_compression_type(rocksdb::DBCompressionType::None);
                o.set_bottommost_compression_type(rocksdb::DBCompressionType::None);
                o
            },
        };
        let mut reconciled = db.reconcile(&existing, stores)?;
        reconciled.dated = db.date_undated(written_at)?;
        if !reconciled.dated.is_empty() {
            tracing::info!(path = %path.display(), checkpoints = ?reconciled.dated, written_at = ?written_at,
                "checkpoints from an earlier eddy version carry no time: taking the last write to the store's files as when they were last caught up with their changelogs");
        }
        // SST files a killed restore wrote but did not ingest: whatever restores next (a bulk
        // restore, batches, a standby) starts from the checkpoint and never needs them.
        db.clear_ingest_dir()?;
        Ok((db, reconciled))
    }

    /// Make the families and checkpoints on disk match `stores`. A checkpoint is only valid
    /// next to the data it describes, so checkpoints go first and families after: a crash in
    /// between leaves families without checkpoints, which the next open clears or drops.
    fn reconcile(
        &mut self,
        existing: &[String],
        stores: &[String],
    ) -> Result<Reconciled, StoreError> {
        let mut out = Reconciled::default();
        let kept = |s: &str| stores.iter().any(|w| w == s) && existing.iter().any(|e| e == s);
        let mut batch = WriteBatch::default();
        let meta = self.cf(META_CF)?;
        let mut it = self.db.raw_iterator_cf(meta);
        it.seek(CHECKPOINT_PREFIX);
        while let Some(key) = it.key().filter(|k| k.starts_with(CHECKPOINT_PREFIX)) {
            let name = String::from_utf8_lossy(&key[CHECKPOINT_PREFIX.len()..]);
            // A global table's checkpoints are per partition: `<store>#<partition>`.
            let store = name.split('#').next().unwrap_or_default();
            if !kept(store) {
                batch.delete_cf(meta, key);
            }
            it.next();
        }
        self.rocks(it.status())?;
        // A time means something only next to its checkpoint: the times of stores gone and of
        // checkpoints gone (a store emptied, a drop cut short) go too.
        it.seek(CAUGHT_UP_PREFIX);
        while let Some(key) = it.key().filter(|k| k.starts_with(CAUGHT_UP_PREFIX)) {
            let name = &key[CAUGHT_UP_PREFIX.len()..];
            let store = String::from_utf8_lossy(name);
            let store = store.split('#').next().unwrap_or_default();
            let checkpoint = [CHECKPOINT_PREFIX, name].concat();
            if !kept(store) || self.rocks(self.db.get_cf(meta, &checkpoint))?.is_none() {
                batch.delete_cf(meta, key);
            }
            it.next();
        }
        self.rocks(it.status())?;
        drop(it);
        for s in stores.iter().filter(|s| kept(s)) {
            if self.checkpoint(s)?.is_none()
                && self.partition_checkpoints(s)?.is_empty()
                && self.clear_into(&mut batch, s)?
            {
                out.cleared.push(s.clone());
            }
        }
        // `default` cannot be dropped: a store of that name that is gone is emptied instead.
        if !stores.iter().any(|s| s == DEFAULT_CF) && self.clear_into(&mut batch, DEFAULT_CF)? {
            out.dropped.push(DEFAULT_CF.to_string());
        }
        self.write_batch(batch)?;
        for e in existing {
            if e != META_CF && e != DEFAULT_CF && !stores.contains(e) {
                // `&mut self`: no other thread reads meanwhile.
                drop(self.forget_iterators());
                let dropped = self.db.drop_cf(e);
                self.rocks(dropped)?;
                out.dropped.push(e.clone());
            }
        }
        Ok(out)
    }

    /// Declare which stores are window stores, with their segments. A window store whose
    /// family was laid out for another segment interval (its retention changed) is emptied
    /// with its checkpoint, so it restores from its changelog in the new layout; those are
    /// returned.
    pub fn with_segments(
        mut self,
        stores: &[(String, Segments)],
    ) -> Result<(Self, Vec<String>), StoreError> {
        let mut cleared = Vec::new();
        let meta = self.cf(META_CF)?;
        let mut batch = WriteBatch::default();
        for (store, seg) in stores {
            let key = [SEGMENTS_PREFIX, store.as_bytes()].concat();
            let had = self.rocks(self.db.get_cf(meta, &key))?;
            // The interval, and a marker for sessions, whose keys are laid out differently.
            let mut want = seg.interval.to_be_bytes().to_vec();
            if seg.schema == crate::window::KeySchema::Session {
                want.push(1);
            }
            if had.as_deref() != Some(&want[..]) {
                if had.is_some() && self.clear_into(&mut batch, store)? {
                    batch.delete_cf(meta, checkpoint_key(store));
                    batch.delete_cf(meta, caught_up_key(store));
                    cleared.push(store.clone());
                } else if had.is_none() && self.checkpoint(store)?.is_some() {
                    // A key-value store of the same name became a window store: its keys mean
                    // something else now.
                    self.clear_into(&mut batch, store)?;
                    batch.delete_cf(meta, checkpoint_key(store));
                    batch.delete_cf(meta, caught_up_key(store));
                    cleared.push(store.clone());
                }
                batch.put_cf(meta, &key, &want);
            }
        }
        self.write_batch(batch)?;
        self.segments = stores.iter().cloned().collect();
        Ok((self, cleared))
    }

    /// The key `key` of `store` has in RocksDB.
    fn db_key<'k>(&self, store: &str, key: &'k [u8]) -> Cow<'k, [u8]> {
        match self.segments.get(store) {
            Some(seg) => Cow::Owned(seg.db_key(key)),
            None => Cow::Borrowed(key),
        }
    }

    /// Drop the segments of a window store that hold only windows starting before `before`:
    /// one range deletion, whose files compaction discards without reading them.
    pub fn expire(&self, store: &str, before: i64) -> Result<(), StoreError> {
        let Some((from, to)) = self
            .segments
            .get(store)
            .and_then(|s| s.expired_range(before))
        else {
            return Ok(());
        };
        let mut expired = self
            .expired_to
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if expired.get(store) == Some(&to) {
            return Ok(());
        }
        let cf = self.cf(store)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(cf, &from, &to);
        self.write_batch(batch)?;
        expired.insert(store.to_string(), to);
        Ok(())
    }

    /// Remove the database of a task that has no persistent store any more. Opening it first
    /// takes RocksDB's lock, so a database another process uses is never deleted. Returns the
    /// stores whose families it held.
    pub fn remove(res: &StateResources, path: &Path) -> Result<Vec<String>, StoreError> {
        if !path.exists() {
            return Ok(Vec::new());
        }
        let existing = existing_families(res, path)?;
        if !existing.is_empty() {
            let cfs = existing
                .iter()
                .map(|n| ColumnFamilyDescriptor::new(n, res.family_options(n)));
            let db = DB::open_cf_descriptors(&res.db_options(), path, cfs).map_err(|source| {
                StoreError::Rocks {
                    path: path.to_path_buf(),
                    cause: source,
                }
            })?;
            drop(db);
        }
        wipe(path)?;
        Ok(existing
            .into_iter()
            .filter(|f| f != META_CF && f != DEFAULT_CF)
            .collect())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write a batch. Every write goes through here: kept iterators would not see it.
    fn write_batch(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let _kept = self.forget_iterators();
        self.rocks(self.db.write_opt(batch, &self.write))
    }

    /// Drop the kept iterators; hold the guard across the change, so that no other thread
    /// (global stores are shared) makes one over the state before it and keeps it.
    fn forget_iterators(&self) -> MutexGuard<'_, HashMap<String, DBRawIterator<'static>>> {
        let mut kept = self
            .iterators
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        kept.clear();
        kept
    }

    /// Run `read` with `store`'s kept iterator (made on first use since the last write),
    /// then check the iterator's status.
    fn with_iterator<T>(
        &self,
        store: &str,
        read: impl FnOnce(&mut DBRawIterator<'static>) -> T,
    ) -> Result<T, StoreError> {
        let mut kept = self
            .iterators
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let it = match kept.get_mut(store) {
            Some(it) => it,
            None => {
                let it = self.db.raw_iterator_cf(self.cf(store)?);
                // SAFETY: the iterator only borrows `self.db` for its lifetime; it is kept in
                // `self.iterators`, which is dropped before `self.db` and emptied before every
                // write, ingestion, flush and family drop, so it never outlives the database
                // or reads a family that is gone. The C++ database does not move with `self`.
                let it: DBRawIterator<'static> = unsafe { std::mem::transmute(it) };
                kept.entry(store.to_string()).or_insert(it)
            }
        };
        let out = read(it);
        self.rocks(it.status())?;
        Ok(out)
    }

    fn rocks<T>(&self, r: Result<T, rocksdb::Error>) -> Result<T, StoreError> {
        r.map_err(|source| StoreError::Rocks {
            path: self.path.clone(),
            cause: source,
        })
    }

    fn cf(&self, store: &str) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(store)
            .ok_or_else(|| StoreError::Unknown(store.to_string()))
    }

    pub fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let cf = self.cf(store)?;
        self.rocks(self.db.get_cf(cf, self.db_key(store, key)))
    }

    /// The windows of `inner` in a window or session store whose time (a window's start, a
    /// session's end) is in `[from, to]`, in key order, with their changelog keys. Reads the
    /// segments that hold any, seeking from one to the next.
    pub fn fetch(
        &self,
        store: &str,
        inner: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Entries, StoreError> {
        let seg = self.segments_of(store)?;
        let mut out = Vec::new();
        self.with_iterator(store, |it| {
            scan_windows(&seg, it, inner, from, to, usize::MAX, &mut out);
        })?;
        Ok(out)
    }

    /// Every window of a window or session store whose time is in `[from, to]`, with its
    /// changelog key, in segment then key order.
    pub fn fetch_all(&self, store: &str, from: i64, to: i64) -> Result<Entries, StoreError> {
        let seg = self.segments_of(store)?;
        let mut it = self.db.raw_iterator_cf(self.cf(store)?);
        let mut out = Vec::new();
        scan_all_windows(&seg, &mut it, from, to, None, usize::MAX, &mut out);
        self.rocks(it.status())?;
        Ok(out)
    }

    /// The keys and values of a key-value store in `[from, to)`, in key order.
    pub fn range(&self, store: &str, from: &[u8], to: &[u8]) -> Result<Entries, StoreError> {
        let mut out = Vec::new();
        self.with_iterator(store, |it| {
            scan_range(it, from, Some(to), usize::MAX, &mut out);
        })?;
        Ok(out)
    }

    /// The segments of a window or session store.
    fn segments_of(&self, store: &str) -> Result<Segments, StoreError> {
        self.segments
            .get(store)
            .copied()
            .ok_or_else(|| StoreError::Unknown(format!("{store} (not a window store)")))
    }

    /// The changelog offset this store's data reflects (next offset to read), if any.
    pub fn checkpoint(&self, store: &str) -> Result<Option<i64>, StoreError> {
        let meta = self.cf(META_CF)?;
        match self.rocks(self.db.get_cf(meta, checkpoint_key(store)))? {
            None => Ok(None),
            Some(b) => {
                let arr: [u8; 8] = b
                    .as_slice()
                    .try_into()
                    .map_err(|_| StoreError::Checkpoint {
                        store: store.to_string(),
                        path: self.path.clone(),
                    })?;
                Ok(Some(i64::from_be_bytes(arr)))
            }
        }
    }

    /// A checkpoint (a store's, or one partition's of a store fed by several, named by
    /// [`partition_checkpoint`]) with the time it was last caught up.
    pub fn stored_checkpoint(&self, name: &str) -> Result<Option<Checkpoint>, StoreError> {
        let Some(offset) = self.checkpoint(name)? else {
            return Ok(None);
        };
        Ok(Some(Checkpoint {
            offset,
            caught_up_at: self.caught_up_at(name)?,
        }))
    }

    /// When the store (or partition) named was last known to be at its changelog's end.
    pub fn caught_up_at(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let meta = self.cf(META_CF)?;
        match self.rocks(self.db.get_cf(meta, caught_up_key(name)))? {
            None => Ok(None),
            Some(b) => <[u8; 8]>::try_from(b.as_slice())
                .map(|a| Some(i64::from_be_bytes(a)))
                .map_err(|_| StoreError::Checkpoint {
                    store: name.to_string(),
                    path: self.path.clone(),
                }),
        }
    }

    /// Give every checkpoint without a time `written_at` (none known: the epoch, so it counts
    /// as too old): checkpoints of versions that recorded no time. The last write to the
    /// database's files is the latest a store can have been caught up (a standby's last batch
    /// may have lagged; an active task's last commit did not): a volume left alone for a day
    /// reads as a day old. A copy that did not keep the files' times (`cp` without `-p`)
    /// reads as new. Returns the checkpoints dated.
    fn date_undated(&self, written_at: Option<i64>) -> Result<Vec<String>, StoreError> {
        let meta = self.cf(META_CF)?;
        let mut undated = Vec::new();
        let mut it = self.db.raw_iterator_cf(meta);
        it.seek(CHECKPOINT_PREFIX);
        while let Some(key) = it.key().filter(|k| k.starts_with(CHECKPOINT_PREFIX)) {
            undated.push(String::from_utf8_lossy(&key[CHECKPOINT_PREFIX.len()..]).into_owned());
            it.next();
        }
        self.rocks(it.status())?;
        drop(it);
        let mut batch = WriteBatch::default();
        let mut dated = Vec::new();
        for name in undated {
            if self.caught_up_at(&name)?.is_none() {
                batch.put_cf(
                    meta,
                    caught_up_key(&name),
                    written_at.unwrap_or(0).to_be_bytes(),
                );
                dated.push(name);
            }
        }
        if !dated.is_empty() {
            self.write_batch(batch)?;
        }
        Ok(dated)
    }

    /// The checkpoints of a store fed by several partitions (a global table's, written under
    /// [`partition_checkpoint`] names): partition → next offset.
    pub fn partition_checkpoints(
        &self,
        store: &str,
    ) -> Result<std::collections::HashMap<i32, i64>, StoreError> {
        let meta = self.cf(META_CF)?;
        let prefix = checkpoint_key(&format!("{store}#"));
        let mut out = std::collections::HashMap::new();
        let mut it = self.db.raw_iterator_cf(meta);
        it.seek(&prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(&prefix) {
                break;
            }
            let partition = std::str::from_utf8(&k[prefix.len()..])
                .ok()
                .and_then(|p| p.parse::<i32>().ok());
            let offset = <[u8; 8]>::try_from(v).ok().map(i64::from_be_bytes);
            match (partition, offset) {
                (Some(p), Some(o)) => {
                    out.insert(p, o);
                }
                _ => {
                    return Err(StoreError::Checkpoint {
                        store: store.to_string(),
                        path: self.path.clone(),
                    });
                }
            }
            it.next();
        }
        self.rocks(it.status())?;
        Ok(out)
    }

    /// Empty a store fed by several partitions and delete their checkpoints.
    pub fn clear_partitioned(&self, store: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        self.clear_into(&mut batch, store)?;
        let meta = self.cf(META_CF)?;
        for p in self.partition_checkpoints(store)?.keys() {
            let name = partition_checkpoint(store, *p);
            batch.delete_cf(meta, checkpoint_key(&name));
            batch.delete_cf(meta, caught_up_key(&name));
        }
        self.write_batch(batch)
    }

    /// Apply changes of several stores and their new checkpoints in ONE atomic batch.
    pub fn write<'a, M: Into<Mark>>(
        &self,
        changes: impl IntoIterator<Item = (&'a str, Change<'a>)>,
        checkpoints: impl IntoIterator<Item = (&'a str, M)>,
    ) -> Result<(), StoreError> {
        self.write_clearing(std::iter::empty(), changes, checkpoints)
    }

    /// [`Self::write`] after deleting whole key ranges `[from, to)` of key-value stores (not
    /// window stores, whose keys are laid out by segment): one
    /// range tombstone each instead of a tombstone per key, which a memtable flush applies
    /// to the keys it covers, so emptied ranges leave nothing on disk.
    pub fn write_clearing<'a, M: Into<Mark>>(
        &self,
        cleared: impl IntoIterator<Item = (&'a str, &'a [u8], &'a [u8])>,
        changes: impl IntoIterator<Item = (&'a str, Change<'a>)>,
        checkpoints: impl IntoIterator<Item = (&'a str, M)>,
    ) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (store, from, to) in cleared {
            batch.delete_range_cf(self.cf(store)?, from, to);
        }
        for (store, c) in changes {
            let cf = self.cf(store)?;
            let key = self.db_key(store, c.key);
            match c.value {
                Some(v) => batch.put_cf(cf, key, v),
                // A key the database surely lacks (memtables and bloom filters, no disk read)
                // needs no tombstone: a window buffered and emitted, or a session replaced,
                // within one commit never reaches the disk.
                None if !self.db.key_may_exist_cf(cf, &key) => {}
                None => batch.delete_cf(cf, key),
            }
        }
        let meta = self.cf(META_CF)?;
        for (store, mark) in checkpoints {
            let mark = mark.into();
            if let Some(offset) = mark.offset {
                batch.put_cf(meta, checkpoint_key(store), offset.to_be_bytes());
            }
            if let Some(at) = mark.caught_up_at {
                batch.put_cf(meta, caught_up_key(store), at.to_be_bytes());
            }
        }
        self.write_batch(batch)
    }

    /// The key a changelog record's key has in `store`'s family: what restore writes into
    /// the SST files it ingests, which bypass [`Self::write`]. Window stores prefix it with
    /// its segment; other stores keep changelog keys as they are.
    pub fn stored_key<'k>(&self, store: &str, key: &'k [u8]) -> Cow<'k, [u8]> {
        self.db_key(store, key)
    }

    /// Options for an SST file to give to [`Self::ingest`].
    pub fn sst_options(&self) -> &Options {
        &self.sst_options
    }

    /// [`Self::sst_options`] without compression (blocks stay readable whatever the family's
    /// compression: each says how it was written).
    pub fn plain_sst_options(&self) -> &Options {
        &self.plain_sst_options
    }

    /// The directory for SST files to ingest (created if missing). It is on the database's
    /// file system, so ingesting a file there moves it (a hard link) instead of copying it.
    pub fn ingest_dir(&self) -> Result<PathBuf, StoreError> {
        let dir = self.path.join(INGEST_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            path: dir.clone(),
            cause: source,
        })?;
        Ok(dir)
    }

    /// Remove what is left in [`Self::ingest_dir`] (files of a restore that failed or was
    /// killed before ingesting them).
    pub fn clear_ingest_dir(&self) -> Result<(), StoreError> {
        wipe(&self.path.join(INGEST_DIR))
    }

    /// Add an SST file (sorted, written with [`Self::sst_options`] or
    /// [`Self::plain_sst_options`]) to `store`, then set the
    /// store's checkpoint. Ingestion gives the file's keys sequence numbers above everything
    /// in the database, so a later file wins over an earlier one and over older data; it
    /// returns once the file is linked and synced and the manifest naming it is synced, so
    /// the checkpoint, written after it (through the WAL like a commit's), never claims
    /// records the store does not have. A crash in between leaves data ahead of the
    /// checkpoint, which the next restore writes again with the same values.
    pub fn ingest(
        &self,
        store: &str,
        file: Option<&Path>,
        checkpoint: impl Into<Mark>,
    ) -> Result<(), StoreError> {
        if let Some(file) = file {
            let mut o = IngestExternalFileOptions::default();
            o.set_move_files(true);
            let cf = self.cf(store)?;
            let _kept = self.forget_iterators();
            self.rocks(self.db.ingest_external_file_cf_opts(cf, &o, vec![file]))?;
        }
        self.write(std::iter::empty(), [(store, checkpoint.into())])
    }

    /// Empty a store and delete its checkpoint in one batch: it then restores its changelog
    /// from the start, as a new store would.
    pub fn clear(&self, store: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        self.clear_into(&mut batch, store)?;
        let meta = self.cf(META_CF)?;
        batch.delete_cf(meta, checkpoint_key(store));
        batch.delete_cf(meta, caught_up_key(store));
        self.write_batch(batch)
    }

    /// Add a deletion of every key of `store` to `batch`; false if it has none.
    fn clear_into(&self, batch: &mut WriteBatch, store: &str) -> Result<bool, StoreError> {
        let cf = self.cf(store)?;
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_to_last();
        self.rocks(it.status())?;
        let Some(last) = it.key() else {
            return Ok(false);
        };
        // The empty key is the smallest; the last key followed by a 0 byte the next one after it.
        let mut end = last.to_vec();
        end.push(0);
        batch.delete_range_cf(cf, Vec::new(), end);
        Ok(true)
    }

    /// Persist memtables (all families at once) so a clean restart replays nothing.
    pub fn flush(&self) -> Result<(), StoreError> {
        let names = self
            .families
            .iter()
            .map(|n| self.cf(n))
            .collect::<Result<Vec<_>, _>>()?;
        let mut fo = FlushOptions::default();
        fo.set_wait(true);
        // Kept iterators would hold on to the flushed memtables.
        let _kept = self.forget_iterators();
        self.rocks(self.db.flush_cfs_opt(&names, &fo))
    }

    /// Every key and value of a store, in key order.
    #[cfg(test)]
    pub(crate) fn contents(&self, store: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let cf = self.cf(store).expect("store");
        self.db
            .iterator_cf(cf, rocksdb::IteratorMode::Start)
            .map(|kv| {
                let (k, v) = kv.expect("read");
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }

    /// Number of SST files of a store on each level (L0 first).
    #[cfg(test)]
    pub(crate) fn files_per_level(&self, store: &str) -> Vec<u64> {
        let cf = self.cf(store).expect("store");
        (0..7)
            .map(|l| {
                let p = format!("rocksdb.num-files-at-level{l}");
                self.db
                    .property_int_value_cf(cf, p.as_str())
                    .expect("property")
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Estimated number of keys and bytes of live data in a store.
    pub fn size(&self, store: &str) -> (u64, u64) {
        let Ok(cf) = self.cf(store) else {
            return (0, 0);
        };
        let prop = |p: &str| {
            self.db
                .property_int_value_cf(cf, p)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        (
            prop("rocksdb.estimate-num-keys"),
            prop("rocksdb.estimate-live-data-size") + prop("rocksdb.cur-size-all-mem-tables"),
        )
    }
}

/// The checkpoint name of one partition of a store fed by several (a global table's).
pub fn partition_checkpoint(store: &str, partition: i32) -> String {
    format!("{store}#{partition}")
}

/// Add the windows of `inner` whose time is in `[from, to]` to `out` (at most `limit`), in
/// time order, with their changelog keys: reads the segments that hold any, seeking from one
/// to the next. Callers check the iterator's status.
fn scan_windows(
    seg: &Segments,
    it: &mut DBRawIterator<'_>,
    inner: &[u8],
    from: i64,
    to: i64,
    limit: usize,
    out: &mut Entries,
) {
    let (lo, hi) = seg.schema.bounds(inner, from, to);
    let (first, last) = (seg.segment(from), seg.segment(to));
    let mut segment = first;
    while segment <= last && out.len() < limit {
        it.seek([&Segments::prefix(segment)[..], &lo].concat());
        segment = loop {
            let Some(k) = it.key() else {
                break i64::MAX;
            };
            match Segments::segment_of(k) {
                // A later segment holds keys: go on from there.
                Some(s) if s != segment => break s,
                Some(_) => {}
                None => break i64::MAX,
            }
            let key = seg.changelog_key(k);
            if key > hi.as_slice() || out.len() >= limit {
                break segment + 1;
            }
            if seg.schema.matches(key, inner, from, to)
                && let Some(v) = it.value()
            {
                out.push((key.to_vec(), v.to_vec()));
            }
            it.next();
        };
    }
}

/// Add every window whose time is in `[from, to]` to `out` (at most `limit`), in segment then
/// key order, with its changelog key; after the one stored under `after` if given.
fn scan_all_windows(
    seg: &Segments,
    it: &mut DBRawIterator<'_>,
    from: i64,
    to: i64,
    after: Option<&[u8]>,
    limit: usize,
    out: &mut Entries,
) {
    let end = Segments::prefix(seg.segment(to).saturating_add(1));
    let start = Segments::prefix(seg.segment(from));
    match after {
        Some(a) if a >= &start[..] => {
            it.seek(a);
            if it.key() == Some(a) {
                it.next();
            }
        }
        _ => it.seek(start),
    }
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        if k >= &end[..] || out.len() >= limit {
            break;
        }
        let key = seg.changelog_key(k);
        if seg.schema.time(key).is_some_and(|t| from <= t && t <= to) {
            out.push((key.to_vec(), v.to_vec()));
        }
        it.next();
    }
}

/// Add the keys and values in `[from, to)` (no end: to the last key) to `out`, at most `limit`.
fn scan_range(
    it: &mut DBRawIterator<'_>,
    from: &[u8],
    to: Option<&[u8]>,
    limit: usize,
    out: &mut Entries,
) {
    it.seek(from);
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        if to.is_some_and(|to| k >= to) || out.len() >= limit {
            break;
        }
        out.push((k.to_vec(), v.to_vec()));
        it.next();
    }
}

fn checkpoint_key(store: &str) -> Vec<u8> {
    [CHECKPOINT_PREFIX, store.as_bytes()].concat()
}

fn caught_up_key(name: &str) -> Vec<u8> {
    [CAUGHT_UP_PREFIX, name.as_bytes()].concat()
}

/// When the newest SST or WAL file of the database at `path` was last modified, in ms since
/// the epoch: the last write to the store's data (a commit, a restored or standby batch, a
/// flush). None if there is none, or the file system does not say.
fn newest_data_file(path: &Path) -> Option<i64> {
    std::fs::read_dir(path)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            // RocksDB's numbered data files; `LOG` (its info log) is rewritten at every open.
            name.ends_with(".sst") || name.ends_with(".log")
        })
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .filter_map(|d| i64::try_from(d.as_millis()).ok())
        .max()
}

/// The families of the database at `path`; none if there is no database yet.
fn existing_families(res: &StateResources, path: &Path) -> Result<Vec<String>, StoreError> {
    if !path.join("CURRENT").exists() {
        return Ok(Vec::new());
    }
    DB::list_cf(&res.db_options(), path).map_err(|source| StoreError::Rocks {
        path: path.to_path_buf(),
        cause: source,
    })
}

/// Remove a task's state directory.
fn wipe(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::Io {
            path: path.to_path_buf(),
            cause: source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_and_checkpoint_survive_reopen_after_flush() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let stores = vec!["counts".to_string()];
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &stores).expect("open");
            assert_eq!(db.checkpoint("counts").expect("read"), None);
            db.write(
                [(
                    "counts",
                    Change {
                        key: b"a",
                        value: Some(b"1"),
                    },
                )],
                [(
                    "counts",
                    Mark {
                        offset: Some(42),
                        caught_up_at: Some(1_000),
                    },
                )],
            )
            .expect("write");
            db.flush().expect("flush");
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &stores).expect("reopen");
        assert_eq!(
            changed,
            Reconciled::default(),
            "same stores: nothing to change"
        );
        assert_eq!(db.get("counts", b"a").expect("get"), Some(b"1".to_vec()));
        assert_eq!(db.checkpoint("counts").expect("read"), Some(42));
        assert!(matches!(db.get("nope", b"a"), Err(StoreError::Unknown(_))));
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Write `key` = `value` to each store with checkpoint `offset`, caught up now, as a
    /// commit would.
    fn commit(db: &TaskDb, stores: &[&str], key: &[u8], value: &[u8], offset: i64) {
        let mark = Mark {
            offset: Some(offset),
            caught_up_at: Some(crate::record::now_ms()),
        };
        db.write(
            stores.iter().map(|s| {
                (
                    *s,
                    Change {
                        key,
                        value: Some(value),
                    },
                )
            }),
            stores.iter().map(|s| (*s, mark)),
        )
        .expect("write");
        db.flush().expect("flush");
    }

    fn families(dir: &Path) -> Vec<String> {
        let mut f = DB::list_cf(&Options::default(), dir).expect("list");
        f.sort();
        f
    }

    #[test]
    fn a_cleared_range_is_gone_from_the_store_but_keys_put_with_it_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let (db, _) = TaskDb::open(&res, dir.path(), &names(&["buf"])).expect("open");
        for k in [b"a", b"b", b"c", b"d"] {
            commit(&db, &["buf"], k, b"v", 1);
        }
        let put = Change {
            key: b"b",
            value: Some(b"new"),
        };
        db.write_clearing(
            [("buf", &b"a"[..], &b"d"[..])],
            [("buf", put)],
            [("buf", 2)],
        )
        .expect("write");
        db.flush().expect("flush");
        let left = db.range("buf", b"", b"z").expect("range");
        assert_eq!(
            left,
            vec![
                (b"b".to_vec(), b"new".to_vec()),
                (b"d".to_vec(), b"v".to_vec())
            ],
            "[a, d) cleared, b put again in the same batch"
        );
        assert_eq!(db.checkpoint("buf").expect("checkpoint"), Some(2));
        // Deleting what is there, and what never was, both read back as absent.
        let gone = |key: &'static [u8]| ("buf", Change { key, value: None });
        db.write([gone(b"d"), gone(b"never")], [("buf", 3)])
            .expect("write");
        assert_eq!(db.get("buf", b"d").expect("get"), None);
        db.flush().expect("flush");
        assert_eq!(db.range("buf", b"c", b"z").expect("range"), vec![]);
    }

    #[test]
    fn a_removed_store_is_dropped_and_a_returning_one_starts_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
            commit(&db, &["a", "b"], b"k", b"v", 7);
        }
        {
            // `a` removed (or now in memory): RocksDB would refuse to open without naming it.
            let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["b"])).expect("open");
            assert_eq!(changed.dropped, names(&["a"]));
            assert!(changed.cleared.is_empty());
            assert_eq!(db.get("b", b"k").expect("get"), Some(b"v".to_vec()));
            assert_eq!(
                db.checkpoint("b").expect("read"),
                Some(7),
                "b kept as it was"
            );
            assert_eq!(
                db.checkpoint("a").expect("read"),
                None,
                "a's checkpoint dropped"
            );
            db.flush().expect("flush");
        }
        assert_eq!(families(dir.path()), names(&["b", "default", META_CF]));
        // `a` back (switched back from memory): a new, empty family with no checkpoint, so it
        // restores its whole changelog.
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
        assert_eq!(changed, Reconciled::default());
        assert_eq!(db.get("a", b"k").expect("get"), None);
        assert_eq!(db.checkpoint("a").expect("read"), None);
        assert_eq!(db.checkpoint("b").expect("read"), Some(7));
    }

    #[test]
    fn a_renamed_store_starts_empty_under_its_new_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["old"])).expect("open");
            commit(&db, &["old"], b"k", b"v", 3);
        }
        {
            let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["new"])).expect("open");
            assert_eq!(changed.dropped, names(&["old"]));
            assert_eq!(db.get("new", b"k").expect("get"), None);
            assert_eq!(db.checkpoint("new").expect("read"), None);
            assert_eq!(db.checkpoint("old").expect("read"), None);
        }
        // Renamed back: the old data is gone for good, the store restores from its changelog.
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["old"])).expect("open");
        assert_eq!(changed.dropped, names(&["new"]));
        assert_eq!(db.get("old", b"k").expect("get"), None);
        assert_eq!(db.checkpoint("old").expect("read"), None);
    }

    #[test]
    fn checkpoints_and_data_that_do_not_go_together_are_discarded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["a"])).expect("open");
            // As a crash between dropping a checkpoint and its family can leave them: data
            // without a checkpoint, and a checkpoint of a store that has no family.
            db.write(
                [(
                    "a",
                    Change {
                        key: b"k",
                        value: Some(b"stale"),
                    },
                )],
                [("b", 9)],
            )
            .expect("write");
            db.flush().expect("flush");
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
        assert_eq!(changed.cleared, names(&["a"]));
        assert_eq!(
            db.get("a", b"k").expect("get"),
            None,
            "untrusted data cleared"
        );
        assert_eq!(
            db.checkpoint("b").expect("read"),
            None,
            "no family, no checkpoint"
        );
    }

    #[test]
    fn clear_empties_one_store_and_keeps_the_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
            commit(&db, &["a", "b"], b"k1", b"v", 5);
            commit(&db, &["a", "b"], &[0xff, 0xff], b"v", 6);
            commit(&db, &["a", "b"], b"", b"v", 7);
            db.clear("b").expect("clear");
            db.clear("b").expect("clearing an empty store is fine");
            db.flush().expect("flush");
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
        assert_eq!(changed, Reconciled::default());
        for k in [&b"k1"[..], &[0xff, 0xff], b""] {
            assert_eq!(db.get("a", k).expect("get"), Some(b"v".to_vec()));
            assert_eq!(db.get("b", k).expect("get"), None);
        }
        assert_eq!(db.checkpoint("a").expect("read"), Some(7));
        assert_eq!(db.checkpoint("b").expect("read"), None);
    }

    #[test]
    fn a_store_named_default_is_emptied_when_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["default"])).expect("open");
            commit(&db, &["default"], b"k", b"v", 2);
        }
        {
            let (_, changed) = TaskDb::open(&res, dir.path(), &names(&["x"])).expect("open");
            assert_eq!(changed.dropped, names(&["default"]));
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["default"])).expect("open");
        assert_eq!(changed.dropped, names(&["x"]));
        assert!(changed.cleared.is_empty(), "emptied already");
        assert_eq!(db.get("default", b"k").expect("get"), None);
        assert_eq!(db.checkpoint("default").expect("read"), None);
    }

    #[test]
    fn remove_deletes_the_database_unless_another_process_holds_it() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dir = parent.path().join("0_0");
        let res = StateResources::new(8 << 20).expect("resources");
        assert!(
            TaskDb::remove(&res, &dir)
                .expect("nothing there")
                .is_empty()
        );
        let (db, _) = TaskDb::open(&res, &dir, &names(&["a"])).expect("open");
        commit(&db, &["a"], b"k", b"v", 1);
        assert!(
            TaskDb::remove(&res, &dir).is_err(),
            "the database is open: RocksDB's lock protects it"
        );
        assert!(dir.join("CURRENT").exists());
        drop(db);
        assert_eq!(TaskDb::remove(&res, &dir).expect("remove"), names(&["a"]));
        assert!(!dir.exists());
    }

    #[test]
    fn a_window_store_expires_whole_segments_and_is_rebuilt_when_its_segments_change() {
        use crate::window::{Segments, key};
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let seg = Segments::for_retention(
            eddy_crds::Duration::from_millis(120_000),
            crate::window::KeySchema::Window { size: 1_000 },
        );
        let open = |seg: Segments| {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["w"])).expect("open");
            db.with_segments(&[("w".to_string(), seg)])
                .expect("segments")
        };
        {
            let (db, cleared) = open(seg);
            assert!(cleared.is_empty());
            let (old, live) = (key(b"k", 10_000), key(b"k", 250_000));
            for k in [&old, &live] {
                db.write(
                    [(
                        "w",
                        Change {
                            key: k,
                            value: Some(b"1"),
                        },
                    )],
                    [("w", 2)],
                )
                .expect("write");
            }
            assert_eq!(db.get("w", &old).expect("get"), Some(b"1".to_vec()));
            // Largest start 300_000, retention 120_000: the segment of 10_000 is wholly expired.
            db.expire("w", seg.expired_before(300_000)).expect("expire");
            assert_eq!(db.get("w", &old).expect("get"), None);
            assert_eq!(db.get("w", &live).expect("get"), Some(b"1".to_vec()));
            db.flush().expect("flush");
        }
        {
            let (db, cleared) = open(seg);
            assert!(cleared.is_empty(), "same layout: kept");
            assert_eq!(db.checkpoint("w").expect("read"), Some(2));
        }
        // Another retention lays keys out in other segments: the store restores from scratch.
        let (db, cleared) = open(Segments::for_retention(
            eddy_crds::Duration::from_millis(86_400_000),
            crate::window::KeySchema::Window { size: 1_000 },
        ));
        assert_eq!(cleared, names(&["w"]));
        assert_eq!(db.checkpoint("w").expect("read"), None);
        assert_eq!(db.get("w", &key(b"k", 250_000)).expect("get"), None);
    }

    #[test]
    fn a_checkpoint_keeps_its_time_until_a_write_gives_another() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let stored = |db: &TaskDb| db.stored_checkpoint("a").expect("read");
        let at = |offset, t| {
            Some(Checkpoint {
                offset,
                caught_up_at: Some(t),
            })
        };
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["a"])).expect("open");
            let mark = Mark {
                offset: Some(5),
                caught_up_at: Some(1_000),
            };
            db.write(std::iter::empty(), [("a", mark)]).expect("write");
            assert_eq!(stored(&db), at(5, 1_000));
            db.write(std::iter::empty(), [("a", 6)]).expect("write");
            assert_eq!(stored(&db), at(6, 1_000), "an offset alone keeps the time");
            let mark = Mark {
                offset: None,
                caught_up_at: Some(2_000),
            };
            db.write(std::iter::empty(), [("a", mark)]).expect("write");
            assert_eq!(stored(&db), at(6, 2_000), "a time alone keeps the offset");
            db.flush().expect("flush");
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a"])).expect("open");
        assert_eq!(changed, Reconciled::default());
        assert_eq!(stored(&db), at(6, 2_000));
        db.clear("a").expect("clear");
        assert_eq!(stored(&db), None);
        assert_eq!(db.caught_up_at("a").expect("read"), None, "cleared with it");
    }

    /// Checkpoints written before times were recorded get the time of the last write to the
    /// database's files: a volume left alone for two days reads as two days old.
    #[test]
    fn checkpoints_of_earlier_versions_are_dated_by_their_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        {
            let (db, _) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
            // As an earlier version wrote it: an offset, no time.
            let change = Change {
                key: b"k",
                value: Some(b"v"),
            };
            db.write([("a", change)], [("a", 7)]).expect("write");
            // A time without a checkpoint means nothing.
            let mark = Mark {
                offset: None,
                caught_up_at: Some(3_000),
            };
            db.write(std::iter::empty(), [("b", mark)]).expect("write");
            db.flush().expect("flush");
        }
        let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(172_800);
        for e in std::fs::read_dir(dir.path()).expect("list") {
            let path = e.expect("entry").path();
            let name = path.to_string_lossy().into_owned();
            if name.ends_with(".sst") || name.ends_with(".log") {
                let f = std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .expect("open file");
                f.set_modified(two_days_ago).expect("set mtime");
            }
        }
        let want = two_days_ago
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .expect("after the epoch");
        {
            let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
            assert_eq!(changed.dated, names(&["a"]));
            let c = db
                .stored_checkpoint("a")
                .expect("read")
                .expect("a checkpoint");
            assert_eq!(c.offset, 7);
            assert!(
                c.caught_up_at.is_some_and(|t| (t - want).abs() < 1_000),
                "{:?} is not two days ago ({want})",
                c.caught_up_at
            );
            assert_eq!(db.caught_up_at("b").expect("read"), None, "dropped");
            db.flush().expect("flush");
        }
        let (db, changed) = TaskDb::open(&res, dir.path(), &names(&["a", "b"])).expect("open");
        assert!(changed.dated.is_empty(), "dated once, not at every open");
        let c = db
            .stored_checkpoint("a")
            .expect("read")
            .expect("a checkpoint");
        assert!(c.caught_up_at.is_some_and(|t| (t - want).abs() < 1_000));
    }

    #[test]
    fn the_metadata_family_name_is_reserved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let err = TaskDb::open(&res, dir.path(), &names(&["a", META_CF]))
            .err()
            .expect("refused");
        assert!(matches!(err, StoreError::Reserved(_)), "{err}");
    }
}

#[cfg(test)]
mod range_tests {
    use super::*;
    use crate::window::{KeySchema, Segments, Window};

    /// Window and session stores are read by key and time range across segments, skipping
    /// keys that merely start with the same bytes.
    #[test]
    fn fetch_reads_a_keys_windows_across_segments_and_fetch_all_every_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let stores = vec!["w".to_string(), "s".to_string()];
        let retention = eddy_crds::Duration::from_millis(600_000);
        let (db, _) = TaskDb::open(&res, dir.path(), &stores).expect("open");
        let win = Segments::for_retention(retention, KeySchema::Window { size: 10 });
        let ses = Segments::for_retention(retention, KeySchema::Session);
        let (db, _) = db
            .with_segments(&[("w".into(), win), ("s".into(), ses)])
            .expect("segments");
        assert_eq!(win.interval, 300_000);
        let w = |k: &str, start: i64| crate::window::key(k.as_bytes(), start);
        let s = |k: &str, start: i64, end: i64| {
            KeySchema::Session.key(k.as_bytes(), Window { start, end })
        };
        let keys = [
            ("w", w("a", 100)),
            ("w", w("a", 400_000)),
            ("w", w("a", 900_000)),
            ("w", w("ab", 400_000)),
            ("w", w("b", 200)),
            ("s", s("a", 0, 1_000)),
            ("s", s("a", 350_000, 700_000)),
            ("s", s("ab", 0, 700_000)),
        ];
        db.write(
            keys.iter().map(|(st, k)| {
                (
                    *st,
                    Change {
                        key: k,
                        value: Some(b"v"),
                    },
                )
            }),
            std::iter::empty::<(&str, i64)>(),
        )
        .expect("write");
        let starts = |v: Entries| -> Vec<i64> {
            v.iter()
                .map(|(k, _)| crate::window::split(k).expect("key").1)
                .collect()
        };
        assert_eq!(
            starts(db.fetch("w", b"a", 0, i64::MAX).expect("fetch")),
            [100, 400_000, 900_000]
        );
        assert_eq!(
            starts(db.fetch("w", b"a", 101, 900_000).expect("fetch")),
            [400_000, 900_000]
        );
        assert_eq!(starts(db.fetch("w", b"b", 0, 1_000).expect("fetch")), [200]);
        let all = db.fetch_all("w", 0, 400_000).expect("fetch_all");
        assert_eq!(all.len(), 4, "a@100, b@200, a@400000, ab@400000");
        // Sessions are segmented and fetched by their end.
        let ends: Vec<Window> = db
            .fetch("s", b"a", 1_000, i64::MAX)
            .expect("fetch")
            .iter()
            .map(|(k, _)| KeySchema::Session.split(k).expect("session").1)
            .collect();
        assert_eq!(
            ends,
            [
                Window {
                    start: 0,
                    end: 1_000
                },
                Window {
                    start: 350_000,
                    end: 700_000
                }
            ]
        );
        assert_eq!(
            db.fetch("s", b"a", 1_001, i64::MAX).expect("fetch").len(),
            1
        );
        assert_eq!(
            db.fetch_all("s", 700_000, 700_000)
                .expect("fetch_all")
                .len(),
            2
        );
    }

    #[test]
    fn reads_see_every_write_expiry_and_clear_made_since_the_last_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let res = StateResources::new(8 << 20).expect("resources");
        let stores = vec!["w".to_string(), "kv".to_string()];
        let (db, _) = TaskDb::open(&res, dir.path(), &stores).expect("open");
        let commit = |db: &TaskDb, store: &str, key: &[u8], offset: i64| {
            let change = Change {
                key,
                value: Some(b"v"),
            };
            db.write([(store, change)], [(store, offset)])
                .expect("write");
            db.flush().expect("flush");
        };
        let win = Segments::for_retention(
            eddy_crds::Duration::from_millis(600_000),
            KeySchema::Window { size: 10 },
        );
        let (db, _) = db.with_segments(&[("w".into(), win)]).expect("segments");
        let w = |start: i64| crate::window::key(b"a", start);
        let starts = |db: &TaskDb| -> Vec<i64> {
            db.fetch("w", b"a", 0, i64::MAX)
                .expect("fetch")
                .iter()
                .map(|(k, _)| crate::window::split(k).expect("key").1)
                .collect()
        };
        let kv = |db: &TaskDb| db.range("kv", b"", b"z").expect("range").len();
        // Each read below follows a read of the same store (its iterator is kept) and a change.
        assert_eq!((starts(&db), kv(&db)), (vec![], 0));
        commit(&db, "w", &w(100), 1);
        commit(&db, "kv", b"k1", 1);
        assert_eq!((starts(&db), kv(&db)), (vec![100], 1));
        commit(&db, "w", &w(700_000), 2);
        db.write(
            [(
                "kv",
                Change {
                    key: b"k2",
                    value: Some(b"v"),
                },
            )],
            std::iter::empty::<(&str, i64)>(),
        )
        .expect("write without a flush");
        assert_eq!((starts(&db), kv(&db)), (vec![100, 700_000], 2));
        db.expire("w", 700_000).expect("expire");
        assert_eq!(starts(&db), [700_000]);
        db.clear("kv").expect("clear");
        assert_eq!(kv(&db), 0);
    }
}

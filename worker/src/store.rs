//! State stores: one RocksDB instance per task, a column family per store plus a metadata
//! family holding each store's changelog checkpoint, so data and checkpoint are written in one
//! atomic batch. Every instance of the process shares one block cache (which also accounts the
//! memtables through a write-buffer manager) and one background thread pool, so memory is
//! bounded per process rather than per shard. In-memory stores are a `BTreeMap` restored
//! from the changelog at every start.

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, Env, FlushOptions, Options, WriteBatch,
    WriteBufferManager, WriteOptions,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const META_CF: &str = "eddy-meta";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB at {path}: {source}")]
    Rocks {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store {0:?} is not a store of this task")]
    Unknown(String),
    #[error("corrupt checkpoint for store {store:?} in {path}")]
    Checkpoint { store: String, path: PathBuf },
}

impl StoreError {
    /// True for I/O errors (a full or failing disk, a lock another process still holds):
    /// they may go away, and the state on disk is still the last commit's.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Rocks { source, .. } => matches!(
                source.kind(),
                rocksdb::ErrorKind::IOError
                    | rocksdb::ErrorKind::Busy
                    | rocksdb::ErrorKind::TryAgain
                    | rocksdb::ErrorKind::TimedOut
                    | rocksdb::ErrorKind::Incomplete
            ),
            StoreError::Io { .. } => true,
            StoreError::Unknown(_) | StoreError::Checkpoint { .. } => false,
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
        // Memtables may use half of the budget before RocksDB flushes; allow_stall keeps
        // the bound hard instead of letting writers overshoot.
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            rocksdb_bytes / 2,
            true,
            cache.clone(),
        );
        let mut env = Env::new().map_err(|source| StoreError::Rocks {
            path: PathBuf::new(),
            source,
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
        o.set_compression_type(rocksdb::DBCompressionType::Lz4);
        o
    }

    /// Bytes RocksDB holds in the shared cache (blocks and memtables).
    pub fn cache_usage(&self) -> usize {
        self.cache.get_usage()
    }
}

/// One task's RocksDB instance.
pub struct TaskDb {
    db: DB,
    path: PathBuf,
    families: Vec<String>,
    write: WriteOptions,
}

/// A change to apply at commit: `None` deletes the key.
pub struct Change<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

impl TaskDb {
    pub fn open(res: &StateResources, path: &Path, stores: &[String]) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfs = stores
            .iter()
            .map(String::as_str)
            .chain([META_CF])
            .map(|n| ColumnFamilyDescriptor::new(n, res.cf_options()));
        let db = DB::open_cf_descriptors(&res.db_options(), path, cfs).map_err(|source| {
            StoreError::Rocks {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let write = WriteOptions::default();
        Ok(Self {
            db,
            path: path.to_path_buf(),
            families: stores
                .iter()
                .cloned()
                .chain([META_CF.to_string()])
                .collect(),
            write,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rocks<T>(&self, r: Result<T, rocksdb::Error>) -> Result<T, StoreError> {
        r.map_err(|source| StoreError::Rocks {
            path: self.path.clone(),
            source,
        })
    }

    fn cf(&self, store: &str) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(store)
            .ok_or_else(|| StoreError::Unknown(store.to_string()))
    }

    pub fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let cf = self.cf(store)?;
        self.rocks(self.db.get_cf(cf, key))
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

    /// Apply changes of several stores and their new checkpoints in ONE atomic batch.
    pub fn write<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a str, Change<'a>)>,
        checkpoints: impl IntoIterator<Item = (&'a str, i64)>,
    ) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (store, c) in changes {
            let cf = self.cf(store)?;
            match c.value {
                Some(v) => batch.put_cf(cf, c.key, v),
                None => batch.delete_cf(cf, c.key),
            }
        }
        let meta = self.cf(META_CF)?;
        for (store, offset) in checkpoints {
            batch.put_cf(meta, checkpoint_key(store), offset.to_be_bytes());
        }
        self.rocks(self.db.write_opt(batch, &self.write))
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
        self.rocks(self.db.flush_cfs_opt(&names, &fo))
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

fn checkpoint_key(store: &str) -> Vec<u8> {
    format!("checkpoint/{store}").into_bytes()
}

/// Remove a task's state directory, e.g. before rebuilding it from a changelog.
pub fn wipe(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// An in-memory store shard: rebuilt from the changelog on every start.
#[derive(Default)]
pub struct MemoryStore {
    pub map: BTreeMap<Vec<u8>, Vec<u8>>,
    pub checkpoint: Option<i64>,
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
            let db = TaskDb::open(&res, dir.path(), &stores).expect("open");
            assert_eq!(db.checkpoint("counts").expect("read"), None);
            db.write(
                [(
                    "counts",
                    Change {
                        key: b"a",
                        value: Some(b"1"),
                    },
                )],
                [("counts", 42)],
            )
            .expect("write");
            db.flush().expect("flush");
        }
        let db = TaskDb::open(&res, dir.path(), &stores).expect("reopen");
        assert_eq!(db.get("counts", b"a").expect("get"), Some(b"1".to_vec()));
        assert_eq!(db.checkpoint("counts").expect("read"), Some(42));
        assert!(matches!(db.get("nope", b"a"), Err(StoreError::Unknown(_))));
    }
}

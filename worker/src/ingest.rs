//! Bulk restore of a large changelog backlog into RocksDB without the memtable: records are
//! gathered in chunks (one buffer for all keys and values, no allocation per record), each
//! chunk sorted by key keeping each key's last record and written as one SST file, which the
//! store ingests ([`crate::store::TaskDb::ingest`]). A record goes through one copy into the
//! chunk and one into the SST file, where the memtable path copied it into a write batch, a
//! memtable and a flushed file.

use crate::store::StoreError;
use rocksdb::{Options, SstFileWriter};
use std::path::{Path, PathBuf};

/// One changelog partition's records in changelog order, not yet written.
#[derive(Default)]
pub struct Chunk {
    data: Vec<u8>,
    entries: Vec<Entry>,
    /// Bytes (keys, values and the index of records) the chunk may hold.
    limit: usize,
    /// Records added since the last [`Chunk::reset`].
    pub read: u64,
    /// Offset after the last record added (or where the chunk starts).
    pub next: i64,
}

#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    key_len: usize,
    /// `None`: a tombstone (the key is deleted).
    value_len: Option<usize>,
}

impl Chunk {
    /// An empty chunk of `limit` bytes, its buffer allocated at once (filled up to
    /// [`Chunk::fits`], it never reallocates).
    pub fn with_capacity(limit: usize) -> Self {
        Self {
            data: Vec::with_capacity(limit),
            limit,
            ..Self::default()
        }
    }

    /// Whether the record can be added within the limit. An empty chunk takes any record.
    pub fn fits(&self, key: &[u8], value: Option<&[u8]>) -> bool {
        let len = key.len() + value.map_or(0, <[u8]>::len);
        self.entries.is_empty()
            || (self.data.len() + len <= self.data.capacity()
                && self.bytes() + len + size_of::<Entry>() <= self.limit)
    }

    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>, offset: i64) {
        self.entries.push(Entry {
            start: self.data.len(),
            key_len: key.len(),
            value_len: value.map(<[u8]>::len),
        });
        self.data.extend_from_slice(key);
        if let Some(v) = value {
            self.data.extend_from_slice(v);
        }
        self.read += 1;
        self.next = offset + 1;
    }

    /// Bytes of keys, values and the index of records held.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.entries.len() * size_of::<Entry>()
    }

    /// Empty the chunk (keeping its buffers) to gather records from offset `next` on.
    pub fn reset(&mut self, next: i64) {
        self.data.clear();
        self.entries.clear();
        self.read = 0;
        self.next = next;
    }

    /// Write each key's last record, in key order, to a new SST file at `path` (values as
    /// puts, tombstones as deletes, so the file also removes what older data has). `None`
    /// if the chunk holds no record.
    pub fn write_sst(
        &mut self,
        options: &Options,
        path: &Path,
    ) -> Result<Option<PathBuf>, StoreError> {
        if self.entries.is_empty() {
            return Ok(None);
        }
        let data = &self.data;
        let key = |e: &Entry| &data[e.start..e.start + e.key_len];
        // Equal keys stay in changelog order (their position in the buffer): the last wins.
        self.entries
            .sort_unstable_by(|a, b| key(a).cmp(key(b)).then(a.start.cmp(&b.start)));
        let rocks = |source| StoreError::Rocks {
            path: path.to_path_buf(),
            cause: source,
        };
        let mut w = SstFileWriter::create(options);
        w.open(path).map_err(rocks)?;
        for (i, e) in self.entries.iter().enumerate() {
            let k = key(e);
            if self.entries.get(i + 1).is_some_and(|n| key(n) == k) {
                continue;
            }
            match e.value_len {
                Some(len) => {
                    let v = e.start + e.key_len;
                    w.put(k, &data[v..v + len])
                }
                None => w.delete(k),
            }
            .map_err(rocks)?;
        }
        w.finish().map_err(rocks)?;
        Ok(Some(path.to_path_buf()))
    }
}

/// What RocksDB did with the blocks of files written with `options`, whose statistics were
/// switched on ([`Compression::watched`]): bytes of blocks it kept compressed, and bytes it
/// stored as they were (a block is kept compressed only if that saves at least 1/8 of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    pub kept: u64,
    pub stored_plain: u64,
}

/// The least data RocksDB must have tried to compress to tell whether compression pays.
const JUDGED_BYTES: u64 = 1 << 20;

impl Compression {
    /// `options` with statistics of their own (a clone would otherwise share the original's).
    pub fn watched(options: &Options) -> Options {
        let mut o = options.clone();
        o.enable_statistics();
        o
    }

    /// The tally of files written with [`Compression::watched`] options.
    pub fn of(options: &Options) -> Self {
        use rocksdb::statistics::Ticker;
        Self {
            kept: options.get_ticker_count(Ticker::BytesCompressedFrom),
            stored_plain: options.get_ticker_count(Ticker::BytesCompressionRejected)
                + options.get_ticker_count(Ticker::BytesCompressionBypassed),
        }
    }

    /// Whether the data compresses: `None` until 1 MiB of blocks were tried; `false` when
    /// RocksDB kept less than a tenth of them compressed, so that attempting the rest is wasted.
    pub fn compresses(&self) -> Option<bool> {
        let tried = self.kept + self.stored_plain;
        (tried >= JUDGED_BYTES).then_some(self.kept >= tried / 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::Pending;
    use crate::store::{Change, StateResources, TaskDb};
    use std::collections::BTreeMap;

    type Record = (Vec<u8>, Option<Vec<u8>>);

    /// A changelog with keys written many times, some deleted and some written again after
    /// their deletion, across what become several chunks.
    fn changelog() -> Vec<Record> {
        let mut x: u64 = 7;
        (0..3000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("k{:03}", (x >> 33) % 300).into_bytes();
                let value =
                    (i % 7 != 3).then(|| format!("v{i}-{}", "x".repeat(i % 50)).into_bytes());
                (key, value)
            })
            .collect()
    }

    /// Restore `records` (offsets from `from`) the write-batch way: batches of the last value
    /// per key, each written with its checkpoint.
    fn write_batches(db: &TaskDb, records: &[Record], from: i64) {
        for (n, batch) in records.chunks(100).enumerate() {
            let mut p = Pending::default();
            for (i, (k, v)) in batch.iter().enumerate() {
                p.add(k, v.as_deref(), from + (n * 100 + i) as i64);
            }
            let changes = p.latest.iter().map(|(k, v)| {
                (
                    "s",
                    Change {
                        key: k,
                        value: v.as_deref(),
                    },
                )
            });
            db.write(changes, [("s", p.next)]).expect("write");
        }
    }

    /// Restore `records` through chunks of at most `limit` bytes, each an ingested SST file.
    fn ingest_chunks(db: &TaskDb, records: &[Record], from: i64, limit: usize) -> usize {
        let dir = db.ingest_dir().expect("dir");
        let mut chunk = Chunk::with_capacity(limit);
        chunk.reset(from);
        let mut files = 0;
        let mut write = |chunk: &mut Chunk| {
            files += 1;
            let path = dir.join(format!("{files}.sst"));
            let file = chunk.write_sst(db.sst_options(), &path).expect("sst");
            db.ingest("s", file.as_deref(), chunk.next).expect("ingest");
            assert!(!path.exists(), "the file was moved into the database");
            assert_eq!(db.checkpoint("s").expect("checkpoint"), Some(chunk.next));
            let next = chunk.next;
            chunk.reset(next);
        };
        for (i, (k, v)) in records.iter().enumerate() {
            if !chunk.fits(k, v.as_deref()) {
                write(&mut chunk);
            }
            chunk.push(k, v.as_deref(), from + i as i64);
        }
        write(&mut chunk);
        files
    }

    /// A window store keeps its keys segment first: restore must write them so, sorted as
    /// RocksDB stores them, or the windows are misread after a large restore.
    #[test]
    fn ingested_chunks_of_a_window_store_are_read_back_by_window() {
        use crate::window::{Segments, key};
        let res = StateResources::new(8 << 20).expect("resources");
        let seg = Segments::for_retention(
            eddy_crds::Duration::from_millis(120_000),
            crate::window::KeySchema::Window { size: 1_000 },
        );
        let open = |dir: &Path| {
            let (db, _) = TaskDb::open(&res, dir, &["s".to_string()]).expect("open");
            db.with_segments(&[("s".to_string(), seg)])
                .expect("segments")
                .0
        };
        // Windows across several segments, keys that sort against their segments' order.
        let records: Vec<Record> = changelog()
            .into_iter()
            .enumerate()
            .map(|(i, (k, v))| (key(&k, ((i as i64 * 7919) % 10) * 50_000), v))
            .collect();
        let (a, b) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let (batches, ingested) = (open(a.path()), open(b.path()));
        write_batches(&batches, &records, 0);
        let stored: Vec<Record> = records
            .iter()
            .map(|(k, v)| (ingested.stored_key("s", k).into_owned(), v.clone()))
            .collect();
        assert!(ingest_chunks(&ingested, &stored, 0, 4096) > 3);
        assert_eq!(batches.contents("s"), ingested.contents("s"));
        let mut last = BTreeMap::new();
        for (k, v) in &records {
            last.insert(k.clone(), v.clone());
        }
        for (k, v) in last {
            assert_eq!(ingested.get("s", &k).expect("get"), v, "{k:?}");
        }
    }

    #[test]
    fn ingested_chunks_leave_the_same_store_as_write_batches() {
        let res = StateResources::new(8 << 20).expect("resources");
        let stores = vec!["s".to_string()];
        let records = changelog();
        // Empty at the start (a new store), or with data of its own (a checkpoint behind):
        // some of its keys the changelog overwrites or deletes, some it leaves alone.
        for existing in [false, true] {
            let (a, b) = (
                tempfile::tempdir().expect("dir"),
                tempfile::tempdir().expect("dir"),
            );
            let (batches, _) = TaskDb::open(&res, a.path(), &stores).expect("open");
            let (ingested, _) = TaskDb::open(&res, b.path(), &stores).expect("open");
            let mut model = BTreeMap::new();
            let from = if existing {
                for db in [&batches, &ingested] {
                    let old: Vec<Record> = (0..400)
                        .map(|i| (format!("k{i:03}").into_bytes(), Some(b"old".to_vec())))
                        .collect();
                    write_batches(db, &old, 0);
                }
                for i in 0..400 {
                    model.insert(format!("k{i:03}").into_bytes(), b"old".to_vec());
                }
                400
            } else {
                0
            };
            write_batches(&batches, &records, from);
            let files = ingest_chunks(&ingested, &records, from, 8 << 10);
            assert!(files > 5, "several chunks: {files}");
            for (k, v) in &records {
                match v {
                    Some(v) => model.insert(k.clone(), v.clone()),
                    None => model.remove(k),
                };
            }
            let want: Vec<_> = model.into_iter().collect();
            assert!(want.len() > 100 && want.len() < 400, "deletes and new keys");
            assert_eq!(batches.contents("s"), want);
            assert_eq!(ingested.contents("s"), want, "existing data: {existing}");
            let end = from + records.len() as i64;
            assert_eq!(batches.checkpoint("s").expect("checkpoint"), Some(end));
            assert_eq!(ingested.checkpoint("s").expect("checkpoint"), Some(end));
            // Nothing flushed: ingested files and the checkpoints in the WAL survive a reopen.
            drop(ingested);
            let (ingested, _) = TaskDb::open(&res, b.path(), &stores).expect("reopen");
            assert_eq!(ingested.contents("s"), want);
            assert_eq!(ingested.checkpoint("s").expect("checkpoint"), Some(end));
        }
    }

    #[test]
    fn an_empty_store_gets_its_first_file_at_the_bottom_and_the_others_in_l0() {
        let res = StateResources::new(8 << 20).expect("resources");
        let dir = tempfile::tempdir().expect("dir");
        let (db, _) = TaskDb::open(&res, dir.path(), &["s".to_string()]).expect("open");
        // Four chunks whose key ranges overlap, as a changelog's do.
        let records: Vec<Record> = (0..4000)
            .map(|i| {
                (
                    format!("k{:04}", (i * 7919) % 4000).into_bytes(),
                    Some(vec![1; 100]),
                )
            })
            .collect();
        assert_eq!(ingest_chunks(&db, &records, 0, 140 * 1000), 4);
        // Below level0_file_num_compaction_trigger (4): nothing to compact after the restore.
        assert_eq!(db.files_per_level("s"), vec![3, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn a_failed_ingest_leaves_the_checkpoint_where_it_was() {
        let res = StateResources::new(8 << 20).expect("resources");
        let dir = tempfile::tempdir().expect("dir");
        let (db, _) = TaskDb::open(&res, dir.path(), &["s".to_string()]).expect("open");
        write_batches(&db, &[(b"k".to_vec(), Some(b"v".to_vec()))], 9);
        let missing = db.ingest_dir().expect("dir").join("missing.sst");
        assert!(db.ingest("s", Some(&missing), 20).is_err());
        assert_eq!(db.checkpoint("s").expect("checkpoint"), Some(10));
        assert_eq!(db.contents("s"), vec![(b"k".to_vec(), b"v".to_vec())]);
    }

    #[test]
    fn a_chunk_stays_within_its_limit_and_an_empty_one_writes_no_file() {
        let mut c = Chunk::with_capacity(1000);
        c.reset(5);
        let dir = tempfile::tempdir().expect("dir");
        let opts = Options::default();
        assert_eq!(
            c.write_sst(&opts, &dir.path().join("a.sst"))
                .expect("write"),
            None
        );
        assert!(
            c.fits(b"k", Some(&[0; 5000])),
            "an empty chunk takes any record"
        );
        let mut n = 0;
        while c.fits(b"key", Some(&[1; 90])) {
            c.push(b"key", Some(&[1; 90]), n);
            n += 1;
        }
        assert!(
            n > 5 && c.bytes() <= 1000,
            "{n} records, {} bytes",
            c.bytes()
        );
        assert_eq!((c.read, c.next), (n as u64, n));
    }

    /// Restore stops compressing what does not compress: random text (the bytes of
    /// encrypted or hashed values, or of the large-restore benchmark's values) is not, JSON
    /// records are, and the same data written without compression reads back alike.
    #[test]
    fn random_values_are_judged_incompressible_and_json_compressible() {
        let res = StateResources::new(8 << 20).expect("resources");
        let dir = tempfile::tempdir().expect("dir");
        let stores = ["random".to_string(), "json".to_string()];
        let (db, _) = TaskDb::open(&res, dir.path(), &stores).expect("open");
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut x: u64 = 88172645463325252;
        let (mut random, mut json) = (
            Chunk::with_capacity(16 << 20),
            Chunk::with_capacity(16 << 20),
        );
        let mut key_42 = BTreeMap::new();
        for i in 0..20_000 {
            let key = format!("key-{i:06}");
            let v: Vec<u8> = (0..300)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    ALPHABET[(x % ALPHABET.len() as u64) as usize]
                })
                .collect();
            random.push(key.as_bytes(), Some(&v), i);
            let j = format!(
                r#"{{"user":"user-{}","amount":{},"status":200,"page":"/products/{:05}"}}"#,
                i % 977,
                i % 100,
                i % 5000
            );
            json.push(key.as_bytes(), Some(j.as_bytes()), i);
            if i == 42 {
                key_42.insert("random", v);
                key_42.insert("json", j.into_bytes());
            }
        }
        let dir = db.ingest_dir().expect("dir");
        for (chunk, store, compresses_well) in
            [(&mut random, "random", false), (&mut json, "json", true)]
        {
            let watched = Compression::watched(db.sst_options());
            let f = chunk
                .write_sst(&watched, &dir.join(format!("{store}.sst")))
                .expect("write")
                .expect("a file");
            let tally = Compression::of(&watched);
            assert_eq!(
                tally.compresses(),
                Some(compresses_well),
                "{store}: {tally:?}"
            );
            let plain = chunk
                .write_sst(
                    db.plain_sst_options(),
                    &dir.join(format!("{store}-plain.sst")),
                )
                .expect("write")
                .expect("a file");
            let size = |p: &Path| std::fs::metadata(p).expect("size").len();
            if compresses_well {
                assert!(
                    size(&plain) > size(&f) * 3 / 2,
                    "the plain file is written without compression: {} vs {} bytes",
                    size(&plain),
                    size(&f)
                );
            }
            db.ingest(store, Some(&plain), chunk.next).expect("ingest");
            assert_eq!(db.contents(store).len(), 20_000);
            let v = db.get(store, b"key-000042").expect("get");
            assert_eq!(v.as_ref(), key_42.get(store), "{store}");
        }
        let tiny = Compression {
            kept: 0,
            stored_plain: 1000,
        };
        assert_eq!(tiny.compresses(), None, "too little data to tell");
    }
}

//! Queries on real RocksDB databases: each kind of store read through a snapshot and decoded
//! as users see it, and the HTTP API of two workers, each holding one partition, forwarding
//! to each other.

use super::api;
use super::client::{self as http, HttpClient};
use super::locate::PeerAddressing;
use super::read::{self, Read, ReadError, Request};
use super::{Cluster, Holder, Kind, StoreInfo};
use crate::status::Status;
use crate::store::{Change, MemoryStore, StateResources, TaskDb, View};
use crate::window::{self, KeySchema, Segments, Window};
use axum::http::{StatusCode, header};
use eddy_crds::query::{Entry, KeyAnswer, QueryProblem, RangeAnswer, StoreDescription};
use eddy_crds::resource::{Assignment, PodTasks, TaskRole, TaskState, TaskStatus, WorkerStatus};
use eddy_crds::{Format, TaskId};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

fn info(name: &str, kind: Kind, key: Format, value: Format, stamped: bool) -> StoreInfo {
    StoreInfo {
        name: name.into(),
        kind,
        key_format: key,
        value_format: value,
        stamped,
        subtopology: Some(0),
        partitioned_by: "t".into(),
        changelog: format!("app-{name}-changelog"),
        not_queryable: None,
    }
}

fn resources() -> StateResources {
    StateResources::new(8 << 20).expect("resources")
}

fn open(res: &StateResources, dir: &Path, stores: &[&str]) -> TaskDb {
    let names: Vec<String> = stores.iter().map(|s| s.to_string()).collect();
    TaskDb::open(res, dir, &names).expect("open").0
}

fn open_windowed(res: &StateResources, dir: &Path, store: &str, seg: Segments) -> TaskDb {
    let (db, cleared) = open(res, dir, &[store])
        .with_segments(&[(store.to_string(), seg)])
        .expect("segments");
    assert!(cleared.is_empty());
    db
}

/// Write `rows` (changelog keys and values) to `store` with its checkpoint, as a commit.
fn commit(db: &TaskDb, store: &str, rows: &[(Vec<u8>, Vec<u8>)], offset: i64) {
    db.write(
        rows.iter().map(|(k, v)| {
            (
                store,
                Change {
                    key: k,
                    value: Some(v),
                },
            )
        }),
        [(store, offset)],
    )
    .expect("write");
}

fn i64v(n: i64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

fn run(info: &StoreInfo, db: &TaskDb, req: &Request) -> Read {
    read::run(info, &db.snapshot(), req).expect("read")
}

fn one(r: Read) -> Option<Entry> {
    match r {
        Read::One(e) => e,
        other => panic!("expected one entry, got {other:?}"),
    }
}

fn many(r: Read) -> Vec<(Vec<u8>, Entry)> {
    match r {
        Read::Many(v) => v,
        other => panic!("expected entries, got {other:?}"),
    }
}

fn kv(key: Value, value: Value, timestamp: Option<i64>) -> Entry {
    Entry {
        key,
        value,
        start: None,
        end: None,
        timestamp,
        order: None,
    }
}

fn get(key: &[u8]) -> Request {
    Request::Get {
        key: key.to_vec(),
        as_of: None,
    }
}

fn range(from: &[u8], to: Option<&[u8]>, limit: usize) -> Request {
    Request::Range {
        from: from.to_vec(),
        to: to.map(<[u8]>::to_vec),
        limit,
    }
}

/// The keys of entries, as their JSON strings.
fn keys(rows: &[(Vec<u8>, Entry)]) -> Vec<&str> {
    rows.iter()
        .map(|(_, e)| e.key.as_str().expect("a string key"))
        .collect()
}

#[test]
fn a_key_value_store_answers_one_key_and_ranges_in_key_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["counts"]);
    let counts = [
        ("apple", 3),
        ("b", -1),
        ("banana", 7),
        ("cherry", 0),
        ("date", i64::MAX),
    ];
    let rows: Vec<_> = counts
        .iter()
        .map(|(k, n)| (k.as_bytes().to_vec(), i64v(*n)))
        .collect();
    commit(&db, "counts", &rows, 42);
    let s = info("counts", Kind::KeyValue, Format::String, Format::I64, false);

    assert_eq!(
        one(run(&s, &db, &get(b"banana"))),
        Some(kv(json!("banana"), json!(7), None))
    );
    assert_eq!(
        one(run(&s, &db, &get(b"date"))),
        Some(kv(json!("date"), json!(i64::MAX), None))
    );
    assert_eq!(one(run(&s, &db, &get(b"bananas"))), None, "not found");
    assert_eq!(one(run(&s, &db, &get(b""))), None);

    // Everything, in key order, each entry sorting at its key's bytes.
    let all = many(run(&s, &db, &range(b"", None, 100)));
    assert_eq!(keys(&all), ["apple", "b", "banana", "cherry", "date"]);
    for ((order, e), (k, n)) in all.iter().zip(counts) {
        assert_eq!(order, k.as_bytes());
        assert_eq!(e, &kv(json!(k), json!(n), None));
    }
    // A limit, a start (inclusive) and an end (exclusive).
    assert_eq!(
        keys(&many(run(&s, &db, &range(b"", None, 2)))),
        ["apple", "b"]
    );
    assert_eq!(
        keys(&many(run(&s, &db, &range(b"b", Some(b"cherry"), 100)))),
        ["b", "banana"]
    );
    assert_eq!(
        keys(&many(run(&s, &db, &range(b"b\0", None, 2)))),
        ["banana", "cherry"],
        "the page after `b`"
    );
    assert_eq!(
        keys(&many(run(&s, &db, &range(b"cherry", Some(b"cherry"), 100)))),
        Vec::<&str>::new()
    );
    assert_eq!(
        keys(&many(run(&s, &db, &range(b"zz", None, 100)))),
        Vec::<&str>::new()
    );
}

#[test]
fn a_value_the_stores_format_cannot_read_is_reported_not_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["counts"]);
    commit(
        &db,
        "counts",
        &[
            (b"good".to_vec(), i64v(1)),
            (b"short".to_vec(), vec![1, 2, 3]),
        ],
        1,
    );
    let s = info("counts", Kind::KeyValue, Format::String, Format::I64, false);
    assert_eq!(
        one(run(&s, &db, &get(b"good"))),
        Some(kv(json!("good"), json!(1), None))
    );
    for req in [get(b"short"), range(b"", None, 10)] {
        let e = read::run(&s, &db.snapshot(), &req).expect_err("corrupt");
        assert!(matches!(e, ReadError::Corrupt { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("store counts holds a value that is not i64"),
            "{text}"
        );
    }
}

#[test]
fn a_json_keyed_store_is_asked_with_json_or_bare_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["users"]);
    commit(
        &db,
        "users",
        &[
            (br#""u1""#.to_vec(), br#"{"name":"Ann"}"#.to_vec()),
            (br#"{"id":7}"#.to_vec(), br#"[1,2]"#.to_vec()),
            (b"12".to_vec(), b"true".to_vec()),
        ],
        3,
    );
    let s = info("users", Kind::KeyValue, Format::Json, Format::Json, false);
    let lookup = |text: &str| {
        let key = read::key_bytes(Format::Json, text).expect("key");
        one(run(&s, &db, &get(&key)))
    };
    let u1 = Some(kv(json!("u1"), json!({"name": "Ann"}), None));
    assert_eq!(lookup("u1"), u1, "bare text is a JSON string");
    assert_eq!(lookup(r#""u1""#), u1);
    assert_eq!(
        lookup(r#"{"id":7}"#),
        Some(kv(json!({"id": 7}), json!([1, 2]), None)),
    );
    assert_eq!(
        lookup(r#"{ "id" : 7 }"#),
        None,
        "the key's JSON text exactly: a source topic's keys are stored as produced"
    );
    assert_eq!(lookup("12"), Some(kv(json!(12), json!(true), None)));
    assert_eq!(lookup("u2"), None);
}

#[test]
fn a_stamped_stores_value_and_timestamp_are_split() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["table"]);
    let ts = 1_700_000_000_123;
    commit(
        &db,
        "table",
        &[
            (b"k".to_vec(), window::with_timestamp(ts, br#"{"n":1}"#)),
            (b"neg".to_vec(), window::with_timestamp(-5, b"null")),
            (b"short".to_vec(), vec![0, 0, 1]),
        ],
        8,
    );
    let s = info("table", Kind::KeyValue, Format::String, Format::Json, true);
    assert_eq!(
        one(run(&s, &db, &get(b"k"))),
        Some(kv(json!("k"), json!({"n": 1}), Some(ts)))
    );
    assert_eq!(
        one(run(&s, &db, &get(b"neg"))),
        Some(kv(json!("neg"), Value::Null, Some(-5)))
    );
    assert_eq!(
        many(run(&s, &db, &range(b"", Some(b"o"), 10)))
            .into_iter()
            .map(|(_, e)| e)
            .collect::<Vec<_>>(),
        [
            kv(json!("k"), json!({"n": 1}), Some(ts)),
            kv(json!("neg"), Value::Null, Some(-5))
        ]
    );
    let e = read::run(&s, &db.snapshot(), &get(b"short")).expect_err("too short");
    assert!(e.to_string().contains("timestamped value"), "{e}");
}

/// Read every window with [`Request::AllWindows`] pages of `limit`, each after the last
/// entry's order; checks no page is longer than asked.
fn all_windows_paged(
    s: &StoreInfo,
    view: &dyn View,
    from: i64,
    to: i64,
    limit: usize,
) -> Vec<(Vec<u8>, Entry)> {
    let mut out: Vec<(Vec<u8>, Entry)> = Vec::new();
    loop {
        let after = out.last().map(|(o, _)| o.clone());
        let page = many(
            read::run(
                s,
                view,
                &Request::AllWindows {
                    from,
                    to,
                    after,
                    limit,
                },
            )
            .expect("read"),
        );
        assert!(page.len() <= limit, "{} > {limit}", page.len());
        let last = page.len() < limit;
        out.extend(page);
        if last {
            return out;
        }
    }
}

/// Pages at several sizes equal one big read: nothing twice, nothing missed, in order.
fn check_paging(s: &StoreInfo, view: &dyn View, from: i64, to: i64, expected: usize) {
    let whole = many(
        read::run(
            s,
            view,
            &Request::AllWindows {
                from,
                to,
                after: None,
                limit: 10_000,
            },
        )
        .expect("read"),
    );
    assert_eq!(whole.len(), expected);
    assert!(
        whole.windows(2).all(|w| w[0].0 < w[1].0),
        "listed in strictly increasing order"
    );
    for limit in [1, 2, 3, 5, expected, expected + 1] {
        assert_eq!(
            all_windows_paged(s, view, from, to, limit),
            whole,
            "pages of {limit}"
        );
    }
}

#[test]
fn a_window_store_answers_one_keys_windows_and_pages_through_every_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let schema = KeySchema::Window { size: 1_000 };
    let seg = Segments::for_retention(eddy_crds::Duration::from_millis(600_000), schema);
    assert_eq!(seg.interval, 300_000);
    let db = open_windowed(&res, dir.path(), "win", seg);
    // "ab" starts with "a": its windows are not "a"'s. The starts span three segments.
    let inner = ["a", "ab", "b", "c"];
    let starts = [0, 100_000, 299_000, 300_000, 650_000, 900_000];
    let count = |k: usize, i: usize| (10 * k + i) as i64;
    let mut rows = Vec::new();
    for (k, key) in inner.iter().enumerate() {
        for (i, start) in starts.iter().enumerate() {
            rows.push((
                window::key(key.as_bytes(), *start),
                window::with_timestamp(start + 999, &i64v(count(k, i))),
            ));
        }
    }
    commit(&db, "win", &rows, 24);
    let s = info(
        "win",
        Kind::Window(schema),
        Format::String,
        Format::I64,
        true,
    );
    let expect = |k: usize, i: usize| Entry {
        key: json!(inner[k]),
        value: json!(count(k, i)),
        start: Some(starts[i]),
        end: Some(starts[i] + 1_000),
        timestamp: Some(starts[i] + 999),
        order: None,
    };

    let windows = |key: &str, from: i64, to: i64, limit: usize| {
        many(run(
            &s,
            &db,
            &Request::Windows {
                key: key.as_bytes().to_vec(),
                from,
                to,
                limit,
            },
        ))
    };
    // One key's windows starting in [from, to], in time order.
    let a = windows("a", 100_000, 650_000, 100);
    assert_eq!(
        a.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(),
        (1..=4).map(|i| expect(0, i)).collect::<Vec<_>>()
    );
    for (order, e) in &a {
        assert_eq!(
            order,
            &window::key(b"a", e.start.expect("start")),
            "a key's windows are ordered by their changelog key"
        );
    }
    assert_eq!(
        windows("ab", 0, i64::MAX, 100)
            .into_iter()
            .map(|(_, e)| e)
            .collect::<Vec<_>>(),
        (0..6).map(|i| expect(1, i)).collect::<Vec<_>>()
    );
    assert_eq!(
        windows("a", 0, i64::MAX, 2)
            .into_iter()
            .map(|(_, e)| e)
            .collect::<Vec<_>>(),
        [expect(0, 0), expect(0, 1)],
        "the first two"
    );
    assert!(windows("a", 300_001, 649_999, 100).is_empty());
    assert!(windows("zz", 0, i64::MAX, 100).is_empty());

    // Every key's windows: ordered by segment then key, as stored.
    let all = many(run(
        &s,
        &db,
        &Request::AllWindows {
            from: 0,
            to: i64::MAX,
            after: None,
            limit: 1_000,
        },
    ));
    let mut seen = BTreeSet::new();
    for (order, e) in &all {
        let start = e.start.expect("start");
        let k = inner
            .iter()
            .position(|k| json!(k) == e.key)
            .expect("a key written");
        let i = starts.iter().position(|s| *s == start).expect("a start");
        assert_eq!(e, &expect(k, i));
        assert_eq!(order, &seg.db_key(&window::key(inner[k].as_bytes(), start)));
        assert!(seen.insert((k, i)), "{e:?} listed twice");
    }
    assert_eq!(
        seen.len(),
        inner.len() * starts.len(),
        "every window listed"
    );
    check_paging(&s, &db.snapshot(), 0, i64::MAX, 24);
    // A time range: 4 starts of 6 for each key.
    check_paging(&s, &db.snapshot(), 100_000, 650_000, 16);
    let ranged = all_windows_paged(&s, &db.snapshot(), 100_000, 650_000, 3);
    assert!(ranged.iter().all(|(_, e)| {
        let t = e.start.expect("start");
        (100_000..=650_000).contains(&t)
    }));
}

#[test]
fn a_session_store_answers_by_session_end_and_pages_through_every_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let seg = Segments::for_retention(
        eddy_crds::Duration::from_millis(600_000),
        KeySchema::Session,
    );
    let db = open_windowed(&res, dir.path(), "sessions", seg);
    let inner = ["a", "ab", "b"];
    let sessions = [
        Window {
            start: 0,
            end: 1_000,
        },
        Window {
            start: 250_000,
            end: 310_000,
        },
        Window {
            start: 400_000,
            end: 400_000,
        },
        Window {
            start: 700_000,
            end: 950_000,
        },
    ];
    let count = |k: usize, i: usize| (10 * k + i + 1) as i64;
    let mut rows = Vec::new();
    for (k, key) in inner.iter().enumerate() {
        for (i, w) in sessions.iter().enumerate() {
            rows.push((
                KeySchema::Session.key(key.as_bytes(), *w),
                i64v(count(k, i)),
            ));
        }
    }
    commit(&db, "sessions", &rows, 12);
    let s = info(
        "sessions",
        Kind::Window(KeySchema::Session),
        Format::String,
        Format::I64,
        false,
    );
    let expect = |k: usize, i: usize| Entry {
        key: json!(inner[k]),
        value: json!(count(k, i)),
        start: Some(sessions[i].start),
        end: Some(sessions[i].end),
        timestamp: None,
        order: None,
    };
    let windows = |key: &str, from: i64, to: i64| {
        many(run(
            &s,
            &db,
            &Request::Windows {
                key: key.as_bytes().to_vec(),
                from,
                to,
                limit: 100,
            },
        ))
        .into_iter()
        .map(|(_, e)| e)
        .collect::<Vec<_>>()
    };
    // Sessions are found by their end: [1_000, 400_000] holds the first three.
    assert_eq!(
        windows("a", 1_000, 400_000),
        [expect(0, 0), expect(0, 1), expect(0, 2)]
    );
    assert_eq!(
        windows("a", 1_001, 400_000),
        [expect(0, 1), expect(0, 2)],
        "a session ending before `from` is out, though it started before"
    );
    assert_eq!(
        windows("ab", 300_000, i64::MAX),
        [expect(1, 1), expect(1, 2), expect(1, 3)],
        "a session that started before `from` but ends in range is in"
    );
    assert!(windows("b", 950_001, i64::MAX).is_empty());

    let all = many(run(
        &s,
        &db,
        &Request::AllWindows {
            from: 0,
            to: i64::MAX,
            after: None,
            limit: 1_000,
        },
    ));
    let listed: BTreeSet<(String, Window)> = all
        .iter()
        .map(|(order, e)| {
            let w = Window {
                start: e.start.expect("start"),
                end: e.end.expect("end"),
            };
            let k = e.key.as_str().expect("string").to_string();
            assert_eq!(order, &seg.db_key(&KeySchema::Session.key(k.as_bytes(), w)));
            (k, w)
        })
        .collect();
    assert_eq!(listed.len(), 12, "every session once");
    check_paging(&s, &db.snapshot(), 0, i64::MAX, 12);
    check_paging(&s, &db.snapshot(), 310_000, 400_000, 6);
}

/// The same rows on disk and in memory answer alike: one key, ranges, a key's windows, and
/// every key's windows (in-memory stores list those by time then key: the same set, paged
/// to the end).
#[test]
fn an_in_memory_store_answers_as_the_same_store_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let keys = ["a", "ab", "b", "c"];
    let times = [0, 100_000, 299_000, 300_000, 650_000];
    let layouts = [
        (Kind::KeyValue, None),
        (
            Kind::Window(KeySchema::Window { size: 1_000 }),
            Some(KeySchema::Window { size: 1_000 }),
        ),
        (Kind::Window(KeySchema::Session), Some(KeySchema::Session)),
    ];
    for (n, (kind, schema)) in layouts.into_iter().enumerate() {
        let path = dir.path().join(n.to_string());
        let db = match schema {
            Some(schema) => open_windowed(
                &res,
                &path,
                "s",
                Segments::for_retention(eddy_crds::Duration::from_millis(600_000), schema),
            ),
            None => open(&res, &path, &["s"]),
        };
        let mut rows = Vec::new();
        for (k, key) in keys.iter().enumerate() {
            for (i, t) in times.iter().enumerate() {
                let stored = match schema {
                    Some(KeySchema::Session) => KeySchema::Session.key(
                        key.as_bytes(),
                        Window {
                            start: t / 2,
                            end: *t,
                        },
                    ),
                    Some(_) => window::key(key.as_bytes(), *t),
                    None => format!("{key}{i}").into_bytes(),
                };
                rows.push((stored, i64v((10 * k + i) as i64)));
            }
        }
        commit(&db, "s", &rows, 21);
        let mem = MemoryStore::default();
        let changes: Vec<_> = rows
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        mem.apply([], &changes, crate::store::Mark::from(21));
        let s = info("s", kind, Format::String, Format::I64, false);
        let (disk, memory) = (db.snapshot(), mem.view(schema));
        assert_eq!(memory.checkpoint("s").expect("checkpoint"), Some(21));
        let mut requests = vec![
            get(b"a1"),
            get(b"zz"),
            range(b"", None, 100),
            range(b"a", Some(b"b"), 3),
            range(b"b", Some(b"a"), 3),
        ];
        if schema.is_some() {
            requests = ["a", "ab", "zz"]
                .iter()
                .flat_map(|k| {
                    [
                        (0, i64::MAX, 100),
                        (100_000, 300_000, 100),
                        (0, i64::MAX, 2),
                    ]
                    .map(|(from, to, limit)| Request::Windows {
                        key: k.as_bytes().to_vec(),
                        from,
                        to,
                        limit,
                    })
                })
                .collect();
        }
        for req in &requests {
            assert_eq!(
                read::run(&s, &memory, req).expect("memory"),
                read::run(&s, &disk, req).expect("disk"),
                "{kind:?}: {req:?}"
            );
        }
        if schema.is_some() {
            let set = |v: &dyn View| {
                all_windows_paged(&s, v, 100_000, 650_000, 3)
                    .into_iter()
                    .map(|(_, e)| serde_json::to_string(&e).expect("json"))
                    .collect::<BTreeSet<_>>()
            };
            assert_eq!(set(&memory), set(&disk), "{kind:?}");
            check_paging(&s, &memory, 0, i64::MAX, 20);
            check_paging(&s, &memory, 100_000, 650_000, 16);
        }
    }
}

/// Put versions through [`crate::versioned::VersionedStore`] (the processing side) and commit
/// what it wrote to `db`, as the task does.
fn put_versions(db: &TaskDb, history: i64, puts: &[(&str, Option<&str>, i64)], offset: i64) {
    use crate::cache::{Backend, StoreState};
    use crate::processor::Context;
    use crate::steps::driver::Recorder;
    use crate::topology::StoreDef;
    let def = StoreDef::versioned(
        "ver",
        Format::String,
        Format::Json,
        eddy_crds::Duration::from_millis(history as u64),
    );
    let mut stores = vec![StoreState::for_def(
        &def,
        "app-ver-changelog".into(),
        Backend::Rocks,
    )];
    let (mut sink, mut out) = (Recorder::default(), Vec::new());
    {
        let mut ctx = Context {
            stores: &mut stores,
            db: Some(db),
            global: None,
            sink: &mut sink,
            out: &mut out,
            topic: None,
        };
        let mut s =
            crate::versioned::VersionedStore::new(ctx.store("ver").expect("store"), history);
        for (k, v, ts) in puts {
            s.put(k.as_bytes(), v.map(str::as_bytes), *ts).expect("put");
        }
    }
    let st = &mut stores[0];
    st.take_dirty();
    let changes = st.take_committed(0);
    db.write(
        changes.iter().map(|(k, v)| {
            (
                "ver",
                Change {
                    key: k,
                    value: v.as_deref(),
                },
            )
        }),
        [("ver", offset)],
    )
    .expect("write");
}

#[test]
fn a_versioned_store_answers_the_newest_version_or_the_one_valid_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["ver"]);
    let history = 100;
    put_versions(
        &db,
        history,
        &[
            ("k", Some(r#""a""#), 10),
            ("k", Some(r#""b""#), 20),
            ("k", None, 30),
            ("k", Some(r#"{"v":"c"}"#), 40),
            ("k1", Some("1"), 15),
            ("gone", Some("1"), 5),
            ("gone", None, 25),
        ],
        7,
    );
    let s = info(
        "ver",
        Kind::Versioned { history },
        Format::String,
        Format::Json,
        false,
    );
    let at = |key: &str, as_of: Option<i64>| {
        one(run(
            &s,
            &db,
            &Request::Get {
                key: key.as_bytes().to_vec(),
                as_of,
            },
        ))
    };
    let version = |key: &str, v: Value, ts: i64| Some(kv(json!(key), v, Some(ts)));
    assert_eq!(
        at("k", None),
        version("k", json!({"v": "c"}), 40),
        "the newest, with the time it is valid from"
    );
    assert_eq!(at("k", Some(i64::MAX)), version("k", json!({"v": "c"}), 40));
    assert_eq!(at("k", Some(9)), None, "before the first version");
    assert_eq!(at("k", Some(10)), version("k", json!("a"), 10));
    assert_eq!(at("k", Some(25)), version("k", json!("b"), 20));
    assert_eq!(at("k", Some(35)), None, "deleted then");
    assert_eq!(at("k1", None), version("k1", json!(1), 15));
    assert_eq!(at("k1", Some(14)), None);
    assert_eq!(at("gone", None), None, "deleted last");
    assert_eq!(at("gone", Some(6)), version("gone", json!(1), 5));
    assert_eq!(at("", None), None);
    assert_eq!(at("stream-time", None), None, "the store's own bookkeeping");

    // Stream time moves to 500: lookups before 400 see only the newest version.
    put_versions(&db, history, &[("other", Some("0"), 500)], 8);
    assert_eq!(at("k", Some(25)), None, "beyond the history");
    assert_eq!(at("k", Some(399)), version("k", json!({"v": "c"}), 40));
    assert_eq!(at("k", None), version("k", json!({"v": "c"}), 40));
    assert_eq!(at("other", Some(500)), version("other", json!(0), 500));
}

#[test]
fn key_bytes_reads_a_key_in_each_format() {
    let kb = read::key_bytes;
    assert_eq!(kb(Format::String, "héllo wörld"), Ok("héllo wörld".into()));
    assert_eq!(kb(Format::String, " 1 "), Ok(b" 1 ".to_vec()), "as typed");
    assert_eq!(kb(Format::I64, "42"), Ok(i64v(42)));
    assert_eq!(kb(Format::I64, " -7 "), Ok(i64v(-7)));
    assert_eq!(kb(Format::I64, &i64::MIN.to_string()), Ok(i64v(i64::MIN)));
    for bad in ["4x", "", "1.5", "99999999999999999999"] {
        let e = kb(Format::I64, bad).expect_err(bad);
        assert!(e.contains("is not an i64 (a decimal integer)"), "{e}");
    }
    assert_eq!(kb(Format::Json, "u1"), Ok(br#""u1""#.to_vec()));
    assert_eq!(kb(Format::Json, r#""u1""#), Ok(br#""u1""#.to_vec()));
    assert_eq!(
        kb(Format::Json, r#"{ "id": 7, "n": [1, 2] }"#),
        Ok(br#"{ "id": 7, "n": [1, 2] }"#.to_vec()),
        "JSON as typed"
    );
    assert_eq!(kb(Format::Json, "12"), Ok(b"12".to_vec()));
    assert_eq!(kb(Format::Json, "null"), Ok(b"null".to_vec()));
    assert_eq!(
        kb(Format::Json, "not json {"),
        Ok(br#""not json {""#.to_vec())
    );
    assert_eq!(kb(Format::Bytes, "[1, 2, 255]"), Ok(vec![1, 2, 255]));
    assert_eq!(kb(Format::Bytes, "[]"), Ok(vec![]));
    assert_eq!(kb(Format::Bytes, "abc"), Ok(b"abc".to_vec()));
    assert_eq!(
        kb(Format::Bytes, "7"),
        Ok(b"7".to_vec()),
        "not an array: text"
    );
    assert!(kb(Format::Bytes, "[1, 256]").is_err(), "not a byte");
    let e = kb(Format::Windowed, "k").expect_err("windowed");
    assert!(e.contains("query the window store"), "{e}");
}

#[test]
fn json_renders_stored_bytes_and_reads_back_what_key_bytes_writes() {
    let s = info("s", Kind::KeyValue, Format::String, Format::Json, false);
    let cases: [(Format, &str, Value); 8] = [
        (Format::String, "héllo", json!("héllo")),
        (Format::String, "", json!("")),
        (Format::I64, "-42", json!(-42)),
        (Format::I64, "9223372036854775807", json!(i64::MAX)),
        (
            Format::Json,
            r#"{"id": 7, "tags": ["x"]}"#,
            json!({"id": 7, "tags": ["x"]}),
        ),
        (Format::Json, "u1", json!("u1")),
        (Format::Bytes, "[0, 1, 255]", json!([0, 1, 255])),
        (Format::Bytes, "hi", json!([104, 105])),
    ];
    for (f, text, want) in cases {
        let bytes = read::key_bytes(f, text).expect(text);
        assert_eq!(
            read::json(&s, "key", f, &bytes).expect(text),
            want,
            "{text}"
        );
    }
    for (f, bytes, says) in [
        (Format::String, &[0xff, 0xfe][..], "not string"),
        (Format::I64, &[1, 2, 3][..], "not i64"),
        (Format::Json, &b"{oops"[..], "not json"),
    ] {
        let e = read::json(&s, "key", f, bytes).expect_err(says);
        assert!(matches!(e, ReadError::Corrupt { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("store s holds a key that is") && text.contains(says),
            "{text}"
        );
    }
}

#[test]
fn a_snapshot_sees_the_data_and_checkpoint_of_one_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let db = open(&res, dir.path(), &["s", "g"]);
    commit(&db, "s", &[(b"a".to_vec(), b"1".to_vec())], 5);
    let partition = crate::store::partition_checkpoint("g", 3);
    db.write(
        [(
            "g",
            Change {
                key: b"x",
                value: Some(b"1"),
            },
        )],
        [(partition.as_str(), 11)],
    )
    .expect("write");
    let snap = db.snapshot();
    commit(
        &db,
        "s",
        &[
            (b"a".to_vec(), b"2".to_vec()),
            (b"b".to_vec(), b"3".to_vec()),
        ],
        6,
    );
    db.write(
        [(
            "g",
            Change {
                key: b"x",
                value: None,
            },
        )],
        [(partition.as_str(), 12)],
    )
    .expect("write");
    db.flush().expect("flush");

    assert_eq!(snap.get("s", b"a").expect("get"), Some(b"1".to_vec()));
    assert_eq!(snap.get("s", b"b").expect("get"), None, "written after");
    assert_eq!(
        snap.range("s", b"", None, 10).expect("range"),
        vec![(b"a".to_vec(), b"1".to_vec())]
    );
    assert_eq!(snap.checkpoint("s").expect("checkpoint"), Some(5));
    assert_eq!(snap.checkpoint("g").expect("checkpoint"), None);
    assert_eq!(snap.get("g", b"x").expect("get"), Some(b"1".to_vec()));
    assert_eq!(
        snap.partition_checkpoint("g", 3).expect("checkpoint"),
        Some(11)
    );
    assert_eq!(snap.partition_checkpoint("g", 4).expect("checkpoint"), None);
    assert!(
        snap.get("nope", b"a").is_err(),
        "a store the task does not have"
    );
    drop(snap);

    let now = db.snapshot();
    assert_eq!(now.get("s", b"a").expect("get"), Some(b"2".to_vec()));
    assert_eq!(now.range("s", b"", None, 10).expect("range").len(), 2);
    assert_eq!(now.checkpoint("s").expect("checkpoint"), Some(6));
    assert_eq!(now.get("g", b"x").expect("get"), None);
    assert_eq!(
        now.partition_checkpoint("g", 3).expect("checkpoint"),
        Some(12)
    );
}

#[test]
fn the_catalog_answers_from_published_copies_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let catalog = super::Catalog::default();
    let task = TaskId::new(0, 1);
    let db = Arc::new(open(&res, dir.path(), &["s"]));
    assert_eq!(catalog.holder(task), None);
    catalog.publish(task, Holder::Replica, Some(&db), Vec::new());
    assert_eq!(catalog.holder(task), Some(Holder::Replica));
    assert_eq!(
        catalog.with_copy(task, |h, c| (
            h,
            c.db.expect("a database").checkpoint("s").expect("read")
        )),
        Some((Holder::Replica, None))
    );
    // The active taking over replaces the replica; the replica letting go then leaves it.
    catalog.publish(task, Holder::Active, Some(&db), Vec::new());
    catalog.withdraw(task, Holder::Replica);
    assert_eq!(catalog.holder(task), Some(Holder::Active));
    catalog.withdraw(task, Holder::Active);
    assert_eq!(catalog.holder(task), None);
    assert!(catalog.with_copy(task, |_, _| ()).is_none());
    // A database closed without withdrawing is not read.
    catalog.publish(task, Holder::Active, Some(&db), Vec::new());
    drop(db);
    assert_eq!(catalog.holder(task), None);
    assert!(catalog.with_copy(task, |_, _| ()).is_none());
}

#[test]
fn a_copy_of_in_memory_stores_answers_until_withdrawn() {
    let catalog = super::Catalog::default();
    let task = TaskId::new(0, 2);
    let mem = MemoryStore::default();
    mem.apply(
        [],
        &[(b"k".to_vec(), Some(b"v".to_vec()))],
        crate::store::Mark::from(3),
    );
    catalog.publish(task, Holder::Active, None, vec![("m".into(), mem.clone())]);
    assert_eq!(catalog.holder(task), Some(Holder::Active));
    let read = |c: &super::Catalog| {
        c.with_copy(task, |_, copy| {
            assert!(copy.db.is_none() && copy.memory("other").is_none());
            let m = copy.memory("m").expect("the store");
            let d = m.read();
            (d.map.get(&b"k"[..]).cloned(), d.checkpoint)
        })
    };
    assert_eq!(read(&catalog), Some((Some(b"v".to_vec()), Some(3))));
    // A later commit is seen: the copy shares the store, it is not a copy of its data.
    mem.apply(
        [],
        &[(b"k".to_vec(), Some(b"w".to_vec()))],
        crate::store::Mark::from(4),
    );
    assert_eq!(read(&catalog), Some((Some(b"w".to_vec()), Some(4))));
    catalog.withdraw(task, Holder::Active);
    assert_eq!(catalog.holder(task), None);
    assert_eq!(read(&catalog), None);
}

// ---- Two workers over HTTP ----

const APP: &str = "applicationId: qa
kafka: {bootstrapServers: '127.0.0.1:1'}
topology:
  - from: {topic: t, key: string, value: json}
  - count: {store: counts}
  - to: {topic: out, value: i64}
";

const PODS: [&str; 2] = ["qa-0", "qa-1"];

/// Keys with characters that need escaping in a URL path.
const KEYS: [&str; 12] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "mary ann", "a/b",
    "zoë",
];

fn config(pod: &str) -> crate::config::WorkerConfig {
    crate::config::WorkerConfig::from_text(
        APP,
        Path::new("app.yaml"),
        crate::config::Overrides {
            instance_id: Some(pod.into()),
            ..Default::default()
        },
    )
    .expect("config")
}

fn worker(pod: &str) -> Arc<Status> {
    let status = Arc::new(Status::default());
    status.queries.set_app(&config(pod));
    status
        .queries
        .set_partitions(&HashMap::from([("t".to_string(), 2)]));
    status
}

/// Serve the query API of `status` on a port of its own; its address.
async fn serve(status: Arc<Status>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        axum::serve(
            listener,
            api::router(status, super::auth::Access::Anonymous, None),
        )
        .await
        .expect("serve");
    });
    address
}

/// Pod `i` runs task 0_i (as active) and answers queries at `addresses[i]`.
fn cluster(addresses: &[String; 2]) -> Cluster {
    let mut c = Cluster {
        assignment: Assignment {
            generation: 1,
            partitions: vec![2],
            ..Default::default()
        },
        workers: Default::default(),
        // The test's workers are not pods: each answers at the loopback port it reports.
        peers: PeerAddressing::Reported,
    };
    for (i, pod) in PODS.iter().enumerate() {
        let task = format!("0_{i}");
        c.assignment.pods.insert(
            pod.to_string(),
            PodTasks {
                active: vec![task.clone()],
                ..Default::default()
            },
        );
        c.workers.insert(
            pod.to_string(),
            WorkerStatus {
                applied_generation: 1,
                query_address: Some(addresses[i].clone()),
                tasks: [(
                    task,
                    TaskStatus {
                        role: TaskRole::Active,
                        state: TaskState::Running,
                        restore_backlog: 0,
                        lag: Some(0),
                    },
                )]
                .into(),
                ..Default::default()
            },
        );
    }
    c
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

async fn call(
    client: &HttpClient,
    address: &str,
    path: &str,
) -> (StatusCode, Option<String>, Value) {
    let (code, headers, body) = http::fetch(client, &format!("http://{address}{path}"), &[])
        .await
        .expect("an answer");
    let retry = headers
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().expect("ascii").to_string());
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (code, retry, body)
}

/// GET `path`, expecting 200 and a `T`.
async fn ok<T: serde::de::DeserializeOwned>(client: &HttpClient, address: &str, path: &str) -> T {
    let (code, _, body) = call(client, address, path).await;
    assert_eq!(code, StatusCode::OK, "{path}: {body}");
    serde_json::from_value(body).expect("an answer of its kind")
}

/// GET `path`, expecting `code` and an error; its message and Retry-After header.
async fn problem(
    client: &HttpClient,
    address: &str,
    path: &str,
    code: StatusCode,
) -> (String, Option<String>, Option<u64>) {
    let (got, retry, body) = call(client, address, path).await;
    assert_eq!(got, code, "{path}: {body}");
    let p: QueryProblem = serde_json::from_value(body).expect("a problem");
    (p.error, retry, p.retry_after_seconds)
}

/// Every key of `/stores/counts/keys{query}` read in pages of `limit`, following `next`.
async fn paged(client: &HttpClient, address: &str, query: &str, limit: usize) -> Vec<String> {
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..=KEYS.len() + 1 {
        let mut path = format!("/stores/counts/keys?limit={limit}{query}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let page: RangeAnswer = ok(client, address, &path).await;
        assert!(page.entries.len() <= limit, "{path}: {page:?}");
        let mut pods: Vec<&str> = page.answered_by.iter().map(|b| b.pod.as_str()).collect();
        pods.sort_unstable();
        assert_eq!(pods, PODS, "both partitions read: {page:?}");
        for e in &page.entries {
            assert!(e.order.is_none(), "the merge's bookkeeping is not shown");
            let k = e.key.as_str().expect("a string key").to_string();
            let n = KEYS.iter().position(|x| *x == k).expect("a key written");
            assert_eq!(e.value, json!(n + 1), "{k}");
            keys.push(k);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return keys,
        }
    }
    panic!("paging did not end: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_answer_every_key_forwarding_to_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let workers = [worker(PODS[0]), worker(PODS[1])];
    // Task 0_p's database on worker p, holding the keys of partition p.
    let mut partition_of = HashMap::new();
    let mut dbs = Vec::new();
    for (p, w) in workers.iter().enumerate() {
        let db = Arc::new(open(&res, &dir.path().join(format!("0_{p}")), &["counts"]));
        let rows: Vec<_> = KEYS
            .iter()
            .enumerate()
            .filter(|(_, k)| crate::partitioner::partition_for(k.as_bytes(), 2) == p as i32)
            .map(|(n, k)| {
                partition_of.insert(*k, p);
                (k.as_bytes().to_vec(), i64v(n as i64 + 1))
            })
            .collect();
        assert!(rows.len() >= 2, "each partition holds some keys");
        commit(&db, "counts", &rows, 100 + p as i64);
        w.queries.publish(
            TaskId::new(0, p as i32),
            Holder::Active,
            Some(&db),
            Vec::new(),
        );
        dbs.push(db);
    }
    let addresses = [
        serve(workers[0].clone()).await,
        serve(workers[1].clone()).await,
    ];
    for w in &workers {
        w.queries.set_cluster(cluster(&addresses));
    }
    let client = http::client();

    // The stores, from either worker.
    for a in &addresses {
        let stores: Vec<StoreDescription> = ok(&client, a, "/stores").await;
        assert_eq!(
            stores,
            [StoreDescription {
                name: "counts".into(),
                kind: "key-value".into(),
                key_format: "string".into(),
                value_format: "i64".into(),
                changelog: "qa-counts-changelog".into(),
                partitions: 2,
                not_queryable: None,
            }]
        );
    }

    // Every key from either worker: answered by the worker holding its partition.
    for (n, k) in KEYS.iter().enumerate() {
        let p = partition_of[k];
        for a in &addresses {
            let path = format!("/stores/counts/keys/{}", enc(k));
            let got: KeyAnswer = ok(&client, a, &path).await;
            assert!(got.found, "{k}");
            assert_eq!((got.key, got.value), (json!(k), json!(n + 1)), "{k}");
            assert_eq!(got.timestamp, None);
            let by = got.answered_by;
            assert_eq!(
                (by.pod.as_str(), by.task, by.role, by.lag),
                (PODS[p], format!("0_{p}"), TaskRole::Active, Some(0)),
                "{k} asked at {a}"
            );
            let position = by.position.expect("a position");
            assert_eq!(
                (position.topic.as_str(), position.partition, position.offset),
                ("qa-counts-changelog", p as i32, 100 + p as i64)
            );
        }
    }
    // A key nobody counted: found nowhere, said by the worker of its partition.
    let missing = "nobody";
    let p = crate::partitioner::partition_for(missing.as_bytes(), 2) as usize;
    for a in &addresses {
        let got: KeyAnswer = ok(&client, a, "/stores/counts/keys/nobody").await;
        assert!(!got.found);
        assert_eq!(got.value, Value::Null);
        assert_eq!(got.answered_by.pod, PODS[p]);
    }

    // Every key once, in byte order, however paged and wherever asked.
    let mut sorted: Vec<&str> = KEYS.to_vec();
    sorted.sort_unstable_by_key(|k| k.as_bytes());
    for a in &addresses {
        for limit in [1, 2, 5, KEYS.len(), 1000] {
            assert_eq!(paged(&client, a, "", limit).await, sorted, "limit {limit}");
        }
        // A range [from, to) across both partitions.
        let within: Vec<&str> = sorted
            .iter()
            .copied()
            .filter(|k| ("bob".as_bytes()..b"grace".as_slice()).contains(&k.as_bytes()))
            .collect();
        assert_eq!(within, ["bob", "carol", "dave", "erin", "frank"]);
        assert_eq!(paged(&client, a, "&from=bob&to=grace", 2).await, within);
    }

    // Mistakes a user makes, answered as such.
    let a = &addresses[0];
    let (why, retry, _) = problem(&client, a, "/stores/nope/keys/x", StatusCode::NOT_FOUND).await;
    assert!(
        why.contains(r#"no store "nope""#) && why.contains("its stores are: counts"),
        "{why}"
    );
    assert_eq!(retry, None);
    let (why, _, _) = problem(&client, a, "/stores/nope/keys", StatusCode::NOT_FOUND).await;
    assert!(why.contains("counts"), "{why}");
    let (why, retry, _) = problem(
        &client,
        a,
        "/stores/counts/keys/alice?colour=red",
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        why.contains(r#"unknown parameter "colour""#) && why.contains("asOf"),
        "{why}"
    );
    assert_eq!(retry, None);
    let (why, _, _) = problem(
        &client,
        a,
        "/stores/counts/keys?limit=0",
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(why.contains("limit"), "{why}");
    let (why, _, _) = problem(
        &client,
        a,
        "/stores/counts/keys/alice?maxLag=soon",
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(why.contains("maxLag"), "{why}");
    let (why, _, _) = problem(
        &client,
        a,
        "/stores/counts/keys/alice?asOf=5",
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(why.contains("only versioned stores"), "{why}");

    // Worker 1 lets go of its copy (closing it, or handing it over): its keys are
    // unavailable for a moment, from either worker; worker 0's still answer.
    workers[1]
        .queries
        .withdraw(TaskId::new(0, 1), Holder::Active);
    let k1 = KEYS.iter().find(|k| partition_of[*k] == 1).expect("a key");
    let k0 = KEYS.iter().find(|k| partition_of[*k] == 0).expect("a key");
    let path = format!("/stores/counts/keys/{}", enc(k1));
    let (why, retry, seconds) = problem(
        &client,
        &addresses[0],
        &path,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert!(
        why.contains("qa-1") && why.contains("holds no running copy of task 0_1"),
        "{why}"
    );
    assert_eq!((retry.as_deref(), seconds), (Some("1"), Some(1)));
    let (why, retry, seconds) = problem(
        &client,
        &addresses[1],
        &path,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert!(
        why.contains("task 0_1 is assigned here, and restoring"),
        "{why}"
    );
    assert_eq!((retry.as_deref(), seconds), (Some("1"), Some(1)));
    for a in &addresses {
        let (why, retry, _) = problem(
            &client,
            a,
            "/stores/counts/keys?limit=2",
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
        assert!(why.contains("partition 1"), "{why}");
        assert_eq!(retry.as_deref(), Some("1"));
        let got: KeyAnswer = ok(&client, a, &format!("/stores/counts/keys/{}", enc(k0))).await;
        assert!(got.found);
        assert_eq!(got.answered_by.pod, PODS[0]);
    }
    drop(dbs);
}

/// A server at a peer's address that is no worker: it reads one request's head, then
/// answers with `head` and, if `endless`, a chunked body that never ends.
async fn impostor(head: &'static str, endless: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if conn.write_all(head.as_bytes()).await.is_err() || !endless {
                    return;
                }
                let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                while conn.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_peer_answers_is_bounded_and_never_passed_on_raw() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = resources();
    let me = worker(PODS[0]);
    let db = Arc::new(open(&res, &dir.path().join("0_0"), &["counts"]));
    me.queries
        .publish(TaskId::new(0, 0), Holder::Active, Some(&db), Vec::new());
    let here = serve(me.clone()).await;
    let k1 = KEYS
        .iter()
        .find(|k| crate::partitioner::partition_for(k.as_bytes(), 2) == 1)
        .expect("a key of partition 1");
    let path = format!("/stores/counts/keys/{}", enc(k1));
    let client = http::client();

    // An error page of some other server: a bad gateway, its body not echoed.
    let page = impostor(
        "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 26\r\nconnection: close\r\n\r\n<html>admin: s3cret</html>",
        false,
    )
    .await;
    me.queries.set_cluster(cluster(&[here.clone(), page]));
    let (why, retry, _) = problem(&client, &here, &path, StatusCode::BAD_GATEWAY).await;
    assert!(
        why.contains("qa-1: answered 500 Internal Server Error without a problem document"),
        "{why}"
    );
    assert!(!why.contains("s3cret"), "{why}");
    assert_eq!(retry, None);

    // A 200 whose body never ends: cut off at the bound, with what to do about it.
    let endless = impostor(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        true,
    )
    .await;
    me.queries.set_cluster(cluster(&[here.clone(), endless]));
    let (why, _, _) = problem(&client, &here, &path, StatusCode::BAD_GATEWAY).await;
    assert!(
        why.contains("larger than 32 MiB: ask for fewer entries"),
        "{why}"
    );
    drop(db);
}

/// A table's values carry their record's timestamp only when its updates go on to a
/// table-table join (as `TableSource` writes them): queries must read each as written.
#[test]
fn only_tables_feeding_a_table_join_are_read_with_timestamps() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (example, store, stamped) in [
        ("examples/orders-enriched.yaml", "customers", false),
        ("examples/customer-accounts.yaml", "customers", true),
        ("examples/customer-accounts.yaml", "accounts", true),
    ] {
        let text = std::fs::read_to_string(repo.join(example)).expect("example");
        let cfg = crate::config::WorkerConfig::from_text(
            &text,
            Path::new(example),
            crate::config::Overrides {
                bootstrap_servers: Some("unused:9092".into()),
                ..Default::default()
            },
        )
        .expect("config");
        let catalog = super::Catalog::default();
        catalog.set_app(&cfg);
        let layout = catalog.layout();
        let info = layout
            .stores
            .iter()
            .find(|s| s.name == store)
            .expect("store");
        assert_eq!(info.stamped, stamped, "{example}: {store}");
    }
}

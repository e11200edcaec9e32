//! End-to-end tests of `eddy-worker` on a real Kafka broker: what a user of the engine would
//! notice — correct results, restarts that replay only the tail, exactly-once under crashes,
//! rebuilt state after a truncated changelog, stores edited between runs, and each `onError`
//! policy.

use anyhow::{Context, Result, ensure};
use eddy_e2e::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const READY: Duration = Duration::from_secs(120);
const DONE: Duration = Duration::from_secs(240);

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn i64_of(b: &[u8]) -> Result<i64> {
    Ok(i64::from_be_bytes(
        b.try_into().context("an i64 output must be 8 bytes")?,
    ))
}

fn payments(from: usize, n: usize) -> (Vec<Input>, HashMap<String, (i64, i64)>) {
    let mut records = Vec::new();
    let mut expected: HashMap<String, (i64, i64)> = HashMap::new();
    for i in from..from + n {
        let user = format!("u{}", (i * 7919) % 300);
        let amount = (i % 13) as i64;
        let status = if i % 5 == 0 { 404 } else { 200 };
        let v = format!(
            r#"{{"user":"{user}","amount":{amount},"status":{status},"pad":"xxxxxxxxxxxxxxxx"}}"#
        );
        records.push((
            Some(format!("order-{i}").into_bytes()),
            Some(v.into_bytes()),
        ));
        if status == 200 {
            let e = expected.entry(user).or_default();
            e.0 += 1;
            e.1 += amount;
        }
    }
    (records, expected)
}

fn merge(a: &mut HashMap<String, (i64, i64)>, b: HashMap<String, (i64, i64)>) {
    for (k, (c, s)) in b {
        let e = a.entry(k).or_default();
        e.0 += c;
        e.1 += s;
    }
}

/// Output (count, sum) per user, checking each key sits in murmur2's partition.
fn spend(topic: &str, partitions: i32) -> Result<HashMap<String, (i64, i64)>> {
    let mut out = HashMap::new();
    for r in read_all(topic)? {
        let (Some(k), Some(v)) = (r.key, r.value) else {
            continue;
        };
        ensure!(
            r.partition == eddy_worker::partitioner::partition_for(&k, partitions),
            "key {} is in partition {}, Kafka's partitioner says {}",
            s(&k),
            r.partition,
            eddy_worker::partitioner::partition_for(&k, partitions)
        );
        let v: serde_json::Value = serde_json::from_slice(&v)?;
        out.insert(
            s(&k),
            (
                v["count"].as_i64().unwrap_or(-1),
                v["sum"].as_i64().unwrap_or(-1),
            ),
        );
    }
    Ok(out)
}

fn changelog_end(topic: &str) -> Result<i64> {
    Ok(read_all(topic)?.len() as i64)
}

fn spend_app(app: &str, input: &str, output: &str, guarantee: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {app}}}
spec:
  processingGuarantee: {guarantee}
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}, key: string, value: json}}
    - filter: '.status == 200'
    - groupBy: '.user'
    - aggregate: {{store: spend, initial: '{{count: 0, sum: 0}}', add: '{{count: ($agg.count + 1), sum: ($agg.sum + .amount)}}'}}
    - to: {{topic: {output}, value: json}}
"#
    )
}

/// A re-keyed aggregation on 4 input partitions gives exact counts and sums, in the right
/// output partitions; a restart replays only the changelog tail; a deleted state dir is
/// restored in full with identical results.
#[test]
fn rekeyed_counts_and_sums_survive_restarts() -> Result<()> {
    let app = unique("spend");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 4)?;
    create_topic(&output, 3)?;
    let dir = tempfile::tempdir()?;
    let yaml = spend_app(&app, &input, &output, "at_least_once");
    let changelog = format!("{app}-spend-changelog");

    let (records, mut expected) = payments(0, 20_000);
    produce(&input, &records)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || Ok(spend(&output, 3)? == expected))?;
    // librdkafka's statistics (every 5 s) feed the lag of every input partition, named by
    // its task.
    wait_until(DONE, || {
        let m = w.metrics()?;
        Ok((0..4).all(|p| {
            m.contains(&format!(
                "eddy_consumer_lag_records{{topic=\"{input}\",partition=\"{p}\",task=\"0_{p}\"}} 0"
            ))
        }))
    })?;
    ensure!(w.stop()? == 0, "SIGTERM must exit 0:\n{}", w.logs());

    // Keep the state dir as it is now, then move on: the copy is "a state dir that is behind".
    let behind = tempfile::tempdir()?;
    copy_dir(&dir.path().join("state"), &behind.path().join("state"))?;
    let end_then = changelog_end(&changelog)?;

    let (more, exp2) = payments(20_000, 3_000);
    produce(&input, &more)?;
    merge(&mut expected, exp2);
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? == 0.0,
        "after a clean stop nothing needs restoring"
    );
    wait_until(DONE, || Ok(spend(&output, 3)? == expected))?;
    ensure!(w.stop()? == 0);

    // The old state dir: restore replays exactly the changelog records written since.
    let end_now = changelog_end(&changelog)?;
    std::fs::remove_dir_all(dir.path().join("state"))?;
    copy_dir(&behind.path().join("state"), &dir.path().join("state"))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let restored = w.metric("eddy_restored_records_total", &[])?;
    ensure!(
        restored == (end_now - end_then) as f64,
        "restored {restored} records, the tail is {}",
        end_now - end_then
    );
    ensure!(w.stop()? == 0);

    // No state dir at all: everything comes back from the changelog, results unchanged.
    std::fs::remove_dir_all(dir.path().join("state"))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let restored = w.metric("eddy_restored_records_total", &[])?;
    ensure!(
        restored == end_now as f64,
        "restored {restored} of {end_now} changelog records"
    );
    let (last, exp3) = payments(23_000, 500);
    produce(&input, &last)?;
    merge(&mut expected, exp3);
    wait_until(DONE, || Ok(spend(&output, 3)? == expected))?;
    ensure!(w.stop()? == 0);
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

fn count_app(app: &str, input: &str, output: &str, guarantee: &str, commit_ms: u64) -> String {
    count_app_with_cache(app, input, output, guarantee, commit_ms, "16Mi")
}

fn count_app_with_cache(
    app: &str,
    input: &str,
    output: &str,
    guarantee: &str,
    commit_ms: u64,
    cache: &str,
) -> String {
    format!(
        r#"applicationId: {app}
processingGuarantee: {guarantee}
commitIntervalMs: {commit_ms}
memory: {{recordCache: "{cache}"}}
topology:
  - from: {{topic: {input}}}
  - count: {{store: counts}}
  - to: {{topic: {output}, value: i64}}
"#
    )
}

fn keyed(n: usize, keys: usize) -> Vec<Input> {
    (0..n)
        .map(|i| {
            (
                Some(format!("k{}", i % keys).into_bytes()),
                Some(format!("{{\"i\":{i}}}").into_bytes()),
            )
        })
        .collect()
}

/// Crash the worker with SIGKILL `kills` times while it works through the input, then let it
/// finish. Returns every committed output value per key, in order.
fn run_with_kills(
    yaml: &str,
    dir: &Path,
    output: &str,
    keys: usize,
    per_key: i64,
    kills: usize,
) -> Result<HashMap<String, Vec<i64>>> {
    for k in 0..kills {
        let mut w = Worker::start(yaml, dir)?;
        w.wait_ready(READY)?;
        let before = w.metric("eddy_records_processed_total", &[])?;
        // Kill mid-flight: once this run has made some progress of its own. A fast earlier
        // run may have committed nearly everything, leaving this one less to do: then kill it
        // after a while anyway (the final checks hold either way).
        let _ = wait_until(Duration::from_secs(10), || {
            Ok(w.metric("eddy_records_processed_total", &[])?
                >= before + 5_000.0 + 3_000.0 * k as f64)
        });
        w.kill9()?;
    }
    let mut w = Worker::start(yaml, dir)?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        let last = latest_by_key(output)?;
        Ok(last.len() == keys && last.values().all(|v| i64_of(v).is_ok_and(|n| n >= per_key)))
    })?;
    ensure!(w.stop()? == 0);
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in read_all(output)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            seen.entry(s(&k)).or_default().push(i64_of(&v)?);
        }
    }
    Ok(seen)
}

/// Exactly-once: 100k records, repeated kill -9; the committed output per key is strictly
/// increasing and ends at the exact count — no duplicate, no loss.
#[test]
fn exactly_once_survives_repeated_kill_9() -> Result<()> {
    let app = unique("eos");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 6)?;
    create_topic(&output, 3)?;
    let (keys, per_key) = (1000, 100);
    produce(&input, &keyed(keys * per_key as usize, keys))?;
    let dir = tempfile::tempdir()?;
    // No record cache and a long commit interval: every update is sent as it happens, so a
    // kill leaves many uncommitted outputs behind that exactly-once must abort.
    let yaml = count_app_with_cache(&app, &input, &output, "exactly_once", 1000, "0");
    let seen = run_with_kills(&yaml, dir.path(), &output, keys, per_key, 3)?;
    ensure!(
        seen.len() == keys,
        "{} keys in the output, expected {keys}",
        seen.len()
    );
    for (k, values) in &seen {
        ensure!(
            values.windows(2).all(|w| w[0] < w[1]),
            "key {k}: committed outputs not strictly increasing: {values:?}"
        );
        ensure!(
            values.last() == Some(&per_key),
            "key {k}: final count {:?}, expected {per_key}",
            values.last()
        );
    }
    Ok(())
}

/// At-least-once under kill -9: nothing is lost (counts may only overshoot).
#[test]
fn at_least_once_loses_nothing_under_kill_9() -> Result<()> {
    let app = unique("alos");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 4)?;
    create_topic(&output, 2)?;
    let (keys, per_key) = (500, 40);
    produce(&input, &keyed(keys * per_key as usize, keys))?;
    let dir = tempfile::tempdir()?;
    let yaml = count_app(&app, &input, &output, "at_least_once", 500);
    let seen = run_with_kills(&yaml, dir.path(), &output, keys, per_key, 2)?;
    ensure!(seen.len() == keys);
    for (k, values) in &seen {
        ensure!(
            values.last().is_some_and(|n| *n >= per_key),
            "key {k} lost records: {values:?}"
        );
    }
    Ok(())
}

/// The record cache turns 20k updates of 10 keys into one output per key per commit,
/// without changing the final values.
#[test]
fn record_cache_coalesces_updates() -> Result<()> {
    let app = unique("cache");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 2)?;
    produce(&input, &keyed(20_000, 10))?;
    let dir = tempfile::tempdir()?;
    // One commit, at shutdown: the cache holds every update until then.
    let mut w = Worker::start(
        &count_app(&app, &input, &output, "at_least_once", 600_000),
        dir.path(),
    )?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 20_000.0)
    })?;
    ensure!(w.stop()? == 0);
    let out = read_all(&output)?;
    ensure!(
        out.len() == 10,
        "{} output records for 10 keys: updates were not coalesced",
        out.len()
    );
    for r in &out {
        ensure!(i64_of(r.value.as_deref().unwrap_or_default())? == 2_000);
    }
    let changelog = read_all(&format!("{app}-counts-changelog"))?;
    ensure!(
        changelog.len() == 10,
        "changelog has {} records",
        changelog.len()
    );
    Ok(())
}

/// A changelog truncated past the local checkpoint: that task is wiped and rebuilt, counted
/// in a metric, and the worker keeps running; untouched tasks only replay their tail.
#[test]
fn truncated_changelog_rebuilds_the_task() -> Result<()> {
    let app = unique("trunc");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 1)?;
    let yaml = count_app(&app, &input, &output, "at_least_once", 200);
    let dir = tempfile::tempdir()?;
    produce(&input, &keyed(2_000, 50))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 2_000.0)
    })?;
    ensure!(w.stop()? == 0);
    let behind = tempfile::tempdir()?;
    copy_dir(&dir.path().join("state"), &behind.path().join("state"))?;

    produce(&input, &keyed(2_000, 50))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 2_000.0)
    })?;
    ensure!(w.stop()? == 0);

    let changelog = format!("{app}-counts-changelog");
    let end0 = read_all(&changelog)?
        .iter()
        .filter(|r| r.partition == 0)
        .count() as i64;
    // Kafka refuses DeleteRecords on compact-only topics; a `compact,delete` changelog (as
    // window stores use) loses its head to retention the same way.
    set_topic_config(&changelog, "cleanup.policy", "compact,delete")?;
    delete_records(&changelog, 0, end0)?;
    std::fs::remove_dir_all(dir.path().join("state"))?;
    copy_dir(&behind.path().join("state"), &dir.path().join("state"))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric(
            "eddy_stores_rebuilt_total",
            &["task=\"0_0\"", "store=\"counts\""]
        )? == 1.0,
        "task 0_0 must be rebuilt:\n{}",
        w.logs()
    );
    ensure!(
        w.metric("eddy_stores_rebuilt_total", &["task=\"0_1\""])? == 0.0,
        "task 0_1 is covered by its changelog"
    );
    ensure!(w.logs().contains("wiping"), "the rebuild is logged");
    produce(&input, &keyed(100, 50))?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 100.0)
    })?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// A store of a two-store topology (see [`two_store_app`]): its name and whether it is in memory.
struct StoreSpec<'a>(&'a str, bool);

/// `count`, then an `aggregate` of the count's updates, in ONE sub-topology (so one task with
/// two stores), writing `{"n": updates the aggregate folded, "last": the count}` as JSON; with
/// `stats: None` the count goes straight to the output. The record cache is off so each input
/// record is exactly one update of each store.
fn two_store_app(
    app: &str,
    input: &str,
    output: &str,
    count: StoreSpec<'_>,
    stats: Option<StoreSpec<'_>>,
) -> String {
    let stats = stats.map_or(String::new(), |StoreSpec(name, mem)| {
        format!(
            "  - aggregate: {{store: {name}, inMemory: {mem}, initial: '{{n: 0, last: 0}}', add: '{{n: ($agg.n + 1), last: .}}'}}\n"
        )
    });
    format!(
        r#"applicationId: {app}
commitIntervalMs: 200
memory: {{recordCache: "0"}}
topology:
  - from: {{topic: {input}}}
  - count: {{store: {}, inMemory: {}}}
{stats}  - to: {{topic: {output}, value: json}}
"#,
        count.0, count.1
    )
}

/// Wait until the output's latest value of every key `k0..k{keys}` is `expected`.
fn await_outputs(w: &Worker, output: &str, keys: usize, expected: serde_json::Value) -> Result<()> {
    let mut last = HashMap::new();
    let ok = wait_until(DONE, || {
        last = latest_by_key(output)?
            .into_iter()
            .map(|(k, v)| (s(&k), serde_json::from_slice(&v).unwrap_or_default()))
            .collect::<HashMap<String, serde_json::Value>>();
        Ok((0..keys).all(|k| last.get(&format!("k{k}")) == Some(&expected)))
    });
    ok.with_context(|| {
        format!(
            "expected {expected} for every key, got {:?}\n{}",
            last.get("k0"),
            w.logs()
        )
    })
}

/// Stores renamed, moved to memory and back, and removed between runs on the same state
/// directory: every run starts, gets ready and continues each store from the right value; a
/// renamed store starts from zero (its changelog is new).
#[test]
fn store_edits_between_runs_keep_the_state_of_the_stores_that_remain() -> Result<()> {
    let app = unique("edits");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    let dir = tempfile::tempdir()?;
    let task_dir = dir.path().join("state").join(&app).join("0_0");
    let (keys, per_run) = (10, 50);
    let run = |yaml: String, expected: serde_json::Value, log: &[&str]| -> Result<()> {
        produce(&input, &keyed(keys * per_run, keys))?;
        let mut w = Worker::start(&yaml, dir.path())?;
        w.wait_ready(READY)?;
        await_outputs(&w, &output, keys, expected)?;
        for l in log {
            ensure!(w.logs().contains(l), "log must say {l:?}:\n{}", w.logs());
        }
        ensure!(w.stop()? == 0);
        Ok(())
    };
    let both = |count, stats| two_store_app(&app, &input, &output, count, Some(stats));
    let dropped = "is no longer in the topology (removed or renamed)";

    run(
        both(StoreSpec("counts", false), StoreSpec("stats", false)),
        serde_json::json!({"n": 50, "last": 50}),
        &[],
    )?;
    // Renamed: `tally` has a new, empty changelog and counts from zero; `stats` goes on.
    run(
        both(StoreSpec("tally", false), StoreSpec("stats", false)),
        serde_json::json!({"n": 100, "last": 50}),
        &[dropped, "store=counts", &format!("{app}-counts-changelog")],
    )?;
    // To memory while `stats` stays in RocksDB: restored from its changelog.
    run(
        both(StoreSpec("tally", true), StoreSpec("stats", false)),
        serde_json::json!({"n": 150, "last": 100}),
        &["store is now in memory", "store=tally"],
    )?;
    // Back to RocksDB: a new family that restores the whole changelog.
    run(
        both(StoreSpec("tally", false), StoreSpec("stats", false)),
        serde_json::json!({"n": 200, "last": 150}),
        &[],
    )?;
    // `stats` removed.
    run(
        two_store_app(&app, &input, &output, StoreSpec("tally", false), None),
        serde_json::json!(200),
        &[dropped, "store=stats"],
    )?;
    ensure!(task_dir.exists(), "tally is still persistent");
    // The last persistent store moves to memory: the task's RocksDB directory goes.
    run(
        two_store_app(&app, &input, &output, StoreSpec("tally", true), None),
        serde_json::json!(250),
        &["removed its RocksDB directory"],
    )?;
    ensure!(
        !task_dir.exists(),
        "{} must be removed: no persistent store is left",
        task_dir.display()
    );
    Ok(())
}

/// A task with two stores whose SECOND changelog (in restore order) was truncated past its
/// checkpoint: only that store is rebuilt; the first keeps its full state.
#[test]
fn truncated_changelog_rebuilds_only_its_store() -> Result<()> {
    truncated_second_changelog(false)
}

/// The same with the first store in memory: restored before the rebuild, it is not emptied.
#[test]
fn truncated_changelog_keeps_an_in_memory_store_of_the_task() -> Result<()> {
    truncated_second_changelog(true)
}

fn truncated_second_changelog(count_in_memory: bool) -> Result<()> {
    let app = unique("trunc2");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    // Changelogs restore in name order: `counts` before `stats`.
    let yaml = two_store_app(
        &app,
        &input,
        &output,
        StoreSpec("counts", count_in_memory),
        Some(StoreSpec("stats", false)),
    );
    let dir = tempfile::tempdir()?;
    let keys = 10;
    produce(&input, &keyed(500, keys))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    await_outputs(&w, &output, keys, serde_json::json!({"n": 50, "last": 50}))?;
    ensure!(w.stop()? == 0);
    let behind = tempfile::tempdir()?;
    copy_dir(&dir.path().join("state"), &behind.path().join("state"))?;

    produce(&input, &keyed(500, keys))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    await_outputs(
        &w,
        &output,
        keys,
        serde_json::json!({"n": 100, "last": 100}),
    )?;
    ensure!(w.stop()? == 0);

    // `stats` loses its whole changelog; the state dir goes back to the first run's, so its
    // checkpoint is below the changelog's start while `counts`' is still covered.
    let changelog = format!("{app}-stats-changelog");
    let end = changelog_end(&changelog)?;
    set_topic_config(&changelog, "cleanup.policy", "compact,delete")?;
    delete_records(&changelog, 0, end)?;
    std::fs::remove_dir_all(dir.path().join("state"))?;
    copy_dir(&behind.path().join("state"), &dir.path().join("state"))?;

    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    produce(&input, &keyed(100, keys))?;
    // `counts` continues from 100; `stats` restarts from what its changelog kept: nothing.
    await_outputs(&w, &output, keys, serde_json::json!({"n": 10, "last": 110}))?;
    ensure!(
        w.metric(
            "eddy_stores_rebuilt_total",
            &["task=\"0_0\"", "store=\"stats\""]
        )? == 1.0,
        "stats must be rebuilt:\n{}",
        w.logs()
    );
    ensure!(
        w.metric(
            "eddy_stores_rebuilt_total",
            &["task=\"0_0\"", "store=\"counts\""]
        )? == 0.0,
        "counts is covered by its changelog"
    );
    ensure!(
        w.logs().contains("wiping this store's local state"),
        "the rebuild is logged:\n{}",
        w.logs()
    );
    ensure!(w.stop()? == 0);
    Ok(())
}

/// A table of `input` kept in the store `items`, which the query API answers.
fn table_app(name: &str, input: &str, output: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  commitIntervalMs: 100
  processingGuarantee: at_least_once
  tables:
    items: {{topic: {input}}}
  topology:
    - from: {{table: items}}
    - to: {{topic: {output}}}
"#
    )
}

/// Whether the worker's query API finds `key` in the store `items`, once it answers.
fn item_found(w: &Worker, key: &str) -> Result<bool> {
    let mut found = None;
    wait_until(READY, || {
        let (code, body) = http_get(&w.http, &format!("/stores/items/keys/{key}"))?;
        if code == 200 {
            let answer: eddy_crds::query::KeyAnswer =
                serde_json::from_str(&body).with_context(|| body.clone())?;
            found = Some(answer.found);
        }
        Ok(found.is_some())
    })
    .with_context(|| format!("the query API did not answer for {key}:\n{}", w.logs()))?;
    Ok(found == Some(true))
}

/// A state directory whose checkpoint is older than its changelog keeps tombstones (a volume
/// kept for a day, a restored backup) does not bring a deleted row back: compaction removed
/// the delete from the changelog, so replaying from the checkpoint would leave the old value.
/// The store is rebuilt from the changelog instead, logged and counted.
#[test]
fn an_old_state_dir_does_not_bring_back_a_row_deleted_since() -> Result<()> {
    let name = unique("tomb");
    let (input, output) = (format!("{name}-in"), format!("{name}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], name.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    let row = |k: &str, v: i64| {
        (
            Some(k.as_bytes().to_vec()),
            Some(format!("{{\"v\":{v}}}").into_bytes()),
        )
    };
    produce(&input, &[row("gone", 1), row("kept", 1)])?;
    let yaml = table_app(&name, &input, &output);
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || item_found(&w, "gone"))?;
    ensure!(w.stop()? == 0);
    let old = tempfile::tempdir()?;
    copy_dir(&dir.path().join("state"), &old.path().join("state"))?;

    // Delete the row, then let compaction drop the value and, after delete.retention.ms, the
    // tombstone: the changelog no longer says anything about the key.
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    produce_tombstones(&input, &[(b"gone".to_vec(), eddy_worker::record::now_ms())])?;
    wait_until(DONE, || Ok(!item_found(&w, "gone")?))?;
    let changelog = format!("{name}-items-changelog");
    set_topic_configs(
        &changelog,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("min.compaction.lag.ms", "0"),
            ("delete.retention.ms", "2000"),
        ],
    )?;
    let mut v = 1;
    wait_until(DONE, || {
        // Records after the tombstone roll its segment and dirty the log again.
        v += 1;
        produce(&input, &[row("kept", v)])?;
        let records = read_all(&changelog)?;
        Ok(!records.iter().any(|r| r.key.as_deref() == Some(b"gone")))
    })
    .context("compaction did not remove the key's value and tombstone from the changelog")?;
    ensure!(w.stop()? == 0);

    // The old state dir's checkpoint predates the delete.
    std::fs::remove_dir_all(dir.path().join("state"))?;
    copy_dir(&old.path().join("state"), &dir.path().join("state"))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        !item_found(&w, "gone")?,
        "the deleted row came back from the old state dir:\n{}",
        w.logs()
    );
    ensure!(
        item_found(&w, "kept")?,
        "the rows the changelog has are restored"
    );
    ensure!(
        w.metric(
            "eddy_stores_rebuilt_total",
            &["store=\"items\"", "reason=\"tombstones_expired\""]
        )? == 1.0,
        "the rebuild is counted:\n{}",
        w.logs()
    );
    ensure!(
        w.logs()
            .contains("longer than the changelog keeps tombstones"),
        "the rebuild is logged"
    );
    ensure!(w.stop()? == 0);
    Ok(())
}

/// Collects the state updater's view of changelog ends from a consumer's statistics.
struct EndsContext(std::sync::Arc<std::sync::Mutex<eddy_worker::ends::Ends>>);

impl rdkafka::ClientContext for EndsContext {
    fn stats(&self, stats: rdkafka::statistics::Statistics) {
        if let Ok(mut ends) = self.0.lock() {
            ends.observe_stats(&stats, std::time::Instant::now());
        }
    }
}
impl rdkafka::consumer::ConsumerContext for EndsContext {}

/// Against a real broker, as the state updater reads them: librdkafka's statistics confirm a
/// partition's end while a consumer fetches it, and stop confirming it once the consumer stops
/// fetching (here paused; a broker out of reach alike), though they keep repeating the old end
/// while the topic grows: the lag computed from it becomes unknown, not 0.
#[test]
fn an_end_is_confirmed_only_while_its_partition_is_fetched() -> Result<()> {
    use eddy_worker::ends::{Ends, FRESH_FOR, fresh};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    use std::time::Instant;
    let topic = unique("ends");
    let _cleanup = Cleanup(vec![topic.clone()], topic.clone());
    create_topic(&topic, 1)?;
    let records = |n: usize| keyed(n, 3);
    produce(&topic, &records(10))?;
    let ends = std::sync::Arc::new(std::sync::Mutex::new(Ends::default()));
    let consumer: BaseConsumer<EndsContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap()?)
        .set("group.id", unique("ends-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("statistics.interval.ms", "1000")
        .create_with_context(EndsContext(ends.clone()))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    // Statistics are served by polls: the end as of `now`, if fresh.
    let poll_end = |now: Instant| -> Result<(Option<i64>, Option<i64>)> {
        let _ = consumer.poll(Duration::from_millis(200));
        let end = ends
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .get(&topic, 0);
        Ok((
            end.map(|e| e.offset),
            end.and_then(|e| fresh(Some(e.offset), e.confirmed, now)),
        ))
    };
    wait_until(Duration::from_secs(30), || {
        Ok(poll_end(Instant::now())?.1 == Some(10))
    })
    .context("a fetching consumer's statistics never confirmed the end")?;

    consumer.pause(&tpl)?;
    produce(&topic, &records(5))?;
    let paused = Instant::now();
    wait_until(FRESH_FOR + Duration::from_secs(20), || {
        Ok(poll_end(Instant::now())?.1.is_none())
    })
    .context("the end stayed fresh though nothing fetched it")?;
    ensure!(
        paused.elapsed() >= FRESH_FOR - Duration::from_secs(3),
        "fresh for {:?} only: the end went stale before its bound",
        paused.elapsed()
    );
    ensure!(
        poll_end(Instant::now())?.0 == Some(10),
        "the statistics repeat the old end (they cannot see the 5 new records)"
    );

    consumer.resume(&tpl)?;
    wait_until(Duration::from_secs(30), || {
        Ok(poll_end(Instant::now())?.1 == Some(15))
    })
    .context("fetching again did not confirm the new end")?;
    Ok(())
}

fn bad_inputs() -> Vec<Input> {
    vec![
        (Some(b"a".to_vec()), Some(br#"{"amount": 5}"#.to_vec())),
        (Some(b"a".to_vec()), Some(b"{not json".to_vec())),
        (Some(b"a".to_vec()), Some(br#"{"amount": "ten"}"#.to_vec())),
        (Some(b"a".to_vec()), Some(br#"{"amount": 7}"#.to_vec())),
    ]
}

fn sum_app(app: &str, input: &str, output: &str, on_error: &str) -> String {
    format!(
        r#"applicationId: {app}
onError: {on_error}
commitIntervalMs: 200
topology:
  - from: {{topic: {input}}}
  - aggregate: {{store: total, initial: '0', add: '$agg + .amount'}}
  - to: {{topic: {output}, value: json}}
"#
    )
}

/// `onError`: fail stops with topic, partition, offset and reason; skip counts and goes on;
/// deadLetter writes the original bytes with headers saying why.
#[test]
fn on_error_policies() -> Result<()> {
    let app = unique("bad");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    produce(&input, &bad_inputs())?;

    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(
        &sum_app(&format!("{app}-fail"), &input, &output, "fail"),
        dir.path(),
    )?;
    let code = w.wait_exit(DONE)?;
    let logs = w.logs();
    ensure!(code != 0, "onError: fail must stop the worker");
    ensure!(
        logs.contains(&format!("{input}[0]@1")) && logs.contains("not valid JSON"),
        "the error names the record and why:\n{logs}"
    );

    let mut w = Worker::start(
        &sum_app(&format!("{app}-skip"), &input, &output, "skip"),
        dir.path(),
    )?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_bad_records_total", &["outcome=\"skip\""])? == 2.0)
    })?;
    wait_until(DONE, || {
        Ok(latest_by_key(&output)?.get(b"a".as_slice()).map(|v| s(v)) == Some("12".into()))
    })?;
    ensure!(w.stop()? == 0);

    let dl_app = format!("{app}-dl");
    let mut w = Worker::start(&sum_app(&dl_app, &input, &output, "deadLetter"), dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_bad_records_total", &["outcome=\"dead_letter\""])? == 2.0)
    })?;
    ensure!(w.stop()? == 0);
    let dlq = read_all(&format!("{dl_app}-dlq"))?;
    ensure!(dlq.len() == 2, "{} dead letters", dlq.len());
    ensure!(
        dlq[0].value.as_deref() == Some(b"{not json".as_slice()),
        "original bytes kept"
    );
    ensure!(dlq[0].headers.get("eddy.error.offset").map(String::as_str) == Some("1"));
    ensure!(
        dlq[1]
            .headers
            .get("eddy.error.reason")
            .is_some_and(|r| r.contains("cannot")),
        "{:?}",
        dlq[1].headers
    );
    Ok(())
}

fn views_app(app: &str, input: &str, output: &str, before_group_by: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {app}}}
spec:
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}, key: string, value: json}}
{before_group_by}    - groupBy: {{key: '.user', name: by-user}}
    - count: {{store: views}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

/// Page views `from..from+n` for 40 users, every third one a 404; the expected count per
/// user, with or without the 404s.
fn views(from: usize, n: usize, with_404: bool, expected: &mut HashMap<String, i64>) -> Vec<Input> {
    (from..from + n)
        .map(|i| {
            let (user, status) = (format!("u{}", i % 40), if i % 3 == 0 { 404 } else { 200 });
            if with_404 || status == 200 {
                *expected.entry(user.clone()).or_default() += 1;
            }
            let v = format!(r#"{{"user":"{user}","status":{status}}}"#);
            (Some(format!("view-{i}").into_bytes()), Some(v.into_bytes()))
        })
        .collect()
}

fn counts(output: &str) -> Result<HashMap<String, i64>> {
    latest_by_key(output)?
        .iter()
        .map(|(k, v)| Ok((s(k), i64_of(v)?)))
        .collect()
}

/// A named groupBy keeps its repartition topic when a filter is inserted before it, between
/// two runs on the same state dir: records in flight in that topic when the old version
/// stopped are counted by the new one, and the counts stay exact.
#[test]
fn named_groupby_keeps_its_repartition_topic_when_a_step_is_inserted() -> Result<()> {
    let app = unique("named");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 3)?;
    create_topic(&output, 2)?;
    let dir = tempfile::tempdir()?;
    let repartition = format!("{app}-by-user-repartition");

    let mut expected = HashMap::new();
    produce(&input, &views(0, 3_000, true, &mut expected))?;
    let mut w = Worker::start(&views_app(&app, &input, &output, ""), dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || Ok(counts(&output)? == expected))?;
    ensure!(w.stop()? == 0);

    // Records the old version wrote to the repartition topic and had not read yet when it
    // stopped: produced there directly, keyed and partitioned as its groupBy does.
    let mut in_flight = HashMap::new();
    let records: Vec<Input> = views(3_000, 600, true, &mut in_flight)
        .into_iter()
        .map(|(_, v)| {
            let value: serde_json::Value =
                serde_json::from_slice(v.as_deref().unwrap_or_default())?;
            let user = value["user"].as_str().unwrap_or_default().to_string();
            Ok((Some(user.into_bytes()), v))
        })
        .collect::<Result<_>>()?;
    produce(&repartition, &records)?;
    for (user, n) in in_flight {
        *expected.entry(user).or_default() += n;
    }
    // The new version filters out 404s before the groupBy: it only changes what new input
    // contributes.
    produce(&input, &views(3_600, 3_000, false, &mut expected))?;
    let yaml = views_app(&app, &input, &output, "    - filter: '.status == 200'\n");
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || Ok(counts(&output)? == expected))?;
    ensure!(w.stop()? == 0);

    let mut internal: Vec<String> = topics_with_prefix(&format!("{app}-"))?
        .into_iter()
        .filter(|t| t != &input && t != &output)
        .collect();
    internal.sort();
    ensure!(
        internal == [repartition, format!("{app}-views-changelog")],
        "internal topics: {internal:?}"
    );
    Ok(())
}

/// A malformed app file is rejected at start with the field and what is expected.
#[test]
fn malformed_app_file_is_rejected_with_the_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "applicationId: x\ntopology:\n  - from: {topic: a}\n  - count: {stor: s}\n",
    )?;
    let out = std::process::Command::new(binary("eddy-worker")?)
        .args(["run", "--bootstrap-servers", "127.0.0.1:1", "-f"])
        .arg(&file)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success());
    ensure!(err.contains("topology[1]") && err.contains("stor"), "{err}");
    Ok(())
}

fn hostile_app(app: &str, input: &str, output: &str) -> String {
    format!(
        r#"applicationId: {app}
onError: skip
commitIntervalMs: 200
topology:
  - from: {{topic: {input}, key: string, value: json}}
  - filter: '.ok == true'
  - filter: '.step as $s | 0 | until(. >= 3; . + $s) | . >= 3'
  - count: {{store: counts}}
  - to: {{topic: {output}, value: i64}}
"#
    )
}

/// Hostile records among normal ones, under `onError: skip`: a document nested 200k deep
/// (which overflowed the stack of the direct evaluator), invalid UTF-8, truncated JSON, and a
/// record on which an expression never ends (`until` with a step of 0), which fails after the
/// default time budget. The same worker process skips exactly those, stays ready and healthy,
/// and counts the rest exactly.
#[test]
fn hostile_records_are_skipped_and_the_worker_survives() -> Result<()> {
    let app = unique("hostile");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;

    let normal = |i: usize| -> Input {
        let ok = !i.is_multiple_of(4);
        (
            Some(format!("user-{}", i % 7).into_bytes()),
            Some(format!(r#"{{"ok":{ok},"step":1,"i":{i}}}"#).into_bytes()),
        )
    };
    let mut expected: HashMap<String, i64> = HashMap::new();
    for i in 0..600usize {
        if !i.is_multiple_of(4) {
            *expected.entry(format!("user-{}", i % 7)).or_default() += 1;
        }
    }
    let deep = 200_000;
    let hostile: Vec<Input> = vec![
        (
            Some(b"user-0".to_vec()),
            Some(
                format!(
                    r#"{{"deep":{}{},"ok":true,"step":1}}"#,
                    "[".repeat(deep),
                    "]".repeat(deep)
                )
                .into_bytes(),
            ),
        ),
        (
            Some(b"user-1".to_vec()),
            Some(b"{\"ok\":true,\"step\":1,\"name\":\"caf\xc3\"}".to_vec()),
        ),
        (
            Some(b"user-2".to_vec()),
            Some(br#"{"ok":true,"step":1,"na"#.to_vec()),
        ),
        (
            Some(b"user-3".to_vec()),
            Some(br#"{"ok":true,"step":0}"#.to_vec()),
        ),
    ];
    // Hostile records spread among the normal ones.
    let mut records = Vec::new();
    for i in 0..600 {
        if i % 150 == 75 {
            records.push(hostile[i / 150].clone());
        }
        records.push(normal(i));
    }
    produce(&input, &records)?;

    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&hostile_app(&app, &input, &output), dir.path())?;
    w.wait_ready(READY)?;
    let pid = w.pid();
    let counts = || -> Result<HashMap<String, i64>> {
        latest_by_key(&output)?
            .into_iter()
            .map(|(k, v)| Ok((s(&k), i64_of(&v)?)))
            .collect()
    };
    wait_until(DONE, || Ok(counts()? == expected))?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_bad_records_total", &["outcome=\"skip\""])? == hostile.len() as f64)
    })?;
    ensure!(w.pid() == pid, "the same worker process");
    ensure!(
        http_get(&w.http, "/readyz")?.0 == 200 && http_get(&w.http, "/healthz")?.0 == 200,
        "the worker is still ready and healthy:\n{}",
        w.logs()
    );
    let logs = w.logs();
    ensure!(
        logs.contains("nested deeper than")
            && logs.contains("not valid UTF-8")
            && logs.contains("not valid JSON")
            && logs.contains("exceeded its time budget of 1000 ms"),
        "each skipped record is logged with its reason:\n{logs}"
    );
    ensure!(w.stop()? == 0, "SIGTERM must exit 0:\n{}", w.logs());
    Ok(())
}

/// A restore of a large backlog (100k records or more per partition, written to RocksDB as
/// SST files it ingests) is on disk before the task runs: killed with SIGKILL right after it
/// is ready, the worker restarts without restoring anything again; killed in the middle of
/// the restore, the next start finishes it; the state is right either way. A small memory
/// budget makes the restore write many files (2 MiB chunks). The values are random letters,
/// which do not compress: the first files are written compressed, the later ones without.
#[test]
fn large_restore_is_persisted_before_the_task_runs() -> Result<()> {
    let app = unique("bigrestore");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    let keys = 150_000;
    let mut x: u64 = 88172645463325252;
    let mut pad = || -> String {
        let mut text = [0u8; 200];
        incompressible_text(&mut x, &mut text);
        String::from_utf8_lossy(&text).into_owned()
    };
    let mut records = |from: usize, n: usize| -> Vec<Input> {
        (0..n)
            .map(|k| {
                (
                    Some(format!("k{k}").into_bytes()),
                    Some(format!(r#"{{"i":{},"pad":"{}"}}"#, from + k, pad()).into_bytes()),
                )
            })
            .collect()
    };
    produce(&input, &records(0, keys))?;
    // The state counts each key's records: a store restored wrong or partly shows in `n`.
    let yaml = format!(
        "applicationId: {app}\nmemory: {{budget: 16Mi}}\ntopology:\n  - from: {{topic: {input}, key: string, value: json}}\n  - aggregate: {{store: latest, initial: '{{n: 0}}', add: '{{n: ($agg.n + 1), i: .i, pad: .pad}}'}}\n  - to: {{topic: {output}, value: json}}\n"
    );
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= keys as f64)
    })?;
    ensure!(w.stop()? == 0);
    std::fs::remove_dir_all(dir.path().join("state"))?;

    // Killed once the restore is under way (~30 MB: several batches).
    let mut w = Worker::start(&yaml, dir.path())?;
    // Polled every few ms, not wait_until's 100 ms: a bulk restore of this size can finish
    // between two 100 ms polls.
    let deadline = std::time::Instant::now() + READY;
    let mut at = 0.0;
    while at == 0.0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the restore did not start"
        );
        std::thread::sleep(Duration::from_millis(2));
        at = w.metric("eddy_restored_records_total", &[]).unwrap_or(0.0);
    }
    w.kill9()?;
    ensure!(
        at < keys as f64,
        "killed after the restore ({at} records): the test needs a kill in the middle"
    );
    // Finished, then killed as soon as it is ready.
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let logs = w.logs();
    w.kill9()?;
    ensure!(
        logs.contains("could not shrink"),
        "restore judged the random values incompressible and wrote its later files plain:\n{logs}"
    );
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let again = w.metric("eddy_restored_records_total", &[])?;
    ensure!(
        again == 0.0,
        "restored {again} records again after a kill -9 that followed a complete restore"
    );
    // No SST file of the restore is left beside the database.
    let leftover: Vec<_> = std::fs::read_dir(dir.path().join("state").join(&app))?
        .filter_map(|t| std::fs::read_dir(t.ok()?.path().join("eddy-restore")).ok())
        .flatten()
        .collect();
    ensure!(leftover.is_empty(), "files left: {leftover:?}");
    // The restored state is the input's: a second record for each of the first 1000 keys
    // counts 2 and carries the new value.
    produce(&input, &records(keys, 1000))?;
    wait_until(DONE, || {
        let last = latest_by_key(&output)?;
        Ok((0..1000).all(|k| {
            last.get(format!("k{k}").as_bytes())
                .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
                .is_some_and(|v| {
                    v["i"] == serde_json::json!(keys + k) && v["n"].as_f64() == Some(2.0)
                })
        }))
    })?;
    ensure!(w.stop()? == 0);
    Ok(())
}

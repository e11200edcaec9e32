//! End-to-end tests of windowed aggregations on a real broker: event time from the value,
//! out-of-order and late records, final results per key and window as Kafka Streams defines
//! them, windowed keys a Java consumer reads, state that survives a restart, and changelogs
//! that Kafka itself expires.

use anyhow::{Context, Result, ensure};
use eddy_e2e::*;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const READY: Duration = Duration::from_secs(120);
const DONE: Duration = Duration::from_secs(240);

/// One login event: user, event time and value, in production order.
struct Event {
    user: String,
    at: i64,
    amount: i64,
}

/// Events for `users` users with event times that mostly move forward, jump back a little
/// (within grace) and now and then a lot (past grace): what a real feed of phone logins
/// looks like.
fn events(n: usize, users: usize, start: i64) -> Vec<Event> {
    let mut out = Vec::new();
    let mut now = start;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        now += (seed % 700) as i64;
        let at = match i % 50 {
            17 => now - 3_000,  // out of order, within a 5 s grace
            33 => now - 40_000, // far behind: late for a 10 s window with 5 s grace
            _ => now,
        };
        out.push(Event {
            user: format!("u{}", seed % users as u64),
            at: at.max(0),
            amount: (seed % 100) as i64,
        });
    }
    out
}

/// Event times near now: the brokers apply the changelogs' time-based retention to them.
fn an_hour_ago() -> Result<i64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(now.as_millis() as i64 - 3_600_000)
}

fn produce_events(topic: &str, events: &[Event]) -> Result<()> {
    let records: Vec<Input> = events
        .iter()
        .map(|e| {
            (
                Some(e.user.clone().into_bytes()),
                Some(format!(r#"{{"at":{},"amount":{}}}"#, e.at, e.amount).into_bytes()),
            )
        })
        .collect();
    produce(topic, &records)
}

/// Kafka Streams' semantics, written independently of eddy: per input partition (one task),
/// stream time is the largest event time seen; a record updates each window `[start,
/// start+size)` that holds it (starts are multiples of `advance`, at least 0) and whose end is
/// after stream time minus grace. Returns the final value per (user, start), with `fold`
/// combining the previous value (if any) and the record, and the number of records that
/// updated no window.
fn model(
    events: &[Event],
    partitions: i32,
    (size, advance, grace): (i64, i64, i64),
    fold: impl Fn(Option<i64>, &Event) -> i64,
) -> (BTreeMap<(String, i64), i64>, usize) {
    let mut out = BTreeMap::new();
    let mut stream_time: HashMap<i32, i64> = HashMap::new();
    let mut late = 0;
    for e in events {
        let p = eddy_worker::partitioner::partition_for(e.user.as_bytes(), partitions);
        let st = stream_time.entry(p).or_insert(i64::MIN);
        *st = (*st).max(e.at);
        let close = *st - grace;
        let mut start = (e.at - size + advance).max(0) / advance * advance;
        let mut updated = false;
        while start <= e.at {
            if start + size > close {
                let k = (e.user.clone(), start);
                let v = fold(out.get(&k).copied(), e);
                out.insert(k, v);
                updated = true;
            }
            start += advance;
        }
        if !updated {
            late += 1;
        }
    }
    (out, late)
}

fn app(name: &str, input: &str, output: &str, steps: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}, key: string, value: json, timestamp: '.at'}}
{steps}    - to: {{topic: {output}, key: json}}
"#
    )
}

/// `{"key": user, "start": ms, "end": ms}` keys and i64 (or JSON number) values, last per key.
fn windowed_results(
    topic: &str,
    size: i64,
    json_values: bool,
) -> Result<BTreeMap<(String, i64), i64>> {
    let mut out = BTreeMap::new();
    for (k, v) in latest_by_key(topic)? {
        let key: serde_json::Value = serde_json::from_slice(&k).context("a JSON windowed key")?;
        let (user, start, end) = (
            key["key"].as_str().context("key.key")?.to_string(),
            key["start"].as_i64().context("key.start")?,
            key["end"].as_i64().context("key.end")?,
        );
        ensure!(
            end == start + size,
            "window {start}..{end} is not {size} ms long"
        );
        let v = if json_values {
            serde_json::from_slice::<i64>(&v).context("a JSON number")?
        } else {
            i64::from_be_bytes(v.as_slice().try_into().context("an i64 count")?)
        };
        out.insert((user, start), v);
    }
    Ok(out)
}

/// A tumbling count with grace: each user's failures per 10 s window of event time, out of
/// order records within the grace period counted, records later than it dropped and
/// counted as dropped, exactly the final counts Kafka Streams' semantics give. A restart
/// resumes from the store (restored from RocksDB, not recounted), and the changelog is
/// `compact,delete` with the retention plus a day, so Kafka expires old windows too.
#[test]
fn a_tumbling_count_gives_final_counts_per_window_and_drops_late_records() -> Result<()> {
    let name = unique("logins");
    let (input, output) = (format!("{name}-in"), format!("{name}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], name.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 2)?;
    let yaml = app(
        &name,
        &input,
        &output,
        "    - window: {tumbling: 10s, grace: 5s, retention: 1h}\n    - count: {store: failures}\n",
    );
    let (size, grace) = (10_000, 5_000);
    let all = events(3_000, 20, an_hour_ago()?);
    let count = |old: Option<i64>, _: &Event| old.unwrap_or(0) + 1;
    let (first, rest) = all.split_at(2_000);
    produce_events(&input, first)?;
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let (expected, late) = model(first, 2, (size, size, grace), count);
    ensure!(late > 10, "the input must hold late records, has {late}");
    wait_until(DONE, || {
        Ok(windowed_results(&output, size, false)? == expected)
    })
    .with_context(|| format!("counts per window\n{}", w.logs()))?;
    let dropped = w.metric("eddy_bad_records_total", &["outcome=\"dropped\""])?;
    ensure!(
        dropped == late as f64,
        "{late} records were later than the grace period, {dropped} counted as dropped"
    );
    ensure!(w.stop()? == 0, "SIGTERM must exit 0:\n{}", w.logs());

    let config = kafka_tool(&[
        "configs",
        "--describe",
        "--entity-type",
        "topics",
        "--entity-name",
        &format!("{name}-failures-changelog"),
    ])?;
    ensure!(
        config.contains("cleanup.policy=compact,delete")
            && config.contains(&format!("retention.ms={}", 3_600_000 + 86_400_000)),
        "the changelog of a window store is compacted and deleted after retention + 1 day: {config}"
    );

    // The rest after a restart: stream time starts over (as in Kafka Streams), counts go on
    // from the store.
    produce_events(&input, rest)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? == 0.0,
        "after a clean stop nothing needs restoring"
    );
    let expected_rest = {
        // Stream time per partition restarts at the first record after the restart.
        let (mut merged, _) = model(first, 2, (size, size, grace), count);
        let (more, _) = model(rest, 2, (size, size, grace), count);
        for (k, n) in more {
            *merged.entry(k).or_insert(0) += n;
        }
        merged
    };
    wait_until(DONE, || {
        Ok(windowed_results(&output, size, false)? == expected_rest)
    })
    .with_context(|| format!("counts per window after the restart\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// A hopping reduce (sum of amounts per 20 s window every 5 s, no grace) from a state dir
/// wiped after the first run: the windows come back from the changelog and sums go on.
#[test]
fn a_hopping_reduce_restores_its_windows_from_the_changelog() -> Result<()> {
    let name = unique("spend");
    let (input, output) = (format!("{name}-in"), format!("{name}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], name.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 1)?;
    let yaml = app(
        &name,
        &input,
        &output,
        "    - map: '.amount'\n    - window: {hopping: 20s, advance: 5s, grace: 0s}\n    - reduce: {store: spend, with: '$agg + .'}\n",
    );
    let (size, advance) = (20_000, 5_000);
    let sum = |old: Option<i64>, e: &Event| old.unwrap_or(0) + e.amount;
    let all = events(1_500, 10, an_hour_ago()?);
    let (first, rest) = all.split_at(1_000);
    produce_events(&input, first)?;
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let (expected, _) = model(first, 2, (size, advance, 0), sum);
    wait_until(DONE, || {
        Ok(windowed_results(&output, size, true)? == expected)
    })
    .with_context(|| format!("sums per window\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);

    std::fs::remove_dir_all(dir.path().join("state"))?;
    produce_events(&input, rest)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? > 0.0,
        "a wiped state dir restores the windows from the changelog"
    );
    let (mut merged, _) = model(first, 2, (size, advance, 0), sum);
    let (more, _) = model(rest, 2, (size, advance, 0), sum);
    for (k, n) in more {
        *merged.entry(k).or_insert(0) += n;
    }
    wait_until(
        DONE,
        || Ok(windowed_results(&output, size, true)? == merged),
    )
    .with_context(|| format!("sums per window after the restore\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// Sessions of each user's events (in order, so none is late): events at most `gap` apart
/// are one session. (user, start, end) -> count.
/// (user, start, end) of a session, and its count.
type Sessions = BTreeMap<(String, i64, i64), i64>;

fn sessions(events: &[Event], gap: i64) -> Sessions {
    let mut by_user: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for e in events {
        by_user.entry(&e.user).or_default().push(e.at);
    }
    let mut out = BTreeMap::new();
    for (user, mut times) in by_user {
        times.sort();
        let mut cur: Option<(i64, i64, i64)> = None;
        for t in times {
            cur = match cur {
                Some((s, e, n)) if t - e <= gap => Some((s, t, n + 1)),
                Some((s, e, n)) => {
                    out.insert((user.to_string(), s, e), n);
                    Some((t, t, 1))
                }
                None => Some((t, t, 1)),
            };
        }
        if let Some((s, e, n)) = cur {
            out.insert((user.to_string(), s, e), n);
        }
    }
    out
}

/// A session count with `suppress: untilWindowCloses` across a restart that wipes the state
/// dir: the session store and the suppression buffer come back from their changelogs, and
/// each session is written once, whole, when it has closed (end + gap + grace behind stream
/// time), never before and never twice.
#[test]
fn suppressed_sessions_are_emitted_once_whole_across_a_restore() -> Result<()> {
    let name = unique("visits");
    let (input, output) = (format!("{name}-in"), format!("{name}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], name.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 1)?;
    let yaml = app(
        &name,
        &input,
        &output,
        "    - window: {session: 5s, grace: 1s}\n    - count: {store: visits}\n    - suppress: untilWindowCloses\n",
    );
    let (gap, grace) = (5_000, 1_000);
    // In order: every record is on time, so the sessions are those of all the events.
    let all: Vec<Event> = events(1_200, 8, an_hour_ago()?)
        .into_iter()
        .scan(i64::MIN, |last, mut e| {
            e.at = e.at.max(*last);
            *last = e.at;
            Some(e)
        })
        .collect();
    let (first, rest) = all.split_at(600);
    // Sessions a partition's stream time has closed: what suppress has emitted.
    let closed = |events: &[Event]| {
        let mut stream_time: HashMap<i32, i64> = HashMap::new();
        for e in events {
            let p = eddy_worker::partitioner::partition_for(e.user.as_bytes(), 2);
            let st = stream_time.entry(p).or_insert(i64::MIN);
            *st = (*st).max(e.at);
        }
        sessions(events, gap)
            .into_iter()
            .filter(|((user, _, end), _)| {
                let p = eddy_worker::partitioner::partition_for(user.as_bytes(), 2);
                end + gap + grace <= stream_time[&p]
            })
            .collect::<BTreeMap<_, _>>()
    };
    let emitted = || -> Result<(Sessions, usize)> {
        let records = read_all(&output)?;
        let mut out = BTreeMap::new();
        for r in &records {
            let key: serde_json::Value =
                serde_json::from_slice(r.key.as_deref().unwrap_or_default())
                    .context("a JSON key")?;
            let k = (
                key["key"].as_str().context("key.key")?.to_string(),
                key["start"].as_i64().context("key.start")?,
                key["end"].as_i64().context("key.end")?,
            );
            let v = r.value.as_deref().context("suppress emits no tombstones")?;
            let n = i64::from_be_bytes(v.try_into().context("an i64 count")?);
            ensure!(
                out.insert(k.clone(), n).is_none(),
                "session {k:?} emitted twice"
            );
        }
        Ok((out, records.len()))
    };

    produce_events(&input, first)?;
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let want = closed(first);
    ensure!(
        want.len() > 10,
        "{} sessions closed in the first half",
        want.len()
    );
    wait_until(DONE, || Ok(emitted()?.0 == want))
        .with_context(|| format!("closed sessions, once each\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);

    std::fs::remove_dir_all(dir.path().join("state"))?;
    produce_events(&input, rest)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let want = closed(&all);
    wait_until(DONE, || Ok(emitted()?.0 == want))
        .with_context(|| format!("closed sessions after the restore\n{}", w.logs()))?;
    let (_, n) = emitted()?;
    ensure!(n == want.len(), "{n} records for {} sessions", want.len());
    ensure!(
        sessions(&all, gap).len() > want.len(),
        "the sessions still open at the end are not emitted"
    );
    ensure!(w.stop()? == 0);
    Ok(())
}

//! The windowed half of eddy vs Kafka Streams (`compare`): the input (`Generate --windowed`
//! of the reference app), both engines' windowed outputs compared window by window, and a
//! model of Kafka Streams' window semantics written here from its documented rules (per task
//! stream time, grace, session merges, suppression), run on the input as read back from the
//! broker, that the agreed result must also match.

use crate::compare::{Case, RETENTION_MS, WindowSpec};
use crate::*;
use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};

/// Distinct keys of the windowed input: each key recurs about every 4 s of event time, so
/// with ~100 records per key the input spans ~7 minutes whatever its size.
pub fn windowed_keys(records: usize) -> usize {
    (records / 100).max(10)
}

/// The windowed input topic (`Generate --windowed`, seed 1), reused when one of the same
/// sizes exists. Event time starts an hour ago, so that the brokers' time-based retention of
/// the windowed changelogs (retention + one day) keeps everything.
pub fn ensure_windowed_input(
    jar: &Path,
    records: usize,
    partitions: i32,
    prefix: &str,
) -> Result<String> {
    let keys = windowed_keys(records);
    let topic = format!("{prefix}-windowed-{records}-{keys}-{partitions}");
    if partition_count(&topic)? == partitions && read_count_fast(&topic)? == records as i64 {
        eprintln!("reusing windowed input topic {topic}");
        return Ok(topic);
    }
    let _ = delete_topics(&[&topic]);
    wait_until(std::time::Duration::from_secs(30), || {
        Ok(partition_count(&topic)? == 0)
    })?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let base = (now.as_millis() as i64 - 3_600_000) / 60_000 * 60_000;
    eprintln!("producing {records} windowed records over {keys} keys to {topic}");
    let out = Command::new("java")
        .arg("-cp")
        .arg(jar)
        .arg("dev.eddy.bench.Generate")
        .args([
            "--windowed",
            "--bootstrap",
            &bootstrap()?,
            "--topic",
            &topic,
        ])
        .args([
            "--records",
            &records.to_string(),
            "--keys",
            &keys.to_string(),
        ])
        .args(["--partitions", &partitions.to_string(), "--seed", "1"])
        .args(["--base-ms", &base.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("running the reference app's Generate --windowed")?;
    if !out.status.success() {
        bail!("Generate --windowed failed ({})", out.status);
    }
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    Ok(topic)
}

/// One input event as the engines see it: its partition (= task), key and fields.
#[derive(Clone, Debug)]
pub struct Event {
    pub partition: i32,
    pub key: String,
    pub ts: i64,
    pub amount: i64,
}

/// The input, in partition and offset order (each task's processing order).
pub fn read_events(topic: &str) -> Result<Vec<Event>> {
    read_all(topic)?
        .into_iter()
        .map(|r| {
            let key = String::from_utf8(r.key.clone().unwrap_or_default())?;
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or(b""))
                .with_context(|| format!("input record {}@{}", r.partition, r.offset))?;
            Ok(Event {
                partition: r.partition,
                key,
                ts: v["ts"].as_i64().context("input value without ts")?,
                amount: v["amount"].as_i64().context("input value without amount")?,
            })
        })
        .collect()
}

/// A window as both engines write its key: inner key, start, end (sessions: both inclusive).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WinKey {
    pub inner: String,
    pub start: i64,
    pub end: i64,
}

impl WinKey {
    /// Kafka Streams' windowed serdes: time windows are the inner key then the start (8-byte
    /// big-endian); sessions the inner key, then the end, then the start.
    pub fn decode(spec: WindowSpec, k: &[u8]) -> Option<WinKey> {
        let long = |b: &[u8]| b.try_into().ok().map(i64::from_be_bytes);
        match spec {
            WindowSpec::Session { .. } => {
                let at = k.len().checked_sub(16)?;
                Some(WinKey {
                    inner: String::from_utf8(k[..at].to_vec()).ok()?,
                    end: long(&k[at..at + 8])?,
                    start: long(&k[at + 8..])?,
                })
            }
            WindowSpec::Time { size, .. }
            | WindowSpec::Sliding {
                difference: size, ..
            } => {
                let at = k.len().checked_sub(8)?;
                let start = long(&k[at..])?;
                Some(WinKey {
                    inner: String::from_utf8(k[..at].to_vec()).ok()?,
                    start,
                    end: start + size,
                })
            }
        }
    }

    pub fn encode(&self, spec: WindowSpec) -> Vec<u8> {
        let mut k = self.inner.as_bytes().to_vec();
        if let WindowSpec::Session { .. } = spec {
            k.extend_from_slice(&self.end.to_be_bytes());
        }
        k.extend_from_slice(&self.start.to_be_bytes());
        k
    }
}

impl std::fmt::Display for WinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}, {}]", self.inner, self.start, self.end)
    }
}

/// An output record: partition, value (None: a tombstone), timestamp.
pub type Out = (i32, Option<Vec<u8>>, i64);

/// Every record of a windowed output topic, keys decoded, in partition and offset order.
pub fn read_output(spec: WindowSpec, topic: &str) -> Result<Vec<(WinKey, Out)>> {
    read_all(topic)?
        .into_iter()
        .map(|r| {
            let k = r.key.unwrap_or_default();
            let w = WinKey::decode(spec, &k).with_context(|| {
                format!(
                    "{topic}: key {:?} is not a windowed key",
                    String::from_utf8_lossy(&k)
                )
            })?;
            Ok((w, (r.partition, r.value, r.timestamp)))
        })
        .collect()
}

/// The last record per window; a tombstone removes the window (a replaced session).
pub fn final_windows(records: &[(WinKey, Out)]) -> BTreeMap<WinKey, (i32, Vec<u8>, i64)> {
    let mut m = BTreeMap::new();
    for (k, (p, v, ts)) in records {
        match v {
            Some(v) => {
                m.insert(k.clone(), (*p, v.clone(), *ts));
            }
            None => {
                m.remove(k);
            }
        }
    }
    m
}

fn value_of(case: Case, v: &[u8]) -> Option<i64> {
    if case == Case::HoppingAggregate || case == Case::WindowedReduce {
        std::str::from_utf8(v).ok()?.parse().ok()
    } else {
        <[u8; 8]>::try_from(v).ok().map(i64::from_be_bytes)
    }
}

fn show(case: Case, v: Option<&[u8]>) -> String {
    match v {
        None => "tombstone".into(),
        Some(v) => value_of(case, v).map_or_else(
            || {
                format!(
                    "{:?} (not a value of this case)",
                    String::from_utf8_lossy(v)
                )
            },
            |n| n.to_string(),
        ),
    }
}

/// What a windowed comparison found.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// Windows in the final result (with suppress: records emitted).
    pub windows: usize,
    /// Input records no window took (later than the grace period), per the model.
    pub dropped: usize,
    /// One line for the log.
    pub summary: String,
}

/// Compare both engines' windowed outputs window by window, then the agreed result with the
/// model. Err lists the first differing windows.
pub fn compare(case: Case, input: &[Event], eddy_out: &str, ks_out: &str) -> Result<Checked> {
    let spec = case.window().context("not a windowed case")?;
    let k = read_output(spec, ks_out)?;
    let e = read_output(spec, eddy_out)?;
    let model = Model::run(case, input);
    let mut c = Checked {
        dropped: model.dropped,
        ..Checked::default()
    };
    if case == Case::TumblingSuppress {
        // Final results only: the exact multiset of emitted records, no tombstones, no
        // window twice.
        let sorted = |v: &[(WinKey, Out)]| {
            let mut v: Vec<(WinKey, i32, Option<Vec<u8>>)> = v
                .iter()
                .map(|(k, (p, v, _))| (k.clone(), *p, v.clone()))
                .collect();
            v.sort();
            v
        };
        let (se, sk) = (sorted(&e), sorted(&k));
        for (who, s) in [("eddy", &se), ("Kafka Streams", &sk)] {
            if let Some(w) = s.windows(2).find(|w| w[0].0 == w[1].0) {
                bail!(
                    "{}: {who} emitted window {} more than once ({} and {})",
                    case.name(),
                    w[0].0,
                    show(case, w[0].2.as_deref()),
                    show(case, w[1].2.as_deref())
                );
            }
        }
        let fe: BTreeMap<WinKey, (i32, Option<Vec<u8>>)> =
            se.into_iter().map(|(k, p, v)| (k, (p, v))).collect();
        let fk: BTreeMap<WinKey, (i32, Option<Vec<u8>>)> =
            sk.into_iter().map(|(k, p, v)| (k, (p, v))).collect();
        diff(case, "emitted", &fe, &fk)?;
        c.windows = fe.len();
        let got: BTreeMap<WinKey, i64> = fe
            .iter()
            .filter_map(|(w, (_, v))| Some((w.clone(), value_of(case, v.as_deref()?)?)))
            .collect();
        model.check(case, &got)?;
    } else {
        let (fe, fk) = (final_windows(&e), final_windows(&k));
        let strip = |m: &BTreeMap<WinKey, (i32, Vec<u8>, i64)>| {
            m.iter()
                .map(|(w, (p, v, _))| (w.clone(), (*p, Some(v.clone()))))
                .collect::<BTreeMap<_, _>>()
        };
        diff(case, "final", &strip(&fe), &strip(&fk))?;
        // Both write a window's largest event time as its record's timestamp.
        let times: Vec<String> = fe
            .iter()
            .filter_map(|(w, (_, _, ts))| {
                let t = fk.get(w)?.2;
                (t != *ts).then(|| format!("{w}: eddy {ts}, Kafka Streams {t}"))
            })
            .collect();
        if !times.is_empty() {
            bail!(
                "{}: {} windows' record timestamps differ, first: {}",
                case.name(),
                times.len(),
                times[..times.len().min(3)].join("; ")
            );
        }
        c.windows = fe.len();
        let got: BTreeMap<WinKey, i64> = fe
            .iter()
            .filter_map(|(w, (_, v, _))| Some((w.clone(), value_of(case, v)?)))
            .collect();
        if case == Case::SlidingCount {
            sliding_bounds(input, &got)?;
        } else {
            model.check(case, &got)?;
        }
    }
    c.summary = format!(
        "{} windows agree{}",
        c.windows,
        if case == Case::SlidingCount {
            " (each within the input's bounds)".to_string()
        } else {
            format!(
                " and match the model of Kafka Streams' semantics; {} of {} input records later than the grace period",
                c.dropped,
                input.len()
            )
        },
    );
    Ok(c)
}

type Side = BTreeMap<WinKey, (i32, Option<Vec<u8>>)>;

/// Err with the first differing windows of both engines' results.
fn diff(case: Case, what: &str, e: &Side, k: &Side) -> Result<()> {
    let mut keys: Vec<&WinKey> = e.keys().chain(k.keys()).collect();
    keys.sort();
    keys.dedup();
    let f = |x: Option<&(i32, Option<Vec<u8>>)>| {
        x.map_or("missing".to_string(), |(p, v)| {
            format!("partition {p} value {}", show(case, v.as_deref()))
        })
    };
    let diffs: Vec<String> = keys
        .iter()
        .filter(|w| e.get(**w) != k.get(**w))
        .map(|w| {
            format!(
                "  {w}: eddy {} / Kafka Streams {}",
                f(e.get(*w)),
                f(k.get(*w))
            )
        })
        .collect();
    if !diffs.is_empty() {
        bail!(
            "{}: {} of {} {what} windows differ (eddy {}, Kafka Streams {}); first ones (key [start, end]):\n{}",
            case.name(),
            diffs.len(),
            keys.len(),
            e.len(),
            k.len(),
            diffs[..diffs.len().min(10)].join("\n")
        );
    }
    Ok(())
}

/// Kafka Streams' windowed semantics over the input, written from its documented rules: per
/// partition (task) stream time is the largest event time the aggregation has seen; a record
/// updates the windows holding it whose end is after stream time minus grace (sessions: whose
/// merged end is at least stream time minus grace minus gap) and is dropped when it updates none.
pub struct Model {
    /// Final value per window.
    pub windows: BTreeMap<WinKey, i64>,
    /// Largest event time per partition at the end of the input.
    pub stream_time: HashMap<i32, i64>,
    /// The partition (task) of each key.
    pub partition_of: HashMap<String, i32>,
    pub dropped: usize,
}

impl Model {
    pub fn run(case: Case, input: &[Event]) -> Model {
        let mut m = Self::windows(case, input);
        m.partition_of = input.iter().map(|e| (e.key.clone(), e.partition)).collect();
        m
    }

    fn empty() -> Model {
        Model {
            windows: BTreeMap::new(),
            stream_time: HashMap::new(),
            partition_of: HashMap::new(),
            dropped: 0,
        }
    }

    fn windows(case: Case, input: &[Event]) -> Model {
        match case.window() {
            Some(WindowSpec::Time {
                size,
                advance,
                grace,
            }) => time_windows(case, input, size, advance, grace),
            Some(WindowSpec::Session { gap, grace }) => sessions(input, gap, grace),
            // Sliding windows are checked against bounds only (see `sliding_bounds`).
            _ => Model::empty(),
        }
    }

    /// Err unless `got` is what the model expects: every window with its final value, or with
    /// suppress exactly the windows closed by the end of the input (end + grace <= the stream
    /// time of their partition).
    fn check(&self, case: Case, got: &BTreeMap<WinKey, i64>) -> Result<()> {
        let want: BTreeMap<WinKey, i64> = match (case, case.window()) {
            (Case::TumblingSuppress, Some(WindowSpec::Time { grace, .. })) => self
                .windows
                .iter()
                .filter(|(w, _)| {
                    self.partition_of
                        .get(&w.inner)
                        .and_then(|p| self.stream_time.get(p))
                        .is_some_and(|st| w.end + grace <= *st)
                })
                .map(|(w, v)| (w.clone(), *v))
                .collect(),
            _ => self.windows.clone(),
        };
        if &want == got {
            return Ok(());
        }
        let mut keys: Vec<&WinKey> = want.keys().chain(got.keys()).collect();
        keys.sort();
        keys.dedup();
        let diffs: Vec<String> = keys
            .iter()
            .filter(|w| want.get(**w) != got.get(**w))
            .take(10)
            .map(|w| {
                let f = |x: Option<&i64>| x.map_or("missing".into(), i64::to_string);
                format!(
                    "  {w}: engines {} / model {}",
                    f(got.get(*w)),
                    f(want.get(*w))
                )
            })
            .collect();
        bail!(
            "{}: the engines agree ({} windows), but not with the model of Kafka Streams' semantics ({} windows); first differences:\n{}",
            case.name(),
            got.len(),
            want.len(),
            diffs.join("\n")
        )
    }
}

/// Tumbling and hopping windows (`KStreamWindowAggregate`): windows `[start, start + size)`
/// with starts at multiples of `advance`; count, sum of amounts or largest amount.
fn time_windows(case: Case, input: &[Event], size: i64, advance: i64, grace: i64) -> Model {
    let mut m = Model::empty();
    for e in input {
        let st = m.stream_time.entry(e.partition).or_insert(i64::MIN);
        *st = (*st).max(e.ts);
        let close = *st - grace;
        let mut start = (e.ts - size + advance).max(0) / advance * advance;
        let mut updated = false;
        while start <= e.ts {
            if start + size > close {
                let w = WinKey {
                    inner: e.key.clone(),
                    start,
                    end: start + size,
                };
                let old = m.windows.get(&w).copied();
                let new = match case {
                    Case::HoppingAggregate => old.unwrap_or(0) + e.amount,
                    Case::WindowedReduce => old.map_or(e.amount, |o| o.max(e.amount)),
                    _ => old.unwrap_or(0) + 1,
                };
                m.windows.insert(w, new);
                updated = true;
            }
            start += advance;
        }
        if !updated {
            m.dropped += 1;
        }
    }
    m
}

/// Session windows (`KStreamSessionWindowAggregate`): a record joins every session of its key
/// that ends at most `gap` before it or starts at most `gap` after it (they merge into one,
/// their counts added); dropped if the merged session ends before stream time − grace − gap.
/// The session store hides sessions that ended before its own stream time (the largest
/// session end) − retention, as Kafka Streams' segmented store does.
fn sessions(input: &[Event], gap: i64, grace: i64) -> Model {
    let mut m = Model::empty();
    let mut store_time: HashMap<i32, i64> = HashMap::new();
    let mut by_key: HashMap<String, Vec<(i64, i64, i64)>> = HashMap::new();
    for e in input {
        let st = m.stream_time.entry(e.partition).or_insert(i64::MIN);
        *st = (*st).max(e.ts);
        let close = *st - grace - gap;
        let store_st = store_time.entry(e.partition).or_insert(i64::MIN);
        let earliest_end = (e.ts - gap).max(store_st.saturating_sub(RETENTION_MS) + 1);
        let sessions = by_key.entry(e.key.clone()).or_default();
        let (mut start, mut end, mut count) = (e.ts, e.ts, 0);
        let mut found = Vec::new();
        for (i, &(s, en, c)) in sessions.iter().enumerate() {
            if en >= earliest_end && s <= e.ts + gap {
                found.push(i);
                (start, end, count) = (start.min(s), end.max(en), count + c);
            }
        }
        if end < close {
            m.dropped += 1;
            continue;
        }
        for &i in found.iter().rev() {
            sessions.remove(i);
        }
        sessions.push((start, end, count + 1));
        *store_st = (*store_st).max(end);
    }
    for (key, list) in by_key {
        for (start, end, count) in list {
            m.windows.insert(
                WinKey {
                    inner: key.clone(),
                    start,
                    end,
                },
                count,
            );
        }
    }
    m
}

/// Sliding windows have no model here (yet): each window `[start, start + difference]` must
/// count at least one record and at most the input records of its key inside it.
fn sliding_bounds(input: &[Event], got: &BTreeMap<WinKey, i64>) -> Result<()> {
    let mut times: HashMap<&str, Vec<i64>> = HashMap::new();
    for e in input {
        times.entry(&e.key).or_default().push(e.ts);
    }
    for t in times.values_mut() {
        t.sort_unstable();
    }
    for (w, n) in got {
        let t = times.get(w.inner.as_str()).map_or(&[][..], Vec::as_slice);
        let inside = t.partition_point(|x| *x <= w.end) - t.partition_point(|x| *x < w.start);
        if *n < 1 || *n as usize > inside {
            bail!(
                "sliding-count: both engines agree, but window {w} counts {n} records while the input holds {inside} of its key in it"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(key: &str, ts: i64) -> Event {
        Event {
            partition: 0,
            key: key.into(),
            ts,
            amount: 1,
        }
    }

    /// A late record in the silence between two sessions merges them into one.
    #[test]
    fn a_bridge_merges_two_sessions() {
        let input = [ev("a", 10_000), ev("a", 18_000), ev("a", 14_000)];
        let m = sessions(&input, 5_000, 2_000);
        let w: Vec<_> = m.windows.into_iter().collect();
        assert_eq!(
            w,
            vec![(
                WinKey {
                    inner: "a".into(),
                    start: 10_000,
                    end: 18_000
                },
                3
            )]
        );
    }

    /// A record later than grace updates no tumbling window.
    #[test]
    fn a_late_record_is_dropped() {
        let input = [ev("a", 10_000), ev("a", 30_000), ev("a", 17_000)];
        let m = time_windows(Case::TumblingCount, &input, 10_000, 10_000, 2_000);
        assert_eq!(m.dropped, 1);
        assert_eq!(m.windows.len(), 2);
    }

    #[test]
    fn keys_round_trip() {
        let w = WinKey {
            inner: "u1".into(),
            start: 5,
            end: 9,
        };
        let s = WindowSpec::Session { gap: 1, grace: 0 };
        assert_eq!(WinKey::decode(s, &w.encode(s)), Some(w));
    }
}

//! eddy against Kafka Streams (`bench/kstreams`'s reference app) on the same input: the same
//! cases under both guarantees, one engine after the other, each from empty state with a fresh
//! application id. Keyed cases (`count`, `sum`): throughput, CPU seconds per million records,
//! peak RSS and restore time, and both engines must end with the same table (same keys, same
//! value bytes, same output partition per key). Windowed cases (`WINDOWED`, on the windowed
//! input of `Generate --windowed`): the same figures but the state on disk at the end instead of
//! a restore, and both outputs compared window by window (`crate::windowed`). Join cases
//! (`JOINS`, on the input of `Generate --joins`): the same figures as the windowed ones, both
//! outputs compared record by record per key (table-table: final tables) and Kafka Streams'
//! against a model of its join semantics (`crate::joins`); `Options::kstreams_only` runs only
//! Kafka Streams and checks it against the model. Used by the `eddy-vs-kstreams` binary and
//! by `e2e/tests/compare.rs`.

use crate::*;
use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Count,
    Sum,
    /// Tumbling 10 s windows, 2 s grace, count (an extra: the base of `TumblingSuppress`).
    TumblingCount,
    /// The same, then `suppress: untilWindowCloses`: one final count per closed window.
    TumblingSuppress,
    /// Hopping 30 s windows every 10 s, 5 s grace, sum of `.amount`.
    HoppingAggregate,
    /// Sliding windows (records at most 10 s apart), 2 s grace, count.
    SlidingCount,
    /// Sessions with a 5 s inactivity gap, 2 s grace, count; merges delete replaced sessions.
    SessionCount,
    /// Tumbling 10 s windows, 2 s grace, reduce to the largest `.amount`.
    WindowedReduce,
    /// Orders joined with the customer table (inner: a miss is dropped).
    StreamTableInner,
    /// The same, left: a miss is joined with null.
    StreamTableLeft,
    /// Orders joined with the global country table by `.country` (inner).
    GlobalTable,
    /// Orders left-joined with shipments at most 5 min apart, 1 min grace.
    StreamStream,
    /// The same, inner.
    StreamStreamInner,
    /// The customer table left-joined with the account table.
    TableTable,
    /// Shipments left-joined with the customer table versioned (10 min of history), as of
    /// each shipment's time.
    StreamTableVersioned,
}

impl Case {
    pub fn name(self) -> &'static str {
        match self {
            Case::Count => "count",
            Case::Sum => "sum",
            Case::TumblingCount => "tumbling-count",
            Case::TumblingSuppress => "tumbling-suppress",
            Case::HoppingAggregate => "hopping-aggregate",
            Case::SlidingCount => "sliding-count",
            Case::SessionCount => "session-count",
            Case::WindowedReduce => "windowed-reduce",
            Case::StreamTableInner => "stream-table-inner",
            Case::StreamTableLeft => "stream-table-left",
            Case::GlobalTable => "global-table",
            Case::StreamStream => "stream-stream",
            Case::StreamStreamInner => "stream-stream-inner",
            Case::TableTable => "table-table",
            Case::StreamTableVersioned => "stream-table-versioned",
        }
    }

    /// A windowed case: reads the windowed input (`Generate --windowed`), writes windowed keys.
    pub fn windowed(self) -> bool {
        self.window().is_some()
    }

    /// A join case: reads the join input (`Generate --joins`).
    pub fn join(self) -> bool {
        JOINS.contains(&self)
    }

    /// The window of a windowed case.
    pub fn window(self) -> Option<WindowSpec> {
        use WindowSpec::*;
        Some(match self {
            Case::Count
            | Case::Sum
            | Case::StreamTableInner
            | Case::StreamTableLeft
            | Case::GlobalTable
            | Case::StreamStream
            | Case::StreamStreamInner
            | Case::TableTable
            | Case::StreamTableVersioned => return None,
            Case::TumblingCount | Case::TumblingSuppress | Case::WindowedReduce => Time {
                size: 10_000,
                advance: 10_000,
                grace: 2_000,
            },
            Case::HoppingAggregate => Time {
                size: 30_000,
                advance: 10_000,
                grace: 5_000,
            },
            Case::SlidingCount => Sliding {
                difference: 10_000,
                grace: 2_000,
            },
            Case::SessionCount => Session {
                gap: 5_000,
                grace: 2_000,
            },
        })
    }

    /// The output value is a count as an 8-byte big-endian long (else decimal text).
    fn i64_values(self) -> bool {
        !matches!(
            self,
            Case::Sum | Case::HoppingAggregate | Case::WindowedReduce
        )
    }
}

/// A windowed case's windows, in milliseconds (both engines are given the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowSpec {
    Time { size: i64, advance: i64, grace: i64 },
    Sliding { difference: i64, grace: i64 },
    Session { gap: i64, grace: i64 },
}

/// How long both engines keep windows: short, so that over the windowed input's minutes of
/// event time whole segments expire and the state on disk at the end is what retention leaves.
pub const RETENTION_MS: i64 = 60_000;

/// Every windowed case, in the order they run.
pub const WINDOWED: [Case; 6] = [
    Case::TumblingCount,
    Case::TumblingSuppress,
    Case::HoppingAggregate,
    Case::SlidingCount,
    Case::SessionCount,
    Case::WindowedReduce,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarantee {
    AtLeastOnce,
    ExactlyOnce,
}

impl Guarantee {
    pub fn eddy(self) -> &'static str {
        match self {
            Guarantee::AtLeastOnce => "at_least_once",
            Guarantee::ExactlyOnce => "exactly_once",
        }
    }
    pub fn kstreams(self) -> &'static str {
        match self {
            Guarantee::AtLeastOnce => "at_least_once",
            Guarantee::ExactlyOnce => "exactly_once_v2",
        }
    }
}

/// Every join case, in the order they run.
pub const JOINS: [Case; 7] = [
    Case::StreamTableInner,
    Case::StreamTableLeft,
    Case::GlobalTable,
    Case::StreamStream,
    Case::StreamStreamInner,
    Case::TableTable,
    Case::StreamTableVersioned,
];

/// Every case × guarantee, in the order they run.
pub const ALL: [(Case, Guarantee); 4] = [
    (Case::Count, Guarantee::AtLeastOnce),
    (Case::Count, Guarantee::ExactlyOnce),
    (Case::Sum, Guarantee::AtLeastOnce),
    (Case::Sum, Guarantee::ExactlyOnce),
];

/// Every windowed case × both guarantees.
pub fn windowed_runs() -> Vec<(Case, Guarantee)> {
    WINDOWED
        .iter()
        .flat_map(|&c| GUARANTEES.map(|g| (c, g)))
        .collect()
}

/// Every join case × both guarantees.
pub fn join_runs() -> Vec<(Case, Guarantee)> {
    JOINS
        .iter()
        .flat_map(|&c| GUARANTEES.map(|g| (c, g)))
        .collect()
}

pub const GUARANTEES: [Guarantee; 2] = [Guarantee::AtLeastOnce, Guarantee::ExactlyOnce];

/// Parse `count:at_least_once,sum:exactly_once` into runs; `keyed` stands for count and sum
/// under both guarantees, `windowed` for [`windowed_runs`], `joins` for [`join_runs`], `all`
/// for the three, and a bare case name for that case under both guarantees.
pub fn parse_runs(s: &str) -> Result<Vec<(Case, Guarantee)>> {
    let every: Vec<(Case, Guarantee)> = [Case::Count, Case::Sum]
        .iter()
        .chain(WINDOWED.iter())
        .chain(JOINS.iter())
        .flat_map(|&c| GUARANTEES.map(|g| (c, g)))
        .collect();
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim) {
        match item {
            "keyed" => out.extend(ALL),
            "windowed" => out.extend(windowed_runs()),
            "joins" => out.extend(join_runs()),
            _ if every.iter().any(|(c, _)| c.name() == item) => out.extend(
                every.iter().copied().filter(|(c, _)| c.name() == item),
            ),
            "all" => {
                out.extend(ALL);
                out.extend(windowed_runs());
                out.extend(join_runs());
            }
            _ => out.push(
                every
                    .iter()
                    .copied()
                    .find(|(c, g)| format!("{}:{}", c.name(), g.eddy()) == item)
                    .with_context(|| {
                        format!(
                            "unknown case '{item}' in --cases; use keyed, windowed, all, joins or a comma-separated list of case names or {}",
                            every
                                .iter()
                                .map(|(c, g)| format!("{}:{}", c.name(), g.eddy()))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?,
            ),
        }
    }
    Ok(out)
}

pub struct Options {
    pub records: usize,
    pub keys: usize,
    pub partitions: i32,
    /// Correctness only: no restore runs (throughput etc. are still recorded, targets ignored).
    pub check_only: bool,
    pub runs: Vec<(Case, Guarantee)>,
    /// Prefix of the input topic (reused when one of the same sizes exists).
    pub input_prefix: String,
    /// Delete the input topic at the end.
    pub delete_input: bool,
    /// Compare both engines' final tables (read whole into memory: costly with many keys).
    pub verify: bool,
    pub jar: PathBuf,
    /// Options of Kafka Streams' JVM ([`CONTAINER_JVM`] unless `--jvm-defaults`).
    pub jvm_opts: Vec<String>,
    /// Run only Kafka Streams (join cases: its output is checked against the model).
    pub kstreams_only: bool,
}

/// Kafka Streams' JVM by default: the heap a JVM takes by default in a 2 GiB container (a
/// quarter of it), not a quarter of the benchmark machine's memory, which only inflates RSS.
pub const CONTAINER_JVM: &[&str] = &["-Xmx512m"];

/// Processing threads of an eddy worker (one loop runs every task): Kafka Streams gets as
/// many (`num.stream.threads`).
pub const EDDY_PROCESSING_THREADS: usize = 1;

impl Options {
    /// One line for reports: how Kafka Streams ran.
    pub fn kstreams_settings(&self) -> String {
        let jvm = if self.jvm_opts.is_empty() {
            "JVM defaults (heap up to a quarter of the machine's memory)".to_string()
        } else {
            format!("JVM `{}`", self.jvm_opts.join(" "))
        };
        format!(
            "Kafka Streams: {jvm}, `num.stream.threads={EDDY_PROCESSING_THREADS}` (eddy's processing threads), its defaults otherwise"
        )
    }
}

/// One engine's figures for one run.
#[derive(Clone, Debug, Default)]
pub struct Measure {
    /// Process start → all input processed → clean close finished.
    pub seconds: f64,
    /// user+sys CPU seconds of the process.
    pub cpu: f64,
    /// Peak RSS (VmHWM) in bytes.
    pub rss: u64,
    /// Restore of the full state after the state dir is deleted (see `restore_*`).
    pub restore_seconds: Option<f64>,
    pub restored_records: Option<f64>,
    /// Kafka Streams only: `KafkaStreams#start()` → RUNNING (no JVM start, no topic checks).
    pub restore_from_start: Option<f64>,
    /// Windowed cases: bytes on disk of the app's state at the end of the run (eddy: its
    /// state dir, i.e. every task's RocksDB; Kafka Streams: `state.dir/<application.id>`).
    pub disk: Option<u64>,
    /// Kafka Streams: the reference app's own JSON lines; eddy: `memory_at_peak_mib`, the
    /// worker's `eddy_memory_bytes` parts when its peak RSS was reached.
    pub extra: Value,
}

impl Measure {
    pub fn rate(&self, records: usize) -> f64 {
        records as f64 / self.seconds.max(1e-9)
    }
    pub fn cpu_per_m(&self, records: usize) -> f64 {
        self.cpu / (records as f64 / 1e6)
    }
    pub fn rss_mib(&self) -> f64 {
        self.rss as f64 / 1048576.0
    }
}

/// Bytes a directory tree takes on disk (allocated blocks, as `du`); 0 if it does not exist.
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => m.blocks() * 512 + disk_usage(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

pub struct Row {
    pub case: Case,
    pub guarantee: Guarantee,
    pub records: usize,
    pub output_keys: usize,
    pub eddy: Measure,
    pub ks: Measure,
    /// Windowed cases: what the window-by-window comparison found.
    pub windowed: Option<crate::windowed::Checked>,
    /// Join cases: what the comparison (and the model) found.
    pub joined: Option<crate::joins::Checked>,
    /// False when only Kafka Streams ran (`Options::kstreams_only`): no ratios.
    pub eddy_ran: bool,
}

impl Row {
    pub fn label(&self) -> String {
        format!("{} {}", self.case.name(), self.guarantee.eddy())
    }
    /// (metric, eddy/KS ratio, target, ratio must be at least the target).
    pub fn ratios(&self) -> Vec<(&'static str, Option<f64>, f64, bool)> {
        let n = self.records;
        if !self.eddy_ran {
            return [
                "throughput",
                "CPU s/M records",
                "peak RSS",
                "restore",
                "disk",
            ]
            .into_iter()
            .zip([2.0, 0.5, 0.5, 0.5, 1.0])
            .map(|(m, t)| (m, None, t, m == "throughput"))
            .collect();
        }
        let restore = match (self.eddy.restore_seconds, self.ks.restore_seconds) {
            (Some(e), Some(k)) => Some(e / k.max(1e-9)),
            _ => None,
        };
        vec![
            (
                "throughput",
                Some(self.eddy.rate(n) / self.ks.rate(n)),
                2.0,
                true,
            ),
            (
                "CPU s/M records",
                Some(self.eddy.cpu_per_m(n) / self.ks.cpu_per_m(n).max(1e-9)),
                0.5,
                false,
            ),
            (
                "peak RSS",
                Some(self.eddy.rss as f64 / (self.ks.rss as f64).max(1.0)),
                0.5,
                false,
            ),
            ("restore", restore, 0.5, false),
            (
                "disk",
                match (self.eddy.disk, self.ks.disk) {
                    (Some(e), Some(k)) => Some(e as f64 / (k as f64).max(1.0)),
                    _ => None,
                },
                1.0,
                false,
            ),
        ]
    }
}

/// Build (cached) the Kafka Streams reference app and return the jar's path.
pub fn kstreams_jar() -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(repo_root().join("bench/kstreams/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .context("running bench/kstreams/build.sh")?;
    if !out.status.success() {
        bail!("bench/kstreams/build.sh failed ({})", out.status);
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| l.trim().to_string())
        .context("build.sh printed no jar path")?;
    Ok(PathBuf::from(path))
}

/// eddy's topology for a keyed or windowed case (joins: `crate::joins::eddy_yaml`). The
/// windowed ones read event time from `.ts` and keep windows [`RETENTION_MS`], like the
/// reference app.
pub fn eddy_yaml(case: Case, g: Guarantee, app: &str, input: &str, output: &str) -> Result<String> {
    let windowed_from =
        format!("  - from: {{topic: {input}, key: string, value: json, timestamp: '.ts'}}\n");
    let steps = match case {
        Case::Count => format!(
            "  - from: {{topic: {input}, key: string, value: bytes}}\n  - count: {{store: counts}}\n  - to: {{topic: {output}, value: i64}}\n"
        ),
        Case::Sum => format!(
            "  - from: {{topic: {input}, key: string, value: json}}\n  - filter: '.status == 200'\n  - groupBy: '.user'\n  - aggregate: {{store: sums, initial: '0', add: '$agg + .amount'}}\n  - to: {{topic: {output}, value: json}}\n"
        ),
        Case::TumblingCount => format!(
            "{windowed_from}  - window: {{tumbling: 10s, grace: 2s, retention: 1m}}\n  - count: {{store: counts}}\n  - to: {{topic: {output}, value: i64}}\n"
        ),
        Case::TumblingSuppress => format!(
            "{windowed_from}  - window: {{tumbling: 10s, grace: 2s, retention: 1m}}\n  - count: {{store: counts}}\n  - suppress: untilWindowCloses\n  - to: {{topic: {output}, value: i64}}\n"
        ),
        Case::HoppingAggregate => format!(
            "{windowed_from}  - window: {{hopping: 30s, advance: 10s, grace: 5s, retention: 1m}}\n  - aggregate: {{store: sums, initial: '0', add: '$agg + .amount'}}\n  - to: {{topic: {output}, value: json}}\n"
        ),
        Case::SlidingCount => format!(
            "{windowed_from}  - window: {{sliding: 10s, grace: 2s, retention: 1m}}\n  - count: {{store: counts}}\n  - to: {{topic: {output}, value: i64}}\n"
        ),
        Case::SessionCount => format!(
            "{windowed_from}  - window: {{session: 5s, grace: 2s, retention: 1m}}\n  - count: {{store: counts}}\n  - to: {{topic: {output}, value: i64}}\n"
        ),
        Case::WindowedReduce => format!(
            "{windowed_from}  - map: '.amount'\n  - window: {{tumbling: 10s, grace: 2s, retention: 1m}}\n  - reduce: {{store: maxes, with: 'if . > $agg then . else $agg end'}}\n  - to: {{topic: {output}, value: json}}\n"
        ),
        _ => bail!(
            "{}: a join case's app is crate::joins::eddy_yaml's",
            case.name()
        ),
    };
    Ok(format!(
        "applicationId: {app}\nprocessingGuarantee: {}\ntopology:\n{steps}",
        g.eddy()
    ))
}

/// Records eddy's tasks process: the count topology has one sub-topology; sum's second one
/// reads back every record with status 200 from the repartition topic (the generator writes 404
/// for every tenth record).
fn eddy_processed(case: Case, records: usize) -> usize {
    match case {
        Case::Sum => records + records - records.div_ceil(10),
        _ => records,
    }
}

/// What the generated input must produce: (sum of all counts, sum of all sums).
fn expected_total(case: Case, records: usize) -> i64 {
    match case {
        Case::Sum => (0..records)
            .filter(|i| i % 10 != 0)
            .map(|i| (i % 97) as i64)
            .sum(),
        _ => records as i64,
    }
}

/// Sample a process's peak RSS and CPU until it exits or `done` says so.
struct Sampler {
    pid: u32,
    rss: u64,
    cpu: f64,
}

impl Sampler {
    fn sample(&mut self) {
        if let Ok((rss, cpu)) = proc_stats(self.pid) {
            self.rss = self.rss.max(rss);
            self.cpu = self.cpu.max(cpu);
        }
    }
}

/// How long eddy's processed count may stand still before a run fails.
pub const NO_PROGRESS: Duration = Duration::from_secs(120);

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!("; its log's last lines:\n{}", all[from..].join("\n"))
}

fn run_eddy(yaml: &str, dir: &Path, processed: usize) -> Result<Measure> {
    let started = Instant::now();
    let mut w = Worker::start(yaml, dir)?;
    let mut s = Sampler {
        pid: w.pid().context("worker pid")?,
        rss: 0,
        cpu: 0.0,
    };
    // A worker that stops making progress (a hang, not slowness) fails the run at once
    // instead of holding it for half an hour.
    let (mut last, mut moved) = (-1.0, Instant::now());
    // Where the memory was when the peak RSS was reached (the worker's `eddy_memory_bytes`).
    let (mut at_peak, mut peak_seen) = (json!({}), 0);
    loop {
        s.sample();
        if let Ok(text) = w.metrics() {
            if s.rss > peak_seen {
                peak_seen = s.rss;
                at_peak = memory_parts(&text, s.rss);
            }
            let v = sum_metric(&text, "eddy_records_processed_total", &[]);
            if v >= processed as f64 {
                break;
            }
            if v > last {
                (last, moved) = (v, Instant::now());
            }
        }
        if moved.elapsed() > NO_PROGRESS {
            bail!(
                "eddy: no progress for {} s at {} of {processed} records processed: a hang, not slowness (worker pid {} was killed; `gdb -p` on a rerun shows where it waits){}",
                NO_PROGRESS.as_secs(),
                last.max(0.0),
                s.pid,
                tail(&w.logs(), 20)
            );
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("eddy: not done after 30 minutes:\n{}", w.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    s.sample();
    // SIGTERM commits and exits; sample while it closes.
    let pid = s.pid;
    let stopper = std::thread::spawn(move || {
        let mut s = Sampler {
            pid,
            rss: 0,
            cpu: 0.0,
        };
        let t = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
            && t.elapsed() < Duration::from_secs(120)
        {
            s.sample();
            std::thread::sleep(Duration::from_millis(20));
        }
        (s.rss, s.cpu)
    });
    let code = w.stop()?;
    let seconds = started.elapsed().as_secs_f64();
    let (rss, cpu) = stopper.join().unwrap_or((0, 0.0));
    if code != 0 {
        bail!("eddy exited with {code}:\n{}", w.logs());
    }
    if !at_peak.as_object().is_some_and(|o| o.is_empty()) {
        eprintln!("eddy's memory at its peak RSS (MiB): {at_peak}");
    }
    Ok(Measure {
        seconds,
        cpu: s.cpu.max(cpu),
        rss: s.rss.max(rss),
        extra: json!({ "memory_at_peak_mib": at_peak }),
        ..Measure::default()
    })
}

/// The worker's `eddy_memory_bytes` parts and `rss`, in MiB.
fn memory_parts(metrics: &str, rss: u64) -> Value {
    let mib = |b: f64| (b / 1048576.0 * 10.0).round() / 10.0;
    let mut parts = serde_json::Map::new();
    parts.insert("rss".into(), json!(mib(rss as f64)));
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("eddy_memory_bytes{part=\"") else {
            continue;
        };
        let Some((part, value)) = rest.split_once("\"} ") else {
            continue;
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            parts.insert(part.to_string(), json!(mib(v)));
        }
    }
    Value::Object(parts)
}

/// eddy's restore: delete the state dir, start → `/readyz` 200 (every task restored and
/// RUNNING), wall time measured here.
fn restore_eddy(yaml: &str, dir: &Path) -> Result<(f64, f64)> {
    std::fs::remove_dir_all(dir.join("state"))?;
    let started = Instant::now();
    let mut w = Worker::start(yaml, dir)?;
    w.wait_ready(Duration::from_secs(600))?;
    let secs = started.elapsed().as_secs_f64();
    let n = w.metric("eddy_restored_records_total", &[])?;
    let code = w.stop()?;
    if code != 0 {
        bail!("eddy (restore) exited with {code}:\n{}", w.logs());
    }
    Ok((secs, n))
}

/// `-Djava.io.tmpdir` in a run's own (temporary) directory: RocksDB's JNI library and
/// lz4-java copy their native libraries there, ~15 MiB a run, and a killed JVM never deletes
/// them.
pub fn jvm_tmpdir(dir: &Path) -> String {
    format!("-Djava.io.tmpdir={}", dir.display())
}

/// Run the reference app; returns (wall seconds, cpu, rss, its JSON line).
pub fn run_java(
    jar: &Path,
    jvm_opts: &[String],
    args: &[String],
    log: &Path,
) -> Result<(f64, f64, u64, Value)> {
    let started = Instant::now();
    let mut child = Command::new("java")
        .args(jvm_opts)
        .arg(jvm_tmpdir(log.parent().unwrap_or(Path::new("."))))
        .arg("-jar")
        .arg(jar)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting java")?;
    let mut s = Sampler {
        pid: child.id(),
        rss: 0,
        cpu: 0.0,
    };
    let status = loop {
        s.sample();
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if started.elapsed() > Duration::from_secs(1900) {
            let _ = child.kill();
            bail!("Kafka Streams: not done after 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        std::io::Read::read_to_string(&mut o, &mut out)?;
    }
    if !status.success() {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        bail!(
            "Kafka Streams reference app exited with {status}:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let line = out
        .lines()
        .last()
        .context("reference app printed nothing")?;
    let v: Value = serde_json::from_str(line).with_context(|| format!("parsing {line}"))?;
    Ok((seconds, s.cpu, s.rss, v))
}

/// An output topic's final table: key → (partition of its last record, last value).
pub type Table = HashMap<Vec<u8>, (i32, Vec<u8>)>;

/// The final table of an output topic.
pub fn final_table(topic: &str) -> Result<Table> {
    let mut m = HashMap::new();
    for r in read_all(topic)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            m.insert(k, (r.partition, v));
        }
    }
    Ok(m)
}

fn show(case: Case, v: &[u8]) -> String {
    match (case.i64_values(), <[u8; 8]>::try_from(v)) {
        (true, Ok(b)) => i64::from_be_bytes(b).to_string(),
        _ => format!("{:?}", String::from_utf8_lossy(v)),
    }
}

fn value_of(case: Case, v: &[u8]) -> Option<i64> {
    if case.i64_values() {
        <[u8; 8]>::try_from(v).ok().map(i64::from_be_bytes)
    } else {
        std::str::from_utf8(v).ok()?.parse().ok()
    }
}

/// Compare both final tables; Err lists the first differing keys.
pub fn compare_tables(case: Case, records: usize, eddy_out: &str, ks_out: &str) -> Result<usize> {
    let e = final_table(eddy_out)?;
    let k = final_table(ks_out)?;
    let mut keys: Vec<&Vec<u8>> = e.keys().chain(k.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut diffs = Vec::new();
    for key in &keys {
        let (a, b) = (e.get(*key), k.get(*key));
        if a != b {
            let f = |x: Option<&(i32, Vec<u8>)>| {
                x.map_or("missing".to_string(), |(p, v)| {
                    format!("partition {p} value {}", show(case, v))
                })
            };
            diffs.push(format!(
                "  {}: eddy {} / Kafka Streams {}",
                String::from_utf8_lossy(key),
                f(a),
                f(b)
            ));
        }
    }
    if !diffs.is_empty() {
        bail!(
            "{}: {} of {} keys differ (eddy {} keys, Kafka Streams {} keys); first ones:\n{}",
            case.name(),
            diffs.len(),
            keys.len(),
            e.len(),
            k.len(),
            diffs
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // Both agree; check that they agree on the right answer.
    let total: i64 = e.values().filter_map(|(_, v)| value_of(case, v)).sum();
    let want = expected_total(case, records);
    if total != want || e.is_empty() {
        bail!(
            "{}: both engines agree, but their values add up to {total}, not {want}",
            case.name()
        );
    }
    Ok(e.len())
}

fn cleanup(prefixes: &[&str], extra: &[&str]) -> Result<()> {
    let mut all: Vec<String> = Vec::new();
    for p in prefixes {
        all.extend(topics_with_prefix(&format!("{p}-"))?);
    }
    all.extend(extra.iter().map(|s| s.to_string()));
    all.sort();
    all.dedup();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    delete_topics(&refs)
}

/// Run every requested case × guarantee; fails on the first mismatch.
pub fn run(o: &Options) -> Result<Vec<Row>> {
    let bs = bootstrap()?;
    eprintln!(
        "kafka at {bs}; {} records, {} keys, {} partitions",
        o.records, o.keys, o.partitions
    );
    if let Some((c, _)) = o.runs.iter().find(|(c, _)| o.kstreams_only && !c.join()) {
        bail!(
            "{}: only the join cases run Kafka Streams alone (checked against the model)",
            c.name()
        );
    }
    let keyed = o.runs.iter().any(|(c, _)| !c.windowed() && !c.join());
    let windowed = o.runs.iter().any(|(c, _)| c.windowed());
    let joins = o.runs.iter().any(|(c, _)| c.join());
    let input = if keyed {
        Some(ensure_input(
            o.records,
            o.keys,
            o.partitions,
            &o.input_prefix,
        )?)
    } else {
        None
    };
    let mut delete: Vec<String> = input.iter().cloned().collect();
    let result = (|| {
        let windowed_input = if windowed {
            let topic = crate::windowed::ensure_windowed_input(
                &o.jar,
                o.records,
                o.partitions,
                &o.input_prefix,
            )?;
            delete.push(topic.clone());
            let events = crate::windowed::read_events(&topic)?;
            Some((topic, events))
        } else {
            None
        };
        let join_input = if joins {
            let j =
                crate::joins::ensure_join_input(&o.jar, o.records, o.partitions, &o.input_prefix)?;
            delete.extend(topics_with_prefix(&format!("{}-", j.prefix))?);
            let records = crate::joins::read_input(&j)?;
            Some((j, records))
        } else {
            None
        };
        let inputs = Inputs {
            keyed: input.as_deref(),
            windowed: windowed_input.as_ref(),
            joins: join_input.as_ref(),
        };
        run_all(o, &bs, &inputs)
    })();
    if o.delete_input {
        let refs: Vec<&str> = delete.iter().map(String::as_str).collect();
        let _ = delete_topics(&refs);
    }
    result
}

/// The inputs a run needs, read once for all its cases.
struct Inputs<'a> {
    keyed: Option<&'a str>,
    windowed: Option<&'a (String, Vec<crate::windowed::Event>)>,
    joins: Option<&'a (crate::joins::JoinInput, crate::joins::Input)>,
}

fn run_all(o: &Options, bs: &str, inputs: &Inputs) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &(case, g) in &o.runs {
        // The topic the case reads (a join's left side), its other side and its records.
        let (input, right, records) = if case.join() {
            let (j, _) = inputs.joins.context("no join input")?;
            let (l, r) = crate::joins::sides(case)?;
            (
                j.topic(l),
                Some(j.topic(r)),
                crate::joins::processed(case, j)?,
            )
        } else if case.windowed() {
            let (i, _) = inputs.windowed.context("no windowed input")?;
            (i.clone(), None, o.records)
        } else {
            let i = inputs.keyed.context("no keyed input")?;
            (i.to_string(), None, o.records)
        };
        let label = format!("{} {}", case.name(), g.eddy());
        let eddy_app = unique(&format!("cmp-eddy-{}", case.name()));
        let ks_app = unique(&format!("cmp-ks-{}", case.name()));
        let (eddy_out, ks_out) = (format!("{eddy_app}-out"), format!("{ks_app}-out"));
        let res = (|| -> Result<Row> {
            create_topic(&ks_out, o.partitions)?;
            // eddy
            let edir = tempfile::tempdir()?;
            let yaml = match inputs.joins {
                Some((j, _)) if case.join() => {
                    crate::joins::eddy_yaml(case, g, &eddy_app, j, &eddy_out)?
                }
                _ => eddy_yaml(case, g, &eddy_app, &input, &eddy_out)?,
            };
            let mut eddy = Measure::default();
            if !o.kstreams_only {
                create_topic(&eddy_out, o.partitions)?;
                eprintln!("{label}: eddy");
                eddy = run_eddy(&yaml, edir.path(), eddy_processed(case, records))?;
                eprintln!(
                    "{label}: eddy {:.2} s, {:.0} records/s",
                    eddy.seconds,
                    eddy.rate(records)
                );
            }
            // Kafka Streams
            eprintln!("{label}: Kafka Streams");
            let kdir = tempfile::tempdir()?;
            let common = kstreams_args(
                bs,
                case,
                g,
                &input,
                right.as_deref(),
                &ks_app,
                &ks_out,
                kdir.path(),
            );
            let mut args = common.clone();
            args.extend(expect_args(case, records));
            let (seconds, cpu, rss, line) =
                run_java(&o.jar, &o.jvm_opts, &args, &kdir.path().join("refapp.log"))?;
            let ks = Measure {
                seconds,
                cpu,
                rss,
                extra: json!({ "run": line }),
                ..Measure::default()
            };
            eprintln!(
                "{label}: Kafka Streams {:.2} s, {:.0} records/s",
                ks.seconds,
                ks.rate(records)
            );
            let mut row = Row {
                case,
                guarantee: g,
                records,
                output_keys: 0,
                eddy,
                ks,
                windowed: None,
                joined: None,
                eddy_ran: !o.kstreams_only,
            };
            if case.windowed() || case.join() {
                if row.eddy_ran {
                    row.eddy.disk = Some(disk_usage(&edir.path().join("state")));
                }
                row.ks.disk = Some(disk_usage(&kdir.path().join("state").join(&ks_app)));
            }
            if case.join() {
                if let (Some((_, records)), true) = (inputs.joins, o.verify) {
                    let eddy_out = row.eddy_ran.then_some(eddy_out.as_str());
                    let c = crate::joins::compare(case, records, eddy_out, &ks_out)?;
                    eprintln!("{label}: {}", c.summary);
                    row.output_keys = c.keys;
                    row.joined = Some(c);
                }
                return Ok(row);
            }
            if case.windowed() {
                if let (Some((_, events)), true) = (inputs.windowed, o.verify) {
                    let c = crate::windowed::compare(case, events, &eddy_out, &ks_out)?;
                    eprintln!("{label}: {}", c.summary);
                    row.output_keys = c.windows;
                    row.windowed = Some(c);
                }
                return Ok(row);
            }
            if o.verify {
                let n = compare_tables(case, o.records, &eddy_out, &ks_out)?;
                eprintln!("{label}: same final table ({n} keys, same partitions)");
                row.output_keys = n;
            }
            if !o.check_only {
                eprintln!("{label}: restores");
                let (secs, n) = restore_eddy(&yaml, edir.path())?;
                row.eddy.restore_seconds = Some(secs);
                row.eddy.restored_records = Some(n);
                std::fs::remove_dir_all(kdir.path().join("state"))?;
                let mut args = common.clone();
                args.push("--restore-only".into());
                let (wall, _, _, line) = run_java(
                    &o.jar,
                    &o.jvm_opts,
                    &args,
                    &kdir.path().join("refapp-restore.log"),
                )?;
                // Same as eddy's: process start → every task restored and RUNNING (JVM
                // start included). `to_running_seconds` (KafkaStreams#start → RUNNING) is kept
                // as `restore_from_start_seconds`.
                row.ks.restore_seconds = line["process_to_running_seconds"]
                    .as_f64()
                    .or(line["to_running_seconds"].as_f64());
                row.ks.restore_from_start = line["to_running_seconds"].as_f64();
                row.ks.restored_records = line["restored_records"].as_f64();
                row.ks.extra["restore"] = line;
                row.ks.extra["restore_wall_seconds"] = json!(wall);
            }
            Ok(row)
        })();
        let _ = cleanup(&[&eddy_app, &ks_app], &[&eddy_out, &ks_out]);
        rows.push(res.with_context(|| label.clone())?);
    }
    Ok(rows)
}

/// The reference app's arguments for one case, state under `dir/state`.
#[allow(clippy::too_many_arguments)]
fn kstreams_args(
    bs: &str,
    case: Case,
    g: Guarantee,
    input: &str,
    right: Option<&str>,
    app: &str,
    output: &str,
    dir: &Path,
) -> Vec<String> {
    let mut args = vec![
        "--bootstrap".to_string(),
        bs.to_string(),
        "--app-id".into(),
        app.to_string(),
        "--case".into(),
        case.name().into(),
        "--guarantee".into(),
        g.kstreams().into(),
        "--input".into(),
        input.to_string(),
        "--output".into(),
        output.to_string(),
        "--state-dir".into(),
        dir.join("state").display().to_string(),
        "--config".into(),
        format!("num.stream.threads={EDDY_PROCESSING_THREADS}"),
    ];
    if let Some(r) = right {
        args.extend(["--right".to_string(), r.to_string()]);
    }
    args
}

/// A throughput run: close as soon as every input (and repartitioned) record is processed.
fn expect_args(case: Case, records: usize) -> [String; 5] {
    [
        "--expect".into(),
        records.to_string(),
        "--expect-repartitioned".into(),
        (eddy_processed(case, records) - records).to_string(),
        "--close-when-processed".into(),
    ]
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The results as a markdown table; `targets` marks each ratio as met (bold) or missed (✗).
pub fn markdown(rows: &[Row], targets: bool) -> String {
    let mut s = String::from(
        "| case | guarantee | records/s eddy | KS | ratio (≥ 2) | CPU s/M eddy | KS | ratio (≤ 0.5) | peak RSS MiB eddy | KS | ratio (≤ 0.5) | restore s eddy | KS | ratio (≤ 0.5) | KS start()→RUNNING s | state on disk MiB eddy | KS | ratio (≤ 1) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let n = r.records;
        let ra = r.ratios();
        let mark = |i: usize| {
            let (_, v, t, at_least) = ra[i];
            match v {
                Some(v) if !targets => format!("{v:.2}"),
                Some(v) if (at_least && v >= t) || (!at_least && v <= t) => {
                    format!("**{v:.2}**")
                }
                Some(v) => format!("{v:.2} ✗"),
                None => "–".into(),
            }
        };
        // eddy's figures, or a dash when only Kafka Streams ran.
        let e = |v: f64, digits: usize| opt(r.eddy_ran.then_some(v), digits);
        s += &format!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.2} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.case.name(),
            r.guarantee.eddy(),
            e(r.eddy.rate(n), 0),
            r.ks.rate(n),
            mark(0),
            e(r.eddy.cpu_per_m(n), 2),
            r.ks.cpu_per_m(n),
            mark(1),
            e(r.eddy.rss_mib(), 0),
            r.ks.rss_mib(),
            mark(2),
            opt(r.eddy.restore_seconds, 2),
            opt(r.ks.restore_seconds, 2),
            mark(3),
            opt(r.ks.restore_from_start, 2),
            opt(r.eddy.disk.map(|b| b as f64 / 1048576.0), 2),
            opt(r.ks.disk.map(|b| b as f64 / 1048576.0), 2),
            mark(4),
        );
    }
    s
}

/// One engine's figures for `n` input records as JSON.
pub fn measure_json(x: &Measure, n: usize) -> Value {
    json!({
            "seconds": x.seconds,
            "records_per_second": x.rate(n),
            "cpu_seconds": x.cpu,
            "cpu_seconds_per_million": x.cpu_per_m(n),
            "peak_rss_bytes": x.rss,
            "restore_seconds": x.restore_seconds,
            "restored_records": x.restored_records,
            "restore_from_start_seconds": x.restore_from_start,
            "state_disk_bytes": x.disk,
            // Kafka Streams: the reference app's own lines; eddy: its memory at the peak RSS.
            "details": x.extra,
    })
}

pub fn to_json(o: &Options, rows: &[Row]) -> Value {
    let m = measure_json;
    json!({
        "records": o.records,
        "keys": o.keys,
        "partitions": o.partitions,
        "kafka_streams_jvm_options": o.jvm_opts,
        "num_stream_threads": EDDY_PROCESSING_THREADS,
        "runs": rows.iter().map(|r| json!({
            "case": r.case.name(),
            "guarantee": r.guarantee.eddy(),
            "output_keys": r.output_keys,
            "windowed": r.windowed.as_ref().map(|c| json!({
                "windows": c.windows,
                "dropped_records": c.dropped,
            })),
            "joins": r.joined.as_ref().map(|c| json!({
                "output_records": c.outputs,
                "output_keys": c.keys,
                "joined": c.joined,
                "unjoined": c.unjoined,
                "dropped_records": c.dropped,
                "kstreams_keys_unlike_the_model": c.kstreams_deviations,
            })),
            "eddy_ran": r.eddy_ran,
            "eddy": r.eddy_ran.then(|| m(&r.eddy, r.records)),
            "kafka_streams": m(&r.ks, r.records),
            "ratios": r.ratios().iter().map(|(name, v, t, _)| json!({"metric": name, "eddy_over_kstreams": v, "target": t})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A hand-written SVG: one panel per metric, a horizontal bar per case+guarantee with the
/// eddy/KS ratio, and a dashed line at the target.
pub fn svg(rows: &[Row]) -> String {
    const COLORS: [&str; 4] = ["#4c78a8", "#72b7b2", "#f58518", "#e45756"];
    let (width, left, right, bar, gap) = (760.0, 190.0, 40.0, 16.0, 4.0);
    let panel_h = 28.0 + rows.len() as f64 * (bar + gap) + 14.0;
    let metrics = [
        "throughput",
        "CPU s/M records",
        "peak RSS",
        "restore",
        "disk",
    ];
    let height = 40.0 + panel_h * metrics.len() as f64 + 10.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">eddy / Kafka Streams (dashed red: target, dotted grey: parity 1.0)</text>\n"
    );
    for (mi, metric) in metrics.iter().enumerate() {
        let y0 = 40.0 + panel_h * mi as f64;
        let vals: Vec<(String, Option<f64>, f64, bool)> = rows
            .iter()
            .map(|r| {
                let (_, v, t, a) = r.ratios()[mi];
                (r.label(), v, t, a)
            })
            .collect();
        let target = vals.first().map_or(1.0, |v| v.2);
        let at_least = vals.first().is_some_and(|v| v.3);
        let max = vals
            .iter()
            .filter_map(|v| v.1)
            .fold(target.max(1.0), f64::max)
            * 1.15;
        let x = |v: f64| left + (width - left - right) * v / max;
        s += &format!(
            "<text x=\"10\" y=\"{}\" font-weight=\"bold\">{} (target {} {target})</text>\n",
            y0 + 14.0,
            esc(metric),
            if at_least { "≥" } else { "≤" }
        );
        for (i, (label, v, t, a)) in vals.iter().enumerate() {
            let y = y0 + 24.0 + i as f64 * (bar + gap);
            s += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                left - 6.0,
                y + bar - 4.0,
                esc(label)
            );
            match v {
                Some(v) => {
                    let ok = if *a { *v >= *t } else { *v <= *t };
                    s += &format!(
                        "<rect x=\"{left}\" y=\"{y}\" width=\"{:.1}\" height=\"{bar}\" fill=\"{}\"/>\n<text x=\"{:.1}\" y=\"{}\">{v:.2}{}</text>\n",
                        (x(*v) - left).max(1.0),
                        COLORS[i % COLORS.len()],
                        x(*v) + 4.0,
                        y + bar - 4.0,
                        if ok { "" } else { " ✗" }
                    );
                }
                None => {
                    s += &format!(
                        "<text x=\"{}\" y=\"{}\" fill=\"#888\">not measured</text>\n",
                        left + 4.0,
                        y + bar - 4.0
                    );
                }
            }
        }
        let bottom = y0 + 24.0 + vals.len() as f64 * (bar + gap);
        let (tx, top, one) = (x(target), y0 + 20.0, x(1.0));
        s += &format!(
            "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"#333\"/>\n<line x1=\"{tx:.1}\" y1=\"{top}\" x2=\"{tx:.1}\" y2=\"{bottom}\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n<line x1=\"{one:.1}\" y1=\"{top}\" x2=\"{one:.1}\" y2=\"{bottom}\" stroke=\"#999\" stroke-dasharray=\"1 3\"/>\n"
        );
    }
    s += "</svg>\n";
    s
}

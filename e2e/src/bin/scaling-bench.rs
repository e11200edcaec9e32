//! `scaling-bench`: how long tasks pause when a stateful app scales out or loses a pod, for eddy
//! under its operator (local control plane, operator and pod runner) and for Kafka Streams
//! (`bench/kstreams`' reference app as local processes), on the same input. Run it through
//! `bench/scaling.sh`; docs/benchmarks.md ("Scaling and failover") says what each figure means.
//!
//! Every case starts an app counting per key (exactly-once, output keyed like the input, so
//! output partition p is task 0_p's), fills its state with `--keys` keys, keeps `--rate` records
//! a second flowing, and watches each task's committed output (`scaling::OutputWatch`):
//! - `eddy-scale-out`: 2 → 3 replicas with warm-ups (the default `spec.warmup`);
//! - `eddy-scale-out-no-warmup`: the same with `warmup.acceptableRecoveryLag` so large that a
//!   task moves as soon as the new pod reports any copy of it, which then restores in full;
//! - `eddy-failover`: 3 replicas, `numStandbyReplicas: 1`; a pod is deleted (`kubectl delete
//!   pod`), then, once everything is back in place, another pod's worker process gets SIGKILL;
//! - `ks-scale-out`: two instances, a third added (Kafka Streams' defaults);
//! - `ks-failover-kill`, `ks-failover-term`: three instances, `num.standby.replicas=1`, one
//!   gets SIGKILL (resp. SIGTERM: a clean close that leaves the group).
//!
//! Writes `results.json` and `results.md` to `--out` and prints the table.

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use eddy_crds::StatefulStreamApp;
use eddy_crds::resource::{Assignment, TaskRole, TaskState, TaskStatus};
use eddy_e2e::k8s::{ControlPlane, Process};
use eddy_e2e::scaling::*;
use eddy_e2e::{bootstrap, create_topic, delete_topics, topics_with_prefix, unique, wait_until};
use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where eddy's apps live, and the operator's own namespace.
const NS: &str = "scalebench";
const OPERATOR_NS: &str = "eddy-system";
/// The operator's default `warmup.acceptableRecoveryLag`, which Kafka Streams shares.
const ACCEPTABLE_LAG: i64 = 10_000;

#[derive(Parser, Debug)]
#[command(
    about = "Pauses of a stateful app's tasks on scale-out and failover, eddy under its operator against Kafka Streams"
)]
struct Args {
    /// Keys in the app's state (one record each before the measurement starts).
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Input (and output) partitions: the tasks.
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// Input records per second, the whole time, keys spread over the key space.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Cases to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eddy-scale-out,eddy-scale-out-no-warmup,eddy-failover,ks-scale-out,ks-failover-kill,ks-failover-term"
    )]
    cases: Vec<String>,
    /// The reference app's jar (default: built by bench/kstreams/build.sh).
    #[arg(long)]
    jar: Option<PathBuf>,
    /// Results directory (default ~/.cache/eddy/bench-results/scaling).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds of steady output measured before each event (the normal gap between commits).
    #[arg(long, default_value_t = 5.0)]
    baseline_s: f64,
    /// Seconds measured after the last task moved or resumed.
    #[arg(long, default_value_t = 5.0)]
    settle_s: f64,
    /// Longest wait for eddy to balance after a scale-out or come back after a failover.
    #[arg(long, default_value_t = 300)]
    balance_wait_s: u64,
    /// Longest wait for Kafka Streams to balance after a scale-out (its probing rebalance
    /// comes every 10 minutes by default).
    #[arg(long, default_value_t = 120)]
    ks_balance_wait_s: u64,
    /// Longest wait for a failed pod's or instance's tasks to process again.
    #[arg(long, default_value_t = 180)]
    failover_wait_s: u64,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("scaling-bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn log(msg: &str) {
    eprintln!("scaling-bench: {msg}");
}

const CASES: &[&str] = &[
    "eddy-scale-out",
    "eddy-scale-out-no-warmup",
    "eddy-failover",
    "ks-scale-out",
    "ks-failover-kill",
    "ks-failover-term",
];

fn real_main() -> Result<()> {
    let args = Args::parse();
    for c in &args.cases {
        if !CASES.contains(&c.as_str()) {
            bail!("unknown case '{c}': the cases are {}", CASES.join(", "));
        }
    }
    if args.partitions < 3 || args.keys == 0 || args.rate == 0 {
        bail!("--partitions must be at least 3, --keys and --rate at least 1");
    }
    let out = match &args.out {
        Some(o) => o.clone(),
        None => PathBuf::from(std::env::var("HOME").context("HOME is not set")?)
            .join(".cache/eddy/bench-results/scaling"),
    };
    bootstrap()?;
    // Logs of every process (operator, pod runner, workers, Kafka Streams instances), kept
    // for a look at what happened; replaced by the next run.
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let started = chrono_now();
    let mut results: Vec<Value> = Vec::new();
    let mut failed = Vec::new();
    // A case that fails is reported and the next one runs; what it left behind goes at the end.
    let mut record = |case: &str, r: Result<Vec<Value>>| match r {
        Ok(v) => results.extend(v),
        Err(e) => {
            log(&format!("{case} failed: {e:#}"));
            failed.push(json!({"case": case, "error": format!("{e:#}")}));
        }
    };
    let wants = |c: &str| args.cases.iter().any(|x| x == c);
    if args.cases.iter().any(|c| c.starts_with("eddy-")) {
        let env = EddyEnv::start(&logs)?;
        for (case, warmups) in [
            ("eddy-scale-out", true),
            ("eddy-scale-out-no-warmup", false),
        ] {
            if wants(case) {
                record(case, eddy_scale_out(&env, &args, warmups).map(|r| vec![r]));
            }
        }
        if wants("eddy-failover") {
            record("eddy-failover", eddy_failover(&env, &args));
        }
        // Apps a failed case left: deleting them deletes their changelogs too.
        let _ = env.kubectl(
            &[
                "-n",
                NS,
                "delete",
                "ssapp",
                "--all",
                "--wait=true",
                "--timeout=180s",
            ],
            None,
        );
    }
    if args.cases.iter().any(|c| c.starts_with("ks-")) {
        let jar = match &args.jar {
            Some(j) => j.clone(),
            None => eddy_e2e::compare::kstreams_jar()?,
        };
        if wants("ks-scale-out") {
            record(
                "ks-scale-out",
                ks_scale_out(&jar, &args, &logs).map(|r| vec![r]),
            );
        }
        for (case, signal) in [("ks-failover-kill", "KILL"), ("ks-failover-term", "TERM")] {
            if wants(case) {
                record(
                    case,
                    ks_failover(&jar, &args, signal, &logs).map(|r| vec![r]),
                );
            }
        }
    }
    leftover_topics();
    let doc = json!({
        "started": started,
        "keys": args.keys,
        "partitions": args.partitions,
        "rate": args.rate,
        "guarantee": "exactly_once",
        "acceptable_recovery_lag": ACCEPTABLE_LAG,
        "results": results,
        "failed": failed,
        "ratios": ratios(&results),
    });
    let md = markdown(&args, &results);
    println!("\n{md}");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    std::fs::write(out.join("results.md"), &md)?;
    log(&format!(
        "wrote {}/results.json and results.md",
        out.display()
    ));
    if !failed.is_empty() {
        bail!(
            "{} case(s) failed (see above and results.json)",
            failed.len()
        );
    }
    Ok(())
}

/// Delete the topics of this run that a failed case left behind: inputs and outputs, eddy's
/// changelogs, Kafka Streams' internal topics (all named with this process's id).
fn leftover_topics() {
    let pid = format!("-{}-", std::process::id());
    let mine = |t: &String| {
        t.contains(&pid)
            && ["scalebench-", "scalebench.", "ks-so-", "ks-fo-"]
                .iter()
                .any(|p| t.starts_with(p))
    };
    if let Ok(all) = topics_with_prefix("") {
        let left: Vec<&str> = all.iter().filter(|t| mine(t)).map(String::as_str).collect();
        if !left.is_empty() {
            log(&format!("deleting {} leftover topics", left.len()));
            let _ = delete_topics(&left);
        }
    }
}

/// Wall-clock time (UTC, ms) of a moment `t` seconds after the stage's epoch, to find it in
/// the processes' logs.
fn wall(stage: &Stage, t: f64) -> String {
    let at = std::time::SystemTime::now() - Duration::from_secs_f64((stage.now() - t).max(0.0));
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}.{:03}", ms / 1000, ms % 1000),
            "+%Y-%m-%dT%H:%M:%S.%3NZ",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn chrono_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------- one case's topics and load

/// A case's input and output topics, the load on the input and the watch on the output.
struct Stage {
    epoch: Instant,
    input: String,
    output: String,
    steady: Option<Steady>,
    watch: Option<OutputWatch>,
}

impl Stage {
    fn new(prefix: &str, partitions: i32) -> Result<Stage> {
        let (input, output) = (
            unique(&format!("{prefix}-in")),
            unique(&format!("{prefix}-out")),
        );
        create_topic(&input, partitions)?;
        create_topic(&output, partitions)?;
        Ok(Stage {
            epoch: Instant::now(),
            input,
            output,
            steady: None,
            watch: None,
        })
    }

    fn now(&self) -> f64 {
        since(self.epoch)
    }

    /// Fill the state, start the steady load, wait until the app (consumer group `group`) has
    /// caught up, then watch the output.
    fn load(&mut self, args: &Args, group: &str) -> Result<()> {
        log(&format!("producing {} keys to {}", args.keys, self.input));
        prepopulate(&self.input, args.keys)?;
        self.steady = Some(Steady::start(&self.input, args.keys, args.rate)?);
        let t = Instant::now();
        let mut last = Instant::now();
        wait_until(Duration::from_secs(1800), || {
            let lag = group_lag(group, &self.input)?;
            if last.elapsed() > Duration::from_secs(10) {
                log(&format!("waiting for {group} to catch up: lag {lag:?}"));
                last = Instant::now();
            }
            // Caught up: less than a second of input left.
            Ok(lag.is_some_and(|l| l <= args.rate as i64))
        })
        .with_context(|| format!("{group} did not catch up with its input"))?;
        log(&format!(
            "{group} caught up with {} keys in {:.1} s",
            args.keys,
            t.elapsed().as_secs_f64()
        ));
        self.watch = Some(OutputWatch::start(&self.output, self.epoch)?);
        Ok(())
    }

    fn watch(&self) -> Result<&OutputWatch> {
        self.watch.as_ref().context("the output is not watched yet")
    }

    /// Per partition, the longest gap in `[from, to]` (the normal cadence of commits).
    fn gaps(&self, from: f64, to: f64, partitions: i32) -> Result<Vec<f64>> {
        let w = self.watch()?;
        Ok((0..partitions)
            .map(|p| longest_gap(&w.arrivals(p), from, to).seconds())
            .collect())
    }

    fn finish(mut self, extra_topics: &[String]) -> Result<()> {
        if let Some(w) = self.watch.take() {
            w.stop()?;
        }
        if let Some(s) = self.steady.take() {
            s.stop()?;
        }
        let mut all = vec![self.input.as_str(), self.output.as_str()];
        all.extend(extra_topics.iter().map(String::as_str));
        delete_topics(&all)
    }
}

fn partition_of(task: &str) -> i32 {
    task.rsplit('_')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(-1)
}

fn all_tasks(partitions: i32) -> Vec<String> {
    (0..partitions).map(|p| format!("0_{p}")).collect()
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn opt3(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| json!(round3(v)))
}

/// The pause at a move: the longest gap that began within 5 s of the moment `m` the task
/// changed hands (eddy: the assignment moved it; Kafka Streams: its new owner reported it
/// active), however long it lasted. Apart from the move's own pause it sees only the
/// machine's noise nearby, not all of it since the event.
fn near(arrivals: &[f64], m: f64, t0: f64, t_end: f64) -> Gap {
    longest(
        gaps(arrivals, t0, t_end)
            .into_iter()
            .filter(|g| (g.start - m).abs() <= 5.0),
    )
    .unwrap_or_else(|| longest_gap(arrivals, t0, t_end))
}

/// Baseline of a stage: p99 and max over partitions of the longest gap in the `secs` before
/// `t0`.
fn baseline(stage: &Stage, t0: f64, secs: f64, partitions: i32) -> Result<Value> {
    let g = stage.gaps(t0 - secs, t0, partitions)?;
    Ok(json!({
        "seconds": secs,
        "gap_p99_s": opt3(percentile(&g, 0.99)),
        "gap_max_s": opt3(g.iter().copied().reduce(f64::max)),
    }))
}

/// Sleep while a condition of the system settles (a benchmark, not a test: it waits on purpose).
fn pause(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
}

// ---------------------------------------------------------------- eddy under its operator

/// What the bench records of an app's status at each change: the assignment, the workers'
/// per-task reports, the Progressing reason.
#[derive(Clone, Debug, PartialEq)]
struct Snap {
    t: f64,
    /// The app's resourceVersion (not compared).
    version: String,
    assignment: Assignment,
    reports: BTreeMap<String, BTreeMap<String, TaskStatus>>,
    reason: String,
}

impl Snap {
    fn same(&self, o: &Snap) -> bool {
        self.assignment == o.assignment && self.reports == o.reports && self.reason == o.reason
    }

    fn actives(&self) -> BTreeMap<String, String> {
        self.assignment
            .pods
            .iter()
            .flat_map(|(pod, t)| t.active.iter().map(move |id| (id.clone(), pod.clone())))
            .collect()
    }

    fn report(&self, pod: &str, task: &str) -> Option<&TaskStatus> {
        self.reports.get(pod)?.get(task)
    }

    /// `pods` pods, actives balanced over them and each reported RUNNING by its pod, no
    /// warm-ups, nobody down, and every standby within the acceptable lag.
    fn balanced(&self, pods: usize, tasks: usize) -> bool {
        let a = &self.assignment;
        let (lo, hi) = (tasks / pods, tasks.div_ceil(pods));
        a.pods.len() == pods
            && a.down.is_empty()
            && self.actives().len() == tasks
            && a.pods.iter().all(|(pod, t)| {
                (lo..=hi).contains(&t.active.len())
                    && t.warmup.is_empty()
                    && t.active.iter().all(|id| {
                        self.report(pod, id).is_some_and(|r| {
                            r.role == TaskRole::Active && r.state == TaskState::Running
                        })
                    })
                    && t.standby.iter().all(|id| {
                        self.report(pod, id).is_some_and(|r| {
                            r.role == TaskRole::Standby
                                && r.lag.is_some_and(|l| l <= ACCEPTABLE_LAG)
                        })
                    })
            })
    }
}

/// The status changes of one app, recorded by a watch.
struct AppWatch {
    snaps: Arc<Mutex<Vec<Snap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl AppWatch {
    fn all(&self) -> Vec<Snap> {
        self.snaps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn latest(&self) -> Option<Snap> {
        self.snaps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .cloned()
    }

    /// The time of the first change at or after `after` whose snapshot satisfies `f`.
    fn first(&self, after: f64, f: impl Fn(&Snap) -> bool) -> Option<f64> {
        self.all()
            .into_iter()
            .find(|s| s.t >= after && f(s))
            .map(|s| s.t)
    }
}

impl Drop for AppWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The local control plane with the chart's CRD and RBAC, the operator and the pod runner.
struct EddyEnv {
    // Dropped in this order: the processes (the runner stops its pods), then the control plane.
    _procs: Vec<Process>,
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    cp: ControlPlane,
    /// The operator's and the runner's logs, and the pod runner's node (pod logs under
    /// `node/pods/<namespace>/<pod>/log`).
    dir: PathBuf,
}

impl EddyEnv {
    fn start(logs: &Path) -> Result<EddyEnv> {
        let cp = ControlPlane::start("scalebench")?;
        let dir = logs.join("eddy");
        std::fs::create_dir_all(&dir)?;
        let op_kubeconfig = cp.install_operator_rbac(OPERATOR_NS, &dir)?;
        cp.kubectl(&["create", "namespace", NS], None)?;
        let procs = vec![
            Process::spawn(
                "eddy-operator",
                &[
                    "run",
                    "--http-addr",
                    "127.0.0.1:0",
                    "--namespace",
                    OPERATOR_NS,
                    "--identity",
                    "scalebench",
                ],
                &[("KUBECONFIG", &op_kubeconfig)],
                &dir.join("operator.log"),
            )?,
            Process::spawn(
                "pod-runner",
                &[
                    "--kubeconfig",
                    &cp.kubeconfig.to_string_lossy(),
                    "--node",
                    "scalebench-node",
                    "--root",
                    &dir.join("node").to_string_lossy(),
                ],
                &[],
                &dir.join("runner.log"),
            )?,
        ];
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let kubeconfig = cp.kubeconfig.clone();
        let client = rt.block_on(async move {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
            let config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        log(&format!(
            "control plane, operator and pod runner up (logs in {})",
            dir.display()
        ));
        Ok(EddyEnv {
            _procs: procs,
            rt,
            client,
            cp,
            dir,
        })
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.cp.kubectl(args, stdin)
    }

    fn watch(&self, name: &str, epoch: Instant) -> AppWatch {
        let snaps: Arc<Mutex<Vec<Snap>>> = Arc::new(Mutex::new(Vec::new()));
        let api: kube::Api<StatefulStreamApp> = kube::Api::namespaced(self.client.clone(), NS);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let into = snaps.clone();
        let task = self.rt.spawn(async move {
            let mut stream = watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = stream.next().await {
                let Ok(app) = ev else { continue };
                let status = app.status.unwrap_or_default();
                let snap = Snap {
                    t: since(epoch),
                    version: app.metadata.resource_version.clone().unwrap_or_default(),
                    assignment: status.assignment.unwrap_or_default(),
                    reports: status
                        .workers
                        .into_iter()
                        .map(|(pod, w)| (pod, w.tasks))
                        .collect(),
                    reason: status
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "Progressing")
                        .map(|c| c.reason.clone())
                        .unwrap_or_default(),
                };
                let mut v = into.lock().unwrap_or_else(PoisonError::into_inner);
                if !v.last().is_some_and(|l| l.same(&snap)) {
                    v.push(snap);
                }
            }
        });
        AppWatch { snaps, task }
    }

    fn apply_app(&self, name: &str, stage: &Stage, replicas: i32, extra: &str) -> Result<()> {
        let yaml = format!(
            r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  kafka: {{bootstrapServers: "{bs}"}}
  processingGuarantee: exactly_once
  cleanupPolicy: Delete
{extra}  topology:
    - from: {{topic: {input}, key: string, value: bytes}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#,
            bs = bootstrap()?,
            input = stage.input,
            output = stage.output,
        );
        self.kubectl(&["-n", NS, "apply", "-f", "-"], Some(&yaml))?;
        Ok(())
    }

    /// Delete the app (its changelog goes with it: cleanupPolicy Delete) and wait until its
    /// pods are gone.
    fn delete_app(&self, name: &str) -> Result<()> {
        self.kubectl(
            &[
                "-n",
                NS,
                "delete",
                "ssapp",
                name,
                "--wait=true",
                "--timeout=180s",
            ],
            None,
        )?;
        wait_until(Duration::from_secs(180), || {
            Ok(self
                .kubectl(
                    &[
                        "-n",
                        NS,
                        "get",
                        "pods",
                        "-l",
                        &format!("app.kubernetes.io/instance={name}"),
                        "-o",
                        "name",
                    ],
                    None,
                )?
                .trim()
                .is_empty())
        })
    }

    fn wait_balanced(&self, w: &AppWatch, pods: usize, tasks: usize, secs: u64) -> Result<()> {
        wait_until(Duration::from_secs(secs), || {
            Ok(w.latest().is_some_and(|s| s.balanced(pods, tasks)))
        })
        .with_context(|| {
            let file = self.dir.join("status-changes.log");
            let _ = std::fs::write(&file, format!("{:#?}", w.all()));
            format!(
                "not balanced over {pods} pods within {secs} s; last status: {:?}; every status change in {}, logs in {}",
                w.latest(),
                file.display(),
                self.dir.display()
            )
        })
    }
}

/// The assignments between `from` and `to` (relative to `from`), for a look at what moved when.
fn status_changes(w: &AppWatch, from: f64, to: f64) -> Vec<Value> {
    let mut last: Option<i64> = None;
    w.all()
        .iter()
        .filter(|s| s.t >= from - 1.0 && s.t <= to)
        .filter(|s| {
            let new = last != Some(s.assignment.generation);
            last = Some(s.assignment.generation);
            new
        })
        .map(|s| {
            let pods: serde_json::Map<String, Value> = s
                .assignment
                .pods
                .iter()
                .map(|(p, t)| {
                    (
                        p.clone(),
                        json!({"active": t.active, "standby": t.standby, "warmup": t.warmup}),
                    )
                })
                .collect();
            json!({"t_s": round3(s.t - from), "generation": s.assignment.generation,
                   "reason": s.reason, "down": s.assignment.down, "pods": pods})
        })
        .collect()
}

/// The application id the operator gives an app: `<namespace>.<name>`.
fn app_id(name: &str) -> String {
    format!("{NS}.{name}")
}

/// When each task of `tasks` was warmed up, caught up, moved and running on its new pod,
/// relative to `t0`, from the recorded status changes.
fn timeline(w: &AppWatch, t0: f64, task: &str, to: &str) -> Value {
    let rel = |t: Option<f64>| opt3(t.map(|t| t - t0));
    let warmup = w.first(t0, |s| {
        s.assignment
            .pods
            .get(to)
            .is_some_and(|p| p.warmup.iter().any(|x| x == task))
    });
    let caught_up = w.first(t0, |s| {
        s.report(to, task).is_some_and(|r| {
            r.role != TaskRole::Active && r.lag.is_some_and(|l| l <= ACCEPTABLE_LAG)
        })
    });
    let moved = w.first(t0, |s| s.actives().get(task).is_some_and(|p| p == to));
    let running = w.first(t0, |s| {
        s.report(to, task)
            .is_some_and(|r| r.role == TaskRole::Active && r.state == TaskState::Running)
    });
    json!({
        "warmup_assigned_s": rel(warmup),
        "caught_up_reported_s": rel(caught_up),
        "moved_s": rel(moved),
        "running_reported_s": rel(running),
    })
}

fn eddy_scale_out(env: &EddyEnv, args: &Args, warmups: bool) -> Result<Value> {
    let case = if warmups {
        "scale-out"
    } else {
        "scale-out-no-warmup"
    };
    log(&format!("eddy {case}"));
    let name = unique(if warmups { "so" } else { "sonw" }).replace('_', "-");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    let extra = if warmups {
        String::new()
    } else {
        // Any reported copy is "caught up": tasks move as soon as the new pod reports one.
        "  warmup: {acceptableRecoveryLag: 1000000000000}\n".to_string()
    };
    env.apply_app(&name, &stage, 2, &extra)?;
    let w = env.watch(&name, stage.epoch);
    let n = args.partitions as usize;
    env.wait_balanced(&w, 2, n, args.balance_wait_s)?;
    stage.load(args, &app_id(&name))?;
    env.wait_balanced(&w, 2, n, args.balance_wait_s)?;
    pause(args.baseline_s);

    let t0 = stage.now();
    let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
    let before = w.latest().context("no status")?.actives();
    env.kubectl(&["-n", NS, "scale", "ssapp", &name, "--replicas=3"], None)?;
    let bal = wait_until(Duration::from_secs(args.balance_wait_s), || {
        Ok(w.latest().is_some_and(|s| s.balanced(3, n)))
    });
    let balanced = bal
        .is_ok()
        .then(|| w.first(t0, |s| s.balanced(3, n)))
        .flatten();
    pause(args.settle_s);
    let t_end = stage.now();
    let after = w.latest().context("no status")?.actives();
    let mut moved = Vec::new();
    let mut pauses = Vec::new();
    let mut handoffs = Vec::new();
    let mut unmoved = Vec::new();
    for task in all_tasks(args.partitions) {
        let arrivals = stage.watch()?.arrivals(partition_of(&task));
        let gap = longest_gap(&arrivals, t0, t_end);
        match (before.get(&task), after.get(&task)) {
            (Some(from), Some(to)) if from != to => {
                pauses.push(gap.seconds());
                let m = w.first(t0, |s| s.actives().get(&task) == Some(to));
                let at_move = m.map(|m| near(&arrivals, m, t0, t_end));
                if let Some(g) = at_move {
                    handoffs.push(g.seconds());
                }
                moved.push(json!({
                    "task": task, "from": from, "to": to,
                    "pause_s": round3(gap.seconds()),
                    "pause_from_s": round3(gap.start - t0),
                    "pause_to_s": round3(gap.end - t0),
                    "resumed": gap.resumed,
                    "pause_at_move_s": opt3(at_move.map(|g| g.seconds())),
                    "timeline": timeline(&w, t0, &task, to),
                }));
            }
            _ => unmoved.push(gap.seconds()),
        }
    }
    let snaps = status_changes(&w, t0, t_end);
    let result = json!({
        "engine": "eddy",
        "case": case,
        "event": "kubectl scale --replicas=3 (from 2)",
        "event_at": wall(&stage, t0),
        "tasks": moved.len(),
        "pause_p99_s": opt3(percentile(&pauses, 0.99)),
        "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
        "pause_at_move_p99_s": opt3(percentile(&handoffs, 0.99)),
        "balanced_after_s": opt3(balanced.map(|t| t - t0)),
        "balance_wait_s": args.balance_wait_s,
        "unmoved_gap_max_s": opt3(unmoved.iter().copied().reduce(f64::max)),
        "baseline": base,
        "moved": moved,
        "status_changes": snaps,
    });
    drop(w);
    env.delete_app(&name)?;
    stage.finish(&topics_with_prefix(&app_id(&name))?)?;
    log(&format!("eddy {case}: {result}"));
    Ok(result)
}

/// The pid of the `eddy-worker` process the pod runner runs for `pod`.
fn worker_pid(pod: &str) -> Result<u32> {
    let want_id = format!("EDDY_INSTANCE_ID={pod}");
    let want_ns = format!("EDDY_NAMESPACE={NS}");
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let has = |v: &str| vars.contains(&v.as_bytes());
        if has(&want_id) && has(&want_ns) && has("EDDY_POD_RUNNER=1") {
            return Ok(pid);
        }
    }
    bail!("no worker process for pod {pod}")
}

fn eddy_failover(env: &EddyEnv, args: &Args) -> Result<Vec<Value>> {
    log("eddy failover");
    let name = unique("fo").replace('_', "-");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    env.apply_app(&name, &stage, 3, "  numStandbyReplicas: 1\n")?;
    let w = env.watch(&name, stage.epoch);
    let n = args.partitions as usize;
    env.wait_balanced(&w, 3, n, args.balance_wait_s)?;
    stage.load(args, &app_id(&name))?;
    env.wait_balanced(&w, 3, n, args.balance_wait_s)?;
    pause(args.baseline_s);
    let mut results = Vec::new();
    for (case, victim) in [("failover-delete", 1), ("failover-kill", 2)] {
        let pod = format!("{name}-{victim}");
        let t0 = stage.now();
        let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
        let before = w.latest().context("no status")?.actives();
        let tasks: Vec<String> = before
            .iter()
            .filter(|(_, p)| **p == pod)
            .map(|(t, _)| t.clone())
            .collect();
        let event = if case == "failover-delete" {
            env.kubectl(&["-n", NS, "delete", "pod", &pod, "--wait=false"], None)?;
            format!("kubectl delete pod {pod} (graceful)")
        } else {
            let pid = worker_pid(&pod)?;
            Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
            format!("SIGKILL to the worker of {pod}")
        };
        log(&format!("{event}: its tasks {tasks:?}"));
        // Each task moved off the pod (at once: to a standby's pod), the pod came back and
        // got its share again, and every task writes output since its last move.
        let moved_at = |task: &str| {
            w.first(t0, |s| {
                s.actives().get(task).is_some_and(|p| *p != pod) && s.assignment.down.contains(&pod)
            })
        };
        let last_move = |task: &str| {
            let all = w.all();
            let owner = |s: &Snap| s.actives().get(task).cloned();
            all.windows(2)
                .rev()
                .find(|p| p[1].t >= t0 && owner(&p[0]) != owner(&p[1]))
                .map(|p| p[1].t)
        };
        let ok = wait_until(Duration::from_secs(args.failover_wait_s), || {
            Ok(w.latest().is_some_and(|s| s.balanced(3, n))
                && tasks.iter().all(|t| {
                    moved_at(t).is_some()
                        && last_move(t).is_some_and(|m| {
                            stage
                                .watch
                                .as_ref()
                                .and_then(|o| o.first_after(partition_of(t), m))
                                .is_some()
                        })
                }))
        });
        let back = w.first(t0, |s| s.balanced(3, n) && s.assignment.down.is_empty());
        if ok.is_err() {
            log(&format!(
                "{case}: not every task processed again and back in place within {} s",
                args.failover_wait_s
            ));
        }
        pause(args.settle_s);
        let t_end = stage.now();
        let mut per_task = Vec::new();
        let mut resumes = Vec::new();
        let mut pauses = Vec::new();
        for task in &tasks {
            let m = moved_at(task);
            // Every change of the task's active pod since the event.
            let mut moves = Vec::new();
            let mut owner = Some(pod.clone());
            for s in w.all().into_iter().filter(|s| s.t >= t0) {
                let now = s.actives().get(task).cloned();
                if now != owner {
                    moves.push(json!({"t_s": round3(s.t - t0), "to": now}));
                    owner = now;
                }
            }
            let arrivals = stage.watch()?.arrivals(partition_of(task));
            let gap = longest_gap(&arrivals, t0, t_end);
            // Processing again: the end of the longest pause that began before the task
            // moved a second time (back to the returning pod), i.e. where it failed over to,
            // or, if it did not process there, where it went next.
            let second_move = w
                .all()
                .into_iter()
                .filter(|s| s.t >= t0)
                .scan(Some(pod.clone()), |owner, s| {
                    let now = s.actives().get(task).cloned();
                    let changed = now != *owner;
                    *owner = now;
                    Some((s.t, changed))
                })
                .filter(|(_, changed)| *changed)
                .nth(1)
                .map(|(t, _)| t);
            let resumed = longest(
                gaps(&arrivals, t0, t_end)
                    .into_iter()
                    .filter(|g| second_move.is_none_or(|m| g.start < m)),
            )
            .unwrap_or(gap);
            if resumed.resumed {
                resumes.push(resumed.end - t0);
            }
            pauses.push(gap.seconds());
            let first_to = m.and_then(|m| {
                w.all()
                    .into_iter()
                    .find(|s| s.t >= m)
                    .and_then(|s| s.actives().get(task).cloned())
            });
            per_task.push(json!({
                "task": task, "from": pod, "to": first_to,
                "moved_s": opt3(m.map(|m| m - t0)),
                "moves": moves,
                "pause_s": round3(gap.seconds()),
                "pause_from_s": round3(gap.start - t0),
                "resumed_s": if resumed.resumed { json!(round3(resumed.end - t0)) } else { Value::Null },
                "lag_at_move": first_to.as_ref().and_then(|to| m.and_then(|m| w.all().into_iter().rev()
                    .find(|s| s.t < m).and_then(|s| s.report(to, task).and_then(|r| r.lag)))),
            }));
        }
        let all_resumed = resumes.len() == tasks.len();
        results.push(json!({
            "engine": "eddy",
            "case": case,
            "event": event,
            "event_at": wall(&stage, t0),
            "standbys": 1,
            "tasks": tasks.len(),
            "resumed_max_s": if all_resumed { opt3(resumes.iter().copied().reduce(f64::max)) } else { Value::Null },
            "resume_wait_s": args.failover_wait_s,
            "pause_p99_s": opt3(percentile(&pauses, 0.99)),
            "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
            "back_in_place_s": opt3(back.map(|b| b - t0)),
            "baseline": base,
            "moved": per_task,
            "status_changes": status_changes(&w, t0, t_end),
        }));
        log(&format!(
            "eddy {case}: {}",
            results.last().unwrap_or(&Value::Null)
        ));
        // Back in place (the pod returned and got its tasks back) before the next event.
        env.wait_balanced(&w, 3, n, args.balance_wait_s)?;
        pause(args.baseline_s);
    }
    drop(w);
    env.delete_app(&name)?;
    stage.finish(&topics_with_prefix(&app_id(&name))?)?;
    Ok(results)
}

// ---------------------------------------------------------------- Kafka Streams

/// One instance's tasks at a moment, as the reference app prints them (`--print-tasks`).
#[derive(Clone, Debug)]
struct KsSnap {
    t: f64,
    state: String,
    active: Vec<String>,
    standby: Vec<String>,
}

/// A reference app instance: a `java` process printing its tasks on every change.
struct KsInstance {
    name: String,
    child: Option<Child>,
    snaps: Arc<Mutex<Vec<KsSnap>>>,
    log: PathBuf,
}

impl KsInstance {
    fn start(
        jar: &Path,
        stage: &Stage,
        app: &str,
        name: &str,
        dir: &Path,
        logs: &Path,
        standbys: u32,
    ) -> Result<KsInstance> {
        let log = logs.join(format!("{app}-{name}.log"));
        let mut child = Command::new("java")
            .arg("-jar")
            .arg(jar)
            .args(["--bootstrap", &bootstrap()?, "--app-id", app])
            .args(["--case", "count", "--guarantee", "exactly_once_v2"])
            .args(["--input", &stage.input, "--output", &stage.output])
            .arg("--state-dir")
            .arg(dir.join(name))
            .arg("--print-tasks")
            .args(["--config", &format!("num.standby.replicas={standbys}")])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting java")?;
        let snaps: Arc<Mutex<Vec<KsSnap>>> = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().context("no stdout")?;
        let (into, epoch) = (snaps.clone(), stage.epoch);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let list = |k: &str| -> Vec<String> {
                    v[k].as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                into.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(KsSnap {
                        t: since(epoch),
                        state: v["state"].as_str().unwrap_or_default().to_string(),
                        active: list("active"),
                        standby: list("standby"),
                    });
            }
        });
        Ok(KsInstance {
            name: name.to_string(),
            child: Some(child),
            snaps,
            log,
        })
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn latest(&self) -> Option<KsSnap> {
        self.snaps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .cloned()
    }

    fn all(&self) -> Vec<KsSnap> {
        self.snaps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn signal(&mut self, sig: &str) -> Result<()> {
        if let Some(c) = &self.child {
            Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status()?;
        }
        Ok(())
    }

    /// SIGTERM (a clean close), SIGKILL after 60 s.
    fn stop(&mut self) {
        let _ = self.signal("TERM");
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for KsInstance {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Task → instance index of the live instances' latest reports.
fn ks_actives(instances: &mut [KsInstance]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (i, inst) in instances.iter_mut().enumerate() {
        if !inst.alive() {
            continue;
        }
        if let Some(s) = inst.latest() {
            for t in s.active {
                m.insert(t, i);
            }
        }
    }
    m
}

/// Every live instance RUNNING with a balanced share of the actives, and `standbys` standby
/// copies of every task.
fn ks_balanced(instances: &mut [KsInstance], tasks: usize, standbys: usize) -> bool {
    let live: Vec<KsSnap> = instances
        .iter_mut()
        .filter_map(|i| if i.alive() { i.latest() } else { None })
        .collect();
    if live.is_empty() {
        return false;
    }
    let (lo, hi) = (tasks / live.len(), tasks.div_ceil(live.len()));
    let actives: std::collections::BTreeSet<&String> =
        live.iter().flat_map(|s| s.active.iter()).collect();
    let standby_copies: usize = live.iter().map(|s| s.standby.len()).sum();
    live.iter()
        .all(|s| s.state == "RUNNING" && (lo..=hi).contains(&s.active.len()))
        && actives.len() == tasks
        && standby_copies == tasks * standbys
}

fn ks_wait_balanced(
    instances: &mut [KsInstance],
    tasks: usize,
    standbys: usize,
    secs: u64,
) -> Result<()> {
    wait_until(Duration::from_secs(secs), || {
        Ok(ks_balanced(instances, tasks, standbys))
    })
    .with_context(|| {
        let states: Vec<String> = instances
            .iter()
            .map(|i| format!("{}: {:?} (log {})", i.name, i.latest(), i.log.display()))
            .collect();
        format!(
            "Kafka Streams not balanced within {secs} s: {}",
            states.join("; ")
        )
    })
}

/// The first time after `after` at which instance `i` reported `task` as active.
fn ks_first_active(inst: &KsInstance, task: &str, after: f64) -> Option<f64> {
    inst.all()
        .into_iter()
        .find(|s| s.t >= after && s.active.iter().any(|t| t == task))
        .map(|s| s.t)
}

fn ks_scale_out(jar: &Path, args: &Args, logs: &Path) -> Result<Value> {
    log("Kafka Streams scale-out");
    let dir = tempfile::tempdir()?;
    let app = unique("ks-so");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    let n = args.partitions as usize;
    // Started on empty topics, so every instance is "caught up" and the tasks spread evenly.
    let mut inst = vec![
        KsInstance::start(jar, &stage, &app, "ks-0", dir.path(), logs, 0)?,
        KsInstance::start(jar, &stage, &app, "ks-1", dir.path(), logs, 0)?,
    ];
    ks_wait_balanced(&mut inst, n, 0, 300)?;
    stage.load(args, &app)?;
    ks_wait_balanced(&mut inst, n, 0, 300)?;
    pause(args.baseline_s);
    let t0 = stage.now();
    let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
    let before = ks_actives(&mut inst);
    inst.push(KsInstance::start(
        jar,
        &stage,
        &app,
        "ks-2",
        dir.path(),
        logs,
        0,
    )?);
    let balanced = wait_until(Duration::from_secs(args.ks_balance_wait_s), || {
        Ok(ks_balanced(&mut inst, n, 0) && inst[2].latest().is_some_and(|s| !s.active.is_empty()))
    })
    .is_ok()
    .then(|| stage.now());
    pause(args.settle_s);
    let t_end = stage.now();
    let after = ks_actives(&mut inst);
    let mut moved = Vec::new();
    let mut pauses = Vec::new();
    let mut handoffs = Vec::new();
    let mut unmoved = Vec::new();
    for task in all_tasks(args.partitions) {
        let gap = longest_gap(&stage.watch()?.arrivals(partition_of(&task)), t0, t_end);
        match (before.get(&task), after.get(&task)) {
            (Some(from), Some(to)) if from != to => {
                pauses.push(gap.seconds());
                let m = ks_first_active(&inst[*to], &task, t0);
                let arrivals = stage.watch()?.arrivals(partition_of(&task));
                let at_move = m.map(|m| near(&arrivals, m, t0, t_end));
                if let Some(g) = at_move {
                    handoffs.push(g.seconds());
                }
                moved.push(json!({
                    "task": task, "from": inst[*from].name, "to": inst[*to].name,
                    "pause_s": round3(gap.seconds()),
                    "pause_from_s": round3(gap.start - t0),
                    "pause_to_s": round3(gap.end - t0),
                    "resumed": gap.resumed,
                    "moved_s": opt3(m.map(|t| t - t0)),
                    "pause_at_move_s": opt3(at_move.map(|g| g.seconds())),
                }));
            }
            _ => unmoved.push(gap.seconds()),
        }
    }
    // What the new instance did meanwhile: its task lists over time (warm-ups show as standbys).
    let new_instance: Vec<Value> = inst[2]
        .all()
        .iter()
        .map(|s| json!({"t_s": round3(s.t - t0), "state": s.state, "active": s.active, "standby": s.standby}))
        .collect();
    let result = json!({
        "engine": "kafka-streams",
        "case": "scale-out",
        "event": "a third instance started (2 running)",
        "event_at": wall(&stage, t0),
        "tasks": moved.len(),
        "pause_p99_s": opt3(percentile(&pauses, 0.99)),
        "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
        "pause_at_move_p99_s": opt3(percentile(&handoffs, 0.99)),
        "balanced_after_s": opt3(balanced.map(|t| t - t0)),
        "balance_wait_s": args.ks_balance_wait_s,
        "unmoved_gap_max_s": opt3(unmoved.iter().copied().reduce(f64::max)),
        "baseline": base,
        "moved": moved,
        "new_instance": new_instance,
    });
    for i in &mut inst {
        i.stop();
    }
    stage.finish(&topics_with_prefix(&app)?)?;
    log(&format!("Kafka Streams scale-out: {result}"));
    Ok(result)
}

fn ks_failover(jar: &Path, args: &Args, signal: &str, logs: &Path) -> Result<Value> {
    let case = if signal == "KILL" {
        "failover-kill"
    } else {
        "failover-term"
    };
    log(&format!("Kafka Streams {case}"));
    let dir = tempfile::tempdir()?;
    let app = unique("ks-fo");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    let n = args.partitions as usize;
    let mut inst = Vec::new();
    for i in 0..3 {
        inst.push(KsInstance::start(
            jar,
            &stage,
            &app,
            &format!("ks-{i}"),
            dir.path(),
            logs,
            1,
        )?);
    }
    ks_wait_balanced(&mut inst, n, 1, 300)?;
    stage.load(args, &app)?;
    ks_wait_balanced(&mut inst, n, 1, 300)?;
    pause(args.baseline_s);
    let t0 = stage.now();
    let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
    let victim = 1;
    let tasks: Vec<String> = inst[victim].latest().map(|s| s.active).unwrap_or_default();
    inst[victim].signal(signal)?;
    let event = format!("SIG{signal} to instance ks-{victim}");
    log(&format!("{event}: its tasks {tasks:?}"));
    let moved_at = |inst: &[KsInstance], task: &str| -> Option<(usize, f64)> {
        inst.iter()
            .enumerate()
            .filter(|(i, _)| *i != victim)
            .filter_map(|(i, x)| ks_first_active(x, task, t0).map(|t| (i, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let ok = wait_until(Duration::from_secs(args.failover_wait_s), || {
        Ok(tasks.iter().all(|t| {
            moved_at(&inst, t).is_some_and(|(_, m)| {
                stage
                    .watch
                    .as_ref()
                    .and_then(|o| o.first_after(partition_of(t), m))
                    .is_some()
            })
        }))
    });
    if ok.is_err() {
        log(&format!(
            "{case}: not every task processed again within {} s",
            args.failover_wait_s
        ));
    }
    pause(args.settle_s);
    let t_end = stage.now();
    let mut per_task = Vec::new();
    let mut resumes = Vec::new();
    let mut pauses = Vec::new();
    for task in &tasks {
        let m = moved_at(&inst, task);
        let gap = longest_gap(&stage.watch()?.arrivals(partition_of(task)), t0, t_end);
        if gap.resumed {
            resumes.push(gap.end - t0);
        }
        pauses.push(gap.seconds());
        per_task.push(json!({
            "task": task, "from": inst[victim].name,
            "to": m.map(|(i, _)| inst[i].name.clone()),
            "moved_s": opt3(m.map(|(_, t)| t - t0)),
            "pause_s": round3(gap.seconds()),
            "pause_from_s": round3(gap.start - t0),
            "resumed_s": if gap.resumed { json!(round3(gap.end - t0)) } else { Value::Null },
        }));
    }
    let all_resumed = resumes.len() == tasks.len();
    let result = json!({
        "engine": "kafka-streams",
        "case": case,
        "event": event,
        "event_at": wall(&stage, t0),
        "standbys": 1,
        "tasks": tasks.len(),
        "resumed_max_s": if all_resumed { opt3(resumes.iter().copied().reduce(f64::max)) } else { Value::Null },
        "resume_wait_s": args.failover_wait_s,
        "pause_p99_s": opt3(percentile(&pauses, 0.99)),
        "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
        "baseline": base,
        "moved": per_task,
    });
    for i in &mut inst {
        i.stop();
    }
    stage.finish(&topics_with_prefix(&app)?)?;
    log(&format!("Kafka Streams {case}: {result}"));
    Ok(result)
}

// ---------------------------------------------------------------- report

fn find<'a>(results: &'a [Value], engine: &str, case: &str) -> Option<&'a Value> {
    results
        .iter()
        .find(|r| r["engine"] == engine && r["case"] == case)
}

/// Kafka Streams / eddy for the figures both engines have: how many times longer Kafka
/// Streams pauses or takes.
fn ratios(results: &[Value]) -> Value {
    let pairs = [
        (
            "scale-out pause p99",
            "scale-out",
            "scale-out",
            "pause_p99_s",
        ),
        (
            "scale-out: time until balanced",
            "scale-out",
            "scale-out",
            "balanced_after_s",
        ),
        (
            "failover, graceful stop: tasks process again",
            "failover-delete",
            "failover-term",
            "resumed_max_s",
        ),
        (
            "failover, SIGKILL: tasks process again",
            "failover-kill",
            "failover-kill",
            "resumed_max_s",
        ),
    ];
    let mut m = serde_json::Map::new();
    for (label, eddy_case, ks_case, field) in pairs {
        let (Some(e), Some(k)) = (
            find(results, "eddy", eddy_case),
            find(results, "kafka-streams", ks_case),
        ) else {
            continue;
        };
        let ratio = match (e[field].as_f64(), k[field].as_f64()) {
            (Some(e), Some(k)) if e > 0.0 => json!(round3(k / e)),
            _ => Value::Null,
        };
        m.insert(
            label.to_string(),
            json!({"eddy": e[field], "kafka_streams": k[field], "ks_over_eddy": ratio}),
        );
    }
    Value::Object(m)
}

fn secs(v: &Value) -> String {
    v.as_f64().map_or("—".into(), |v| format!("{v:.2}"))
}

fn markdown(args: &Args, results: &[Value]) -> String {
    let mut s = format!(
        "{} keys, {} partitions, {} input records/s, exactly-once; seconds.\n\n",
        args.keys, args.partitions, args.rate
    );
    s.push_str("| engine | case | event | tasks | pause p99 | pause max | of it at the move (p99) | other tasks' longest gap | processing again after (max) | balanced after | normal gap (p99 over tasks) | target |\n");
    s.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in results {
        let case = r["case"].as_str().unwrap_or_default();
        let eddy = r["engine"] == "eddy";
        let resumed = if case.starts_with("failover") {
            match r["resumed_max_s"].as_f64() {
                Some(v) => format!("{v:.2}"),
                None => format!("not within {} s", r["resume_wait_s"]),
            }
        } else {
            "—".into()
        };
        let balanced = if case.starts_with("scale-out") {
            match r["balanced_after_s"].as_f64() {
                Some(v) => format!("{v:.2}"),
                None => format!("not within {} s", r["balance_wait_s"]),
            }
        } else {
            "—".into()
        };
        let target = match (eddy, case) {
            (true, "scale-out") => match r["pause_p99_s"].as_f64() {
                Some(v) if v < 1.0 => "< 1 s ✓".to_string(),
                _ => "< 1 s ✗".to_string(),
            },
            (true, c) if c.starts_with("failover") => match r["resumed_max_s"].as_f64() {
                Some(v) if v < 5.0 => "< 5 s ✓".to_string(),
                _ => "< 5 s ✗".to_string(),
            },
            _ => String::new(),
        };
        s.push_str(&format!(
            "| {} | {case} | {} | {} | {} | {} | {} | {} | {resumed} | {balanced} | {} | {target} |\n",
            if eddy { "eddy" } else { "Kafka Streams" },
            r["event"].as_str().unwrap_or_default(),
            r["tasks"],
            secs(&r["pause_p99_s"]),
            secs(&r["pause_max_s"]),
            secs(&r["pause_at_move_p99_s"]),
            secs(&r["unmoved_gap_max_s"]),
            secs(&r["baseline"]["gap_p99_s"]),
        ));
    }
    let ratios = ratios(results);
    if let Some(m) = ratios.as_object().filter(|m| !m.is_empty()) {
        s.push_str(
            "\n| Kafka Streams / eddy | eddy | Kafka Streams | ratio |\n|---|---:|---:|---:|\n",
        );
        for (label, v) in m {
            s.push_str(&format!(
                "| {label} | {} | {} | {} |\n",
                secs(&v["eddy"]),
                secs(&v["kafka_streams"]),
                v["ks_over_eddy"]
                    .as_f64()
                    .map_or("—".into(), |r| format!("{r:.1}×"))
            ));
        }
    }
    s
}

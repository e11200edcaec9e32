//! eddy's cases of the scaling benchmark, under its operator: the local control plane with
//! the chart's CRD and RBAC, the operator and the pod runner; the app's status recorded at
//! every change to see when each task was warmed up, caught up, moved and running.

use super::measure::{gaps, longest, longest_gap, percentile, since};
use super::stage::{
    Stage, baseline, log, opt3, partition_of, pause, rollout_figures, round3, scale_out_figures,
    wall,
};
use super::{ACCEPTABLE_LAG, Settings};
use crate::k8s::{ControlPlane, Process};
use crate::{bootstrap, topics_with_prefix, unique, wait_until};
use anyhow::{Context as _, Result, bail};
use eddy_crds::StatefulStreamApp;
use eddy_crds::resource::{Assignment, TaskRole, TaskState, TaskStatus};
use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where eddy's apps live, and the operator's own namespace.
const NS: &str = "scalebench";
const OPERATOR_NS: &str = "eddy-system";

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
    /// `status.progress` (`RollingUpdate k/n` while the operator rolls the pods).
    progress: Option<String>,
}

impl Snap {
    fn same(&self, o: &Snap) -> bool {
        self.assignment == o.assignment
            && self.reports == o.reports
            && self.reason == o.reason
            && self.progress == o.progress
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
pub struct EddyEnv {
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
    pub fn start(logs: &Path) -> Result<EddyEnv> {
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
                    "--lease-name",
                    ControlPlane::LEASE,
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
                    progress: status.progress,
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

    /// Delete the apps a failed case left (their changelogs go with them).
    pub fn delete_all_apps(&self) -> Result<()> {
        self.kubectl(
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
        )?;
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

pub fn scale_out(env: &EddyEnv, args: &Settings, warmups: bool) -> Result<Value> {
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
    let figures = scale_out_figures(
        &stage,
        args.partitions,
        (t0, t_end),
        (&before, &after),
        |task, to| w.first(t0, |s| s.actives().get(task).is_some_and(|p| p == to)),
        |task, to, _| ("timeline", timeline(&w, t0, task, to)),
    )?;
    let snaps = status_changes(&w, t0, t_end);
    let mut result = json!({
        "engine": "eddy",
        "case": case,
        "event": "kubectl scale --replicas=3 (from 2)",
        "event_at": wall(&stage, t0),
        "balanced_after_s": opt3(balanced.map(|t| t - t0)),
        "balance_wait_s": args.balance_wait_s,
        "baseline": base,
        "status_changes": snaps,
    });
    if let Value::Object(r) = &mut result {
        r.extend(figures);
    }
    drop(w);
    env.delete_app(&name)?;
    stage.finish(&topics_with_prefix(&app_id(&name))?)?;
    log(&format!("eddy {case}: {result}"));
    Ok(result)
}

/// The app's pods, name → uid.
fn pod_uids(env: &EddyEnv, name: &str) -> Result<BTreeMap<String, String>> {
    let out = env.kubectl(
        &[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={name}"),
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}"#,
        ],
        None,
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(p, u)| (p.to_string(), u.to_string()))
        .collect())
}

/// A rolling update of 3 pods: a change of the pod template (an env variable of the worker,
/// as an image upgrade or a config change would be), with one standby per task or none.
/// Done when every pod was replaced, `status.progress` no longer shows the rollout and the app
/// is balanced with every copy caught up.
pub fn rollout(env: &EddyEnv, args: &Settings, standby: bool) -> Result<Value> {
    let case = if standby {
        "rollout"
    } else {
        "rollout-no-standby"
    };
    log(&format!("eddy {case}"));
    let name = unique(if standby { "ro" } else { "rons" }).replace('_', "-");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    let extra = if standby {
        "  numStandbyReplicas: 1\n"
    } else {
        ""
    };
    env.apply_app(&name, &stage, 3, extra)?;
    let w = env.watch(&name, stage.epoch);
    let n = args.partitions as usize;
    env.wait_balanced(&w, 3, n, args.balance_wait_s)?;
    stage.load(args, &app_id(&name))?;
    env.wait_balanced(&w, 3, n, args.balance_wait_s)?;
    pause(args.baseline_s);

    let t0 = stage.now();
    let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
    let before = pod_uids(env, &name)?;
    env.kubectl(
        &[
            "-n",
            NS,
            "patch",
            "ssapp",
            &name,
            "--type=merge",
            "-p",
            r#"{"spec":{"podTemplate":{"spec":{"containers":[{"name":"worker","env":[{"name":"BENCH_REVISION","value":"2"}]}]}}}}"#,
        ],
        None,
    )?;
    // `status.progress` is `RollingUpdate k/3` while the operator rolls the pods, the
    // `Progressing` reason otherwise.
    let rolling = |s: &Snap| {
        s.progress
            .as_deref()
            .is_some_and(|p| p.starts_with("RollingUpdate"))
    };
    let started = |w: &AppWatch| w.first(t0, rolling);
    let done = |w: &AppWatch| {
        started(w).and_then(|from| w.first(from, |s| !rolling(s) && s.balanced(3, n)))
    };
    let finished = wait_until(Duration::from_secs(args.rollout_wait_s), || {
        let now = pod_uids(env, &name)?;
        Ok(done(&w).is_some()
            && now.len() == 3
            && now
                .iter()
                .all(|(p, u)| before.get(p).is_some_and(|b| b != u)))
    });
    if let Err(e) = &finished {
        log(&format!("{case}: {e:#}"));
    }
    let rolled_out = finished.is_ok().then(|| done(&w)).flatten();
    pause(args.settle_s);
    let t_end = stage.now();
    let figures = rollout_figures(&stage, args.partitions, (t0, t_end))?;
    // When the progress changed, and when each pod went down and came back.
    let mut steps = Vec::new();
    let mut last: Option<(Option<String>, Vec<String>)> = None;
    for s in w.all().into_iter().filter(|s| s.t >= t0 && s.t <= t_end) {
        let now = (s.progress.clone(), s.assignment.down.clone());
        if last.as_ref() != Some(&now) {
            steps.push(json!({"t_s": round3(s.t - t0), "progress": now.0, "down": now.1}));
            last = Some(now);
        }
    }
    let mut result = json!({
        "engine": "eddy",
        "case": case,
        "event": "a pod template change (3 pods)",
        "event_at": wall(&stage, t0),
        "standbys": u8::from(standby),
        "rolled_out_after_s": opt3(rolled_out.map(|t| t - t0)),
        "rollout_wait_s": args.rollout_wait_s,
        "baseline": base,
        "steps": steps,
        "status_changes": status_changes(&w, t0, t_end),
    });
    if let Value::Object(r) = &mut result {
        r.extend(figures);
    }
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

pub fn failover(env: &EddyEnv, args: &Settings) -> Result<Vec<Value>> {
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
            format!("kubectl delete pod {pod} (graceful: its worker hands its tasks over)")
        } else {
            let pid = worker_pid(&pod)?;
            Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
            format!("SIGKILL to the worker of {pod}")
        };
        log(&format!("{event}: its tasks {tasks:?}"));
        // Each task moved off the pod (to a standby's pod: handed over while the deleted pod
        // stops, failed over from the killed one), the pod came back and got its share again,
        // and every task writes output since its last move.
        let moved_at =
            |task: &str| w.first(t0, |s| s.actives().get(task).is_some_and(|p| *p != pod));
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

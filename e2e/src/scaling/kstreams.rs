//! Kafka Streams' cases of the scaling benchmark: `bench/kstreams`' reference app as local
//! `java` processes, each printing its active and standby tasks on every change
//! (`--print-tasks`; warm-ups show among the standbys).

use super::Settings;
use super::measure::{longest_gap, percentile, since};
use super::stage::{
    Stage, baseline, log, opt3, partition_of, pause, rollout_figures, round3, scale_out_figures,
    wall,
};
use crate::{bootstrap, topics_with_prefix, unique, wait_until};
use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
        config: &[String],
    ) -> Result<KsInstance> {
        // A restarted instance (the rolling bounce) keeps the first one's log.
        let mut log = logs.join(format!("{app}-{name}.log"));
        for run in 2.. {
            if !log.exists() {
                break;
            }
            log = logs.join(format!("{app}-{name}-{run}.log"));
        }
        let mut child = Command::new("java")
            .arg(crate::compare::jvm_tmpdir(dir))
            .arg("-jar")
            .arg(jar)
            .args(["--bootstrap", &bootstrap()?, "--app-id", app])
            .args(["--case", "count", "--guarantee", "exactly_once_v2"])
            .args(["--input", &stage.input, "--output", &stage.output])
            .arg("--state-dir")
            .arg(dir.join(name))
            .arg("--print-tasks")
            .args(config.iter().flat_map(|kv| ["--config", kv.as_str()]))
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

/// Kafka Streams' settings for the scale-out: its defaults but for the probing rebalance,
/// which moves caught-up warm-ups, at its smallest interval instead of every 10 minutes.
const SCALE_OUT_CONFIG: &[&str] = &[
    "num.standby.replicas=0",
    "probing.rebalance.interval.ms=60000",
];

/// The failover cases: how the instance is stopped, and Kafka Streams' settings (one standby
/// per task; otherwise its defaults, or the smallest session timeout the broker allows by
/// default so that a killed member is noticed sooner).
pub const FAILOVERS: &[(&str, &str, &[&str])] = &[
    ("failover-kill", "KILL", &["num.standby.replicas=1"]),
    (
        "failover-kill-session-6s",
        "KILL",
        &[
            "num.standby.replicas=1",
            "session.timeout.ms=6000",
            "heartbeat.interval.ms=2000",
        ],
    ),
    ("failover-term", "TERM", &["num.standby.replicas=1"]),
];

fn owned(config: &[&str]) -> Vec<String> {
    config.iter().map(|s| s.to_string()).collect()
}

pub fn scale_out(jar: &Path, args: &Settings, logs: &Path) -> Result<Value> {
    log("Kafka Streams scale-out");
    let config = owned(SCALE_OUT_CONFIG);
    let dir = tempfile::tempdir()?;
    let app = unique("ks-so");
    let mut stage = Stage::new("scalebench", args.partitions)?;
    let n = args.partitions as usize;
    // Started on empty topics, so every instance is "caught up" and the tasks spread evenly.
    let mut inst = vec![
        KsInstance::start(jar, &stage, &app, "ks-0", dir.path(), logs, &config)?,
        KsInstance::start(jar, &stage, &app, "ks-1", dir.path(), logs, &config)?,
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
        &config,
    )?);
    let balanced = wait_until(Duration::from_secs(args.ks_balance_wait_s), || {
        Ok(ks_balanced(&mut inst, n, 0) && inst[2].latest().is_some_and(|s| !s.active.is_empty()))
    })
    .is_ok()
    .then(|| stage.now());
    pause(args.settle_s);
    let t_end = stage.now();
    let after = ks_actives(&mut inst);
    let name = |m: BTreeMap<String, usize>| -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(t, i)| (t, inst[i].name.clone()))
            .collect()
    };
    let (before, after) = (name(before), name(after));
    let figures = scale_out_figures(
        &stage,
        args.partitions,
        (t0, t_end),
        (&before, &after),
        |task, to| {
            inst.iter()
                .find(|i| i.name == to)
                .and_then(|i| ks_first_active(i, task, t0))
        },
        |_, _, m| ("moved_s", opt3(m.map(|t| t - t0))),
    )?;
    // What the new instance did meanwhile: its task lists over time (warm-ups show as standbys).
    let new_instance: Vec<Value> = inst[2]
        .all()
        .iter()
        .map(|s| json!({"t_s": round3(s.t - t0), "state": s.state, "active": s.active, "standby": s.standby}))
        .collect();
    let mut result = json!({
        "engine": "kafka-streams",
        "case": "scale-out",
        "event": "a third instance started (2 running)",
        "config": config,
        "event_at": wall(&stage, t0),
        "balanced_after_s": opt3(balanced.map(|t| t - t0)),
        "balance_wait_s": args.ks_balance_wait_s,
        "baseline": base,
        "new_instance": new_instance,
    });
    if let Value::Object(r) = &mut result {
        r.extend(figures);
    }
    for i in &mut inst {
        i.stop();
    }
    stage.finish(&topics_with_prefix(&app)?)?;
    log(&format!("Kafka Streams scale-out: {result}"));
    Ok(result)
}

/// One of [`FAILOVERS`]: `case` is its name there.
pub fn failover(jar: &Path, args: &Settings, case: &str, logs: &Path) -> Result<Value> {
    let Some((case, signal, config)) = FAILOVERS.iter().find(|f| f.0 == case) else {
        anyhow::bail!("no Kafka Streams failover case {case}");
    };
    let config = owned(config);
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
            &config,
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
        "config": config,
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

/// The rolling bounce cases: Kafka Streams' defaults (no standby), and one standby per task.
pub const ROLLOUTS: &[(&str, &[&str])] = &[
    ("rollout", &["num.standby.replicas=0"]),
    ("rollout-standby", &["num.standby.replicas=1"]),
];

/// One of [`ROLLOUTS`]: the rolling bounce a StatefulSet's `RollingUpdate` does to three
/// instances, highest ordinal first: SIGTERM (a clean close that leaves the group), the same
/// instance started again on its state directory once the old process exited, and the next one
/// once it is RUNNING (what a readiness probe on `KafkaStreams#state` waits for). Done when the
/// last one is back and the group is balanced.
pub fn rollout(jar: &Path, args: &Settings, case: &str, logs: &Path) -> Result<Value> {
    let Some((case, config)) = ROLLOUTS.iter().find(|f| f.0 == case) else {
        anyhow::bail!("no Kafka Streams rollout case {case}");
    };
    let config = owned(config);
    let standbys = usize::from(config.iter().any(|c| c == "num.standby.replicas=1"));
    log(&format!("Kafka Streams {case}"));
    let dir = tempfile::tempdir()?;
    let app = unique("ks-ro");
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
            &config,
        )?);
    }
    ks_wait_balanced(&mut inst, n, standbys, 300)?;
    stage.load(args, &app)?;
    ks_wait_balanced(&mut inst, n, standbys, 300)?;
    pause(args.baseline_s);
    let t0 = stage.now();
    let base = baseline(&stage, t0, args.baseline_s, args.partitions)?;
    let deadline = Instant::now() + Duration::from_secs(args.rollout_wait_s);
    let mut steps = Vec::new();
    let mut failed = None;
    for i in (0..3).rev() {
        let down = stage.now();
        inst[i].stop();
        let exited = stage.now();
        inst[i] = KsInstance::start(
            jar,
            &stage,
            &app,
            &format!("ks-{i}"),
            dir.path(),
            logs,
            &config,
        )?;
        let left = deadline.saturating_duration_since(Instant::now());
        let ready = wait_until(left, || {
            Ok(inst[i].latest().is_some_and(|s| s.state == "RUNNING"))
        });
        steps.push(json!({
            "instance": inst[i].name,
            "stopped_s": round3(down - t0),
            "exited_s": round3(exited - t0),
            "running_s": ready.is_ok().then(|| round3(stage.now() - t0)),
        }));
        if let Err(e) = ready {
            failed = Some(format!("ks-{i} not RUNNING again: {e:#}"));
            break;
        }
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let rolled_out = match failed {
        None => wait_until(left, || Ok(ks_balanced(&mut inst, n, standbys)))
            .map(|()| stage.now())
            .map_err(|e| format!("not balanced after the bounce: {e:#}")),
        Some(f) => Err(f),
    };
    if let Err(e) = &rolled_out {
        log(&format!("Kafka Streams {case}: {e}"));
    }
    pause(args.settle_s);
    let t_end = stage.now();
    let figures = rollout_figures(&stage, args.partitions, (t0, t_end))?;
    let mut result = json!({
        "engine": "kafka-streams",
        "case": case,
        "event": "a rolling bounce of 3 instances (SIGTERM, start again)",
        "config": config,
        "event_at": wall(&stage, t0),
        "standbys": standbys,
        "rolled_out_after_s": rolled_out.ok().map(|t| round3(t - t0)),
        "rollout_wait_s": args.rollout_wait_s,
        "baseline": base,
        "steps": steps,
    });
    if let Value::Object(r) = &mut result {
        r.extend(figures);
    }
    for i in &mut inst {
        i.stop();
    }
    stage.finish(&topics_with_prefix(&app)?)?;
    log(&format!("Kafka Streams {case}: {result}"));
    Ok(result)
}

//! Zombie workers: a worker cut off from the API server while it still reaches Kafka, and a
//! worker frozen (SIGSTOP) past the failover bound, each with records arriving the whole
//! time, under both guarantees. The operator fails the pod over and its tasks run elsewhere;
//! the old worker must not write anything after that, however long it goes on (cut off) or
//! whenever it wakes up (frozen). One control plane with one operator and the pod runner
//! serves every test of this binary ([`eddy_e2e::operated`]); the pod runner relays each
//! pod's API traffic through a link the test can cut.
//!
//! What a user would notice: under exactly-once, every record counted once (each key's
//! outputs count up one record at a time and end at all of them); under at-least-once, no
//! update lost (an aggregate that a duplicate cannot hide a loss from, [`eddy_e2e::seen`]).

use anyhow::{Context, Result, ensure};
use eddy_e2e::operated::{Namespace, Operated, WAIT};
use eddy_e2e::*;
use std::collections::BTreeMap;

const KEYS: usize = 120;
const PARTITIONS: i32 = 4;

fn env() -> Result<&'static Operated> {
    eddy_e2e::operated::shared(1, |_, _| Ok(()))
}

const APPS: [(&str, &str); 2] = [("eos", "exactly_once"), ("alos", "at_least_once")];

fn apps_yaml(bs: &str, input: &str, outputs: &[String]) -> String {
    let mut all = String::new();
    for ((app, guarantee), output) in APPS.iter().zip(outputs) {
        all += &format!(
            r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {app}}}
spec:
  replicas: 2
  numStandbyReplicas: 1
  kafka: {{bootstrapServers: "{bs}"}}
  cleanupPolicy: Delete
  processingGuarantee: {guarantee}
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}}}
{}---
"#,
            seen::steps("seen", output)
        );
    }
    all
}

/// How a test takes a worker away from the API server and gives it back.
enum Fault {
    /// The pod's link to the API server drops everything; Kafka stays reachable.
    Cut,
    /// The worker process is stopped (SIGSTOP) and later continued.
    Freeze,
}

impl Fault {
    fn apply(&self, env: &Operated, ns: &str, pod: &str) -> Result<()> {
        match self {
            Fault::Cut => std::fs::write(env.pod_dir(ns, pod).join("api-link"), "cut")?,
            Fault::Freeze => {
                let pid = env.worker_pid(ns, pod)?;
                signal(pid, libc::SIGSTOP)?;
                wait_until(WAIT, || eddy_e2e::operated::all_threads_stopped(pid))?;
            }
        }
        Ok(())
    }

    fn heal(&self, env: &Operated, ns: &str, pod: &str) -> Result<()> {
        match self {
            Fault::Cut => std::fs::remove_file(env.pod_dir(ns, pod).join("api-link"))?,
            Fault::Freeze => signal(env.worker_pid(ns, pod)?, libc::SIGCONT)?,
        }
        Ok(())
    }
}

fn signal(pid: i32, sig: libc::c_int) -> Result<()> {
    // SAFETY: a plain syscall on the pod's process, which the pod runner started.
    ensure!(
        unsafe { libc::kill(pid, sig) } == 0,
        "signal {sig} to {pid}"
    );
    Ok(())
}

/// Pod 1 of each app loses the API server (cut off or frozen) under load; the operator fails
/// it over; its tasks run on pod 0 for a while; then it comes back and the apps settle.
fn zombie(fault: Fault) -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let input = space.topic("z-in", PARTITIONS)?;
    let outputs = vec![space.topic("z-eos", 2)?, space.topic("z-alos", 2)?];
    let load = Load::start(&input, KEYS, 200)?;
    env.apply(ns, &apps_yaml(&env.bs, &input, &outputs))?;
    for (app, _) in APPS {
        env.wait_settled(ns, app, 2)?;
    }
    let mut moved: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (app, _) in APPS {
        let (_, s) = env.app_status(ns, app)?;
        let victim = format!("{app}-1");
        let tasks = s
            .assignment
            .and_then(|mut a| a.pods.remove(&victim))
            .map(|p| p.active)
            .unwrap_or_default();
        ensure!(!tasks.is_empty(), "{victim} runs no task");
        moved.insert(app, tasks);
        fault.apply(env, ns, &victim)?;
    }

    // The operator fails each victim over, and pod 0 runs its tasks.
    let processed = |app: &str, task: &str| -> Result<f64> {
        let task = format!("task=\"{task}\"");
        env.pod_metric(
            ns,
            &format!("{app}-0"),
            "eddy_records_processed_total",
            &[&task],
        )
    };
    let mut before: BTreeMap<(&str, String), f64> = BTreeMap::new();
    for (app, _) in APPS {
        let victim = format!("{app}-1");
        wait_until(WAIT, || {
            let (_, s) = env.app_status(ns, app)?;
            let Some(a) = s.assignment else {
                return Ok(false);
            };
            let survivor = s.workers.get(&format!("{app}-0"));
            Ok(a.down.contains(&victim)
                && moved[app].iter().all(|t| {
                    survivor
                        .and_then(|w| w.tasks.get(t))
                        .is_some_and(|t| t.state.name() == "RUNNING")
                }))
        })
        .with_context(|| format!("{app}: {victim} was not failed over\n{}", env.logs()))?;
        for t in &moved[app] {
            before.insert((app, t.clone()), processed(app, t)?);
        }
    }
    // The zombie's chance to do harm: pod 0 processes a few hundred records of each moved
    // task while the victim is still away.
    wait_until(WAIT, || {
        for ((app, task), n) in &before {
            if processed(app, task)? < n + 200.0 {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .with_context(|| env.logs())?;
    // Cut off, the at-least-once worker says why it stopped (its HTTP port is local); checked
    // after the records, which matter more.
    let stopped = match fault {
        Fault::Cut => env.pod_metric(
            ns,
            "alos-1",
            "eddy_recoveries_total",
            &["reason=\"ApiServerUnreachable\""],
        )?,
        Fault::Freeze => 1.0,
    };
    for (app, _) in APPS {
        fault.heal(env, ns, &format!("{app}-1"))?;
    }
    for (app, _) in APPS {
        env.wait_settled(ns, app, 2)?;
    }

    load.stop()?;
    let sent = seen::sent(&input)?;
    ensure!(sent.len() == KEYS, "the load wrote {} keys", sent.len());
    for ((app, guarantee), output) in APPS.iter().zip(&outputs) {
        let eos = *guarantee == "exactly_once";
        wait_until(WAIT, || seen::complete(&sent, output, eos)).with_context(|| {
            let lost = match eos {
                true => String::new(),
                false => {
                    let lost = seen::lost(&sent, output).unwrap_or_default();
                    format!(
                        ": updates lost on {} keys, e.g. {:?}",
                        lost.len(),
                        lost.first()
                    )
                }
            };
            format!(
                "{app}: not every record counted {}{lost}\n{}",
                if eos { "exactly once" } else { "at least once" },
                env.logs()
            )
        })?;
    }
    ensure!(
        stopped >= 1.0,
        "the cut-off at-least-once worker never stopped for its lease\n{}",
        env.logs()
    );
    env.delete_apps(ns)?;
    Ok(())
}

/// A worker cut off from the API server but not from Kafka: the operator fails it over after
/// 30 s of silence; under at-least-once it stopped writing by itself at 20 s (its lease),
/// under exactly-once its successor fenced it; either way it takes nothing back until a report
/// gets through and shows it what it holds now.
#[test]
fn a_worker_cut_off_from_the_api_server_writes_nothing_after_its_failover() -> Result<()> {
    zombie(Fault::Cut)
}

/// A worker frozen past the failover bound and then resumed: what it had queued is never sent
/// (exactly-once: fenced; at-least-once: expired, and its lease has lapsed), and it does not
/// take its old tasks back from the assignment it had cached.
#[test]
fn a_worker_frozen_past_its_failover_writes_nothing_when_it_resumes() -> Result<()> {
    zombie(Fault::Freeze)
}

//! Standby tasks end to end: two workers on a real control plane and a real broker follow
//! an assignment the test writes into the app's status itself (the operator's placement is
//! not involved: the test plays the operator, so it decides exactly who holds what). The
//! workers run as the operator would start them (`EDDY_ASSIGNMENT=operator`, the pod name as
//! instance id, the app's namespace).

use anyhow::{Context, Result, ensure};
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::*;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 4;
const KEYS: usize = 400;

fn app_yaml(name: &str, bs: &str, input: &str, output: &str, guarantee: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 2
  numStandbyReplicas: 1
  kafka: {{bootstrapServers: "{bs}"}}
  processingGuarantee: {guarantee}
  commitIntervalMs: 100
  topology:
    - from: {{topic: {input}}}
{}"#,
        seen::steps("counts", output)
    )
}

/// `n` more records over `KEYS` keys, numbered on from `next` (the sequence numbers of
/// [`eddy_e2e::seen`]).
fn produce_counts(topic: &str, next: &mut usize, n: usize) -> Result<()> {
    let records: Vec<Input> = (*next..*next + n)
        .map(|i| {
            (
                Some(format!("k{}", i % KEYS).into_bytes()),
                Some(format!("{{\"i\":{i}}}").into_bytes()),
            )
        })
        .collect();
    *next += n;
    produce(topic, &records)
}

struct Setup<'a> {
    cp: &'a ControlPlane,
    ns: String,
    app: String,
}

impl Setup<'_> {
    /// Write `status.assignment` as the operator would: replaced as a whole (a merge patch
    /// would merge the pods' lists with the previous generation's), the workers' reports
    /// left alone, each pod's entry naming the run of its worker that reported last (a
    /// worker takes only an entry made for its own run).
    fn assign(&self, generation: i64, mut pods: Value) -> Result<()> {
        let names: Vec<String> = pods
            .as_object()
            .context("pods is an object")?
            .keys()
            .cloned()
            .collect();
        for pod in names {
            let mut run = Value::Null;
            wait_until(WAIT, || {
                run = self.report(&pod)?["incarnation"].clone();
                Ok(run.is_string())
            })
            .with_context(|| format!("{pod} reports no incarnation"))?;
            pods[&pod]["incarnation"] = run;
        }
        let assignment = json!({
            "generation": generation,
            "partitions": [PARTITIONS],
            "pods": pods,
        });
        let (kind, patch) = if generation == 1 {
            ("merge", json!({"status": {"assignment": assignment}}))
        } else {
            (
                "json",
                json!([{"op": "replace", "path": "/status/assignment", "value": assignment}]),
            )
        };
        self.cp.kubectl(
            &[
                "-n",
                &self.ns,
                "patch",
                "statefulstreamapp",
                &self.app,
                "--subresource=status",
                &format!("--type={kind}"),
                "-p",
                &patch.to_string(),
            ],
            None,
        )?;
        Ok(())
    }

    /// A worker's report (`status.workers.<pod>`).
    fn report(&self, pod: &str) -> Result<Value> {
        let out = self.cp.kubectl(
            &[
                "-n",
                &self.ns,
                "get",
                "statefulstreamapp",
                &self.app,
                "-o",
                "json",
            ],
            None,
        )?;
        let v: Value = serde_json::from_str(&out)?;
        Ok(v["status"]["workers"][pod].clone())
    }

    /// True when `pod` applied `generation` and reports every task with `role`, RUNNING,
    /// with lag 0.
    fn holds_all(&self, pod: &str, generation: i64, role: &str) -> Result<bool> {
        let r = self.report(pod)?;
        if r["appliedGeneration"].as_i64() != Some(generation) {
            return Ok(false);
        }
        let tasks = &r["tasks"];
        Ok((0..PARTITIONS).all(|p| {
            let t = &tasks[format!("0_{p}")];
            t["role"] == role && t["state"] == "RUNNING" && t["lag"].as_i64() == Some(0)
        }))
    }
}

fn worker(
    cp: &ControlPlane,
    app: &str,
    ns: &str,
    app_id: &str,
    pod: &str,
    dir: &Path,
) -> Result<Worker> {
    let env = [
        ("EDDY_ASSIGNMENT", "operator".to_string()),
        ("EDDY_NAMESPACE", ns.to_string()),
        ("EDDY_INSTANCE_ID", pod.to_string()),
        ("EDDY_APPLICATION_ID", app_id.to_string()),
        ("KUBECONFIG", cp.kubeconfig.to_string_lossy().to_string()),
    ];
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Worker::start_with(
        app,
        &dir.join(pod),
        &WorkerOptions {
            env,
            ..Default::default()
        },
    )
}

/// Every record of `input` accounted for in `output` ([`seen::complete`]): exactly-once,
/// each counted once (an error if one was counted twice); at-least-once, no update lost.
fn counted(input: &str, output: &str, exactly_once: bool) -> Result<bool> {
    let sent = seen::sent(input)?;
    ensure!(sent.len() == KEYS, "the input holds {} keys", sent.len());
    seen::complete(&sent, output, exactly_once)
}

#[test]
fn a_standby_follows_the_changelog_and_takes_over_with_only_the_tail() -> Result<()> {
    standby_takes_over("exactly_once")
}

#[test]
fn a_standby_takes_over_under_at_least_once() -> Result<()> {
    standby_takes_over("at_least_once")
}

fn standby_takes_over(guarantee: &str) -> Result<()> {
    let eos = guarantee == "exactly_once";
    let bs = bootstrap()?;
    let cp = ControlPlane::start(&format!("sb-{}-{}", std::process::id(), &guarantee[..1]))?;
    // A CRD just created may not have conditions yet for `kubectl wait` to read.
    let crd = repo_root().join("charts/eddy-operator/crds");
    wait_until(WAIT, || Ok(cp.install_crd(&crd).is_ok()))?;
    let ns = unique("standby");
    let app = "counter".to_string();
    let app_id = unique("sb-app");
    let input = unique("sb-in");
    let output = unique("sb-out");
    let changelog = eddy_crds::topics::changelog(&app_id, "counts");
    create_topic(&input, PARTITIONS)?;
    create_topic(&output, PARTITIONS)?;
    let result = (|| -> Result<()> {
        cp.kubectl(&["create", "namespace", &ns], None)?;
        let yaml = app_yaml(&app, &bs, &input, &output, guarantee);
        cp.kubectl(&["-n", &ns, "apply", "-f", "-"], Some(&yaml))?;
        let s = Setup {
            cp: &cp,
            ns: ns.clone(),
            app: app.clone(),
        };
        let all: Vec<String> = (0..PARTITIONS).map(|p| format!("0_{p}")).collect();
        let dir = tempfile::tempdir()?;
        let mut w0 = worker(&cp, &yaml, &ns, &app_id, "w0", dir.path())?;
        let mut w1 = worker(&cp, &yaml, &ns, &app_id, "w1", dir.path())?;
        s.assign(1, json!({"w0": {"active": all}, "w1": {"standby": all}}))?;
        w0.wait_ready(WAIT)?;
        // Only standbys: Ready all the same (a rolling update must not stall on it).
        w1.wait_ready(WAIT)?;

        let mut next = 0;
        produce_counts(&input, &mut next, 20 * KEYS)?;
        wait_until(WAIT, || counted(&input, &output, eos)).with_context(|| w0.logs())?;
        wait_until(WAIT, || s.holds_all("w1", 1, "STANDBY"))
            .with_context(|| format!("{:#}\n{}", s.report("w1").unwrap_or_default(), w1.logs()))?;
        // Awaited, not read once: the report is written apart from the processing and failed
        // this check once under CI load while the next report read fine.
        wait_until(WAIT, || s.holds_all("w0", 1, "ACTIVE"))
            .with_context(|| format!("{:#}\n{}", s.report("w0").unwrap_or_default(), w0.logs()))?;
        let m = w1.metrics()?;
        ensure!(
            sum_metric(&m, "eddy_standby_tasks", &["role=\"standby\""]) == f64::from(PARTITIONS),
            "standby tasks metric:\n{m}"
        );
        ensure!(
            sum_metric(&m, "eddy_standby_lag_records", &[]) == 0.0,
            "standby lag metric:\n{m}"
        );
        ensure!(
            sum_metric(&m, "eddy_standby_updated_records_total", &[]) > 0.0,
            "standby updates metric:\n{m}"
        );
        ensure!(
            sum_metric(&m, "eddy_restored_records_total", &[]) == 0.0,
            "a standby restores nothing:\n{m}"
        );

        // Swap: w1 becomes active, w0 keeps the tasks as standbys. w1 takes over only once
        // w0 committed and let go, and restores only what its standby copy lacked.
        s.assign(2, json!({"w0": {"standby": all}, "w1": {"active": all}}))?;
        wait_until(WAIT, || s.holds_all("w1", 2, "ACTIVE"))
            .with_context(|| format!("{:#}\n{}", s.report("w1").unwrap_or_default(), w1.logs()))?;
        produce_counts(&input, &mut next, 10 * KEYS)?;
        wait_until(WAIT, || counted(&input, &output, eos)).with_context(|| w1.logs())?;
        wait_until(WAIT, || s.holds_all("w0", 2, "STANDBY"))
            .with_context(|| format!("{:#}\n{}", s.report("w0").unwrap_or_default(), w0.logs()))?;

        let changelog_records: i64 = (0..PARTITIONS)
            .map(|p| watermarks(&changelog, p).map(|(_, high)| high))
            .sum::<Result<i64>>()?;
        let restored = w1.metric("eddy_restored_records_total", &[])?;
        ensure!(
            changelog_records >= KEYS as i64,
            "the changelog holds {changelog_records} records"
        );
        ensure!(
            restored * 10.0 < changelog_records as f64,
            "the promoted standby restored {restored} of the changelog's {changelog_records} records: more than a tail"
        );
        ensure!(
            w0.metric("eddy_standby_tasks", &["role=\"standby\""])? == f64::from(PARTITIONS),
            "the demoted worker follows the tasks as standbys"
        );
        // w0 let go at once: w1 did not have to wait out the hand-off timeout and fence it.
        ensure!(
            !w1.logs().contains("still holds tasks assigned here"),
            "w1 fenced w0 instead of being handed the tasks:\n{}",
            w1.logs()
        );
        ensure!(w0.stop()? == 0, "w0 stops cleanly:\n{}", w0.logs());

        // A restarted standby resumes from the checkpoint stored with its data: it applies
        // only what was written while it was away, not the whole changelog again.
        produce_counts(&input, &mut next, 5 * KEYS)?;
        wait_until(WAIT, || counted(&input, &output, eos)).with_context(|| w1.logs())?;
        let old_run = s.report("w0")?["incarnation"].clone();
        let mut w0 = worker(&cp, &yaml, &ns, &app_id, "w0", dir.path())?;
        // Its entry was made for its previous run: it applies it holding nothing and waits
        // for one made for this run.
        wait_until(WAIT, || {
            let r = s.report("w0")?;
            Ok(r["incarnation"].is_string()
                && r["incarnation"] != old_run
                && r["appliedGeneration"].as_i64() == Some(2))
        })
        .with_context(|| w0.logs())?;
        ensure!(
            w0.logs()
                .contains("decided before the operator saw this run"),
            "{}",
            w0.logs()
        );
        ensure!(
            s.report("w0")?["tasks"]
                .as_object()
                .is_none_or(|t| t.is_empty()),
            "a restarted worker took the tasks of its previous run's entry:\n{}",
            w0.logs()
        );
        s.assign(3, json!({"w0": {"standby": all}, "w1": {"active": all}}))?;
        w0.wait_ready(WAIT)?;
        wait_until(WAIT, || s.holds_all("w0", 3, "STANDBY"))
            .with_context(|| format!("{:#}\n{}", s.report("w0").unwrap_or_default(), w0.logs()))?;
        let changelog_records: i64 = (0..PARTITIONS)
            .map(|p| watermarks(&changelog, p).map(|(_, high)| high))
            .sum::<Result<i64>>()?;
        let applied = w0.metric("eddy_standby_updated_records_total", &[])?;
        ensure!(
            applied > 0.0 && applied * 2.0 < changelog_records as f64,
            "the restarted standby applied {applied} of the changelog's {changelog_records} records: not only what it missed"
        );
        ensure!(w0.stop()? == 0, "w0 stops cleanly:\n{}", w0.logs());
        ensure!(w1.stop()? == 0, "w1 stops cleanly:\n{}", w1.logs());
        Ok(())
    })();
    let _ = cp.kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    delete_topics(&[&input, &output, &changelog])?;
    result
}

//! The operator end to end, on a real control plane (etcd, kube-apiserver,
//! kube-controller-manager from `e2e/k8s/cluster.sh`), a real Kafka broker, and worker pods
//! run as local `eddy-worker` processes by the pod runner: install the chart's CRD and RBAC,
//! run the operator with its own ServiceAccount's rights, `kubectl apply` an app, and check
//! what a user would: objects, correct output, readable status, scale, bad apps, deletion.

use anyhow::{Context, Result, ensure};
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);
const NS: &str = "eddy-system";

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bin: &str, args: &[&str], envs: &[(&str, &Path)], log: &Path) -> Result<Process> {
    let out = std::fs::File::create(log)?;
    let child = Command::new(binary(bin)?)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .env("EDDY_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()?;
    Ok(Process(child))
}

fn jsonpath(cp: &ControlPlane, ns: &str, what: &str, path: &str) -> String {
    cp.kubectl(
        &["-n", ns, "get", what, "-o", &format!("jsonpath={path}")],
        None,
    )
    .unwrap_or_default()
}

fn app_yaml(name: &str, replicas: i32, bs: &str, input: &str, output: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  kafka: {{bootstrapServers: "{bs}"}}
  commitIntervalMs: 200
{extra}  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

#[test]
fn operator_runs_an_app_on_a_real_control_plane() -> Result<()> {
    let bs = bootstrap()?;
    let cp = ControlPlane::start(&format!("op-{}", std::process::id()))?;
    let dir = tempfile::tempdir()?;

    // The chart's CRD and RBAC, as `helm install` would create them (the operator itself
    // runs here as a local process with its ServiceAccount's token).
    cp.kubectl(&["create", "namespace", NS], None)?;
    cp.install_crd(&repo_root().join("charts/eddy-operator/crds"))?;
    let rbac = cp.tool(
        "helm",
        &[
            "template",
            "t",
            "charts/eddy-operator",
            "--namespace",
            NS,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
        None,
    )?;
    cp.kubectl(&["apply", "-f", "-"], Some(&rbac))?;
    let op_kubeconfig = cp.kubeconfig_for(NS, "t-eddy-operator", dir.path())?;

    let op_port = free_port()?;
    let _operator = spawn(
        "eddy-operator",
        &[
            "run",
            "--http-addr",
            &format!("127.0.0.1:{op_port}"),
            "--namespace",
            NS,
            "--identity",
            "op-a",
        ],
        &[("KUBECONFIG", &op_kubeconfig)],
        &dir.path().join("operator.log"),
    )?;
    // A second replica waits on the Lease: one leader at a time.
    let op_b_port = free_port()?;
    let _operator_b = spawn(
        "eddy-operator",
        &[
            "run",
            "--http-addr",
            &format!("127.0.0.1:{op_b_port}"),
            "--namespace",
            NS,
            "--identity",
            "op-b",
        ],
        &[("KUBECONFIG", &op_kubeconfig)],
        &dir.path().join("operator-b.log"),
    )?;
    let leader = |port: u16| -> Result<f64> {
        Ok(sum_metric(
            &http_get(&format!("127.0.0.1:{port}"), "/metrics")?.1,
            "eddy_operator_leader",
            &[],
        ))
    };
    wait_until(WAIT, || {
        Ok(leader(op_port).unwrap_or(0.0) + leader(op_b_port).unwrap_or(0.0) == 1.0)
    })
    .with_context(|| logs(dir.path()))?;
    let holder = jsonpath(
        &cp,
        NS,
        "lease/eddy-operator-leader",
        "{.spec.holderIdentity}",
    );
    ensure!(
        holder == "op-a" || holder == "op-b",
        "lease held by {holder:?}"
    );

    let _runner = spawn(
        "pod-runner",
        &[
            "--kubeconfig",
            &cp.kubeconfig.to_string_lossy(),
            "--node",
            "e2e-node",
            "--root",
            &dir.path().join("node").to_string_lossy(),
        ],
        &[],
        &dir.path().join("runner.log"),
    )?;

    let app = unique("op");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic(&input, 4)?;
    create_topic(&output, 2)?;
    let records: Vec<Input> = (0..4000)
        .map(|i| {
            (
                Some(format!("k{}", i % 40).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(&input, &records)?;

    let ns = "default";
    // Exactly-once: the scale-out below moves tasks between workers, which under
    // exactly-once goes through the hand-off (the new owner waits for the old one to let go).
    let yaml = app_yaml(
        &app,
        2,
        &bs,
        &input,
        &output,
        "  cleanupPolicy: Delete\n  processingGuarantee: exactly_once\n",
    );
    cp.kubectl(&["-n", ns, "apply", "-f", "-"], Some(&yaml))?;

    // The objects appear, owned by the app.
    wait_until(WAIT, || {
        Ok(jsonpath(&cp, ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "2")
    })
    .with_context(|| logs(dir.path()))?;
    for what in [
        format!("service/{app}-workers"),
        format!("configmap/{app}-app"),
        format!("serviceaccount/{app}-worker"),
        format!("role/{app}-worker"),
        format!("rolebinding/{app}-worker"),
        format!("poddisruptionbudget/{app}"),
    ] {
        let owner = jsonpath(
            &cp,
            ns,
            &what,
            "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        );
        ensure!(
            owner == format!("StatefulStreamApp/{app}"),
            "{what} is owned by {owner:?}"
        );
    }

    // Workers run their assigned tasks and produce the right counts.
    wait_until(WAIT, || {
        let last = latest_by_key(&output)?;
        Ok(last.len() == 40 && last.values().all(|v| v.as_slice() == 100i64.to_be_bytes()))
    })
    .with_context(|| logs(dir.path()))?;
    wait_until(WAIT, || {
        Ok(jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running")
    })
    .with_context(|| {
        format!(
            "status: {}\n{}",
            jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status}"),
            logs(dir.path())
        )
    })?;
    let tasks = jsonpath(
        &cp,
        ns,
        &format!("ssapp/{app}"),
        "{.status.workers.*.tasks.*.state}",
    );
    ensure!(
        tasks.split_whitespace().filter(|s| *s == "RUNNING").count() == 4,
        "task states: {tasks}"
    );
    let table = cp.kubectl(&["-n", ns, "get", "ssapp", &app], None)?;
    ensure!(
        table.contains("READY") && table.contains("PHASE") && table.contains("BACKLOG"),
        "{table}"
    );
    ensure!(
        table.contains("2/2") && table.contains("Running"),
        "{table}"
    );

    // kubectl scale goes through the scale subresource to the StatefulSet.
    cp.kubectl(&["-n", ns, "scale", "ssapp", &app, "--replicas=3"], None)?;
    wait_until(WAIT, || {
        Ok(jsonpath(&cp, ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "3")
    })?;
    wait_until(WAIT, || {
        Ok(jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status.readyReplicas}") == "3")
    })
    .with_context(|| logs(dir.path()))?;

    // A worker that lost its volume restores its tasks from the changelog: the status shows
    // the backlog while it does, and it falls back to 0.
    let more: Vec<Input> = (0..200_000)
        .map(|i| (Some(format!("big-{i}").into_bytes()), Some(b"{}".to_vec())))
        .collect();
    produce(&input, &more)?;
    wait_until(WAIT, || {
        Ok(read_all(&format!("{app}-counts-changelog"))?.len() >= 200_040)
    })?;
    // Across the move to three workers every new record is counted exactly once, in the
    // committed output.
    wait_until(WAIT, || {
        let mut last = std::collections::HashMap::new();
        for r in read_all(&output)? {
            if let (Some(k), Some(v)) = (r.key, r.value) {
                last.insert(k, v);
            }
        }
        Ok((0..200_000).all(|i| {
            last.get(format!("big-{i}").as_bytes())
                .is_some_and(|v| v.as_slice() == 1i64.to_be_bytes())
        }))
    })
    .with_context(|| logs(dir.path()))?;
    let pvc_dir = dir
        .path()
        .join("node/pvcs")
        .join(ns)
        .join(format!("state-{app}-0"));
    ensure!(pvc_dir.exists(), "no PVC dir at {}", pvc_dir.display());
    cp.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            &format!("{app}-0"),
            "--wait=true",
        ],
        None,
    )?;
    std::fs::remove_dir_all(&pvc_dir)?;
    let mut max_backlog = 0i64;
    wait_until(WAIT, || {
        let b: i64 = jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status.backlog}")
            .parse()
            .unwrap_or(0);
        max_backlog = max_backlog.max(b);
        Ok(max_backlog > 0)
    })
    .with_context(|| logs(dir.path()))?;
    wait_until(WAIT, || {
        Ok(
            jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status.backlog}") == "0"
                && jsonpath(&cp, ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running",
        )
    })
    .with_context(|| logs(dir.path()))?;
    ensure!(
        max_backlog > 1000,
        "the status showed a backlog of only {max_backlog} records"
    );

    // Nonsense is rejected at admission with what to fix; a missing topic is Degraded.
    let bad = app_yaml(
        "bad-standbys",
        2,
        &bs,
        &input,
        &output,
        "  numStandbyReplicas: 2\n",
    );
    let err = cp
        .kubectl(&["-n", ns, "apply", "-f", "-"], Some(&bad))
        .expect_err("admission must refuse");
    ensure!(
        err.to_string()
            .contains("numStandbyReplicas must be less than replicas"),
        "{err}"
    );
    let missing = app_yaml("missing-topic", 1, &bs, "no-such-topic", &output, "");
    cp.kubectl(&["-n", ns, "apply", "-f", "-"], Some(&missing))?;
    wait_until(WAIT, || {
        Ok(jsonpath(
            &cp,
            ns,
            "ssapp/missing-topic",
            "{.status.conditions[?(@.type==\"Degraded\")].reason}",
        ) == "SourceTopicMissing")
    })?;
    cp.kubectl(&["-n", ns, "delete", "ssapp", "missing-topic"], None)?;

    ensure!(
        leader(op_port).unwrap_or(0.0) + leader(op_b_port).unwrap_or(0.0) == 1.0,
        "still exactly one leader"
    );

    // Deleting the app removes its objects and, with cleanupPolicy Delete, its topics.
    cp.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "ssapp",
            &app,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    wait_until(WAIT, || {
        Ok(jsonpath(&cp, ns, &format!("statefulset/{app}"), "{.metadata.name}").is_empty())
    })?;
    wait_until(WAIT, || {
        Ok(topics_with_prefix(&format!("{app}-counts"))?.is_empty())
    })?;
    delete_topics(&[&input, &output])?;
    Ok(())
}

fn logs(dir: &Path) -> String {
    ["operator.log", "runner.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            format!(
                "--- {f}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

//! End-to-end test of `pod-runner` (src/bin/pod-runner.rs), the scheduler and kubelet of the
//! local control plane of `e2e/k8s/cluster.sh`: a StatefulSet's pods get bound, run (as a fake
//! worker: a shell script serving /readyz with python3), probed, reported Ready to the
//! StatefulSet controller, keep their PVC dirs across deletion, and are stopped when deleted or
//! scaled away. Starts its own control plane and stops it at the end, even on failure.

use anyhow::{Context as _, Result, bail, ensure};
use eddy_e2e::{repo_root, unique};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "podrunner";
const TIMEOUT: Duration = Duration::from_secs(120);

/// The fake worker: records what it was given in its state dir, then serves HTTP 200 on
/// /readyz at $EDDY_HTTP_ADDR until SIGTERM.
const FAKE_WORKER: &str = r#"#!/bin/sh
set -eu
echo "$EDDY_INSTANCE_ID" >> "$EDDY_STATE_DIR/hello"
cp "$EDDY_APP_FILE" "$EDDY_STATE_DIR/app.yaml"
env | sort > "$EDDY_STATE_DIR/env"
echo "$$" > "$EDDY_STATE_DIR/pid"
exec python3 -c '
import http.server, os, signal, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
host, port = os.environ["EDDY_HTTP_ADDR"].rsplit(":", 1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ("/readyz", "/healthz") else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")
    def log_message(self, *a):
        pass
http.server.HTTPServer((host, int(port)), H).serve_forever()
'
"#;

/// Stops the pod runner, then the control plane, when the test ends (even by a panic).
struct Guard {
    cluster: String,
    runner: Option<Child>,
    tmp: tempfile::TempDir,
    /// Set when the test passed; otherwise the runner's log is printed.
    passed: bool,
}

impl Guard {
    fn runner_log(&self) -> PathBuf {
        self.tmp.path().join("pod-runner.log")
    }

    /// SIGTERM to the runner; its exit status (SIGKILL and an error after 40 s).
    fn stop_runner(&mut self) -> Result<std::process::ExitStatus> {
        let Some(mut child) = self.runner.take() else {
            bail!("runner not running")
        };
        // SAFETY: plain syscall on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("pod-runner did not exit within 40 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.runner.is_some() {
            let _ = self.stop_runner();
        }
        if !self.passed {
            let log = std::fs::read_to_string(self.runner_log()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- last lines of the pod-runner log ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        let _ = Command::new("bash")
            .arg(repo_root().join("e2e/k8s/cluster.sh"))
            .args(["stop", "--name", &self.cluster])
            .stdout(Stdio::null())
            .status();
    }
}

/// Polls F every 250 ms until it returns Some, failing after TIMEOUT with its last error.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + TIMEOUT;
    let mut last = String::from("condition not met");
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {TIMEOUT:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn client_from(path: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(path)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn read_pid(dir: &Path) -> Result<u32> {
    let s = std::fs::read_to_string(dir.join("pid"))?;
    Ok(s.trim().parse()?)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn ready_replicas(sts: &Api<StatefulSet>) -> Result<i32> {
    let s = sts.get("web").await?;
    Ok(s.status.and_then(|s| s.ready_replicas).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_runner_runs_a_statefulset() -> Result<()> {
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let name = unique("podrunner");
    let tmp = tempfile::tempdir()?;
    let mut guard = Guard {
        cluster: name.clone(),
        runner: None,
        tmp,
        passed: false,
    };
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/k8s/cluster.sh"))
        .args(["start", "--name", &name])
        .stderr(Stdio::inherit())
        .output()
        .context("running e2e/k8s/cluster.sh")?;
    ensure!(
        out.status.success(),
        "e2e/k8s/cluster.sh start --name {name} failed ({}): the local control plane could not be \
         built or started; see its output above",
        out.status
    );
    let kubeconfig = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .context("cluster.sh printed no kubeconfig path")?
            .trim(),
    );
    phase("control plane up");

    let dir = guard.tmp.path().to_path_buf();
    let root = dir.join("root");
    let worker = dir.join("fake-worker.sh");
    std::fs::write(&worker, FAKE_WORKER)?;
    std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let log = std::fs::File::create(guard.runner_log())?;
    guard.runner = Some(
        Command::new(env!("CARGO_BIN_EXE_pod-runner"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node", "local"])
            .arg("--root")
            .arg(&root)
            .arg("--worker-bin")
            .arg(&worker)
            .env("POD_RUNNER_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting pod-runner")?,
    );

    let client = client_from(&kubeconfig).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("node 'local' Ready", || async {
        let n = nodes.get_opt("local").await?;
        Ok(n.and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            .then_some(()))
    })
    .await?;

    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
    )
    .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    eventually("serviceaccount default", || async {
        Ok(sas.get_opt("default").await?.map(|_| ()))
    })
    .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "web-app"},
            "data": {"app.yaml": "applicationId: demo\n"},
        }))?,
    )
    .await?;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    sts.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "serviceName": "web",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 10,
                        "containers": [{
                            "name": "worker",
                            "image": "eddy-worker:test",
                            "args": ["run"],
                            "env": [
                                {"name": "EDDY_APP_FILE", "value": "/etc/eddy/app.yaml"},
                                {"name": "EDDY_STATE_DIR", "value": "/var/lib/eddy"},
                                {"name": "EDDY_HTTP_ADDR", "value": "0.0.0.0:9090"},
                                {"name": "EDDY_INSTANCE_ID",
                                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            ],
                            "ports": [{"name": "http", "containerPort": 9090}],
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9090},
                                               "periodSeconds": 5},
                            "volumeMounts": [
                                {"name": "state", "mountPath": "/var/lib/eddy"},
                                {"name": "app", "mountPath": "/etc/eddy", "readOnly": true},
                            ],
                        }],
                        "volumes": [{"name": "app", "configMap": {"name": "web-app"}}],
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "state"},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}},
                }],
            },
        }))?,
    )
    .await?;
    phase("statefulset created");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    eventually("web-0 and web-1 Ready, readyReplicas 2", || async {
        for p in ["web-0", "web-1"] {
            if !pods.get_opt(p).await?.as_ref().is_some_and(is_ready) {
                return Ok(None);
            }
        }
        Ok((ready_replicas(&sts).await? == 2).then_some(()))
    })
    .await?;
    phase("both pods Ready, statefulset readyReplicas=2");

    // What each process got: its PVC dir, the config map, a loopback port, its own kubeconfig.
    let pvc_dir = |pod: &str| root.join("pvcs").join(NS).join(format!("state-{pod}"));
    for p in ["web-0", "web-1"] {
        let d = pvc_dir(p);
        let hello = std::fs::read_to_string(d.join("hello"))?;
        ensure!(hello == format!("{p}\n"), "{p}: hello is {hello:?}");
        let app = std::fs::read_to_string(d.join("app.yaml"))?;
        ensure!(app == "applicationId: demo\n", "{p}: app.yaml is {app:?}");
        let env = std::fs::read_to_string(d.join("env"))?;
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .with_context(|| format!("{p}: no {k} in its environment"))
        };
        ensure!(var("EDDY_POD_RUNNER")? == "1");
        ensure!(var("EDDY_STATE_DIR")? == d.display().to_string());
        let http = var("EDDY_HTTP_ADDR")?;
        ensure!(
            http.starts_with("127.0.0.1:") && http != "127.0.0.1:9090",
            "{p}: EDDY_HTTP_ADDR={http}"
        );
        let pod = pods.get(p).await?;
        let status = pod.status.context("no status")?;
        ensure!(status.pod_ip.as_deref() == Some("127.0.0.1"));
        ensure!(status.phase.as_deref() == Some("Running"));
        // The process talks to the API server as the pod's service account, with its RBAC.
        let as_pod = client_from(Path::new(&var("KUBECONFIG")?)).await?;
        let review = Api::<SelfSubjectReview>::all(as_pod.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await?;
        let user = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username);
        ensure!(
            user.as_deref() == Some("system:serviceaccount:podrunner:default"),
            "{p}: the pod's kubeconfig authenticates as {user:?}"
        );
        let denied = Api::<Pod>::namespaced(as_pod, NS)
            .list(&Default::default())
            .await;
        ensure!(
            matches!(&denied, Err(kube::Error::Api(s)) if s.code == 403),
            "{p}: listing pods as the default service account should be forbidden: {denied:?}"
        );
    }
    phase("pvc dirs, config map, env, pod kubeconfigs checked");

    // Deleting web-0: its process stops, the controller recreates it on the same PVC dir.
    let old = pods.get("web-0").await?;
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    let old_pid = read_pid(&pvc_dir("web-0"))?;
    ensure!(alive(old_pid), "web-0's process {old_pid} is not running");
    pods.delete("web-0", &DeleteParams::default()).await?;
    eventually("web-0's old process stopped", || async {
        Ok((!alive(old_pid)).then_some(()))
    })
    .await?;
    phase("old web-0 process stopped");
    let new_uid = eventually("web-0 recreated and Ready", || async {
        Ok(pods
            .get_opt("web-0")
            .await?
            .filter(|p| p.metadata.uid.as_deref() != Some(&old_uid) && is_ready(p))
            .and_then(|p| p.metadata.uid))
    })
    .await?;
    let hello = std::fs::read_to_string(pvc_dir("web-0").join("hello"))?;
    ensure!(
        hello == "web-0\nweb-0\n",
        "web-0's PVC dir was not kept: hello is {hello:?}"
    );
    let new_pid = read_pid(&pvc_dir("web-0"))?;
    ensure!(
        new_pid != old_pid && alive(new_pid),
        "new web-0 process {new_pid}"
    );
    eventually("readyReplicas back to 2", || async {
        Ok((ready_replicas(&sts).await? == 2).then_some(()))
    })
    .await?;
    phase(&format!(
        "web-0 recreated ({old_uid} -> {new_uid}) on the same PVC dir"
    ));

    // Scaling to 1 removes web-1 and its process; its PVC (and dir) stay until deleted.
    let pid1 = read_pid(&pvc_dir("web-1"))?;
    sts.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await?;
    eventually("web-1 gone, its process stopped", || async {
        Ok((pods.get_opt("web-1").await?.is_none() && !alive(pid1)).then_some(()))
    })
    .await?;
    ensure!(
        pvc_dir("web-1").join("hello").exists(),
        "web-1's PVC dir removed with the pod"
    );
    ensure!(alive(new_pid), "web-0's process died on scale-down");
    eventually("statefulset readyReplicas 1", || async {
        Ok((ready_replicas(&sts).await? == 1).then_some(()))
    })
    .await?;
    phase("scaled to 1: web-1 and its process gone");

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    pvcs.delete("state-web-1", &DeleteParams::default()).await?;
    eventually("state-web-1 dir removed with its PVC", || async {
        Ok((!pvc_dir("web-1").exists()).then_some(()))
    })
    .await?;
    phase("PVC state-web-1 deleted, its dir removed");

    // SIGTERM stops the runner and the processes it started.
    let status = guard.stop_runner()?;
    ensure!(status.success(), "pod-runner exited with {status}");
    ensure!(!alive(new_pid), "web-0's process outlived the pod runner");
    phase("pod-runner stopped, exit 0");
    guard.passed = true;
    Ok(())
}

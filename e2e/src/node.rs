//! The real-node tier's environment, shared by a whole test binary (`e2e/tests/node.rs`): a
//! control plane with a real node (`e2e/k8s/cluster.sh start --node`, `e2e/k8s/node.sh
//! start`: kube-scheduler, kubelet, containerd and runc, a CNI bridge, kube-proxy), a Kafka
//! broker listening on the node's bridge address (the pods reach it there, and so do the
//! tests), the images `images/build.sh` makes from the release binaries loaded into the node's
//! containerd, and the chart installed with `helm install` as README tells users. The first
//! test that asks starts all of it; it stops when the test binary exits, also after a failed
//! start, a failed test or SIGINT/SIGTERM, and `node.sh stop` undoes what the node did to the
//! host. Root only; one real node per machine.
//!
//! Pods are addressed by their IP (the tests read a worker's `/metrics` at `<pod IP>:9090`
//! from the host, the kubelet probes it there): no cluster DNS, nothing resolves a name.

use crate::k8s::ControlPlane;
use crate::{ClusterGuard, create_topic, delete_topics, http_get, own_cluster_on, repo_root};
use crate::{sum_metric, topics_with_prefix, unique, wait_until};
use anyhow::{Context as _, Result, anyhow, ensure};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The name of the control plane, the node (`eddy-<NAME>`) and the Kafka cluster.
pub const NAME: &str = "tier";
/// The chart's release and namespace, as README's `helm install` names them.
pub const RELEASE: &str = "eddy-operator";
pub const OPERATOR_NS: &str = "eddy-system";
/// The default StorageClass: local PersistentVolumes under the node's run dir, bound when a
/// pod using the claim is scheduled (`WaitForFirstConsumer`: kube-scheduler picks the node).
pub const STORAGE_CLASS: &str = "eddy-local";
/// How long the helpers and tests wait for something pods, the operator or a worker must do.
pub const WAIT: Duration = Duration::from_secs(240);
/// User and group of the images and the worker pods (`runAsUser`, `fsGroup`).
pub const WORKER_UID: u32 = 65532;
/// A label on the PersistentVolumes made for a test's namespace (deleted with it).
const PV_LABEL: &str = "e2e.eddy.dev/namespace";

/// The control plane, node, broker and chart of a test binary.
pub struct RealNode {
    pub cp: ControlPlane,
    /// The broker's bootstrap address, on the node's bridge address.
    pub bs: String,
    /// The Node's name.
    pub node: String,
    /// The node's (and the API server's, and the broker's) address on the bridge.
    pub node_ip: String,
    /// The node's run dir (`<run root>/node-<NAME>`): containerd's and the kubelet's state,
    /// and the local PersistentVolumes' directories under `volumes/`.
    pub run_dir: PathBuf,
    /// The node's containerd socket (`ctr --address`).
    pub socket: PathBuf,
    /// The images the chart runs (what `images/build.sh` tags).
    pub worker_image: String,
    pub operator_image: String,
}

static SHARED: OnceLock<std::result::Result<RealNode, String>> = OnceLock::new();
/// The broker, stopped at exit.
static KAFKA: Mutex<Option<ClusterGuard>> = Mutex::new(None);

/// The binary's real node with the chart installed, started by the first caller.
pub fn shared() -> Result<&'static RealNode> {
    SHARED
        .get_or_init(|| {
            // SAFETY: registers a plain function without arguments, run once at exit.
            unsafe { libc::atexit(teardown) };
            crate::operated::exit_on_signals();
            RealNode::start().map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("the real node did not start: {e}"))
}

/// At exit (statics are never dropped), and after a failed start too: the node (its pods
/// drained, the host restored), the broker, the control plane.
extern "C" fn teardown() {
    let t = Instant::now();
    if let Some(Ok(env)) = SHARED.get() {
        // Without the operator and the StatefulSets, nothing recreates the pods the node's
        // stop drains.
        let _ = env.kubectl(
            &[
                "delete",
                "deployments,statefulsets",
                "--all",
                "--all-namespaces",
                "--wait=false",
            ],
            None,
        );
    }
    let _ = script("e2e/k8s/node.sh", &["stop", "--name", NAME]);
    let kafka = KAFKA.lock().unwrap_or_else(PoisonError::into_inner).take();
    match kafka {
        Some(guard) => drop(guard),
        // A start that failed before the guard was kept may have left a broker.
        None => {
            let _ = script("e2e/kafka/kafka.sh", &["stop", "--name", NAME]);
        }
    }
    let _ = script("e2e/k8s/cluster.sh", &["stop", "--name", NAME]);
    note(&format!(
        "node, broker and control plane stopped in {:.1} s",
        secs(t.elapsed())
    ));
}

/// Runs a script of the repository (`bash PATH ARGS`), its progress on stderr; its stdout.
fn script(path: &str, args: &[&str]) -> Result<String> {
    script_with(path, args, &[])
}

fn script_with(path: &str, args: &[&str], envs: &[(&str, &Path)]) -> Result<String> {
    let out = Command::new("bash")
        .arg(repo_root().join(path))
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {path}"))?;
    ensure!(
        out.status.success(),
        "{path} {} failed ({})",
        args.join(" "),
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The last line a script printed (the scripts print their result last).
fn last_line(out: &str) -> String {
    out.lines().last().unwrap_or_default().trim().to_string()
}

/// A run dir's `env` file: `KEY=VALUE` lines.
fn read_env(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl RealNode {
    fn start() -> Result<Self> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        ensure!(
            unsafe { libc::geteuid() } == 0,
            "the real-node tier needs root (containerd, runc, the kubelet and the node's network)"
        );
        let t = Instant::now();
        let cp = ControlPlane::start_with(NAME, &["--node"])?;
        let cluster_dir = cp
            .kubeconfig
            .parent()
            .context("the kubeconfig has no run dir")?
            .to_path_buf();
        let cluster_env = read_env(&cluster_dir.join("env"))?;
        let node_ip = cluster_env
            .get("EDDY_K8S_NODE_IP")
            .context("the control plane's env has no EDDY_K8S_NODE_IP (not started with --node)")?
            .clone();
        let t_cp = t.elapsed();

        let t = Instant::now();
        let node = last_line(&script("e2e/k8s/node.sh", &["start", "--name", NAME])?);
        let run_root = cluster_dir.parent().context("no run root")?;
        let node_env = read_env(&run_root.join(format!("node-{NAME}/env")))?;
        let field = |k: &str| -> Result<PathBuf> {
            node_env
                .get(k)
                .map(PathBuf::from)
                .with_context(|| format!("the node's env has no {k}"))
        };
        let run_dir = field("EDDY_NODE_RUN_DIR")?;
        let socket = field("EDDY_NODE_CONTAINERD_SOCKET")?;
        let t_node = t.elapsed();

        // The broker on the bridge address: pods have no other way to the host.
        let t = Instant::now();
        let guard = own_cluster_on(NAME, &node_ip)?;
        *KAFKA.lock().unwrap_or_else(PoisonError::into_inner) = Some(guard);
        let bs = crate::bootstrap()?;
        let t_kafka = t.elapsed();

        // The images of these release binaries, as docker archives, into the node's
        // containerd (no registry is reachable; the chart's and the operator's pull policy,
        // IfNotPresent, then never pulls).
        let t = Instant::now();
        let release = crate::binary("eddy-worker")?;
        let target = release
            .parent()
            .and_then(Path::parent)
            .context("no target dir above the release binaries")?;
        let archives = tempfile::tempdir()?;
        script_with(
            "images/build.sh",
            &["--prebuilt", "--save", &archives.path().to_string_lossy()],
            &[("CARGO_TARGET_DIR", target)],
        )?;
        let t_build = t.elapsed();
        let t = Instant::now();
        let version = env!("CARGO_PKG_VERSION");
        let files: Vec<String> = ["eddy-worker", "eddy-operator"]
            .iter()
            .map(|b| {
                archives
                    .path()
                    .join(format!("{b}-{version}.tar"))
                    .to_string_lossy()
                    .to_string()
            })
            .collect();
        let mut args = vec!["load", "--name", NAME];
        args.extend(files.iter().map(String::as_str));
        script("e2e/k8s/node.sh", &args)?;
        drop(archives);
        let t_load = t.elapsed();

        let env = RealNode {
            cp,
            bs,
            node,
            node_ip,
            run_dir,
            socket,
            worker_image: format!("ghcr.io/eddy-dev/eddy-worker:{version}"),
            operator_image: format!("ghcr.io/eddy-dev/eddy-operator:{version}"),
        };
        env.apply_cluster(&format!(
            r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {STORAGE_CLASS}
  annotations: {{storageclass.kubernetes.io/is-default-class: "true"}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
"#
        ))?;

        // README's install, word for word.
        let t = Instant::now();
        env.cp.tool(
            "helm",
            &[
                "install",
                RELEASE,
                "charts/eddy-operator",
                "--namespace",
                OPERATOR_NS,
                "--create-namespace",
            ],
            None,
        )?;
        env.kubectl(
            &[
                "-n",
                OPERATOR_NS,
                "wait",
                "--for=condition=Available",
                &format!("deployment/{RELEASE}"),
                &format!("--timeout={}s", WAIT.as_secs()),
            ],
            None,
        )
        .with_context(|| env.diagnostics(OPERATOR_NS))?;
        wait_until(WAIT, || Ok(env.operator_leaders()? == 1.0))
            .with_context(|| format!("no operator pod leads\n{}", env.diagnostics(OPERATOR_NS)))?;
        let t_chart = t.elapsed();
        note(&format!(
            "control plane {:.1} s, node {} {:.1} s, broker {} {:.1} s, images built {:.1} s and loaded {:.1} s, chart installed to a leading operator {:.1} s",
            secs(t_cp),
            env.node,
            secs(t_node),
            env.bs,
            secs(t_kafka),
            secs(t_build),
            secs(t_load),
            secs(t_chart)
        ));
        Ok(env)
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.cp.kubectl(args, stdin)
    }

    /// `kubectl get WHAT -o jsonpath=PATH` in NS, empty if it fails (e.g. not found).
    pub fn get(&self, ns: &str, what: &str, path: &str) -> String {
        self.cp.jsonpath(ns, what, path)
    }

    pub fn apply(&self, ns: &str, yaml: &str) -> Result<()> {
        self.kubectl(&["-n", ns, "apply", "-f", "-"], Some(yaml))?;
        Ok(())
    }

    /// App `app`'s status as the workers and the operator wrote it.
    pub fn app_status(&self, ns: &str, app: &str) -> Result<eddy_crds::resource::AppStatus> {
        let json = self.kubectl(&["-n", ns, "get", "ssapp", app, "-o", "json"], None)?;
        let v: serde_json::Value = serde_json::from_str(&json).context("the app's JSON")?;
        if v["status"].is_null() {
            return Ok(Default::default());
        }
        serde_json::from_value(v["status"].clone()).context("the app's status")
    }

    fn apply_cluster(&self, yaml: &str) -> Result<()> {
        self.kubectl(&["apply", "-f", "-"], Some(yaml))?;
        Ok(())
    }

    /// The operator pods' IPs.
    pub fn operator_pod_ips(&self) -> Vec<String> {
        self.get(OPERATOR_NS, "pods", "{.items[*].status.podIP}")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Sum of `eddy_operator_leader` over the operator pods, read at their IPs.
    pub fn operator_leaders(&self) -> Result<f64> {
        let mut sum = 0.0;
        for ip in self.operator_pod_ips() {
            if let Ok((200, text)) = http_get(&format!("{ip}:8080"), "/metrics") {
                sum += sum_metric(&text, "eddy_operator_leader", &[]);
            }
        }
        Ok(sum)
    }

    /// Local PersistentVolumes for the `replicas` state claims (`state-<app>-<i>`) an app's
    /// StatefulSet makes in `ns`: a directory each under the node's run dir, pre-bound to its
    /// claim, on this node. Deleted with the test's [`Namespace`] (the directories with the
    /// node's run dir).
    pub fn local_volumes(&self, ns: &str, app: &str, replicas: usize) -> Result<()> {
        for i in 0..replicas {
            let claim = format!("state-{app}-{i}");
            let pv = format!("{ns}-{claim}");
            let dir = self.volume_dir(&pv);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            self.apply_cluster(&format!(
                r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: {pv}
  labels: {{{PV_LABEL}: {ns}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {STORAGE_CLASS}
  claimRef: {{namespace: {ns}, name: {claim}}}
  local: {{path: "{}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {{key: kubernetes.io/hostname, operator: In, values: [{}]}}
"#,
                dir.display(),
                self.node
            ))?;
        }
        Ok(())
    }

    /// The host directory of a local PersistentVolume made by [`Self::local_volumes`].
    pub fn volume_dir(&self, pv: &str) -> PathBuf {
        self.run_dir.join("volumes").join(pv)
    }

    /// The host pid of a running pod's first container (containerd's task of it).
    pub fn container_pid(&self, ns: &str, pod: &str) -> Result<u32> {
        let id = self.get(
            ns,
            &format!("pod/{pod}"),
            "{.status.containerStatuses[0].containerID}",
        );
        let id = id
            .strip_prefix("containerd://")
            .with_context(|| format!("{ns}/{pod} has no containerd container: {id:?}"))?;
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "tasks", "ls"])
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        ensure!(
            out.status.success(),
            "ctr tasks ls: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tasks = String::from_utf8_lossy(&out.stdout).to_string();
        tasks
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(id)).then(|| f.next()).flatten()
            })
            .find_map(|pid| pid.parse().ok())
            .with_context(|| format!("no task of container {id} ({ns}/{pod}): {tasks}"))
    }

    /// What is going on in `ns` and with the operator: pods, claims, events, the apps'
    /// status, and the last lines of every pod's log.
    pub fn diagnostics(&self, ns: &str) -> String {
        let mut out = String::new();
        let mut add = |title: &str, text: Result<String>| {
            out.push_str(&format!(
                "--- {title}\n{}\n",
                text.unwrap_or_else(|e| format!("({e:#})"))
            ));
        };
        add(
            &format!("pods and claims in {ns}"),
            self.kubectl(&["-n", ns, "get", "pods,pvc", "-o", "wide"], None),
        );
        add(
            "apps",
            self.kubectl(
                &[
                    "-n",
                    ns,
                    "get",
                    "ssapp",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}: {.status}{\"\\n\"}{end}",
                ],
                None,
            ),
        );
        add(
            &format!("events in {ns}"),
            self.kubectl(
                &["-n", ns, "get", "events", "--sort-by=.lastTimestamp"],
                None,
            )
            .map(|t| {
                let lines: Vec<&str> = t.lines().collect();
                lines[lines.len().saturating_sub(25)..].join("\n")
            }),
        );
        let spaces = if ns == OPERATOR_NS {
            vec![ns]
        } else {
            vec![ns, OPERATOR_NS]
        };
        for space in spaces {
            let pods = self.get(space, "pods", "{.items[*].metadata.name}");
            for pod in pods.split_whitespace() {
                add(
                    &format!("{space}/{pod}"),
                    self.kubectl(&["-n", space, "logs", pod, "--tail=30"], None),
                );
            }
        }
        out
    }
}

/// A process's `/proc/<pid>/status` fields, their whitespace collapsed to single spaces.
pub fn proc_status(pid: u32) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            (
                k.to_string(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect())
}

/// The mount options of a process's root filesystem (`/proc/<pid>/mountinfo`).
pub fn root_mount_options(pid: u32) -> Result<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .with_context(|| format!("no root mount in /proc/{pid}/mountinfo"))
}

/// A namespace of one test's own, the topics it uses and the PersistentVolumes made for it:
/// deleted when the test ends, passed or failed.
pub struct Namespace<'a> {
    env: &'a RealNode,
    pub name: String,
    /// Prefixes of topics to delete: the namespace's apps' default application ids
    /// (`<namespace>.`) and the topics the test created.
    topics: std::cell::RefCell<Vec<String>>,
}

impl<'a> Namespace<'a> {
    pub fn new(env: &'a RealNode) -> Result<Self> {
        let name = unique("n");
        env.kubectl(&["create", "namespace", &name], None)?;
        Ok(Self {
            env,
            topics: std::cell::RefCell::new(vec![format!("{name}.")]),
            name,
        })
    }

    /// A new topic of a unique name starting with `prefix`, deleted with the namespace.
    pub fn topic(&self, prefix: &str, partitions: i32) -> Result<String> {
        let name = unique(prefix);
        self.topics.borrow_mut().push(name.clone());
        create_topic(&name, partitions)?;
        Ok(name)
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self
            .env
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"], None);
        let _ = self.env.kubectl(
            &[
                "delete",
                "pv",
                "-l",
                &format!("{PV_LABEL}={}", self.name),
                "--wait=false",
            ],
            None,
        );
        for prefix in self.topics.borrow().iter() {
            if let Ok(left) = topics_with_prefix(prefix) {
                let left: Vec<&str> = left.iter().map(String::as_str).collect();
                let _ = delete_topics(&left);
            }
        }
    }
}

/// Seconds since `t`, for the timings the tests print.
pub fn since(t: Instant) -> f64 {
    secs(t.elapsed())
}

/// A line on stderr that the test harness does not capture (timings, in CI's log too).
pub fn note(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "real node: {line}");
}

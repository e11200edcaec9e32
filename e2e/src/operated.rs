//! Apps under a running operator, shared by a whole test binary: one control plane
//! (`e2e/k8s/cluster.sh`), the chart's CRD and RBAC, operator replicas running as local
//! processes with the chart's ServiceAccount, and the pod runner playing the kubelet. The
//! first test that asks starts them; they stop when the test binary exits. Each test works in
//! a [`Namespace`] of its own, so the tests of a binary run concurrently.

use crate::k8s::{ControlPlane, Process};
use crate::{bootstrap, delete_topics, free_port, http_get, sum_metric, topics_with_prefix};
use crate::{create_topic, unique, wait_until};
use anyhow::{Context as _, Result, anyhow};
use eddy_crds::resource::{AppStatus, TaskRole};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// How long the helpers below wait for something the operator or a worker must do.
pub const WAIT: Duration = Duration::from_secs(180);
/// The operator's own namespace (its Lease and ServiceAccount).
pub const OPERATOR_NS: &str = "eddy-system";

/// The control plane, the operators and the pod runner of a test binary.
pub struct Operated {
    pub cp: ControlPlane,
    pub bs: String,
    pub dir: tempfile::TempDir,
    /// HTTP ports of the operator replicas.
    pub operators: Vec<u16>,
}

static SHARED: OnceLock<std::result::Result<Operated, String>> = OnceLock::new();
/// The operators and the pod runner, stopped when the test binary exits.
static PROCESSES: Mutex<Vec<Process>> = Mutex::new(Vec::new());

/// The binary's shared control plane with `operators` operator replicas (one leads), started
/// by the first caller; `before` runs once, after the CRD and RBAC are in place and before
/// the operators start (to create objects they must find when they list).
pub fn shared(
    operators: usize,
    before: impl FnOnce(&ControlPlane, &str) -> Result<()>,
) -> Result<&'static Operated> {
    shared_with(
        &Setup {
            operators,
            ..Setup::default()
        },
        before,
    )
}

/// How the operators of [`shared_with`] run.
#[derive(Default)]
pub struct Setup<'a> {
    /// Operator replicas (one leads).
    pub operators: usize,
    /// Namespaces created before the RBAC is installed (`watchNamespaces` puts a Role in each).
    pub namespaces: &'a [&'a str],
    /// Chart values (`--set` arguments) the operators' RBAC is rendered with.
    pub values: &'a [&'a str],
    /// More `eddy-operator run` arguments, e.g. `--watch-namespaces`.
    pub args: &'a [&'a str],
}

/// [`shared`], the operators' RBAC rendered with chart values and run with more arguments.
pub fn shared_with(
    setup: &Setup,
    before: impl FnOnce(&ControlPlane, &str) -> Result<()>,
) -> Result<&'static Operated> {
    SHARED
        .get_or_init(|| {
            // SAFETY: registers a plain function without arguments, run once at exit.
            unsafe { libc::atexit(teardown) };
            exit_on_signals();
            Operated::start(setup, before).map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("the shared control plane did not start: {e}"))
}

/// At exit (statics are never dropped): stop the processes, then the control plane.
extern "C" fn teardown() {
    let procs = std::mem::take(&mut *PROCESSES.lock().unwrap_or_else(PoisonError::into_inner));
    // All of them get SIGTERM at once; the runner stops its pods' processes.
    procs.iter().for_each(Process::term);
    drop(procs);
    if let Some(Ok(env)) = SHARED.get() {
        env.cp.stop();
        let _ = std::fs::remove_dir_all(env.dir.path());
    }
}

/// SIGINT, SIGTERM or SIGHUP ends the process through `exit`, so that [`teardown`] runs:
/// killed outright, it would leave the control plane, the operators and the pods running.
pub(crate) fn exit_on_signals() {
    use tokio::signal::unix::{SignalKind, signal};
    std::thread::spawn(|| {
        let wait = async {
            let mut int = signal(SignalKind::interrupt())?;
            let mut term = signal(SignalKind::terminate())?;
            let mut hup = signal(SignalKind::hangup())?;
            Ok::<_, std::io::Error>(tokio::select! {
                _ = int.recv() => 130,
                _ = term.recv() => 143,
                _ = hup.recv() => 129,
            })
        };
        let code = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .and_then(|rt| rt.block_on(wait));
        match code {
            Ok(code) => {
                eprintln!("signal received: stopping the control plane, operators and pods");
                std::process::exit(code);
            }
            // Without handlers the signals keep their default action (no teardown).
            Err(e) => eprintln!("cannot handle signals for the teardown: {e}"),
        }
    });
}

fn spawn(bin: &str, args: &[&str], envs: &[(&str, &Path)], log: &Path) -> Result<()> {
    let p = Process::spawn(bin, args, envs, log)?;
    PROCESSES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(p);
    Ok(())
}

impl Operated {
    fn start(
        setup: &Setup,
        before: impl FnOnce(&ControlPlane, &str) -> Result<()>,
    ) -> Result<Self> {
        let bs = bootstrap()?;
        let cp = ControlPlane::start(&format!("op-{}", std::process::id()))?;
        let dir = tempfile::tempdir()?;
        for ns in setup.namespaces {
            cp.kubectl(&["create", "namespace", ns], None)?;
        }
        // The chart's CRD and RBAC, as `helm install` would create them (the operator itself
        // runs here as a local process with its ServiceAccount's token).
        let op_kubeconfig = cp.install_operator_rbac_with(OPERATOR_NS, dir.path(), setup.values)?;
        before(&cp, &bs)?;
        let ports = (0..setup.operators)
            .map(|_| free_port())
            .collect::<Result<Vec<_>>>()?;
        for (i, port) in ports.iter().enumerate() {
            let id = format!("op-{i}");
            let addr = format!("127.0.0.1:{port}");
            let mut args = vec![
                "run",
                "--http-addr",
                &addr,
                "--namespace",
                OPERATOR_NS,
                "--identity",
                &id,
                "--lease-name",
                ControlPlane::LEASE,
            ];
            args.extend_from_slice(setup.args);
            spawn(
                "eddy-operator",
                &args,
                &[("KUBECONFIG", &op_kubeconfig)],
                &dir.path().join(format!("{id}.log")),
            )?;
        }
        spawn(
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
        let env = Operated {
            cp,
            bs,
            dir,
            operators: ports,
        };
        wait_until(WAIT, || Ok(env.leaders() == 1.0)).with_context(|| env.logs())?;
        Ok(env)
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.cp.kubectl(args, stdin)
    }

    /// `kubectl get WHAT -o jsonpath=PATH` in NS, empty if it fails (e.g. not found).
    pub fn get(&self, ns: &str, what: &str, path: &str) -> String {
        self.cp.jsonpath(ns, what, path)
    }

    /// Every value `path` takes in NS's WHAT from now on (`kubectl get -w`: each write the
    /// API server makes, however brief), until the [`Watch`] is dropped.
    pub fn watch(&self, ns: &str, what: &str, path: &str) -> Result<Watch> {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(self.cp.bin.join("kubectl"))
            .args(["-n", ns, "get", what, "-w", "-o"])
            .arg(format!("jsonpath={path}{{\"\\n\"}}"))
            .env("KUBECONFIG", &self.cp.kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let out = child.stdout.take().context("kubectl's stdout")?;
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                into.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Ok(Watch { child, seen })
    }

    /// An app as JSON (`kubectl get -o json`).
    pub fn app_json(&self, ns: &str, app: &str) -> Result<serde_json::Value> {
        let text = self.kubectl(&["-n", ns, "get", "ssapp", app, "-o", "json"], None)?;
        Ok(serde_json::from_str(&text)?)
    }

    pub fn apply(&self, ns: &str, yaml: &str) -> Result<()> {
        self.kubectl(&["-n", ns, "apply", "-f", "-"], Some(yaml))?;
        Ok(())
    }

    /// An app's `Degraded` condition: (status, reason, message).
    pub fn degraded(&self, ns: &str, app: &str) -> (String, String, String) {
        let c = |field: &str| {
            self.get(
                ns,
                &format!("ssapp/{app}"),
                &format!("{{.status.conditions[?(@.type==\"Degraded\")].{field}}}"),
            )
        };
        (c("status"), c("reason"), c("message"))
    }

    pub fn wait_degraded(&self, ns: &str, app: &str, reason: &str) -> Result<String> {
        wait_until(WAIT, || Ok(self.degraded(ns, app).1 == reason)).with_context(|| {
            format!(
                "{ns}/{app} never became Degraded/{reason}: status {}\n{}",
                self.get(ns, &format!("ssapp/{app}"), "{.status}"),
                self.logs()
            )
        })?;
        Ok(self.degraded(ns, app).2)
    }

    /// Sum of `eddy_operator_leader` over the replicas.
    pub fn leaders(&self) -> f64 {
        self.operators
            .iter()
            .map(|p| {
                http_get(&format!("127.0.0.1:{p}"), "/metrics")
                    .map(|(_, text)| sum_metric(&text, "eddy_operator_leader", &[]))
                    .unwrap_or(0.0)
            })
            .sum()
    }

    /// The leading operator replica's `/metrics` (the one showing the apps).
    pub fn leader_metrics(&self) -> Result<String> {
        for p in &self.operators {
            if let Ok((200, text)) = http_get(&format!("127.0.0.1:{p}"), "/metrics")
                && sum_metric(&text, "eddy_operator_leader", &[]) == 1.0
            {
                return Ok(text);
            }
        }
        Err(anyhow!("no operator replica leads"))
    }

    /// The directory the pod runner keeps a pod in (its `log`, its `http` address).
    pub fn pod_dir(&self, ns: &str, pod: &str) -> PathBuf {
        self.dir.path().join("node/pods").join(ns).join(pod)
    }

    /// The directory the pod runner keeps a PersistentVolumeClaim's data in.
    pub fn volume_dir(&self, ns: &str, claim: &str) -> PathBuf {
        self.dir.path().join("node/pvcs").join(ns).join(claim)
    }

    /// The pid of a running worker pod's process (the pod runner writes it into the pod's
    /// directory), to freeze it with SIGSTOP as a hung node would be.
    pub fn worker_pid(&self, ns: &str, pod: &str) -> Result<i32> {
        let path = self.pod_dir(ns, pod).join("pid");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no pid at {}", path.display()))?;
        Ok(text.trim().parse()?)
    }

    /// `kubectl` with the kubeconfig the pod runner wrote for a pod: a token of its
    /// ServiceAccount bound to the pod, as its worker has.
    pub fn kubectl_as_pod(&self, ns: &str, pod: &str, args: &[&str]) -> Result<String> {
        let kubeconfig = self.pod_dir(ns, pod).join("kubeconfig");
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap_or_default()];
        all.extend_from_slice(args);
        self.cp.kubectl(&all, None)
    }

    /// A running worker pod's `/metrics`.
    pub fn pod_metrics(&self, ns: &str, pod: &str) -> Result<String> {
        let path = self.pod_dir(ns, pod).join("http");
        let addr = std::fs::read_to_string(&path)
            .with_context(|| format!("no HTTP address at {}", path.display()))?;
        let (code, text) = http_get(addr.trim(), "/metrics")?;
        anyhow::ensure!(code == 200, "{pod}/metrics answered {code}");
        Ok(text)
    }

    /// The sum of a metric over the series of a running worker pod matching `filters`
    /// (`label="value"` strings).
    pub fn pod_metric(&self, ns: &str, pod: &str, name: &str, filters: &[&str]) -> Result<f64> {
        Ok(sum_metric(&self.pod_metrics(ns, pod)?, name, filters))
    }

    /// The last lines of the operators', the runner's and every worker pod's log, and every
    /// app's status. `EDDY_E2E_LOG_LINES` sets how many lines of each log (default 30).
    pub fn logs(&self) -> String {
        let lines = std::env::var("EDDY_E2E_LOG_LINES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(30);
        let mut files: Vec<PathBuf> = (0..self.operators.len())
            .map(|i| format!("op-{i}.log"))
            .chain(["runner.log".to_string()])
            .map(|f| self.dir.path().join(f))
            .collect();
        let pods = self.dir.path().join("node/pods");
        for ns in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            for pod in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                files.push(pod.path().join("log"));
            }
        }
        let statuses = self
            .kubectl(
                &[
                    "get",
                    "ssapp",
                    "-A",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}: {.status}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
        let statuses = format!("--- apps\n{statuses}");
        std::iter::once(statuses)
            .chain(files.iter().map(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(lines).collect();
                format!(
                    "--- {}\n{}",
                    f.strip_prefix(self.dir.path()).unwrap_or(f).display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            }))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// An app's `metadata.generation` and its status as the operator and the workers wrote it.
    pub fn app_status(&self, ns: &str, app: &str) -> Result<(i64, AppStatus)> {
        let v = self.app_json(ns, app)?;
        let generation = v["metadata"]["generation"].as_i64().unwrap_or(0);
        let status: AppStatus = serde_json::from_value(v["status"].clone()).unwrap_or_default();
        Ok((generation, status))
    }

    /// Settled at `replicas`: the StatefulSet has exactly that many pods, all Ready and on the
    /// current revision (the rolling update done); the assignment spreads every task over them and nothing moves; each
    /// worker applied it and runs its actives; the phase is Running.
    pub fn settled(&self, ns: &str, app: &str, replicas: usize) -> Result<bool> {
        let (generation, s) = self.app_status(ns, app)?;
        let sts = |path: &str| self.get(ns, &format!("statefulset/{app}"), path);
        let Some(a) = &s.assignment else {
            return Ok(false);
        };
        let progressing = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.status == "True");
        let pods_ok = a.pods.len() == replicas
            && a.pods
                .values()
                .all(|p| !p.active.is_empty() && p.warmup.is_empty())
            && a.down.is_empty();
        let workers_ok = a.pods.iter().all(|(pod, tasks)| {
            s.workers.get(pod).is_some_and(|w| {
                w.applied_generation == a.generation
                    && tasks.active.iter().all(|t| {
                        w.tasks.get(t).is_some_and(|t| {
                            t.role == TaskRole::Active && t.state.name() == "RUNNING"
                        })
                    })
            })
        });
        Ok(s.observed_generation == Some(generation)
            && !progressing
            && pods_ok
            && workers_ok
            && s.phase.map(|p| format!("{p:?}")).as_deref() == Some("Running")
            && sts("{.spec.replicas}") == replicas.to_string()
            && sts("{.status.readyReplicas}") == replicas.to_string()
            && sts("{.status.replicas}") == replicas.to_string()
            // Every pod on the current template (the StatefulSet updates OnDelete, so its
            // currentRevision never moves; updatedReplicas counts the pods on updateRevision).
            && sts("{.status.updatedReplicas}") == replicas.to_string())
    }

    pub fn wait_settled(&self, ns: &str, app: &str, replicas: usize) -> Result<()> {
        wait_until(WAIT, || self.settled(ns, app, replicas)).with_context(|| {
            format!(
                "{ns}/{app} did not settle at {replicas} replicas\n{}",
                self.logs()
            )
        })
    }

    /// `kubectl scale ssapp`.
    pub fn scale(&self, ns: &str, app: &str, replicas: usize) -> Result<()> {
        self.kubectl(
            &[
                "-n",
                ns,
                "scale",
                "ssapp",
                app,
                &format!("--replicas={replicas}"),
            ],
            None,
        )?;
        Ok(())
    }

    /// Delete every app of a namespace and wait until they are gone (the operator removes
    /// their finalizers, and with `cleanupPolicy: Delete` their internal topics).
    pub fn delete_apps(&self, ns: &str) -> Result<()> {
        self.kubectl(
            &[
                "-n",
                ns,
                "delete",
                "ssapp",
                "--all",
                "--wait=true",
                "--timeout=120s",
            ],
            None,
        )?;
        Ok(())
    }
}

/// Whether every thread of `pid` is stopped (state `T` in its `stat`): `kill(SIGSTOP)` returns
/// before the process stops.
pub fn all_threads_stopped(pid: i32) -> Result<bool> {
    let mut all = true;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command, which is in parentheses and may hold spaces.
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        all &= state == Some('T');
    }
    Ok(all)
}

/// A namespace of one test's own and the topics the test uses, deleted when the test ends,
/// passed or failed.
pub struct Namespace<'a> {
    env: &'a Operated,
    pub name: String,
    /// Prefixes of topics to delete: the namespace's apps' default application ids
    /// (`<namespace>.`), explicit ones, and the topics the test created.
    topics: std::cell::RefCell<Vec<String>>,
}

impl<'a> Namespace<'a> {
    pub fn new(env: &'a Operated, labels: &[&str]) -> Result<Self> {
        let name = unique("t");
        env.kubectl(&["create", "namespace", &name], None)?;
        if !labels.is_empty() {
            let mut args = vec!["label", "namespace", name.as_str()];
            args.extend(labels);
            env.kubectl(&args, None)?;
        }
        Ok(Self::adopt(env, &name))
    }

    /// A namespace that exists already (one of [`Setup::namespaces`]), deleted like the others
    /// when the test ends: one test per such namespace.
    pub fn adopt(env: &'a Operated, name: &str) -> Self {
        Self {
            env,
            topics: std::cell::RefCell::new(vec![format!("{name}.")]),
            name: name.to_string(),
        }
    }

    /// A new topic of a unique name starting with `prefix`, deleted with the namespace.
    pub fn topic(&self, prefix: &str, partitions: i32) -> Result<String> {
        let name = unique(prefix);
        self.topics.borrow_mut().push(name.clone());
        create_topic(&name, partitions)?;
        Ok(name)
    }

    /// A token of a new ServiceAccount `account` of this namespace, the way a query client
    /// gets one; with `may_query`, the account is bound here to the chart's ClusterRole for
    /// query clients (`t-eddy-operator-query`).
    pub fn query_token(&self, account: &str, may_query: bool) -> Result<String> {
        let ns = self.name.as_str();
        self.env
            .kubectl(&["-n", ns, "create", "serviceaccount", account], None)?;
        if may_query {
            self.env.kubectl(
                &[
                    "-n",
                    ns,
                    "create",
                    "rolebinding",
                    account,
                    "--clusterrole=t-eddy-operator-query",
                    &format!("--serviceaccount={ns}:{account}"),
                ],
                None,
            )?;
        }
        let token = self.env.kubectl(
            &["-n", ns, "create", "token", account, "--duration=2h"],
            None,
        )?;
        Ok(token.trim().to_string())
    }

    /// Delete the topics starting with `prefix` (an explicit application id's) at the end.
    pub fn owns_topics(&self, prefix: &str) {
        self.topics.borrow_mut().push(prefix.to_string());
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self
            .env
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"], None);
        for prefix in self.topics.borrow().iter() {
            if let Ok(left) = topics_with_prefix(prefix) {
                let left: Vec<&str> = left.iter().map(String::as_str).collect();
                let _ = delete_topics(&left);
            }
        }
    }
}

/// Values seen by [`Operated::watch`]; stops the watch when dropped.
pub struct Watch {
    child: std::process::Child,
    seen: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Watch {
    /// The values seen so far, in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

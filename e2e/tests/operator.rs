//! The operator end to end, on a real control plane (etcd, kube-apiserver,
//! kube-controller-manager from `e2e/k8s/cluster.sh`), a real Kafka broker, and worker pods
//! run as local `eddy-worker` processes by the pod runner. One control plane, one pair of
//! operators (one leader) and one pod runner serve every test of this binary: the first test
//! starts them, they stop when the binary exits. Each test works in namespaces of its own, so
//! the tests run concurrently. They check what a user would: objects, correct output, status,
//! scale, bad and malformed apps, objects the operator did not create, pod templates, the
//! `restricted` Pod Security Standard, application ids, deletion. A malformed app exists
//! before the operators start, so every test also shows it does not disturb other apps.

use anyhow::{Context, Result, anyhow, ensure};
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);
/// The operator's own namespace (its Lease and ServiceAccount).
const NS: &str = "eddy-system";

struct Process(Child);

impl Process {
    fn term(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.term();
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

/// What every test shares.
struct Env {
    cp: ControlPlane,
    bs: String,
    dir: tempfile::TempDir,
    /// HTTP ports of the two operator replicas.
    operators: [u16; 2],
    /// Namespace of the app `bad` that no typed client can read.
    malformed: String,
}

/// An app no typed client can read: `groupBy: 42` passes the CRD's schema (a groupBy is a
/// string or an object, which a structural schema must leave open) but is no expression,
/// like a resource stored before a schema change. It carries the operator's finalizer, as an
/// app the operator had taken on before it became unreadable.
fn malformed_app(bs: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: bad, finalizers: [eddy.dev/cleanup]}}
spec:
  kafka: {{bootstrapServers: "{bs}"}}
  cleanupPolicy: Delete
  topology:
    - from: {{topic: never-created}}
    - groupBy: 42
    - count: {{store: counts}}
"#
    )
}

static ENV: OnceLock<std::result::Result<Env, String>> = OnceLock::new();
/// The operators and the pod runner, stopped when the test binary exits.
static PROCESSES: Mutex<Vec<Process>> = Mutex::new(Vec::new());

/// The shared control plane, operators and pod runner, started by the first caller.
fn env() -> Result<&'static Env> {
    ENV.get_or_init(|| {
        // SAFETY: registers a plain function without arguments, run once at exit.
        unsafe { libc::atexit(teardown) };
        start().map_err(|e| format!("{e:#}"))
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
    if let Some(Ok(env)) = ENV.get() {
        env.cp.stop();
        let _ = std::fs::remove_dir_all(env.dir.path());
    }
}

fn spawn(bin: &str, args: &[&str], envs: &[(&str, &Path)], log: &Path) -> Result<()> {
    let out = std::fs::File::create(log)?;
    let child = Command::new(binary(bin)?)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .env("EDDY_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()?;
    PROCESSES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Process(child));
    Ok(())
}

fn start() -> Result<Env> {
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
    // The malformed app is there before the operators start: they list it with all others.
    let malformed = unique("malformed");
    cp.kubectl(&["create", "namespace", &malformed], None)?;
    cp.kubectl(
        &["-n", &malformed, "apply", "-f", "-"],
        Some(&malformed_app(&bs)),
    )?;

    // Two replicas: one leads, the other waits on the Lease.
    let operators = [free_port()?, free_port()?];
    for (port, id) in operators.iter().zip(["op-a", "op-b"]) {
        spawn(
            "eddy-operator",
            &[
                "run",
                "--http-addr",
                &format!("127.0.0.1:{port}"),
                "--namespace",
                NS,
                "--identity",
                id,
            ],
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
    let env = Env {
        cp,
        bs,
        dir,
        operators,
        malformed,
    };
    wait_until(WAIT, || Ok(env.leaders() == 1.0)).with_context(|| env.logs())?;
    Ok(env)
}

impl Env {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.cp.kubectl(args, stdin)
    }

    /// `kubectl get WHAT -o jsonpath=PATH` in NS, empty if it fails (e.g. not found).
    fn get(&self, ns: &str, what: &str, path: &str) -> String {
        self.kubectl(
            &["-n", ns, "get", what, "-o", &format!("jsonpath={path}")],
            None,
        )
        .unwrap_or_default()
    }

    fn apply(&self, ns: &str, yaml: &str) -> Result<()> {
        self.kubectl(&["-n", ns, "apply", "-f", "-"], Some(yaml))?;
        Ok(())
    }

    /// An app's `Degraded` condition: (status, reason, message).
    fn degraded(&self, ns: &str, app: &str) -> (String, String, String) {
        let c = |field: &str| {
            self.get(
                ns,
                &format!("ssapp/{app}"),
                &format!("{{.status.conditions[?(@.type==\"Degraded\")].{field}}}"),
            )
        };
        (c("status"), c("reason"), c("message"))
    }

    fn wait_degraded(&self, ns: &str, app: &str, reason: &str) -> Result<String> {
        wait_until(WAIT, || Ok(self.degraded(ns, app).1 == reason)).with_context(|| {
            format!(
                "{ns}/{app} never became Degraded/{reason}: status {}\n{}",
                self.get(ns, &format!("ssapp/{app}"), "{.status}"),
                self.logs()
            )
        })?;
        Ok(self.degraded(ns, app).2)
    }

    /// Sum of `eddy_operator_leader` over both replicas.
    fn leaders(&self) -> f64 {
        self.operators
            .iter()
            .map(|p| {
                http_get(&format!("127.0.0.1:{p}"), "/metrics")
                    .map(|(_, text)| sum_metric(&text, "eddy_operator_leader", &[]))
                    .unwrap_or(0.0)
            })
            .sum()
    }

    /// The last lines of the operators', the runner's and every worker pod's log.
    fn logs(&self) -> String {
        let mut files: Vec<std::path::PathBuf> = ["op-a.log", "op-b.log", "runner.log"]
            .iter()
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
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- {}\n{}",
                    f.strip_prefix(self.dir.path()).unwrap_or(f).display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            }))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Delete every app of a namespace and wait until they are gone (the operator removes
    /// their finalizers, and with `cleanupPolicy: Delete` their internal topics).
    fn delete_apps(&self, ns: &str) -> Result<()> {
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

/// A namespace of one test's own and the topics the test uses, deleted when the test ends,
/// passed or failed.
struct Namespace<'a> {
    env: &'a Env,
    name: String,
    /// Prefixes of topics to delete: the namespace's apps' default application ids
    /// (`<namespace>.`), explicit ones, and the topics the test created.
    topics: std::cell::RefCell<Vec<String>>,
}

impl<'a> Namespace<'a> {
    fn new(env: &'a Env, labels: &[&str]) -> Result<Self> {
        let name = unique("t");
        env.kubectl(&["create", "namespace", &name], None)?;
        if !labels.is_empty() {
            let mut args = vec!["label", "namespace", name.as_str()];
            args.extend(labels);
            env.kubectl(&args, None)?;
        }
        Ok(Self {
            env,
            topics: std::cell::RefCell::new(vec![format!("{name}.")]),
            name,
        })
    }

    /// A new topic of a unique name starting with `prefix`, deleted with the namespace.
    fn topic(&self, prefix: &str, partitions: i32) -> Result<String> {
        let name = unique(prefix);
        self.topics.borrow_mut().push(name.clone());
        create_topic(&name, partitions)?;
        Ok(name)
    }

    /// Delete the topics starting with `prefix` (an explicit application id's) at the end.
    fn owns_topics(&self, prefix: &str) {
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

/// `n` records over `keys` keys (`k0`, `k1`, ...) into `topic`.
fn produce_counts(topic: &str, n: usize, keys: usize) -> Result<()> {
    let records: Vec<Input> = (0..n)
        .map(|i| {
            (
                Some(format!("k{}", i % keys).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(topic, &records)
}

/// `output` holds the count `each` for each of `keys` keys.
fn counted(output: &str, keys: usize, each: i64) -> Result<bool> {
    let last = latest_by_key(output)?;
    Ok(last.len() == keys && last.values().all(|v| v.as_slice() == each.to_be_bytes()))
}

#[test]
fn runs_scales_restores_and_deletes_an_app() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let bs = &env.bs;

    let app = unique("op");
    let (input, output) = (space.topic("op-in", 4)?, space.topic("op-out", 2)?);
    produce_counts(&input, 4000, 40)?;

    // Exactly-once: the scale-out below moves tasks between workers, which under
    // exactly-once goes through the hand-off (the new owner waits for the old one to let go).
    let yaml = app_yaml(
        &app,
        2,
        bs,
        &input,
        &output,
        "  cleanupPolicy: Delete\n  processingGuarantee: exactly_once\n",
    );
    env.apply(ns, &yaml)?;

    // The objects appear, owned by the app.
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "2")
    })
    .with_context(|| env.logs())?;
    for what in [
        format!("service/{app}-workers"),
        format!("configmap/{app}-app"),
        format!("serviceaccount/{app}-worker"),
        format!("role/{app}-worker"),
        format!("rolebinding/{app}-worker"),
        format!("poddisruptionbudget/{app}"),
    ] {
        let owner = env.get(
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
    wait_until(WAIT, || counted(&output, 40, 100)).with_context(|| env.logs())?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running")
    })
    .with_context(|| {
        format!(
            "status: {}\n{}",
            env.get(ns, &format!("ssapp/{app}"), "{.status}"),
            env.logs()
        )
    })?;
    let tasks = env.get(
        ns,
        &format!("ssapp/{app}"),
        "{.status.workers.*.tasks.*.state}",
    );
    ensure!(
        tasks.split_whitespace().filter(|s| *s == "RUNNING").count() == 4,
        "task states: {tasks}"
    );
    let table = env.kubectl(&["-n", ns, "get", "ssapp", &app], None)?;
    ensure!(
        table.contains("READY") && table.contains("PHASE") && table.contains("BACKLOG"),
        "{table}"
    );
    ensure!(
        table.contains("2/2") && table.contains("Running"),
        "{table}"
    );

    // kubectl scale goes through the scale subresource to the StatefulSet.
    env.kubectl(&["-n", ns, "scale", "ssapp", &app, "--replicas=3"], None)?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "3")
    })?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("ssapp/{app}"), "{.status.readyReplicas}") == "3")
    })
    .with_context(|| env.logs())?;

    // A worker that lost its volume restores its tasks from the changelog: the status shows
    // the backlog while it does, and it falls back to 0. The changelog is named after the
    // default application id, `<namespace>.<name>`.
    let changelog = format!("{ns}.{app}-counts-changelog");
    let more: Vec<Input> = (0..200_000)
        .map(|i| (Some(format!("big-{i}").into_bytes()), Some(b"{}".to_vec())))
        .collect();
    produce(&input, &more)?;
    wait_until(WAIT, || Ok(read_all(&changelog)?.len() >= 200_040))?;
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
    .with_context(|| env.logs())?;
    let pvc_dir = env
        .dir
        .path()
        .join("node/pvcs")
        .join(ns)
        .join(format!("state-{app}-0"));
    ensure!(pvc_dir.exists(), "no PVC dir at {}", pvc_dir.display());
    env.kubectl(
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
        let b: i64 = env
            .get(ns, &format!("ssapp/{app}"), "{.status.backlog}")
            .parse()
            .unwrap_or(0);
        max_backlog = max_backlog.max(b);
        Ok(max_backlog > 0)
    })
    .with_context(|| env.logs())?;
    wait_until(WAIT, || {
        Ok(
            env.get(ns, &format!("ssapp/{app}"), "{.status.backlog}") == "0"
                && env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running",
        )
    })
    .with_context(|| env.logs())?;
    ensure!(
        max_backlog > 1000,
        "the status showed a backlog of only {max_backlog} records"
    );

    // Nonsense is rejected at admission with what to fix; a missing topic is Degraded.
    let bad = app_yaml(
        "bad-standbys",
        2,
        bs,
        &input,
        &output,
        "  numStandbyReplicas: 2\n",
    );
    let err = env
        .kubectl(&["-n", ns, "apply", "-f", "-"], Some(&bad))
        .expect_err("admission must refuse");
    ensure!(
        err.to_string()
            .contains("numStandbyReplicas must be less than replicas"),
        "{err}"
    );
    let missing = app_yaml("missing-topic", 1, bs, "no-such-topic", &output, "");
    env.apply(ns, &missing)?;
    env.wait_degraded(ns, "missing-topic", "SourceTopicMissing")?;
    env.kubectl(&["-n", ns, "delete", "ssapp", "missing-topic"], None)?;

    ensure!(env.leaders() == 1.0, "still exactly one leader");

    // Deleting the app removes its objects and, with cleanupPolicy Delete, its topics.
    env.kubectl(
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
        Ok(env
            .get(ns, &format!("statefulset/{app}"), "{.metadata.name}")
            .is_empty())
    })?;
    wait_until(WAIT, || {
        Ok(topics_with_prefix(&format!("{ns}.{app}-counts"))?.is_empty())
    })?;
    Ok(())
}

#[test]
fn a_malformed_app_marks_only_itself_and_stays_deletable() -> Result<()> {
    let env = env()?;
    let bad_ns = env.malformed.as_str();
    let good_space = Namespace::new(env, &[])?;
    let good_ns = good_space.name.as_str();
    let (input, output) = (
        good_space.topic("malformed-in", 1)?,
        good_space.topic("malformed-out", 1)?,
    );

    let message = env.wait_degraded(bad_ns, "bad", "InvalidSpec")?;
    ensure!(message.contains("spec.topology[1]"), "{message}");
    ensure!(
        env.get(bad_ns, "statefulset/bad", "{.metadata.name}")
            .is_empty(),
        "an unreadable app gets no workers"
    );

    // Another app, created and scaled while the malformed one exists, is reconciled.
    env.apply(good_ns, &app_yaml("good", 0, &env.bs, &input, &output, ""))?;
    wait_until(WAIT, || {
        Ok(env.get(good_ns, "statefulset/good", "{.spec.replicas}") == "0")
    })
    .with_context(|| env.logs())?;
    env.kubectl(
        &["-n", good_ns, "scale", "ssapp", "good", "--replicas=1"],
        None,
    )?;
    wait_until(WAIT, || {
        Ok(env.get(good_ns, "statefulset/good", "{.spec.replicas}") == "1")
    })
    .with_context(|| env.logs())?;

    // The malformed app can be deleted: its finalizer goes whatever its spec says.
    env.kubectl(
        &[
            "-n",
            bad_ns,
            "delete",
            "ssapp",
            "bad",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    )
    .with_context(|| env.logs())?;
    env.kubectl(&["delete", "namespace", bad_ns, "--wait=false"], None)?;
    env.delete_apps(good_ns)?;
    Ok(())
}

#[test]
fn objects_the_operator_did_not_create_are_left_alone() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let input = space.topic("clash-in", 1)?;
    // No workers (0 replicas): this is about objects.
    let app = |extra: &str| app_yaml("clash", 0, &env.bs, &input, "clash-out", extra);

    env.kubectl(
        &[
            "-n",
            ns,
            "create",
            "configmap",
            "clash-app",
            "--from-literal=owner=someone-else",
        ],
        None,
    )?;
    env.apply(ns, &app(""))?;
    let message = env.wait_degraded(ns, "clash", "NameConflict")?;
    ensure!(
        message.contains("ConfigMap clash-app") && message.contains("delete"),
        "{message}"
    );
    // Its other objects are there, the ConfigMap is untouched, and no StatefulSet runs pods
    // with someone else's app file.
    wait_until(WAIT, || {
        Ok(!env
            .get(ns, "service/clash-workers", "{.metadata.name}")
            .is_empty())
    })?;
    ensure!(
        env.get(ns, "configmap/clash-app", "{.data}") == r#"{"owner":"someone-else"}"#,
        "data: {}",
        env.get(ns, "configmap/clash-app", "{.data}")
    );
    ensure!(
        env.get(ns, "configmap/clash-app", "{.metadata.ownerReferences}")
            .is_empty(),
        "the ConfigMap was adopted"
    );
    let managers = env.get(
        ns,
        "configmap/clash-app",
        "{.metadata.managedFields[*].manager}",
    );
    ensure!(!managers.contains("eddy-operator"), "managers: {managers}");
    ensure!(
        env.get(ns, "statefulset/clash", "{.metadata.name}")
            .is_empty(),
        "a StatefulSet was created"
    );

    // The fix the message names: delete the ConfigMap; the operator creates its own.
    env.kubectl(&["-n", ns, "delete", "configmap", "clash-app"], None)?;
    wait_until(WAIT, || {
        Ok(env.get(
            ns,
            "configmap/clash-app",
            "{.metadata.ownerReferences[0].name}",
        ) == "clash"
            && env.get(ns, "statefulset/clash", "{.spec.replicas}") == "0"
            && env.degraded(ns, "clash").0 == "False")
    })
    .with_context(|| env.logs())?;

    // A change the API server refuses (the volumes of a StatefulSet never change) is a
    // Degraded condition and a Warning event naming the object and what to do.
    env.apply(ns, &app("  storage: {size: 2Gi}\n"))?;
    let message = env.wait_degraded(ns, "clash", "ApplyFailed")?;
    ensure!(
        message.contains("StatefulSet clash:") && message.contains("--cascade=orphan"),
        "{message}"
    );
    wait_until(WAIT, || {
        Ok(env
            .get(
                ns,
                "events",
                "{.items[?(@.reason==\"ApplyFailed\")].message}",
            )
            .contains("StatefulSet clash:"))
    })?;
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn a_pod_template_adds_env_and_a_sidecar_to_the_worker() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let (input, output) = (space.topic("tmpl-in", 2)?, space.topic("tmpl-out", 1)?);
    produce_counts(&input, 200, 10)?;
    let extra = "  podTemplate:\n    spec:\n      containers:\n        - {name: worker, env: [{name: TEAM, value: blue}]}\n        - {name: proxy, image: envoyproxy/envoy, args: [--version]}\n";
    env.apply(ns, &app_yaml("tmpl", 1, &env.bs, &input, &output, extra))?;
    // The worker still runs (the pod runner runs the first container) and counts right.
    wait_until(WAIT, || counted(&output, 10, 20)).with_context(|| env.logs())?;
    let containers = env.get(ns, "pod/tmpl-0", "{.spec.containers[*].name}");
    ensure!(containers == "worker proxy", "containers: {containers}");
    let env_names = env.get(ns, "pod/tmpl-0", "{.spec.containers[0].env[*].name}");
    ensure!(
        env_names.contains("TEAM") && env_names.contains("EDDY_APP_FILE"),
        "worker env: {env_names}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn a_restricted_namespace_admits_the_workers_and_the_operator() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(
        env,
        &[
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
    )?;
    let ns = space.name.as_str();

    // The API server's PodSecurity admission enforces here: a plain pod is refused.
    let plain = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}"#;
    let err = env
        .kubectl(
            &["-n", ns, "create", "--dry-run=server", "-f", "-"],
            Some(plain),
        )
        .expect_err("a plain pod must be refused");
    ensure!(err.to_string().contains("PodSecurity"), "{err}");

    // The chart's operator: the pod its Deployment's ReplicaSet would create is admitted.
    let chart = env.cp.tool(
        "helm",
        &[
            "template",
            "t",
            "charts/eddy-operator",
            "--namespace",
            ns,
            "--show-only",
            "templates/deployment.yaml",
        ],
        None,
    )?;
    // kubectl prints one JSON document per object (the Deployment, its Service).
    let json = env.kubectl(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(&chart),
    )?;
    let deployment = serde_json::Deserializer::from_str(&json)
        .into_iter::<serde_json::Value>()
        .collect::<std::result::Result<Vec<_>, _>>()?
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .context("no Deployment in the chart")?;
    let template = &deployment["spec"]["template"];
    let account = template["spec"]["serviceAccountName"]
        .as_str()
        .context("the operator runs under its own ServiceAccount")?;
    env.kubectl(&["-n", ns, "create", "serviceaccount", account], None)?;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "operator", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    });
    env.kubectl(
        &["-n", ns, "create", "--dry-run=server", "-f", "-"],
        Some(&pod.to_string()),
    )
    .context("the chart's operator pod is refused")?;

    // Worker pods are created by the StatefulSet controller, admitted, and run.
    let (input, output) = (
        space.topic("restricted-in", 2)?,
        space.topic("restricted-out", 1)?,
    );
    produce_counts(&input, 200, 10)?;
    env.apply(ns, &app_yaml("locked", 1, &env.bs, &input, &output, ""))?;
    wait_until(WAIT, || counted(&output, 10, 20)).with_context(|| {
        format!(
            "{}\n{}",
            env.get(ns, "events", "{.items[*].message}"),
            env.logs()
        )
    })?;
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn apps_of_one_name_in_two_namespaces_run_on_their_own_topics() -> Result<()> {
    let env = env()?;
    let spaces = [Namespace::new(env, &[])?, Namespace::new(env, &[])?];
    let input = spaces[0].topic("twin-in", 2)?;
    produce_counts(&input, 200, 10)?;
    let outputs = [
        spaces[0].topic("twin-a-out", 1)?,
        spaces[1].topic("twin-b-out", 1)?,
    ];
    // Exactly-once: two apps sharing an id would also share transactional ids and fence
    // each other.
    for (space, output) in spaces.iter().zip(&outputs) {
        env.apply(
            &space.name,
            &app_yaml(
                "twin",
                1,
                &env.bs,
                &input,
                output,
                "  processingGuarantee: exactly_once\n  cleanupPolicy: Delete\n",
            ),
        )?;
    }
    for output in &outputs {
        wait_until(WAIT, || counted(output, 10, 20)).with_context(|| env.logs())?;
    }
    for space in &spaces {
        let changelog = format!("{}.twin-counts-changelog", space.name);
        ensure!(
            topics_with_prefix(&changelog)? == [changelog.clone()],
            "no changelog {changelog}"
        );
    }
    ensure!(
        topics_with_prefix("twin-counts")?.is_empty(),
        "a topic named after the bare app name exists"
    );
    for space in &spaces {
        env.delete_apps(&space.name)?;
    }
    Ok(())
}

#[test]
fn an_application_id_used_twice_is_refused_for_the_newer_app() -> Result<()> {
    let env = env()?;
    let (first_space, second_space) = (Namespace::new(env, &[])?, Namespace::new(env, &[])?);
    let (first_ns, second_ns) = (first_space.name.as_str(), second_space.name.as_str());
    let id = unique("shared-id");
    first_space.owns_topics(&format!("{id}-"));
    let input = first_space.topic("shared-in", 2)?;
    let outputs = [
        first_space.topic("first-out", 1)?,
        second_space.topic("second-out", 1)?,
    ];
    produce_counts(&input, 100, 10)?;
    let extra = format!("  applicationId: {id}\n  cleanupPolicy: Delete\n");
    env.apply(
        first_ns,
        &app_yaml("first", 1, &env.bs, &input, &outputs[0], &extra),
    )?;
    wait_until(WAIT, || counted(&outputs[0], 10, 10)).with_context(|| env.logs())?;

    env.apply(
        second_ns,
        &app_yaml("second", 1, &env.bs, &input, &outputs[1], &extra),
    )?;
    let message = env.wait_degraded(second_ns, "second", "ApplicationIdConflict")?;
    ensure!(
        message.contains(&format!("{first_ns}/first")) && message.contains(&id),
        "{message}"
    );
    ensure!(
        env.get(second_ns, "statefulset/second", "{.metadata.name}")
            .is_empty(),
        "the refused app got workers"
    );

    // The first app keeps running, also after the refused one is deleted: with
    // cleanupPolicy Delete it must not take the first app's topics along.
    env.delete_apps(second_ns)?;
    produce_counts(&input, 100, 10)?;
    wait_until(WAIT, || counted(&outputs[0], 10, 20)).with_context(|| env.logs())?;
    ensure!(
        !topics_with_prefix(&format!("{id}-counts-changelog"))?.is_empty(),
        "the first app's changelog was deleted"
    );
    ensure!(
        env.degraded(first_ns, "first").0 == "False",
        "the first app: {:?}",
        env.degraded(first_ns, "first")
    );
    ensure!(
        latest_by_key(&outputs[1])?.is_empty(),
        "the refused app wrote output"
    );
    env.delete_apps(first_ns)?;
    wait_until(WAIT, || {
        Ok(topics_with_prefix(&format!("{id}-"))?.is_empty())
    })?;
    Ok(())
}

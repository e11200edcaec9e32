//! `pod-runner`: the scheduler and kubelet of eddy's local end-to-end control plane
//! (`e2e/k8s/cluster.sh`, which has neither). It registers one Node, binds every unscheduled
//! Pod to it and runs each bound Pod's first container as a local process — always the
//! `--worker-bin` program (the image is ignored) with the container's `args` — rewriting what
//! a real pod would get from its own filesystem and network so that many pods share one
//! machine:
//!
//! - volumes become host dirs: `configMap`/`secret`/`projected`/`downwardAPI`/`emptyDir` under
//!   `ROOT/pods/<ns>/<pod>/volumes/<volume>/`, a `persistentVolumeClaim` under
//!   `ROOT/pvcs/<ns>/<claim>/` (kept until the PVC object is deleted), and every env var whose
//!   value starts with a `mountPath` is rewritten to the host dir;
//! - `EDDY_HTTP_ADDR` becomes `127.0.0.1:<free port>`, written to `ROOT/pods/<ns>/<pod>/http`
//!   and to the pod's annotation `e2e.eddy.dev/http-addr` (so tests, and a Prometheus
//!   discovering pods through the API server, can scrape a pod's metrics); the readiness
//!   probe's `httpGet` goes there (every second) and drives the `Ready` condition;
//! - `EDDY_QUERY_ADDR` (the query API) becomes `127.0.0.1:<free port>` too, also set as
//!   `EDDY_QUERY_ADVERTISED_ADDR` (where other workers forward queries, which
//!   `EDDY_QUERY_PEERS=reported` makes them use instead of the pods' names) and written to
//!   the annotation `e2e.eddy.dev/query-addr`;
//! - `KUBECONFIG` points at a kubeconfig holding a token of the pod's ServiceAccount (so the
//!   process has exactly the pod's RBAC), and `EDDY_POD_RUNNER=1` is set; its server is a
//!   per-pod TCP relay to the API server, which a test cuts by writing `cut` into
//!   `ROOT/pods/<ns>/<pod>/api-link` (and heals by removing it): from then on it forwards
//!   nothing and holds its connections open, as a network partition between the pod and the
//!   API server would, while the pod still reaches Kafka; healed, it closes what it held so
//!   clients reconnect;
//! - the process id goes to `ROOT/pods/<ns>/<pod>/pid` (a test may freeze it with SIGSTOP);
//! - stdout and stderr are appended to `ROOT/pods/<ns>/<pod>/log`;
//! - `securityContext` (pod and container) is not applied: the process runs as the runner's
//!   own user, also when that is root and the pod asks for `runAsUser`/`runAsNonRoot`, and the
//!   "root filesystem" is the host's. Admission (the API server's PodSecurity plugin) has
//!   already checked the pod; switching users would need the worker binary, the pod dirs and
//!   the PVC dirs readable and writable by that user (and `fsGroup` emulated), which proves
//!   nothing more about eddy. Only the first container runs: sidecars and init containers
//!   are ignored.
//!
//! Exited processes are restarted per `restartPolicy` (with a back-off), a deleted pod's
//! process gets SIGTERM, then SIGKILL after its grace period (capped at 30 s), then the pod
//! object is removed for good, as a kubelet does. SIGTERM/SIGINT stop every process and exit 0.
//!
//! ```text
//! pod-runner --kubeconfig PATH --node NAME --root DIR [--worker-bin PATH]
//! ```
//!
//! Logs go to stderr; `POD_RUNNER_LOG` (an `EnvFilter`, default `info`) sets the level.

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, Node, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use kube::runtime::watcher::Event;
use kube::{Client, Config, ResourceExt as _};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

/// The longest a pod's process gets between SIGTERM and SIGKILL.
const MAX_GRACE: i64 = 30;
/// How often the node's Ready condition and Lease are renewed.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// Longest back-off between restarts of a failing container.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Lifetime of the ServiceAccount tokens handed to processes.
const TOKEN_SECONDS: i64 = 24 * 3600;
const FIELD_MANAGER: &str = "pod-runner";

#[derive(Parser, Debug)]
#[command(about = "Schedules and runs the pods of a local, kubelet-less Kubernetes control plane")]
struct Args {
    /// Kubeconfig of the cluster (an admin: it creates tokens, binds pods, patches statuses).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Name of the Node to register and bind pods to.
    #[arg(long)]
    node: String,
    /// Directory for pod dirs, logs and PVC contents.
    #[arg(long)]
    root: PathBuf,
    /// Program every container runs (default: `eddy-worker` next to this executable).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POD_RUNNER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What every pod's supervisor shares.
struct Runner {
    client: Client,
    node: String,
    root: PathBuf,
    worker_bin: PathBuf,
    /// API server URL and CA (`certificate-authority-data` or a file) for the pods' kubeconfigs.
    server: String,
    ca: (&'static str, String),
}

async fn run(args: Args) -> Result<()> {
    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("creating {}", args.root.display()))?;
    let root = std::fs::canonicalize(&args.root)?;
    let worker_bin = match args.worker_bin {
        Some(p) => std::path::absolute(p)?,
        None => std::env::current_exe()?
            .parent()
            .context("executable has no parent dir")?
            .join("eddy-worker"),
    };
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let (server, ca) = cluster_of(&kubeconfig, &args.kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let rt = Arc::new(Runner {
        client,
        node: args.node,
        root,
        worker_bin,
        server,
        ca,
    });
    info!(node = %rt.node, root = %rt.root.display(), worker = %rt.worker_bin.display(), "starting");

    rt.heartbeat().await.context("registering the node")?;
    let heartbeat = tokio::spawn({
        let rt = rt.clone();
        async move {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                if let Err(e) = rt.heartbeat().await {
                    warn!("node heartbeat: {e:#}");
                }
            }
        }
    });
    let pvcs = tokio::spawn(watch_pvcs(rt.clone()));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut pods: HashMap<String, (mpsc::UnboundedSender<Msg>, JoinHandle<()>)> = HashMap::new();
    let mut listed = HashSet::new();
    let stream = watcher(
        Api::<Pod>::all(rt.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut result = Ok(());
    loop {
        let event = tokio::select! {
            _ = term.recv() => { info!("SIGTERM"); break; }
            _ = tokio::signal::ctrl_c() => { info!("SIGINT"); break; }
            event = stream.next() => event,
        };
        pods.retain(|_, (_, task)| !task.is_finished());
        match event {
            None => {
                result = Err(anyhow!("the pod watch ended"));
                break;
            }
            Some(Err(e)) => warn!("pod watch: {e}"),
            Some(Ok(Event::Init)) => listed.clear(),
            Some(Ok(Event::InitApply(pod))) => {
                listed.insert(pod.uid().unwrap_or_default());
                rt.on_pod(pod, &mut pods).await;
            }
            Some(Ok(Event::InitDone)) => {
                for (uid, (tx, _)) in &pods {
                    if !listed.contains(uid) {
                        let _ = tx.send(Msg::Gone);
                    }
                }
            }
            Some(Ok(Event::Apply(pod))) => rt.on_pod(pod, &mut pods).await,
            Some(Ok(Event::Delete(pod))) => {
                if let Some((tx, _)) = pods.get(&pod.uid().unwrap_or_default()) {
                    let _ = tx.send(Msg::Gone);
                }
            }
        }
    }

    heartbeat.abort();
    pvcs.abort();
    pods.retain(|_, (_, task)| !task.is_finished());
    info!("stopping {} pod(s)", pods.len());
    for (tx, _) in pods.values() {
        let _ = tx.send(Msg::Shutdown);
    }
    let all = futures::future::join_all(pods.into_values().map(|(_, task)| task));
    if tokio::time::timeout(Duration::from_secs(MAX_GRACE as u64 + 10), all)
        .await
        .is_err()
    {
        warn!("some pods did not stop in time");
    }
    info!("stopped");
    result
}

/// Server URL and CA of the kubeconfig's current context.
fn cluster_of(kc: &Kubeconfig, path: &Path) -> Result<(String, (&'static str, String))> {
    let ctx_name = kc
        .current_context
        .as_deref()
        .context("kubeconfig has no current-context")?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .with_context(|| format!("kubeconfig has no context {ctx_name}"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .with_context(|| format!("kubeconfig has no cluster {}", ctx.cluster))?;
    let server = cluster
        .server
        .clone()
        .context("kubeconfig cluster has no server")?;
    let ca = if let Some(data) = &cluster.certificate_authority_data {
        ("certificate-authority-data", data.clone())
    } else if let Some(file) = &cluster.certificate_authority {
        let dir = path.parent().unwrap_or(Path::new("."));
        let file = std::path::absolute(dir.join(file))?;
        ("certificate-authority", file.display().to_string())
    } else {
        ("insecure-skip-tls-verify", String::new())
    };
    Ok((server, ca))
}

fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Runner {
    /// Creates (or adopts) the Node, marks it Ready and renews its Lease.
    async fn heartbeat(&self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = match nodes.get_opt(&self.node).await? {
            Some(n) => n,
            None => {
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": self.node, "labels": {
                        "kubernetes.io/hostname": self.node,
                        "kubernetes.io/os": "linux",
                        "eddy.dev/pod-runner": "true",
                    }},
                }))?;
                info!(node = %self.node, "registering the node");
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(n) => n,
                    Err(e) if is_status(&e, 409) => nodes.get(&self.node).await?,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let ts = now();
        let resources =
            json!({"cpu": "32", "memory": "128Gi", "pods": "1000", "ephemeral-storage": "100Gi"});
        let cond = |type_: &str, status: &str, reason: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": reason,
                   "lastHeartbeatTime": ts, "lastTransitionTime": ts})
        };
        // Keep each condition's lastTransitionTime while its status stays the same.
        let mut conditions = vec![
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ];
        let old = node.status.as_ref().and_then(|s| s.conditions.as_ref());
        for c in &mut conditions {
            let same = old
                .and_then(|o| o.iter().find(|o| o.type_ == c["type"]))
                .filter(|o| o.status == c["status"]);
            if let Some(t) = same.and_then(|o| o.last_transition_time.as_ref()) {
                c["lastTransitionTime"] = serde_json::to_value(t)?;
            }
        }
        let status = json!({"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.node}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "architecture": std::env::consts::ARCH, "operatingSystem": "linux",
                "osImage": "eddy pod-runner", "kernelVersion": "", "bootID": "", "machineID": "",
                "systemUUID": "", "containerRuntimeVersion": "pod-runner://0",
                "kubeletVersion": "v0.0.0-pod-runner", "kubeProxyVersion": "",
            },
        }});
        nodes
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .context("patching the node status")?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), "kube-node-lease");
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.node, "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                     "uid": node.uid().unwrap_or_default()}]},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                     "renewTime": serde_json::to_value(MicroTime(Timestamp::now()))?},
        });
        leases
            .patch(
                &self.node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
            .context("renewing the node lease")?;
        Ok(())
    }

    /// One pod event: binds it, or hands it to its supervisor (started on first sight).
    async fn on_pod(
        self: &Arc<Self>,
        pod: Pod,
        pods: &mut HashMap<String, (mpsc::UnboundedSender<Msg>, JoinHandle<()>)>,
    ) {
        let (ns, name, uid) = (
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid(),
        );
        let Some(uid) = uid else { return };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        match node {
            None if pod.metadata.deletion_timestamp.is_none() => {
                let binding = json!({
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns, "uid": uid},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                });
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                match api
                    .create_subresource::<_, Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await
                {
                    Ok(_) => info!(pod = %format!("{ns}/{name}"), "bound"),
                    Err(e) if is_status(&e, 409) => debug!("binding {ns}/{name}: {e}"),
                    Err(e) => warn!("binding {ns}/{name}: {e}"),
                }
            }
            Some(n) if n == self.node => {
                if let Some((tx, _)) = pods.get(&uid) {
                    let _ = tx.send(Msg::Update(Box::new(pod)));
                } else {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let sup = Supervisor::new(self.clone(), pod);
                    pods.insert(uid, (tx, tokio::spawn(sup.run(rx))));
                }
            }
            _ => {}
        }
    }
}

/// Removes a PVC's host dir once the PVC object is gone (and, at each (re)list, the dirs of
/// PVCs that no longer exist).
async fn watch_pvcs(rt: Arc<Runner>) {
    let base = rt.root.join("pvcs");
    let mut listed = HashSet::new();
    let stream = watcher(
        Api::<PersistentVolumeClaim>::all(rt.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Err(e) => warn!("pvc watch: {e}"),
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(pvc)) => {
                listed.insert(
                    base.join(pvc.namespace().unwrap_or_default())
                        .join(pvc.name_any()),
                );
            }
            Ok(Event::InitDone) => {
                let Ok(namespaces) = std::fs::read_dir(&base) else {
                    continue;
                };
                for dir in namespaces
                    .flatten()
                    .filter_map(|ns| std::fs::read_dir(ns.path()).ok())
                {
                    for claim in dir.flatten().map(|c| c.path()) {
                        if !listed.contains(&claim) {
                            info!(dir = %claim.display(), "removing the dir of a deleted PVC");
                            let _ = std::fs::remove_dir_all(&claim);
                        }
                    }
                }
            }
            Ok(Event::Apply(_)) => {}
            Ok(Event::Delete(pvc)) => {
                let dir = base
                    .join(pvc.namespace().unwrap_or_default())
                    .join(pvc.name_any());
                if dir.exists() {
                    info!(dir = %dir.display(), "PVC deleted, removing its dir");
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        warn!("removing {}: {e}", dir.display());
                    }
                }
            }
        }
    }
}

enum Msg {
    /// The pod changed (status, deletionTimestamp, ...).
    Update(Box<Pod>),
    /// The pod object is gone: stop its process.
    Gone,
    /// The runner stops: stop the process, leave the pod object alone.
    Shutdown,
}

/// One pod: its process, restarts, probes and status.
struct Supervisor {
    rt: Arc<Runner>,
    pod: Pod,
    ns: String,
    name: String,
    uid: String,
    dir: PathBuf,
    start_time: Value,
    child: Option<Child>,
    /// When the current process started (API time, and for the back-off reset).
    started: Option<(Value, Instant)>,
    /// Where the readiness probe goes: port and path (`None`: ready while running).
    probe: Option<Probe>,
    /// Consecutive probe successes (> 0) or failures (< 0).
    probe_streak: i32,
    ready: bool,
    restart_count: i32,
    /// Why the container is not running: (reason, message).
    waiting: Option<(String, String)>,
    last_terminated: Option<Value>,
    /// The pod is done for good (restartPolicy allowed no restart): Succeeded or Failed.
    finished: Option<&'static str>,
    /// Pod condition type → (status, lastTransitionTime).
    transitions: HashMap<&'static str, (bool, Value)>,
    /// The last status sent, and whether the pod changed since (then it is sent again).
    sent: Option<Value>,
    dirty: bool,
    /// The relay between the pod's processes and the API server (see the module doc), with
    /// the port it listens on: started with the first process, stopped with the supervisor.
    api_link: Option<(u16, JoinHandle<()>)>,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some((_, relay)) = self.api_link.take() {
            relay.abort();
        }
    }
}

impl Supervisor {
    fn new(rt: Arc<Runner>, pod: Pod) -> Self {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let dir = rt.root.join("pods").join(&ns).join(&name);
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or_else(now);
        let finished = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Some("Succeeded"),
            Some("Failed") => Some("Failed"),
            _ => None,
        };
        Supervisor {
            restart_count: pod_restarts(&pod),
            uid: pod.uid().unwrap_or_default(),
            rt,
            pod,
            ns,
            name,
            dir,
            start_time,
            child: None,
            started: None,
            probe: None,
            probe_streak: 0,
            ready: false,
            waiting: Some(("ContainerCreating".into(), String::new())),
            last_terminated: None,
            finished,
            transitions: HashMap::new(),
            sent: None,
            dirty: true,
            api_link: None,
        }
    }

    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    /// The container that runs: the first one (eddy's `worker`); see the module doc for
    /// what is not emulated (other containers, securityContext).
    fn container(&self) -> Result<&Container> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .context("pod has no containers")
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let id = format!("{}/{}", self.ns, self.name);
        info!(pod = %id, uid = %self.uid, "pod assigned");
        let mut backoff = Duration::from_secs(1);
        let mut next_start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.deleting() {
                self.stop().await;
                self.delete().await;
                return;
            }
            if self.child.is_none()
                && self.finished.is_none()
                && Instant::now() >= next_start
                && let Err((reason, e)) = self.start().await
            {
                warn!(pod = %id, "{reason}: {e:#}");
                self.waiting = Some((reason.into(), format!("{e:#}")));
                next_start = Instant::now() + backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            self.report().await;
            tokio::select! {
                status = wait(&mut self.child) => {
                    self.exited(status);
                    let ran = self.started.as_ref().map(|(_, t)| t.elapsed()).unwrap_or_default();
                    if ran >= Duration::from_secs(10) {
                        backoff = Duration::from_secs(1);
                    }
                    if self.finished.is_none() {
                        self.waiting = Some(("CrashLoopBackOff".into(),
                            format!("back-off {}s restarting failed container", backoff.as_secs())));
                        next_start = Instant::now() + backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                _ = tick.tick() => {
                    if self.child.is_some() {
                        self.probe().await;
                    }
                }
                msg = rx.recv() => match msg {
                    Some(Msg::Update(pod)) => {
                        self.pod = *pod;
                        self.dirty = true;
                    }
                    Some(Msg::Gone) | None => {
                        info!(pod = %id, "pod object gone");
                        self.stop().await;
                        self.cleanup();
                        return;
                    }
                    Some(Msg::Shutdown) => {
                        self.stop().await;
                        return;
                    }
                }
            }
        }
    }

    /// Prepares volumes, environment and credentials and starts the process.
    async fn start(&mut self) -> std::result::Result<(), (&'static str, anyhow::Error)> {
        let config_err = |e| ("CreateContainerConfigError", e);
        let container = self.container().map_err(config_err)?.clone();
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| config_err(anyhow!("creating {}: {e}", self.dir.display())))?;
        let mounts = self.volumes(&container).await.map_err(config_err)?;
        let mut env = self.env(&container).await.map_err(config_err)?;
        for (_, value) in env.iter_mut() {
            if let Some(v) = rewrite_path(value, &mounts) {
                *value = v;
            }
        }
        // The HTTP listener moves to a free loopback port; the readiness probe follows it.
        let mut http = None;
        if let Some((_, addr)) = env.iter_mut().find(|(k, _)| k == "EDDY_HTTP_ADDR") {
            let port = eddy_e2e::free_port().map_err(config_err)?;
            http = Some((
                addr.rsplit(':').next().and_then(|p| p.parse::<i32>().ok()),
                port,
            ));
            *addr = format!("127.0.0.1:{port}");
            std::fs::write(self.dir.join("http"), addr.as_bytes()).map_err(|e| {
                config_err(anyhow!("writing {}: {e}", self.dir.join("http").display()))
            })?;
            // For a Prometheus discovering pods through the API server: the pod's IP and
            // container port say 127.0.0.1:9090, which is not where it listens.
            let api: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.ns);
            let patch = json!({"metadata": {"uid": self.uid,
                "annotations": {eddy_e2e::k8s::POD_HTTP_ANNOTATION: addr.as_str()}}});
            if let Err(e) = api
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                warn!(pod = %format!("{}/{}", self.ns, self.name), "annotating the HTTP address: {e}");
            }
        }
        self.probe = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|get| {
                let port = match &get.port {
                    IntOrString::Int(p) => Some(*p),
                    IntOrString::String(name) => container
                        .ports
                        .iter()
                        .flatten()
                        .find(|p| p.name.as_deref() == Some(name))
                        .map(|p| p.container_port),
                };
                let port = match (http, port) {
                    (Some((orig, new)), p) if orig == p || p.is_none() => new,
                    (_, Some(p)) => u16::try_from(p).unwrap_or(0),
                    (_, None) => 0,
                };
                let p = container.readiness_probe.as_ref();
                Probe {
                    port,
                    path: get.path.clone().unwrap_or_else(|| "/".into()),
                    timeout: p.and_then(|p| p.timeout_seconds).unwrap_or(1).max(1),
                    success_threshold: p.and_then(|p| p.success_threshold).unwrap_or(1).max(1),
                    failure_threshold: p.and_then(|p| p.failure_threshold).unwrap_or(3).max(1),
                }
            });
        // The query API too; other workers reach it at the same loopback address.
        if let Some((_, addr)) = env.iter_mut().find(|(k, _)| k == "EDDY_QUERY_ADDR") {
            let port = eddy_e2e::free_port().map_err(config_err)?;
            *addr = format!("127.0.0.1:{port}");
            let advertised = addr.clone();
            env.retain(|(k, _)| k != "EDDY_QUERY_ADVERTISED_ADDR" && k != "EDDY_QUERY_PEERS");
            env.push(("EDDY_QUERY_ADVERTISED_ADDR".into(), advertised.clone()));
            // No pod names resolve here: the workers forward to the addresses they report.
            env.push(("EDDY_QUERY_PEERS".into(), "reported".into()));
            let api: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.ns);
            let patch = json!({"metadata": {"uid": self.uid,
                "annotations": {eddy_e2e::k8s::POD_QUERY_ANNOTATION: advertised}}});
            if let Err(e) = api
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                warn!(pod = %format!("{}/{}", self.ns, self.name), "annotating the query address: {e}");
            }
        }
        let kubeconfig = self.kubeconfig().await.map_err(config_err)?;
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        env.push(("EDDY_POD_RUNNER".into(), "1".into()));
        env.push(("HOSTNAME".into(), self.name.clone()));

        let log_path = self.dir.join("log");
        let run_err = |e| ("RunContainerError", e);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| run_err(anyhow!("opening {}: {e}", log_path.display())))?;
        let args = container.args.clone().unwrap_or_default();
        use std::io::Write as _;
        let _ = writeln!(
            log,
            "--- pod-runner: {} {} {}",
            Timestamp::now(),
            self.rt.worker_bin.display(),
            args.join(" ")
        );
        let mut cmd = Command::new(&self.rt.worker_bin);
        cmd.args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| run_err(e.into()))?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        // Nothing of the runner's own pod-ish environment leaks into the process.
        for (k, _) in std::env::vars_os() {
            let k_ = k.to_string_lossy();
            if k_.starts_with("EDDY_") || k_.starts_with("KUBERNETES_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe; the process dies with the runner's thread.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| run_err(anyhow!("starting {}: {e}", self.rt.worker_bin.display())))?;
        if self.started.is_some() {
            self.restart_count += 1;
        }
        let pid = child.id().unwrap_or(0);
        info!(pod = %format!("{}/{}", self.ns, self.name), pid, restarts = self.restart_count, "started");
        if let Err(e) = std::fs::write(self.dir.join("pid"), pid.to_string()) {
            warn!(pod = %format!("{}/{}", self.ns, self.name), "writing its pid: {e}");
        }
        self.child = Some(child);
        self.started = Some((now(), Instant::now()));
        self.waiting = None;
        self.ready = false;
        self.probe_streak = 0;
        Ok(())
    }

    /// One readiness probe (every second, whatever the probe's periodSeconds): Ready after
    /// successThreshold successes in a row, not Ready after failureThreshold failures.
    async fn probe(&mut self) {
        let Some(p) = &self.probe else {
            self.ready = true;
            return;
        };
        let timeout = Duration::from_secs(p.timeout.unsigned_abs().into());
        if http_ok(p.port, &p.path, timeout).await {
            self.probe_streak = self.probe_streak.max(0) + 1;
            if self.probe_streak >= p.success_threshold {
                self.ready = true;
            }
        } else {
            self.probe_streak = self.probe_streak.min(0) - 1;
            if -self.probe_streak >= p.failure_threshold {
                self.ready = false;
            }
        }
    }

    /// The process exited: record it, decide per restartPolicy whether the pod is done.
    fn exited(&mut self, status: std::io::Result<ExitStatus>) {
        self.child = None;
        self.ready = false;
        let (code, signal) = match &status {
            Ok(s) => (
                s.code()
                    .unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(s).unwrap_or(0)),
                std::os::unix::process::ExitStatusExt::signal(s),
            ),
            Err(_) => (-1, None),
        };
        info!(pod = %format!("{}/{}", self.ns, self.name), code, ?signal, "process exited");
        self.last_terminated = Some(json!({
            "exitCode": code,
            "signal": signal,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": self.started.as_ref().map(|(t, _)| t.clone()),
            "finishedAt": now(),
        }));
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always");
        let restart = match policy {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => true,
        };
        if !restart {
            self.finished = Some(if code == 0 { "Succeeded" } else { "Failed" });
        }
    }

    /// Host dirs of the container's volume mounts: (mountPath, host path).
    async fn volumes(&self, container: &Container) -> Result<Vec<(String, PathBuf)>> {
        let volumes = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let mut mounts = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let v = volumes
                .iter()
                .find(|v| v.name == m.name)
                .with_context(|| format!("volumeMount {}: no such volume", m.name))?;
            let pod_dir = self.dir.join("volumes").join(&v.name);
            let host = if let Some(claim) = &v.persistent_volume_claim {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.rt.client.clone(), &self.ns);
                if api.get_opt(&claim.claim_name).await?.is_none() {
                    bail!("persistentvolumeclaim \"{}\" not found", claim.claim_name);
                }
                self.rt
                    .root
                    .join("pvcs")
                    .join(&self.ns)
                    .join(&claim.claim_name)
            } else if let Some(host_path) = &v.host_path {
                PathBuf::from(&host_path.path)
            } else {
                let mut files = BTreeMap::new();
                if let Some(cm) = &v.config_map {
                    self.add_files(
                        &mut files,
                        false,
                        &cm.name,
                        cm.items.as_deref(),
                        cm.optional,
                    )
                    .await?;
                } else if let Some(s) = &v.secret {
                    let name = s.secret_name.clone().unwrap_or_default();
                    self.add_files(&mut files, true, &name, s.items.as_deref(), s.optional)
                        .await?;
                } else if let Some(d) = &v.downward_api {
                    for item in d.items.iter().flatten() {
                        if let Some(f) = &item.field_ref {
                            files
                                .insert(item.path.clone(), self.field(&f.field_path)?.into_bytes());
                        }
                    }
                } else if let Some(p) = &v.projected {
                    for s in p.sources.iter().flatten() {
                        if let Some(cm) = &s.config_map {
                            self.add_files(
                                &mut files,
                                false,
                                &cm.name,
                                cm.items.as_deref(),
                                cm.optional,
                            )
                            .await?;
                        }
                        if let Some(sec) = &s.secret {
                            self.add_files(
                                &mut files,
                                true,
                                &sec.name,
                                sec.items.as_deref(),
                                sec.optional,
                            )
                            .await?;
                        }
                        for item in s.downward_api.iter().flat_map(|d| d.items.iter().flatten()) {
                            if let Some(f) = &item.field_ref {
                                files.insert(
                                    item.path.clone(),
                                    self.field(&f.field_path)?.into_bytes(),
                                );
                            }
                        }
                        if let Some(t) = &s.service_account_token {
                            let audiences = t.audience.clone().map(|a| vec![a]);
                            let token = self.token(audiences).await?;
                            files.insert(t.path.clone(), token.into_bytes());
                        }
                    }
                } else if v.empty_dir.is_none() {
                    warn!(pod = %self.name, volume = %v.name, "unsupported volume type, using an empty dir");
                }
                // emptyDir keeps its contents across restarts; the others are rewritten.
                if v.empty_dir.is_none() {
                    let _ = std::fs::remove_dir_all(&pod_dir);
                }
                for (path, data) in files {
                    let file = pod_dir.join(&path);
                    std::fs::create_dir_all(file.parent().unwrap_or(&pod_dir))?;
                    std::fs::write(&file, data)
                        .with_context(|| format!("writing {}", file.display()))?;
                }
                pod_dir
            };
            std::fs::create_dir_all(&host)
                .with_context(|| format!("creating {}", host.display()))?;
            let host = match &m.sub_path {
                Some(sub) if !sub.is_empty() => host.join(sub),
                _ => host,
            };
            mounts.push((m.mount_path.clone(), host));
        }
        Ok(mounts)
    }

    /// Adds the keys of a ConfigMap or Secret (all of them, or `items`) as files.
    async fn add_files(
        &self,
        files: &mut BTreeMap<String, Vec<u8>>,
        secret: bool,
        name: &str,
        items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
        optional: Option<bool>,
    ) -> Result<()> {
        let Some(data) = self.data(secret, name, optional).await? else {
            return Ok(());
        };
        match items {
            Some(items) => {
                for i in items {
                    let v = data
                        .get(&i.key)
                        .with_context(|| format!("key {} not in {} {name}", i.key, kind(secret)))?;
                    files.insert(i.path.clone(), v.clone());
                }
            }
            None => files.extend(data),
        }
        Ok(())
    }

    /// The data of a ConfigMap or Secret in the pod's namespace (`None`: missing and optional).
    async fn data(
        &self,
        secret: bool,
        name: &str,
        optional: Option<bool>,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
        let client = self.rt.client.clone();
        let data = if secret {
            Api::<Secret>::namespaced(client, &self.ns)
                .get_opt(name)
                .await?
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect()
                })
        } else {
            Api::<ConfigMap>::namespaced(client, &self.ns)
                .get_opt(name)
                .await?
                .map(|c| {
                    let mut m: BTreeMap<String, Vec<u8>> = c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    m.extend(
                        c.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    m
                })
        };
        match data {
            None if optional != Some(true) => bail!("{} \"{name}\" not found", kind(secret)),
            d => Ok(d),
        }
    }

    /// The container's environment (`envFrom`, then `env`), before rewrites.
    async fn env(&self, container: &Container) -> Result<Vec<(String, String)>> {
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(e, _)| *e != k);
            env.push((k, v));
        };
        for from in container.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            let data = if let Some(r) = &from.config_map_ref {
                self.data(false, &r.name, r.optional).await?
            } else if let Some(r) = &from.secret_ref {
                self.data(true, &r.name, r.optional).await?
            } else {
                None
            };
            for (k, v) in data.unwrap_or_default() {
                set(
                    &mut env,
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v).into(),
                );
            }
        }
        for EnvVar {
            name,
            value,
            value_from,
        } in container.env.iter().flatten()
        {
            let value = match value_from {
                None => Some(expand(value.as_deref().unwrap_or_default(), &env)),
                Some(from) => {
                    if let Some(f) = &from.field_ref {
                        Some(self.field(&f.field_path)?)
                    } else if let Some(r) = &from.config_map_key_ref {
                        self.key(false, &r.name, &r.key, r.optional).await?
                    } else if let Some(r) = &from.secret_key_ref {
                        self.key(true, &r.name, &r.key, r.optional).await?
                    } else {
                        warn!(pod = %self.name, env = %name, "unsupported valueFrom, not set");
                        None
                    }
                }
            };
            if let Some(v) = value {
                set(&mut env, name.clone(), v);
            }
        }
        Ok(env)
    }

    async fn key(
        &self,
        secret: bool,
        name: &str,
        key: &str,
        optional: Option<bool>,
    ) -> Result<Option<String>> {
        let data = self.data(secret, name, optional).await?.unwrap_or_default();
        match data.get(key) {
            Some(v) => Ok(Some(String::from_utf8_lossy(v).into())),
            None if optional == Some(true) => Ok(None),
            None => bail!("key {key} not in {} {name}", kind(secret)),
        }
    }

    /// A downward-API field of the pod.
    fn field(&self, path: &str) -> Result<String> {
        let meta = &self.pod.metadata;
        let spec = self.pod.spec.as_ref();
        let from_map = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
            let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
            Some(
                map.as_ref()
                    .and_then(|m| m.get(key))
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.ns.clone(),
            "metadata.uid" => self.uid.clone(),
            "spec.nodeName" => self.rt.node.clone(),
            "spec.serviceAccountName" => spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            "status.podIP" | "status.hostIP" | "status.podIPs" | "status.hostIPs" => {
                "127.0.0.1".into()
            }
            _ => from_map(&meta.labels, "metadata.labels['")
                .or_else(|| from_map(&meta.annotations, "metadata.annotations['"))
                .with_context(|| format!("unsupported fieldRef {path}"))?,
        })
    }

    /// A token of the pod's ServiceAccount, bound to the pod.
    async fn token(&self, audiences: Option<Vec<String>>) -> Result<String> {
        let sa = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences,
                expiration_seconds: Some(TOKEN_SECONDS),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.name.clone()),
                    uid: Some(self.uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.rt.client.clone(), &self.ns);
        let resp = api
            .create_token_request(&sa, &PostParams::default(), &req)
            .await
            .with_context(|| format!("requesting a token of serviceaccount {}/{sa}", self.ns))?;
        resp.status
            .and_then(|s| s.token)
            .context("TokenRequest returned no token")
    }

    /// Writes the pod's kubeconfig (the cluster through the pod's relay, a token of its
    /// ServiceAccount).
    async fn kubeconfig(&mut self) -> Result<PathBuf> {
        let token = self.token(None).await?;
        let (scheme, authority) = self
            .rt
            .server
            .split_once("://")
            .context("the API server URL has no scheme")?;
        let authority = authority.trim_end_matches('/').to_string();
        let port = match &self.api_link {
            Some((port, _)) => *port,
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let port = listener.local_addr()?.port();
                let relay = tokio::spawn(api_link(
                    listener,
                    authority.clone(),
                    self.dir.join("api-link"),
                ));
                self.api_link = Some((port, relay));
                port
            }
        };
        let host = authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h);
        let server = format!("{scheme}://{host}:{port}");
        let (ca_key, ca) = &self.rt.ca;
        let mut cluster = json!({"server": server});
        cluster[*ca_key] = if *ca_key == "insecure-skip-tls-verify" {
            json!(true)
        } else {
            json!(ca)
        };
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod", "namespace": self.ns}}],
            "current-context": "pod",
        });
        let path = self.dir.join("kubeconfig");
        let tmp = self.dir.join("kubeconfig.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&kc)?)?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Sends the pod status if it changed (or the pod object did: someone else may have
    /// patched it).
    async fn report(&mut self) {
        let status = self.status();
        if !self.dirty && self.sent.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.ns);
        let patch = json!({"metadata": {"uid": self.uid}, "status": status});
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.sent = Some(status);
                self.dirty = false;
            }
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => self.dirty = false,
            Err(e) => {
                warn!(pod = %format!("{}/{}", self.ns, self.name), "patching the status: {e}")
            }
        }
    }

    fn status(&mut self) -> Value {
        let running = self.child.is_some();
        let ready = running && self.ready;
        let state = if let Some((t, _)) = self.started.as_ref().filter(|_| running) {
            json!({"running": {"startedAt": t}})
        } else if let (Some(_), Some(t)) = (self.finished, &self.last_terminated) {
            json!({"terminated": t})
        } else {
            let (reason, message) = self.waiting.clone().unwrap_or_default();
            json!({"waiting": {"reason": reason, "message": message}})
        };
        let last_state = match &self.last_terminated {
            Some(t) if self.finished.is_none() => json!({"terminated": t}),
            _ => json!({}),
        };
        let container = self.container().ok();
        let container_status = json!({
            "name": container.map(|c| c.name.clone()).unwrap_or_default(),
            "image": container.and_then(|c| c.image.clone()).unwrap_or_default(),
            "imageID": "",
            "containerID": self.child.as_ref().and_then(|c| c.id()).map(|p| format!("pod-runner://{p}")),
            "ready": ready,
            "started": running,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": last_state,
        });
        let phase = match self.finished {
            Some(p) => p,
            None if self.started.is_some() => "Running",
            None => "Pending",
        };
        let mut conditions = Vec::new();
        for (type_, ok) in [
            ("PodReadyToStartContainers", true),
            ("Initialized", true),
            ("Ready", ready),
            ("ContainersReady", ready),
            ("PodScheduled", true),
        ] {
            let t = match self.transitions.get(type_) {
                Some((s, t)) if *s == ok => t.clone(),
                _ => {
                    let t = now();
                    self.transitions.insert(type_, (ok, t.clone()));
                    t
                }
            };
            let mut c = json!({"type": type_, "status": if ok { "True" } else { "False" },
                               "lastProbeTime": null, "lastTransitionTime": t});
            if !ok {
                c["reason"] = json!(if phase == "Running" || phase == "Pending" {
                    "ContainersNotReady"
                } else {
                    "PodCompleted"
                });
            }
            conditions.push(c);
        }
        json!({
            "phase": phase,
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": [container_status],
        })
    }

    /// Stops the process: SIGTERM to its process group, SIGKILL after the grace period.
    async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .clamp(0, MAX_GRACE);
        let id = format!("{}/{}", self.ns, self.name);
        let pgid = child.id().map(|p| p as libc::pid_t);
        if let Some(pgid) = pgid {
            info!(pod = %id, pid = pgid, grace, "sending SIGTERM");
            // SAFETY: plain syscall; the group is the child's own (process_group(0)).
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
        }
        let status =
            match tokio::time::timeout(Duration::from_secs(grace as u64), child.wait()).await {
                Ok(s) => s,
                Err(_) => {
                    warn!(pod = %id, "still running after {grace}s, sending SIGKILL");
                    if let Some(pgid) = pgid {
                        // SAFETY: as above.
                        unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    }
                    child.wait().await
                }
            };
        if let Some(pgid) = pgid {
            // Whatever else the process left in its group.
            // SAFETY: as above.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        self.exited(status);
    }

    /// Removes what only this pod used: its non-persistent volumes, its kubeconfig, its
    /// API relay's switch and its pid.
    fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(self.dir.join("volumes"));
        for f in ["kubeconfig", "api-link", "pid"] {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
    }

    /// Deletes the (terminating, process stopped) pod object for good.
    async fn delete(&self) {
        self.cleanup();
        let api: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let id = format!("{}/{}", self.ns, self.name);
        for attempt in 1..=20 {
            match api.delete(&self.name, &dp).await {
                Ok(_) => {
                    info!(pod = %id, "deleted");
                    return;
                }
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => return,
                Err(e) => {
                    warn!(pod = %id, attempt, "deleting: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

fn kind(secret: bool) -> &'static str {
    if secret { "secret" } else { "configmap" }
}

/// Waits for the process to exit; never, if there is none.
async fn wait(child: &mut Option<Child>) -> std::io::Result<ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// `$(VAR)` references to earlier variables, as Kubernetes expands them.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = value.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// VALUE with its longest matching mount path replaced by that mount's host dir.
fn rewrite_path(value: &str, mounts: &[(String, PathBuf)]) -> Option<String> {
    mounts
        .iter()
        .filter_map(|(mount, host)| {
            let mount = mount.trim_end_matches('/');
            let rest = value.strip_prefix(mount)?;
            (rest.is_empty() || rest.starts_with('/'))
                .then(|| (mount.len(), format!("{}{rest}", host.display())))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, v)| v)
}

/// A readiness probe's httpGet, moved to the process's loopback port.
struct Probe {
    port: u16,
    path: String,
    timeout: i32,
    success_threshold: i32,
    failure_threshold: i32,
}

/// The restart count in the pod's status (a restarted runner keeps counting from there).
fn pod_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

/// An HTTP GET of 127.0.0.1:PORT/PATH answered 2xx or 3xx within TIMEOUT.
async fn http_ok(port: u16, path: &str, timeout: Duration) -> bool {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/pod-runner\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 256];
        while !buf.contains(&b'\n') && buf.len() < 4096 {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(buf)
    };
    let Ok(Ok(buf)) = tokio::time::timeout(timeout, get).await else {
        return false;
    };
    let line = String::from_utf8_lossy(&buf);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok());
    matches!(code, Some(200..=399))
}

/// A pod's relay to the API server at `upstream` (`host:port`), cut while the file `control`
/// says `cut` (checked every 100 ms): see the module doc.
async fn api_link(listener: tokio::net::TcpListener, upstream: String, control: PathBuf) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let cut = std::fs::read_to_string(&control).is_ok_and(|s| s.trim() == "cut");
                tx.send_if_modified(|c| std::mem::replace(c, cut) != cut);
            }
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    tokio::spawn(relay(conn, upstream.clone(), rx.clone()));
                }
                Err(e) => warn!("API relay: accepting: {e}"),
            },
        }
    }
}

/// One connection through a pod's API relay. Cut, it forwards nothing and holds both ends
/// (as a partition would: the client sees no error, only silence) until the link heals, then
/// closes them. It ends with the relay (the watch's sender dropped).
async fn relay(
    mut conn: tokio::net::TcpStream,
    upstream: String,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    let _upstream = if *cut.borrow() {
        None
    } else {
        let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => return,
            cut_now = cut.wait_for(|c| *c) => if cut_now.is_err() { return },
        }
        Some(up)
    };
    let _ = cut.wait_for(|c| !*c).await;
}

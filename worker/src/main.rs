//! `eddy-worker run -f app.yaml`: runs a StatefulStreamApp (or its bare spec) on Kafka.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use eddy_crds::upgrade::Version;
use eddy_telemetry::logging::LogFormat;
use eddy_worker::metrics::Metrics;
use eddy_worker::{Overrides, Status, WorkerConfig};
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

// jemalloc for every allocation of the process, RocksDB's and librdkafka's too (its malloc
// replaces glibc's): with glibc's, malloc and free took a quarter of a windowed reduce's CPU, and
// glibc's per-thread arenas kept ~100 MiB freed by RocksDB's and librdkafka's threads.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: two arenas and a one-second decay give freed pages back instead of
/// keeping them (its defaults raised a keyed sum's peak RSS from 268 to 350 MiB).
#[unsafe(export_name = "malloc_conf")]
pub static MALLOC_CONF: &u8 = &b"narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

/// The allocator's view of the heap, for `eddy_memory_bytes`: what is allocated (RocksDB,
/// librdkafka, the caches, everything) and the pages jemalloc holds for it.
struct JemallocUse;

impl eddy_worker::metrics::MemoryUse for JemallocUse {
    fn memory_parts(&self) -> Vec<(&'static str, usize)> {
        use tikv_jemalloc_ctl::{epoch, stats};
        // The statistics are a snapshot taken when the epoch advances.
        if epoch::advance().is_err() {
            return Vec::new();
        }
        [
            ("heap_allocated", stats::allocated::read()),
            ("heap_resident", stats::resident::read()),
        ]
        .into_iter()
        .filter_map(|(part, bytes)| Some((part, bytes.ok()?)))
        .collect()
    }
}

#[derive(Parser)]
#[command(
    name = "eddy-worker",
    version,
    about = "Runs a stateful stream application on Kafka",
    after_help = "Exit status: 0 done; 1 error (printed on stderr as `error: ` and each cause once); 2 bad command line; 3 `check --previous`: the update would strand or drop data."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log output on stderr: `text`, or `json` (one object per line, for log collectors).
    #[arg(
        long,
        global = true,
        env = "EDDY_LOG_FORMAT",
        default_value = "text",
        value_name = "text|json"
    )]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run an app: this process owns every task of it.
    Run(RunArgs),
    /// Check an app file and print its sub-topologies and internal topics, without Kafka;
    /// with --previous, also what updating from that version would strand or drop.
    Check(CheckArgs),
    /// Read a store of a running app through a worker's query API (any worker answers any
    /// key) and print the answer as JSON.
    Query(QueryArgs),
}

#[derive(clap::Args)]
struct QueryArgs {
    /// A worker's query API: a standalone worker's --query-addr, the app's `<name>-query`
    /// Service, or a `kubectl port-forward` to it.
    #[arg(long, env = "EDDY_QUERY_URL", default_value = "http://127.0.0.1:9091")]
    url: String,
    /// The app file, to check the store against before asking.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// The store to read (`GET /stores` lists them).
    #[arg(long)]
    store: String,
    /// One key, written as text in the store's key format (a number for i64 keys, JSON for
    /// json keys). Without it, every key from --from to --to.
    #[arg(long)]
    key: Option<String>,
    /// Key-value stores: the first key of a range (inclusive). Window stores: the earliest
    /// window time, ms since the epoch.
    #[arg(long)]
    from: Option<String>,
    /// Key-value stores: the end of a range (exclusive). Window stores: the latest window
    /// time (inclusive), ms.
    #[arg(long)]
    to: Option<String>,
    /// Versioned stores: the value as of this time (ms).
    #[arg(long)]
    as_of: Option<i64>,
    /// Accept a standby copy lacking at most this many changelog records, or `any`.
    #[arg(long)]
    max_lag: Option<String>,
    /// Entries per page (1 to 1000).
    #[arg(long)]
    limit: Option<usize>,
    /// Follow `next` and print every page's entries as one answer.
    #[arg(long)]
    all: bool,
    /// The bearer token to send (e.g. `$(kubectl create token NAME)`). Without it, to a
    /// loopback --url only (a port-forward), the token of the kubeconfig, if it holds one.
    #[arg(long, env = "EDDY_QUERY_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The app file: a StatefulStreamApp manifest or its bare spec (YAML or JSON).
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// The version running now, to compare internal topics with: a file, or `-` for standard
    /// input (`kubectl get ssapp NAME -o yaml`, `git show HEAD:app.yaml`). Exit status 3 when
    /// the update would strand records in flight or drop a store's state.
    #[arg(long, value_name = "FILE")]
    previous: Option<PathBuf>,
    /// The applicationId of both versions, over the files' (as `run --application-id`).
    #[arg(long)]
    application_id: Option<String>,
    /// Also check the app against a Kafka cluster: the topics it reads and writes exist, and
    /// the tables it joins have the partition counts of the streams joining them.
    #[arg(long)]
    bootstrap_servers: Option<String>,
}

/// `check --previous` found records in flight that would be stranded or state dropped.
const EXIT_WOULD_LOSE_DATA: u8 = 3;

#[derive(clap::Args)]
struct RunArgs {
    /// A StatefulStreamApp manifest or its bare spec (YAML or JSON).
    #[arg(short = 'f', long = "file", env = "EDDY_APP_FILE")]
    file: PathBuf,
    #[arg(long, env = "EDDY_BOOTSTRAP_SERVERS")]
    bootstrap_servers: Option<String>,
    /// Where task state lives: <state-dir>/<applicationId>/<taskId>/.
    #[arg(long, env = "EDDY_STATE_DIR")]
    state_dir: Option<PathBuf>,
    #[arg(long, env = "EDDY_APPLICATION_ID")]
    application_id: Option<String>,
    /// This worker's name (the pod name on Kubernetes).
    #[arg(long, env = "EDDY_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Serve /metrics, /healthz and /readyz here (and the query API, unless --query-addr).
    #[arg(long, env = "EDDY_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Serve the query API here.
    #[arg(long, env = "EDDY_QUERY_ADDR")]
    query_addr: Option<SocketAddr>,
    /// Where other workers reach this worker's query API (default under the operator: the
    /// pod's name in the app's headless Service).
    #[arg(long, env = "EDDY_QUERY_ADVERTISED_ADDR")]
    advertised_query_addr: Option<String>,
    /// Under the operator: on SIGTERM, keep processing the active tasks for at most this many
    /// seconds while the operator moves them to caught-up copies on other pods, then stop
    /// (0: stop at once, the tasks fail over). Keep it well below the pod's
    /// `terminationGracePeriodSeconds` (60): the clean close after it needs time too.
    #[arg(long, env = "EDDY_HANDOFF_TIMEOUT_SECONDS", default_value_t = 20)]
    handoff_timeout_seconds: u64,
    /// Under the operator, where this worker forwards queries: `service`, the other pods'
    /// names in the app's headless Service; `reported`, the address each worker reports
    /// (for workers that are not the app's pods; trusts whoever may write the app's status).
    #[arg(long, env = "EDDY_QUERY_PEERS", value_enum, default_value_t = QueryPeers::Service)]
    query_peers: QueryPeers,
}

/// Threads reading pages and global tables for the query API at once: more reads wait.
const QUERY_BLOCKING_THREADS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum QueryPeers {
    Service,
    Reported,
}

/// Stack of the processing thread. Address space only: pages are backed as they are first
/// touched, by deep jq recursion (bounded by `expr::budget::MAX_EVAL_STACK`) or by dropping
/// a deeply nested value a jq expression built, which recurses once per level (about 70
/// bytes a level; jq nests about a million levels per second of `expressionTimeoutMs`).
fn processing_stack(expression_timeout: Duration) -> usize {
    const PER_SECOND: usize = 96 << 20;
    let seconds =
        usize::try_from(expression_timeout.as_secs().saturating_add(1)).unwrap_or(usize::MAX);
    seconds.saturating_mul(PER_SECOND).clamp(256 << 20, 4 << 30)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    eddy_telemetry::logging::init(cli.log_format, "info,librdkafka=warn,rdkafka=warn");
    let result = match cli.command {
        Command::Check(a) => check(a),
        Command::Run(a) => run(a).map(|()| ExitCode::SUCCESS),
        Command::Query(a) => query(a),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {}", eddy_telemetry::report::Report(e.as_ref()));
        ExitCode::FAILURE
    })
}

/// The topology as a graph, as Kafka Streams' `Topology#describe` draws it: each
/// sub-topology's sources and processors with the stores they use and where their output
/// goes, its stores' changelogs, its sinks, then the global tables.
fn describe(cfg: &eddy_worker::config::WorkerConfig) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let names = |next: Option<usize>, s: &eddy_worker::topology::SubTopology| {
        next.and_then(|n| s.processors.get(n))
            .map_or_else(|| "none".to_string(), |n| n.name.clone())
    };
    for s in &cfg.topology.subtopologies {
        let _ = writeln!(
            out,
            "sub-topology {}: a task per partition of {}",
            s.id,
            s.source().topic
        );
        for (n, i) in s.inputs.iter().enumerate() {
            let what = match (&i.table, i.source.internal) {
                (Some(t), _) => format!(" (table {t})"),
                (None, true) => " (repartition)".to_string(),
                (None, false) if n > 0 => " (joined stream)".to_string(),
                (None, false) => String::new(),
            };
            let _ = writeln!(
                out,
                "  source {}{what}\n    --> {}",
                i.source.topic,
                names(i.entry, s)
            );
        }
        for n in &s.processors {
            let stores = match n.stores.is_empty() {
                true => String::new(),
                false => format!(" (stores: {})", n.stores.join(", ")),
            };
            let _ = writeln!(
                out,
                "  processor {}{stores}\n    --> {}",
                n.name,
                names(n.next, s)
            );
        }
        for st in &s.stores {
            let changelog = eddy_crds::topics::changelog(&cfg.application_id, &st.name);
            let fed = st
                .forward_to
                .map(|f| format!(", updates --> {}", names(Some(f), s)))
                .unwrap_or_default();
            // A stream join's window stores hold records by timestamp, not windows.
            let joined = s
                .processors
                .iter()
                .any(|n| n.name.starts_with("join-") && n.stores.contains(&st.name));
            let _ = match &st.window {
                Some(w) if joined => writeln!(
                    out,
                    "  join window store {} (one side's records by key and time, retention {}) -> {changelog}",
                    st.name, w.retention
                ),
                Some(w) => writeln!(
                    out,
                    "  {} store {} ({}, retention {}{fed}) -> {changelog}",
                    if matches!(w.windows, eddy_worker::window::Windows::Session { .. }) {
                        "session"
                    } else {
                        "window"
                    },
                    st.name,
                    w.windows,
                    w.retention
                ),
                None if st.versioned.is_some() => writeln!(
                    out,
                    "  versioned store {} (each key's values by time, history {}) -> {changelog}",
                    st.name,
                    st.versioned.unwrap_or_default()
                ),
                None if joined && st.ordered => writeln!(
                    out,
                    "  join store {} (records waiting for a partner) -> {changelog}",
                    st.name
                ),
                None if st.name.ends_with("-suppress") && st.ordered => {
                    writeln!(out, "  suppression buffer {} -> {changelog}", st.name)
                }
                None if fed.is_empty() => writeln!(out, "  store {} -> {changelog}", st.name),
                None => writeln!(out, "  store {} ({}) -> {changelog}", st.name, &fed[2..]),
            };
        }
        for sink in &s.sinks {
            let _ = writeln!(out, "  to {}", sink.topic);
        }
    }
    for g in &cfg.topology.globals {
        let _ = writeln!(
            out,
            "global table {}: every worker holds all of {} in store {}, restored before processing (the topic is its changelog)",
            g.name, g.topic, g.store
        );
    }
    out
}

fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_for_check(
        &a.file,
        a.application_id.clone(),
        a.bootstrap_servers.clone(),
    )?;
    println!("application {}", cfg.application_id);
    print!("{}", describe(&cfg));
    if let Some(servers) = &a.bootstrap_servers {
        let (counts, _) =
            eddy_worker::changelog::describe(&cfg, std::time::Duration::from_secs(10))?;
        eddy_worker::changelog::plan(&cfg, &counts)
            .with_context(|| format!("checking the app's topics on {servers}"))?;
        println!("kafka {servers}: the topics read exist, joined topics are co-partitioned");
    }
    println!("internal topics:");
    for n in eddy_crds::topics::internal_names(&cfg.application_id, &cfg.spec) {
        println!("  {} ({})", n.topic, n.origin);
    }
    let Some(previous) = a.previous else {
        return Ok(ExitCode::SUCCESS);
    };
    let old = load_for_check(&previous, a.application_id, None)
        .context("the previous version (--previous)")?;
    let changes = eddy_crds::upgrade::compare(
        Version {
            application_id: &old.application_id,
            spec: &old.spec,
        },
        Version {
            application_id: &cfg.application_id,
            spec: &cfg.spec,
        },
    );
    let shown = match previous.to_str() {
        Some("-") => "standard input".to_string(),
        _ => previous.display().to_string(),
    };
    println!("\ncompared with {shown} (the version running now):");
    for c in &changes {
        let label = if c.loses_data() { "warning" } else { "note" };
        println!("{label}: {c}");
    }
    let losses = changes.iter().filter(|c| c.loses_data()).count();
    if losses == 0 {
        println!("no records in flight stranded, no state dropped");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "{losses} change(s) would lose data in a rolling update (exit status {EXIT_WOULD_LOSE_DATA})"
        );
        Ok(ExitCode::from(EXIT_WOULD_LOSE_DATA))
    }
}

/// An app file as `check` reads it (`-`: standard input): valid, compiled, no Kafka needed.
fn load_for_check(
    path: &Path,
    application_id: Option<String>,
    bootstrap_servers: Option<String>,
) -> anyhow::Result<WorkerConfig> {
    let o = Overrides {
        bootstrap_servers: Some(bootstrap_servers.unwrap_or_else(|| "unused:9092".into())),
        application_id,
        ..Default::default()
    };
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the app file from standard input")?;
        return Ok(WorkerConfig::from_text(&text, Path::new("<stdin>"), o)?);
    }
    Ok(WorkerConfig::load(path, o)?)
}

fn run(a: RunArgs) -> anyhow::Result<()> {
    let cfg = WorkerConfig::load(
        &a.file,
        Overrides {
            kafka_security: std::env::vars()
                .filter(|(k, _)| k.starts_with("EDDY_KAFKA_"))
                .collect(),
            bootstrap_servers: a.bootstrap_servers,
            state_dir: a.state_dir,
            application_id: a.application_id,
            instance_id: a.instance_id,
        },
    )?;
    cfg.check_credentials()?;
    let metrics = Arc::new(Metrics::new());
    metrics.set_memory_source("jemalloc", Arc::new(JemallocUse));
    // Under the operator (EDDY_ASSIGNMENT=operator, set in the pod template) the worker runs
    // the tasks assigned to its pod instead of all of them.
    let link = match std::env::var("EDDY_ASSIGNMENT").as_deref() {
        Ok("operator") => Some(eddy_worker::assignment::Link::new(
            std::env::var("EDDY_NAMESPACE")
                .context("EDDY_NAMESPACE must name the app's namespace")?,
            cfg.resource_name.clone().context(
                "under the operator the app file must be a whole StatefulStreamApp manifest",
            )?,
            cfg.instance_id.clone(),
        )),
        Ok("all") | Err(_) => None,
        Ok(other) => anyhow::bail!("EDDY_ASSIGNMENT={other:?}: expected `operator` or `all`"),
    };
    let link = link.map(|mut l| {
        if a.query_peers == QueryPeers::Reported {
            l.peers = eddy_worker::query::locate::PeerAddressing::Reported;
        } else if let Some(addr) = &a.advertised_query_addr {
            tracing::warn!(
                "--advertised-query-addr {addr} is reported, but the other workers forward to this pod's name in the headless Service ({}); --query-peers reported makes them use reported addresses",
                eddy_crds::query::pod_query_address(&l.app, &l.pod, &l.namespace)
            );
        }
        l
    });
    let status = Arc::new(Status {
        follow_assignment: link.is_some(),
        ..Default::default()
    });
    // One thread serves the operator link and /metrics (and the queries, when they share
    // the HTTP address); a second runtime serves a query API of its own address, each get
    // on one thread: spread over two, a get cost 50 µs of CPU instead of 34 (wake-ups).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    status.queries.set_app(&cfg);
    // A query API of its own address (as under the operator) runs on a runtime of its own:
    // a flood of queries must not delay the status reports and the assignment watch on `rt`
    // past the failover bound. Its blocking pool (pages, global tables) is bounded too.
    let query_rt = match (a.query_addr, cfg.spec.queries_enabled()) {
        (Some(_), true) => Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .max_blocking_threads(QUERY_BLOCKING_THREADS)
                .thread_name("eddy-query")
                .enable_all()
                .build()
                .context("starting the query API's runtime")?,
        ),
        _ => None,
    };
    // Under the operator: the API server to check tokens with, and this worker's own token,
    // which it forwards with whether it checks tokens or not (a peer may, mid-rollout).
    let kube_config =
        match (&link, cfg.spec.queries_enabled()) {
            (Some(_), true) => Some(rt.block_on(kube::Config::infer()).context(
                "reading the Kubernetes client configuration (in-cluster or KUBECONFIG)",
            )?),
            _ => None,
        };
    let queries = match cfg.spec.queries_enabled() {
        true => {
            let served_on = query_rt.as_ref().unwrap_or(&rt);
            let access = query_access(
                &cfg,
                link.as_ref().zip(kube_config.as_ref()),
                a.query_addr.or(a.http_addr),
                served_on,
                &metrics,
            )?;
            let own = kube_config
                .as_ref()
                .map(|c| Arc::new(eddy_worker::query::auth::OwnToken::of(&c.auth_info)));
            Some(eddy_worker::query::api::router(status.clone(), access, own))
        }
        false => None,
    };
    let serve =
        |rt: &tokio::runtime::Runtime, addr: SocketAddr, app: axum::Router, what: &'static str| {
            let listener = rt
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("binding the {what} address {addr}"))?;
            rt.spawn(eddy_worker::server::serve(listener, app, what));
            anyhow::Ok(())
        };
    if let Some(addr) = a.http_addr {
        let mut app =
            eddy_worker::http::router(metrics.clone(), status.clone(), cfg.liveness_timeout);
        if a.query_addr.is_none()
            && let Some(q) = &queries
        {
            app = app.merge(q.clone());
        }
        serve(&rt, addr, app, "HTTP")?;
    }
    if let (Some(addr), Some(q), Some(qrt)) = (a.query_addr, queries.clone(), &query_rt) {
        serve(qrt, addr, q, "query")?;
    }
    if queries.is_some()
        && let Ok(mut r) = status.report.lock()
    {
        r.query_address = match (&a.advertised_query_addr, &link) {
            (Some(addr), _) => Some(addr.clone()),
            (None, Some(l)) => Some(eddy_crds::query::pod_query_address(
                &l.app,
                &l.pod,
                &l.namespace,
            )),
            (None, None) => None,
        };
    }
    // Only under the operator is there someone to hand the tasks to; the operator hands a
    // terminating pod's tasks over only if its worker says it waits for that.
    let handoff = std::time::Duration::from_secs(if link.is_some() {
        a.handoff_timeout_seconds
    } else {
        0
    });
    if let Ok(mut r) = status.report.lock() {
        r.handoff_seconds = handoff.as_secs();
    }
    if let Some(link) = link {
        let client = rt
            .block_on(kube::Client::try_default())
            .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
        let (c, l, s) = (client.clone(), link.clone(), status.clone());
        rt.spawn(async move {
            if let Err(e) = eddy_worker::assignment::follow(c, l, s).await {
                tracing::error!("following the assignment stopped: {e:#}");
            }
        });
        rt.spawn(eddy_worker::assignment::report(
            client,
            link,
            status.clone(),
            std::time::Duration::from_secs(2),
        ));
    }
    {
        let status = status.clone();
        rt.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            // Alone, there is nobody to hand the tasks to.
            if !handoff.is_zero() && status.has_peers() {
                tracing::info!(
                    "asked to stop: handing the active tasks over first (at most {} s)",
                    handoff.as_secs()
                );
                status.begin_stopping();
                let deadline = tokio::time::Instant::now() + handoff;
                loop {
                    let held = status.active_tasks();
                    if held == 0 {
                        tracing::info!("no active task left here");
                        break;
                    }
                    // A second signal stops at once.
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {
                            tracing::warn!(tasks = held, "the hand-off did not finish within {} s: stopping with these tasks, which fail over", handoff.as_secs());
                            break;
                        }
                        _ = term.recv() => break,
                        _ = int.recv() => break,
                        _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                    }
                }
            }
            tracing::info!("shutting down: finishing the current batch and committing");
            status.shutdown.store(true, Ordering::Relaxed);
        });
    }
    let worker = std::thread::Builder::new()
        .name("eddy-stream".into())
        .stack_size(processing_stack(cfg.expression_timeout))
        .spawn(move || {
            eddy_worker::expr::budget::report_this_thread();
            eddy_worker::run(&cfg, metrics, status)
        })
        .context("starting the processing thread")?;
    let result = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the processing thread panicked"))?;
    // Queries stop first: nothing answers from a worker that no longer reports.
    if let Some(qrt) = query_rt {
        qrt.shutdown_timeout(std::time::Duration::from_secs(1));
    }
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result.map_err(|e| match e.hint() {
        Some(hint) => anyhow::Error::new(e).context(format!("stopped ({hint})")),
        None => e.into(),
    })
}

/// The bearer token of the Kubernetes configuration `kubectl` would use, if it holds one
/// (exec plugins and client certificates do not: then `--token`).
async fn kubeconfig_token() -> Option<String> {
    use secrecy::ExposeSecret as _;
    let config = kube::Config::infer().await.ok()?;
    let auth = config.auth_info;
    match (auth.token, auth.token_file) {
        (Some(t), _) => Some(t.expose_secret().to_string()),
        (None, Some(f)) => std::fs::read_to_string(f).ok(),
        (None, None) => None,
    }
}

/// Whether `url` names this machine (`localhost`, 127.0.0.0/8, `::1`).
fn loopback_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<axum::http::Uri>() else {
        return false;
    };
    match uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
    {
        Some("localhost") => true,
        Some(h) => h
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// Who may query this worker. Under the operator, Kubernetes RBAC (the reviewer's client made
/// on `rt`, the runtime serving queries) unless the app says anonymous; a standalone worker has
/// no API server to ask, so it answers without a credential, and only on loopback unless the
/// app says anonymous.
fn query_access(
    cfg: &WorkerConfig,
    link: Option<(&eddy_worker::assignment::Link, &kube::Config)>,
    served_at: Option<SocketAddr>,
    rt: &tokio::runtime::Runtime,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<eddy_worker::query::auth::Access> {
    use eddy_worker::query::auth::{Access, Reviewer};
    if cfg.spec.queries_anonymous() {
        return Ok(Access::Anonymous);
    }
    if let Some((l, config)) = link {
        let _on = rt.enter();
        let reviewer = Reviewer::connect(config.clone(), &l.namespace, &l.app)
            .context("setting up the query API's token checks")?
            .with_metrics(metrics.clone());
        return Ok(Access::Kubernetes(Arc::new(reviewer)));
    }
    match served_at {
        Some(addr) if !addr.ip().is_loopback() => anyhow::bail!(
            "the query API at {addr} would answer anyone without a credential: a standalone worker cannot check tokens (there is no Kubernetes API server to ask). Serve it on loopback (--query-addr 127.0.0.1:9091), switch it off (spec.queries.enabled: false), or allow it (spec.queries.anonymous: true)"
        ),
        _ => Ok(Access::Anonymous),
    }
}

/// `eddy-worker query`: build the request from the store's kind, print the answer.
fn query(a: QueryArgs) -> anyhow::Result<ExitCode> {
    use eddy_crds::query::{RangeAnswer, StoreDescription};
    let base = a.url.trim_end_matches('/').to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client = eddy_worker::query::client::client();
    // The kubeconfig's token may be a powerful one: sent only to this machine (a
    // port-forward), never in clear over a network; elsewhere --token says which to send.
    let token = match a.token {
        Some(t) => Some(t),
        None if loopback_url(&base) => rt.block_on(kubeconfig_token()),
        None => None,
    };
    let authorization = token.map(|t| format!("Bearer {}", t.trim()));
    let get = |url: String| {
        let client = client.clone();
        let headers: Vec<(&str, &str)> = authorization
            .as_deref()
            .map(|a| ("authorization", a))
            .into_iter()
            .collect();
        rt.block_on(async move {
            let (code, _, body) = eddy_worker::query::client::fetch(&client, &url, &headers)
                .await
                .map_err(|e| anyhow::anyhow!("asking {url}: {e}"))?;
            if !code.is_success() {
                let msg = serde_json::from_slice::<eddy_crds::query::QueryProblem>(&body)
                    .map(|p| p.error)
                    .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
                anyhow::bail!("{url}: {code}: {msg}");
            }
            anyhow::Ok(body)
        })
    };
    let stores: Vec<StoreDescription> = match &a.file {
        Some(f) => {
            let cfg = load_for_check(f, None, None)?;
            let catalog = eddy_worker::query::Catalog::default();
            catalog.set_app(&cfg);
            catalog.describe()
        }
        None => serde_json::from_slice(&get(format!("{base}/stores"))?)
            .context("reading the worker's list of stores")?,
    };
    let Some(store) = stores.iter().find(|s| s.name == a.store) else {
        let names: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
        anyhow::bail!(
            "no store {:?} in the app; its stores are: {}",
            a.store,
            names.join(", ")
        );
    };
    let enc = |s: &str| {
        form_urlencoded::byte_serialize(s.as_bytes())
            .collect::<String>()
            .replace('+', "%20")
    };
    let mut params: Vec<(&str, String)> = Vec::new();
    let windowed = matches!(store.kind.as_str(), "window" | "session");
    let path = match (&a.key, windowed) {
        (Some(k), true) => format!("/stores/{}/keys/{}/windows", enc(&store.name), enc(k)),
        (Some(k), false) => format!("/stores/{}/keys/{}", enc(&store.name), enc(k)),
        (None, true) => format!("/stores/{}/windows", enc(&store.name)),
        (None, false) => format!("/stores/{}/keys", enc(&store.name)),
    };
    for (name, v) in [("from", &a.from), ("to", &a.to), ("maxLag", &a.max_lag)] {
        if let Some(v) = v {
            params.push((name, v.clone()));
        }
    }
    if let Some(t) = a.as_of {
        params.push(("asOf", t.to_string()));
    }
    if let Some(n) = a.limit {
        params.push(("limit", n.to_string()));
    }
    let url = |after: Option<&str>| {
        let mut q: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", enc(v)))
            .collect();
        if let Some(t) = after {
            q.push(format!("after={t}"));
        }
        match q.is_empty() {
            true => format!("{base}{path}"),
            false => format!("{base}{path}?{}", q.join("&")),
        }
    };
    let body = get(url(None))?;
    let single = a.key.is_some() && !windowed;
    if single || !a.all {
        let v: serde_json::Value = serde_json::from_slice(&body).context("reading the answer")?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut all: RangeAnswer = serde_json::from_slice(&body).context("reading the answer")?;
    while let Some(next) = all.next.take() {
        let page: RangeAnswer =
            serde_json::from_slice(&get(url(Some(&next)))?).context("reading the answer")?;
        all.entries.extend(page.entries);
        all.answered_by = page.answered_by;
        all.next = page.next;
    }
    println!("{}", serde_json::to_string_pretty(&all)?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_worker::query::auth::Access;

    fn app(queries: &str) -> WorkerConfig {
        let text = format!(
            "applicationId: a\nkafka: {{bootstrapServers: k:9092}}\ntopology: [{{from: {{topic: a}}}}, {{count: {{store: c}}}}]\n{queries}"
        );
        WorkerConfig::from_text(&text, Path::new("app.yaml"), Overrides::default())
            .expect("a valid app")
    }

    /// A standalone worker cannot check tokens: it answers without one on loopback, and
    /// elsewhere only if the app says anonymous.
    #[test]
    fn a_standalone_worker_answers_anyone_only_on_loopback_or_if_the_app_says_so() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let at = |a: &str| a.parse::<SocketAddr>().ok();
        let metrics = Arc::new(Metrics::new());
        let access = |cfg: &WorkerConfig, addr| query_access(cfg, None, at(addr), &rt, &metrics);
        let closed = app("");
        assert!(matches!(
            access(&closed, "127.0.0.1:9091"),
            Ok(Access::Anonymous)
        ));
        assert!(matches!(
            access(&closed, "[::1]:9091"),
            Ok(Access::Anonymous)
        ));
        let e = access(&closed, "0.0.0.0:9090").err().expect("refused");
        let e = format!("{e:#}");
        assert!(
            e.contains("0.0.0.0:9090") && e.contains("spec.queries.anonymous: true"),
            "{e}"
        );
        let open = app("queries: {anonymous: true}");
        assert!(matches!(
            access(&open, "0.0.0.0:9090"),
            Ok(Access::Anonymous)
        ));
    }

    #[test]
    fn the_kubeconfig_s_token_goes_only_to_this_machine() {
        for url in [
            "http://127.0.0.1:9091",
            "http://localhost:9091/",
            "http://[::1]:9091",
            "http://127.0.0.2",
        ] {
            assert!(loopback_url(url), "{url}");
        }
        for url in [
            "http://pv-query:9091",
            "http://10.0.0.5:9091",
            "http://localhost.example.com",
            "not a url",
        ] {
            assert!(!loopback_url(url), "{url}");
        }
    }
}

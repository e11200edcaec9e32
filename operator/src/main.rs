//! `eddy-operator run` reconciles StatefulStreamApps; `eddy-operator crd` prints the CRD.

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use clap::{Parser, Subcommand};
use eddy_operator::{controller, leader, metrics::Metrics, resources};
use eddy_telemetry::logging::LogFormat;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "eddy-operator",
    version,
    about = "Runs eddy apps on Kubernetes",
    after_help = "Exit status: 0 stopped on SIGTERM or done; 1 error (printed on stderr as `error: ` and each cause once); 2 bad command line."
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
    /// Print the StatefulStreamApp CustomResourceDefinition (YAML).
    Crd,
    /// Print the reference page of the CRD's fields (Markdown, docs/reference.md).
    Reference,
    /// Reconcile StatefulStreamApps (in-cluster or KUBECONFIG credentials).
    Run {
        /// Serve /metrics, /healthz and /readyz here.
        #[arg(long, env = "EDDY_OPERATOR_HTTP_ADDR", default_value = "0.0.0.0:8080")]
        http_addr: SocketAddr,
        /// Namespace of the leader-election Lease.
        #[arg(long, env = "EDDY_OPERATOR_NAMESPACE", default_value = "default")]
        namespace: String,
        /// This replica's name (the pod name).
        #[arg(long, env = "EDDY_OPERATOR_IDENTITY")]
        identity: Option<String>,
        /// Name of the leader-election Lease. The replicas of one install share it; two
        /// installs in one namespace need two (the chart's is `<release name>-leader`).
        #[arg(
            long,
            env = "EDDY_OPERATOR_LEASE_NAME",
            default_value = "eddy-operator-leader"
        )]
        lease_name: String,
        /// Install or update the CRD before starting.
        #[arg(long)]
        install_crd: bool,
        /// Watch only these namespaces (comma-separated; default: all). The operator then
        /// needs rights in those namespaces only (the chart's `watchNamespaces`).
        #[arg(
            long,
            env = "EDDY_OPERATOR_WATCH_NAMESPACES",
            value_delimiter = ',',
            value_name = "NS,..."
        )]
        watch_namespaces: Vec<String>,
        /// Log output of the worker pods (`EDDY_LOG_FORMAT` in their pod template): `text`,
        /// or `json`. An app's `podTemplate` may set its own.
        #[arg(
            long,
            env = "EDDY_OPERATOR_WORKER_LOG_FORMAT",
            default_value = "text",
            value_name = "text|json"
        )]
        worker_log_format: LogFormat,
        /// Worker image of the apps that do not name one in `spec.image` (the chart's
        /// `workerImage`; default `ghcr.io/eddy-dev/eddy-worker:<this operator's version>`).
        #[arg(long, env = "EDDY_OPERATOR_WORKER_IMAGE", value_name = "IMAGE")]
        worker_image: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    eddy_telemetry::logging::init(cli.log_format, "info,kube=warn");
    // As eddy-worker prints its errors: one line, each cause once.
    main_of(cli).map_or_else(
        |e| {
            eprintln!("error: {}", eddy_telemetry::report::Report(e.as_ref()));
            std::process::ExitCode::FAILURE
        },
        |()| std::process::ExitCode::SUCCESS,
    )
}

fn main_of(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => {
            print!("{}", serde_yaml::to_string(&eddy_crds::resource::crd())?);
            Ok(())
        }
        Command::Reference => {
            print!("{}", eddy_crds::reference::markdown());
            Ok(())
        }
        Command::Run {
            http_addr,
            namespace,
            identity,
            lease_name,
            install_crd,
            watch_namespaces,
            worker_log_format,
            worker_image,
        } => {
            let scope = controller::Scope::new(&watch_namespaces)?;
            let workers = worker_settings(worker_log_format, worker_image);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(run(
                    http_addr,
                    namespace,
                    identity,
                    lease_name,
                    install_crd,
                    scope,
                    workers,
                ))
        }
    }
}

fn worker_settings(log_format: LogFormat, image: Option<String>) -> resources::WorkerSettings {
    resources::WorkerSettings {
        log_format,
        // `EDDY_OPERATOR_WORKER_IMAGE=` means the default, not an image named "".
        image: image.filter(|i| !i.trim().is_empty()),
    }
}

async fn run(
    http_addr: SocketAddr,
    namespace: String,
    identity: Option<String>,
    lease_name: String,
    install_crd: bool,
    scope: controller::Scope,
    workers: resources::WorkerSettings,
) -> anyhow::Result<()> {
    let mut stop = stopping();
    let identity = identity.unwrap_or_else(|| format!("eddy-operator-{}", std::process::id()));
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::default());
    let m = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("binding {http_addr}"))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("HTTP server stopped: {e}");
        }
    });
    if install_crd {
        controller::install_crd(client.clone())
            .await
            .context("installing the CRD")?;
    }
    let mut leadership = tokio::select! {
        l = leader::lead(client.clone(), &namespace, &lease_name, &identity) => l,
        _ = stop.wait_for(|s| *s) => {
            tracing::info!("stopping (not the leader)");
            return Ok(());
        }
    };
    metrics.leader.set(1);
    tracing::info!("leading: reconciling StatefulStreamApps in {scope}");
    let result = tokio::select! {
        // Returns once stopped by a signal and the reconciles under way have finished.
        _ = controller::run(client, metrics.clone(), identity, scope, workers, stop.clone()) => Ok(()),
        _ = leadership.lost() => Err(anyhow::anyhow!("lost the leader lease: stopping so a follower takes over")),
    };
    // Only the leader shows the apps (a scrape between here and the exit must not show two).
    metrics.leader.set(0);
    metrics.clear_apps();
    if result.is_ok() {
        // Hand over now rather than let a follower wait out the lease.
        match leadership.release().await {
            Ok(true) => tracing::info!("released the leader lease"),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "releasing the leader lease: {e}: a follower takes over once it expires ({} s)",
                leader::LEASE_SECONDS
            ),
        }
    }
    result
}

/// Turns true on the first SIGTERM or SIGINT: the controllers finish the reconciles under way
/// and the leader releases its lease. A second signal exits at once.
fn stopping() -> tokio::sync::watch::Receiver<bool> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = tokio::sync::watch::channel(false);
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    tokio::spawn(async move {
        let (mut term, mut int) = match (term, int) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(
                    "cannot handle SIGTERM/SIGINT ({e}): they stop the operator without releasing its lease"
                );
                // Keeps `tx`: a closed channel would read as "stop".
                std::future::pending::<()>().await;
                drop(tx);
                return;
            }
        };
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n > 0 {
                tracing::warn!("second signal: exiting now");
                std::process::exit(1);
            }
            tracing::info!("stopping: finishing the reconciles under way");
            let _ = tx.send(true);
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(args: &[&str]) -> resources::WorkerSettings {
        let argv = [&["eddy-operator", "run"][..], args].concat();
        match Cli::try_parse_from(argv)
            .expect("the arguments parse")
            .command
        {
            Command::Run {
                worker_log_format,
                worker_image,
                ..
            } => worker_settings(worker_log_format, worker_image),
            _ => panic!("not `run`"),
        }
    }

    #[test]
    fn worker_image_names_the_image_of_apps_without_one_and_empty_means_the_default() {
        assert_eq!(workers(&[]).image, None);
        assert_eq!(
            workers(&["--worker-image", "registry.example.com/t/eddy-worker:0.1.0"])
                .image
                .as_deref(),
            Some("registry.example.com/t/eddy-worker:0.1.0")
        );
        assert_eq!(workers(&["--worker-image", ""]).image, None);
    }
}

//! `eddy-operator run` reconciles StatefulStreamApps; `eddy-operator crd` prints the CRD.

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use clap::{Parser, Subcommand};
use eddy_operator::{controller, leader, metrics::Metrics};
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "eddy-operator",
    version,
    about = "Runs eddy apps on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDDY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
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
            install_crd,
            watch_namespaces,
        } => {
            let scope = controller::Scope::new(&watch_namespaces)?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(run(http_addr, namespace, identity, install_crd, scope))
        }
    }
}

async fn run(
    http_addr: SocketAddr,
    namespace: String,
    identity: Option<String>,
    install_crd: bool,
    scope: controller::Scope,
) -> anyhow::Result<()> {
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
    let lost = leader::lead(
        client.clone(),
        &namespace,
        "eddy-operator-leader",
        &identity,
    )
    .await;
    metrics.leader.set(1);
    tracing::info!("leading: reconciling StatefulStreamApps in {scope}");
    let result = tokio::select! {
        _ = controller::run(client, metrics.clone(), identity, scope) => Ok(()),
        _ = lost => Err(anyhow::anyhow!("lost the leader lease: stopping so a follower takes over")),
    };
    // Only the leader shows the apps (a scrape between here and the exit must not show two).
    metrics.leader.set(0);
    metrics.clear_apps();
    result
}

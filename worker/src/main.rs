//! `eddy-worker run -f app.yaml`: runs a StatefulStreamApp (or its bare spec) on Kafka.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use eddy_worker::metrics::Metrics;
use eddy_worker::{Overrides, Status, WorkerConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[derive(Parser)]
#[command(
    name = "eddy-worker",
    version,
    about = "Runs a stateful stream application on Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an app: this process owns every task of it.
    Run(RunArgs),
    /// Check an app file and print its sub-topologies and internal topics, without Kafka.
    Check {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
}

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
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long, env = "EDDY_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDDY_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,librdkafka=warn,rdkafka=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Check { file } => {
            let cfg = WorkerConfig::load(
                &file,
                Overrides {
                    bootstrap_servers: Some("unused:9092".into()),
                    ..Default::default()
                },
            )?;
            println!("application {}", cfg.application_id);
            for s in &cfg.topology.subtopologies {
                println!(
                    "sub-topology {}: from {} ({} processors)",
                    s.id,
                    s.source.topic,
                    s.processors.len()
                );
                for st in &s.stores {
                    println!(
                        "  store {} -> {}",
                        st.name,
                        eddy_crds::topics::changelog(&cfg.application_id, &st.name)
                    );
                }
                for sink in &s.sinks {
                    println!("  to {}", sink.topic);
                }
            }
            Ok(())
        }
        Command::Run(a) => run(a),
    }
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
    let metrics = Arc::new(Metrics::new());
    // Under the operator (EDDY_ASSIGNMENT=operator, set in the pod template) the worker runs
    // the tasks assigned to its pod instead of all of them.
    let link = match std::env::var("EDDY_ASSIGNMENT").as_deref() {
        Ok("operator") => Some(eddy_worker::assignment::Link {
            namespace: std::env::var("EDDY_NAMESPACE")
                .context("EDDY_NAMESPACE must name the app's namespace")?,
            app: cfg.resource_name.clone().context(
                "under the operator the app file must be a whole StatefulStreamApp manifest",
            )?,
            pod: cfg.instance_id.clone(),
        }),
        Ok("all") | Err(_) => None,
        Ok(other) => anyhow::bail!("EDDY_ASSIGNMENT={other:?}: expected `operator` or `all`"),
    };
    let status = Arc::new(Status {
        follow_assignment: link.is_some(),
        ..Default::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(addr) = a.http_addr {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("binding the HTTP address {addr}"))?;
        let app = eddy_worker::http::router(metrics.clone(), status.clone());
        rt.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("HTTP server stopped: {e}");
            }
        });
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
            tracing::info!("shutting down: finishing the current batch and committing");
            status.shutdown.store(true, Ordering::Relaxed);
        });
    }
    let worker = std::thread::Builder::new()
        .name("eddy-stream".into())
        .spawn(move || eddy_worker::run(&cfg, metrics, status))
        .context("starting the processing thread")?;
    let result = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the processing thread panicked"))?;
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result.map_err(Into::into)
}

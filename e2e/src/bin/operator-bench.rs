//! `operator-bench`: the operator's benchmark on a real local control plane and Kafka broker.
//! Measures the time from a spec change to the updated StatefulSet (median of 10 changes) and
//! the operator's peak RSS while it manages 50 apps (`--apps`); `--json PATH` also writes the
//! results as JSON (bench/report reads it).

use anyhow::{Context, Result};
use clap::Parser;
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::*;
use serde_json::json;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "The operator's benchmark: spec change → updated StatefulSet, and the operator's peak RSS with many apps (a local control plane; a broker from EDDY_TEST_BOOTSTRAP, else one named `test`)"
)]
struct Args {
    /// Apps the operator manages (2 replicas each).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    apps: u64,
    /// Also write the results as JSON to this file (bench/report reads it).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let apps = args.apps as usize;
    let bs = bootstrap()?;
    let cp = ControlPlane::start(&format!("opbench-{}", std::process::id()))?;
    let kubectl = |args: &[&str], stdin: Option<&str>| cp.kubectl(args, stdin);
    cp.install_crd(&repo_root().join("crds/statefulstreamapp.yaml"))?;
    let topic = unique("opbench-in");
    create_topic(&topic, 6)?;

    let mut op = Command::new(binary("eddy-operator")?)
        .args([
            "run",
            "--http-addr",
            "127.0.0.1:0",
            "--namespace",
            "default",
            "--identity",
            "bench",
        ])
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("EDDY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = op.id();
    let app = |i: usize, commit: u64| {
        format!(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: app-{i}}}\nspec:\n  replicas: 2\n  commitIntervalMs: {commit}\n  kafka: {{bootstrapServers: \"{bs}\"}}\n  topology:\n    - from: {{topic: {topic}}}\n    - count: {{store: c}}\n"
        )
    };
    let all: String = (0..apps).map(|i| app(i, 1000) + "---\n").collect();
    let started = Instant::now();
    kubectl(&["apply", "-f", "-"], Some(&all))?;
    wait_until(Duration::from_secs(300), || {
        let gens = kubectl(
            &[
                "get",
                "ssapp",
                "-o",
                "jsonpath={.items[*].status.assignment.generation}",
            ],
            None,
        )?;
        Ok(gens.split_whitespace().count() == apps)
    })?;
    let all_assigned = started.elapsed();
    let hash = || {
        kubectl(
            &[
                "get",
                "sts",
                "app-0",
                "-o",
                "jsonpath={.spec.template.metadata.annotations.eddy\\.dev/spec-hash}",
            ],
            None,
        )
    };
    let mut latencies = Vec::new();
    for n in 0..10u64 {
        let before = hash()?;
        let t = Instant::now();
        kubectl(&["apply", "-f", "-"], Some(&app(0, 2000 + n)))?;
        wait_until(Duration::from_secs(60), || Ok(hash()? != before))?;
        latencies.push(t.elapsed().as_secs_f64());
    }
    latencies.sort_by(f64::total_cmp);
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("operator exited")?;
    let hwm: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0.0);
    let _ = op.kill();
    let _ = op.wait();
    // The apps' changelogs, named after their default application id `default.app-<i>`.
    let changelogs = topics_with_prefix("default.app-")?;
    let mut done: Vec<&str> = changelogs.iter().map(String::as_str).collect();
    done.push(&topic);
    delete_topics(&done)?;
    let median = latencies[latencies.len() / 2];
    let slowest = latencies[latencies.len() - 1];
    let rss_mib = hwm / 1024.0;
    let mut md = String::from("| measure | value | target |\n|---|---:|---:|\n");
    md += &format!(
        "| {apps} apps created → all assigned | {:.2} s | |\n",
        all_assigned.as_secs_f64()
    );
    md += &format!(
        "| spec change → StatefulSet updated (median of 10, kubectl round trips included) | {median:.3} s | < 1 s |\n"
    );
    md += &format!("| slowest of the 10 | {slowest:.3} s | |\n");
    md += &format!("| operator peak RSS with {apps} apps | {rss_mib:.1} MiB | < 64 MiB |\n");
    print!("{md}");
    if let Some(path) = &args.json {
        let doc = json!({
            "benchmark": "operator",
            "apps": apps,
            "all_assigned_seconds": all_assigned.as_secs_f64(),
            "spec_change_median_seconds": median,
            "spec_change_slowest_seconds": slowest,
            "spec_change_seconds": latencies,
            "operator_peak_rss_bytes": (hwm * 1024.0) as u64,
            "markdown": md,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

//! `bench-report`: the merging and comparing half of `bench/report` (which runs the
//! benchmarks; docs/benchmarks.md, "The report"). Code in `eddy_e2e::report`.
//!
//! ```text
//! bench-report meta --out DIR --command CMD      machine, versions, command → DIR/meta.json
//! bench-report render DIR [--publish]            DIR/report.{json,md} and charts; --publish
//!                                                also updates docs/benchmarks.md and docs/bench/
//! bench-report compare OLD NEW [--threshold 10]  per-figure change; exit 1 on a regression
//! ```

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use eddy_e2e::report;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Merges, renders and compares benchmark results (see bench/report)")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write the machine, the versions and the command line to DIR/meta.json.
    Meta {
        #[arg(long)]
        out: PathBuf,
        /// The command line of the run, as typed.
        #[arg(long)]
        command: String,
    },
    /// Merge a run directory into report.json and report.md, and draw its charts.
    Render {
        dir: PathBuf,
        /// Also write the blocks of docs/benchmarks.md (between their markers) and the charts
        /// to docs/bench/.
        #[arg(long)]
        publish: bool,
    },
    /// Compare two reports (report.json files, run directories, or a results directory for
    /// its newest run): every figure's change; exit 1 when one is a regression.
    Compare {
        old: PathBuf,
        new: PathBuf,
        /// Percent worse that counts as a regression.
        #[arg(long, default_value_t = 10.0)]
        threshold: f64,
    },
}

fn main() {
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("bench-report: error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn real_main() -> Result<i32> {
    match Args::parse().command {
        Cmd::Meta { out, command } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let m = report::meta(&command);
            std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&m)?)?;
            Ok(0)
        }
        Cmd::Render { dir, publish } => {
            let r = report::merge(&dir)?;
            std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&r)?)?;
            std::fs::write(dir.join("report.md"), report::report_markdown(&r))?;
            let mut charts = Vec::new();
            for sec in report::SECTIONS {
                if !r["sections"][*sec].is_null() {
                    charts.extend(report::charts(sec, &r["sections"][*sec]["source"], &dir));
                }
            }
            for (name, svg) in &charts {
                std::fs::write(dir.join(name), svg)?;
            }
            eprintln!(
                "wrote {}/report.json, report.md and {} chart(s)",
                dir.display(),
                charts.len()
            );
            if publish {
                let docs = eddy_e2e::repo_root().join("docs");
                let bench = docs.join("bench");
                std::fs::create_dir_all(&bench)?;
                for (name, svg) in &charts {
                    std::fs::write(bench.join(name), svg)?;
                }
                let done = report::publish(&r, &docs.join("benchmarks.md"), "bench")?;
                eprintln!(
                    "updated docs/benchmarks.md ({}) and docs/bench/",
                    done.join(", ")
                );
            }
            Ok(0)
        }
        Cmd::Compare {
            old,
            new,
            threshold,
        } => {
            if threshold.is_nan() || threshold < 0.0 {
                anyhow::bail!("--threshold must be a percentage ≥ 0, got {threshold}");
            }
            let (o, n) = (report::load(&old)?, report::load(&new)?);
            let c = report::compare(&o, &n, threshold / 100.0);
            print!("{}", report::comparison_text(&c, &o, &n));
            Ok(if c.regressions().is_empty() { 0 } else { 1 })
        }
    }
}

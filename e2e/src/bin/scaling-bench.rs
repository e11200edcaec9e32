//! `scaling-bench`: how long tasks pause when a stateful app scales out, loses a pod or is
//! rolled, eddy under its operator against Kafka Streams. Run it through `bench/scaling.sh`; the cases are
//! in `eddy_e2e::scaling`, and docs/benchmarks.md ("Scaling and failover") says what each
//! figure means. Writes `results.json` and `results.md` to `--out` and prints the table.

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use eddy_e2e::scaling::stage::{log, utc_now};
use eddy_e2e::scaling::{ACCEPTABLE_LAG, Settings, eddy, kstreams, report};
use eddy_e2e::{bootstrap, delete_topics, topics_with_prefix};
use serde_json::{Value, json};
use std::path::PathBuf;

/// The cases, in the order they run.
const CASES: &[&str] = &[
    // 2 → 3 replicas with warm-ups (the default `spec.warmup`).
    "eddy-scale-out",
    // The same with `warmup.acceptableRecoveryLag` so large that a task moves as soon as the
    // new pod reports any copy of it, which then restores in full.
    "eddy-scale-out-no-warmup",
    // 3 replicas, `numStandbyReplicas: 1`: a pod deleted, then another's worker SIGKILLed.
    "eddy-failover",
    // 3 replicas, a pod template change rolled by the operator, with one standby per task and
    // without.
    "eddy-rollout",
    "eddy-rollout-no-standby",
    // Two instances, a third added.
    "ks-scale-out",
    // Three instances, `num.standby.replicas=1`, one SIGKILLed (with Kafka Streams' default
    // session timeout, then with the smallest the broker allows), one SIGTERMed (a clean close
    // that leaves the group).
    "ks-failover-kill",
    "ks-failover-kill-session-6s",
    "ks-failover-term",
    // Three instances bounced one at a time (SIGTERM, started again on their state) as a
    // StatefulSet's RollingUpdate does, with Kafka Streams' defaults and with one standby.
    "ks-rollout",
    "ks-rollout-standby",
];

#[derive(Parser, Debug)]
#[command(
    about = "Pauses of a stateful app's tasks on scale-out, failover and rolling updates, eddy under its operator against Kafka Streams"
)]
struct Args {
    #[command(flatten)]
    settings: Settings,
    /// Cases to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eddy-scale-out,eddy-scale-out-no-warmup,eddy-failover,eddy-rollout,eddy-rollout-no-standby,ks-scale-out,ks-failover-kill,ks-failover-kill-session-6s,ks-failover-term,ks-rollout,ks-rollout-standby"
    )]
    cases: Vec<String>,
    /// The reference app's jar (default: built by bench/kstreams/build.sh).
    #[arg(long)]
    jar: Option<PathBuf>,
    /// Results directory (default ~/.cache/eddy/bench-results/scaling).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("scaling-bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let args = Args::parse();
    for c in &args.cases {
        if !CASES.contains(&c.as_str()) {
            bail!("unknown case '{c}': the cases are {}", CASES.join(", "));
        }
    }
    let s = &args.settings;
    if s.partitions < 3 || s.keys == 0 || s.rate == 0 {
        bail!("--partitions must be at least 3, --keys and --rate at least 1");
    }
    let out = match &args.out {
        Some(o) => o.clone(),
        None => PathBuf::from(std::env::var("HOME").context("HOME is not set")?)
            .join(".cache/eddy/bench-results/scaling"),
    };
    bootstrap()?;
    // Logs of every process (operator, pod runner, workers, Kafka Streams instances), kept
    // for a look at what happened; replaced by the next run.
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let started = utc_now();
    let mut results: Vec<Value> = Vec::new();
    let mut failed = Vec::new();
    // A case that fails is reported and the next one runs; what it left behind goes at the end.
    let mut record = |case: &str, r: Result<Vec<Value>>| match r {
        Ok(v) => results.extend(v),
        Err(e) => {
            log(&format!("{case} failed: {e:#}"));
            failed.push(json!({"case": case, "error": format!("{e:#}")}));
        }
    };
    let wants = |c: &str| args.cases.iter().any(|x| x == c);
    if args.cases.iter().any(|c| c.starts_with("eddy-")) {
        let env = eddy::EddyEnv::start(&logs)?;
        for (case, warmups) in [
            ("eddy-scale-out", true),
            ("eddy-scale-out-no-warmup", false),
        ] {
            if wants(case) {
                record(case, eddy::scale_out(&env, s, warmups).map(|r| vec![r]));
            }
        }
        if wants("eddy-failover") {
            record("eddy-failover", eddy::failover(&env, s));
        }
        for (case, standby) in [("eddy-rollout", true), ("eddy-rollout-no-standby", false)] {
            if wants(case) {
                record(case, eddy::rollout(&env, s, standby).map(|r| vec![r]));
            }
        }
        let _ = env.delete_all_apps();
    }
    if args.cases.iter().any(|c| c.starts_with("ks-")) {
        let jar = match &args.jar {
            Some(j) => j.clone(),
            None => eddy_e2e::compare::kstreams_jar()?,
        };
        if wants("ks-scale-out") {
            record(
                "ks-scale-out",
                kstreams::scale_out(&jar, s, &logs).map(|r| vec![r]),
            );
        }
        for (case, _, _) in kstreams::FAILOVERS {
            let name = format!("ks-{case}");
            if wants(&name) {
                record(
                    &name,
                    kstreams::failover(&jar, s, case, &logs).map(|r| vec![r]),
                );
            }
        }
        for (case, _) in kstreams::ROLLOUTS {
            let name = format!("ks-{case}");
            if wants(&name) {
                record(
                    &name,
                    kstreams::rollout(&jar, s, case, &logs).map(|r| vec![r]),
                );
            }
        }
    }
    leftover_topics();
    let doc = json!({
        "started": started,
        "keys": s.keys,
        "partitions": s.partitions,
        "rate": s.rate,
        "guarantee": "exactly_once",
        "acceptable_recovery_lag": ACCEPTABLE_LAG,
        "results": results,
        "failed": failed,
        "ratios": report::ratios(&results),
    });
    let md = report::markdown(s, &results);
    println!("\n{md}");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    std::fs::write(out.join("results.md"), &md)?;
    log(&format!(
        "wrote {}/results.json and results.md",
        out.display()
    ));
    if !failed.is_empty() {
        bail!(
            "{} case(s) failed (see above and results.json)",
            failed.len()
        );
    }
    Ok(())
}

/// Delete the topics of this run that a failed case left behind: inputs and outputs, eddy's
/// changelogs, Kafka Streams' internal topics (all named with this process's id).
fn leftover_topics() {
    let pid = format!("-{}-", std::process::id());
    let mine = |t: &String| {
        t.contains(&pid)
            && ["scalebench-", "scalebench.", "ks-so-", "ks-fo-"]
                .iter()
                .any(|p| t.starts_with(p))
    };
    if let Ok(all) = topics_with_prefix("") {
        let left: Vec<&str> = all.iter().filter(|t| mine(t)).map(String::as_str).collect();
        if !left.is_empty() {
            log(&format!("deleting {} leftover topics", left.len()));
            let _ = delete_topics(&left);
        }
    }
}

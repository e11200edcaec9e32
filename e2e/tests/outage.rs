//! The broker goes away under load and comes back: down for 30 s (a crash and restart), then
//! frozen for 20 s (SIGSTOP: a long GC pause, a hung host). Workers keep their
//! processes and their state, and resume when the broker answers again: under exactly-once
//! every key's committed count is strictly increasing and exact at the end, under
//! at-least-once nothing is lost. A test binary of its own, because it runs (and breaks) its
//! own broker.

use anyhow::{Result, ensure};
use eddy_e2e::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const KEYS: usize = 200;

fn count_app(app: &str, input: &str, output: &str, guarantee: &str) -> String {
    format!(
        r#"applicationId: {app}
processingGuarantee: {guarantee}
commitIntervalMs: 200
memory: {{recordCache: "0"}}
topology:
  - from: {{topic: {input}}}
  - count: {{store: counts}}
  - to: {{topic: {output}, value: i64}}
"#
    )
}

/// Keep checking, for `d`, that both workers are still the same processes and healthy.
fn hold(d: Duration, workers: &mut [&mut Worker]) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for w in workers.iter_mut() {
            ensure!(w.running(), "a worker exited:\n{}", w.logs());
            let (healthz, _) = w.health()?;
            ensure!(healthz.0 == 200, "/healthz: {healthz:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

/// What the broker says about open transactions, for a failure's message: a transaction the
/// group coordinator holds open while the transaction coordinator lists its id as `Empty` is
/// Kafka's hanging transaction (docs/operations.md, "A transaction left hanging").
fn open_transactions() -> String {
    let tool = |args: &[&str]| {
        let args = [&["transactions"], args].concat();
        kafka_tool(&args).unwrap_or_else(|e| format!("({e:#})\n"))
    };
    let mut report = format!("kafka-transactions list:\n{}", tool(&["list"]));
    // kafka.sh's brokers have 10 partitions of __consumer_offsets.
    for p in 0..10 {
        let producers = tool(&[
            "describe-producers",
            "--topic",
            "__consumer_offsets",
            "--partition",
            &p.to_string(),
        ]);
        if !producers.starts_with("ProducerId") {
            report += &format!("describe-producers __consumer_offsets-{p}: {producers}");
            continue;
        }
        // A producer's row ends in its open transaction's start offset, or `None`.
        let open: Vec<&str> = producers
            .lines()
            .skip(1)
            .filter(|l| {
                l.split_whitespace()
                    .last()
                    .is_some_and(|o| o.parse::<i64>().is_ok())
            })
            .collect();
        if !open.is_empty() {
            report += &format!(
                "open in __consumer_offsets-{p}:\n{}\n{}\n",
                producers.lines().next().unwrap_or(""),
                open.join("\n")
            );
        }
    }
    report
}

#[test]
fn workers_survive_a_broker_restart_and_a_frozen_broker() -> Result<()> {
    let cluster = format!("outage-{}", std::process::id());
    let _cluster = own_cluster(1, &cluster)?;
    let app = unique("outage");
    let input = format!("{app}-in");
    create_topic(&input, 4)?;
    let (eos_out, alos_out) = (format!("{app}-eos-out"), format!("{app}-alos-out"));
    create_topic(&eos_out, 2)?;
    create_topic(&alos_out, 2)?;
    let dir = tempfile::tempdir()?;
    let mut eos = Worker::start(
        &count_app(&format!("{app}-eos"), &input, &eos_out, "exactly_once"),
        &dir.path().join("eos"),
    )?;
    let mut alos = Worker::start(
        &count_app(&format!("{app}-alos"), &input, &alos_out, "at_least_once"),
        &dir.path().join("alos"),
    )?;
    eos.wait_ready(Duration::from_secs(120))?;
    alos.wait_ready(Duration::from_secs(120))?;

    let load = Load::start(&input, KEYS, 400)?;
    wait_until(Duration::from_secs(60), || {
        Ok(eos.metric("eddy_records_processed_total", &[])? > 1000.0)
    })
    .map_err(|e| anyhow::anyhow!("no progress before the outage: {e}\n{}", eos.logs()))?;

    // A broker crash: down for 30 s (longer than the 30 s transaction timeout). Killed, not
    // stopped: a controlled shutdown of a partition's last replica makes Kafka's transaction
    // coordinator complete a commit that arrives meanwhile without writing its markers (the
    // leader is unknown, so the partitions are taken for deleted), which leaves the input
    // offsets pending for good (docs/operations.md, "A transaction left hanging").
    kafka_node(&cluster, 1, "kill")?;
    hold(Duration::from_secs(30), &mut [&mut eos, &mut alos])?;
    kafka_node(&cluster, 1, "start")?;
    eos.wait_ready(Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}\n{}", open_transactions()))?;
    alos.wait_ready(Duration::from_secs(120))?;
    let processed = eos.metric("eddy_records_processed_total", &[])?;
    // Usually 0-8 s; a failure carries the worker's state and log.
    let back = Instant::now();
    wait_until(Duration::from_secs(120), || {
        Ok(eos.metric("eddy_records_processed_total", &[])? > processed + 1000.0)
    })
    .map_err(|e| {
        // /readyz says why the worker waits (the input lag would not: a worker that has not
        // resumed its partitions yet reports none).
        let metric = |name: &str| eos.metric(name, &[]).map_or(-1.0, |v| v);
        anyhow::anyhow!(
            "no progress after the restart ({processed} processed before): {e}; processed {}, recoveries {}; health {:?}\n{}\n{}",
            metric("eddy_records_processed_total"),
            metric("eddy_recoveries_total"),
            eos.health().ok(),
            eos.logs(),
            open_transactions()
        )
    })?;
    eprintln!(
        "outage: processing again {:.1} s after the broker came back",
        back.elapsed().as_secs_f64()
    );

    // A frozen broker: connections stay open, nothing answers.
    kafka_node(&cluster, 1, "pause")?;
    let frozen = hold(Duration::from_secs(20), &mut [&mut eos, &mut alos]);
    kafka_node(&cluster, 1, "resume")?;
    frozen?;

    let sent = load.stop()?;
    let total: i64 = sent.values().sum();
    ensure!(sent.len() == KEYS, "{} keys produced", sent.len());
    let caught_up = |out: &str, exact: bool| {
        let out = out.to_string();
        let sent = sent.clone();
        move || -> Result<bool> {
            let seen = i64_values_by_key(&out)?;
            Ok(sent.iter().all(|(k, n)| {
                seen.get(k)
                    .and_then(|v| v.last())
                    .is_some_and(|last| if exact { last == n } else { last >= n })
            }))
        }
    };
    // What a failure looks like from outside: which keys are short, and what the worker
    // says about itself (progress, commits, lag, /healthz names a stuck processing thread).
    let diagnose = |w: &Worker, out: &str| -> String {
        let seen = i64_values_by_key(out).unwrap_or_default();
        let mut short: Vec<String> = sent
            .iter()
            .filter_map(|(k, n)| {
                let last = seen.get(k).and_then(|v| v.last()).copied();
                (last < Some(*n)).then(|| format!("{k}: {n} sent, last count {last:?}"))
            })
            .collect();
        short.sort();
        let metric = |name: &str| w.metric(name, &[]).map_or(-1.0, |v| v);
        format!(
            "{} keys short ({}); processed {}, commits {}, recoveries {}, input lag {}; health {:?}\n{}",
            short.len(),
            short.iter().take(5).cloned().collect::<Vec<_>>().join("; "),
            metric("eddy_records_processed_total"),
            metric("eddy_commits_total"),
            metric("eddy_recoveries_total"),
            metric("eddy_consumer_lag_records"),
            w.health().ok(),
            w.logs()
        )
    };
    wait_until(Duration::from_secs(240), caught_up(&eos_out, true)).map_err(|e| {
        anyhow::anyhow!(
            "exactly-once app did not reach the exact counts of {total} records: {e}: {}",
            diagnose(&eos, &eos_out)
        )
    })?;
    wait_until(Duration::from_secs(240), caught_up(&alos_out, false)).map_err(|e| {
        anyhow::anyhow!(
            "at-least-once app lost records: {e}: {}",
            diagnose(&alos, &alos_out)
        )
    })?;
    let committed: HashMap<String, Vec<i64>> = i64_values_by_key(&eos_out)?;
    for (k, values) in &committed {
        ensure!(
            values.windows(2).all(|w| w[0] < w[1]),
            "exactly-once, key {k}: committed counts not strictly increasing: {values:?}"
        );
    }
    ensure!(eos.running() && alos.running(), "both workers survived");
    ensure!(eos.stop()? == 0 && alos.stop()? == 0);
    Ok(())
}

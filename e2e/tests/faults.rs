//! Faults around a worker on a real broker, as an operator of a Kafka estate meets them:
//! Kafka unreachable when the worker starts, outputs the broker would reject, a state disk
//! that fills up, and a transaction timeout shorter than the commit interval. The worker
//! waits or follows `onError`, never loses a record, and says what is wrong.

use anyhow::{Context, Result, ensure};
use eddy_e2e::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(120);
const DONE: Duration = Duration::from_secs(240);

fn count_app(app: &str, input: &str, output: &str, guarantee: &str) -> String {
    format!(
        "applicationId: {app}\nprocessingGuarantee: {guarantee}\ncommitIntervalMs: 200\ntopology:\n  - from: {{topic: {input}}}\n  - count: {{store: counts}}\n  - to: {{topic: {output}, value: i64}}\n"
    )
}

fn keyed(from: usize, n: usize, keys: usize) -> Vec<Input> {
    (from..from + n)
        .map(|i| {
            (
                Some(format!("k{}", i % keys).into_bytes()),
                Some(format!("{{\"i\":{i}}}").into_bytes()),
            )
        })
        .collect()
}

fn final_counts(topic: &str) -> Result<HashMap<String, i64>> {
    Ok(i64_values_by_key(topic)?
        .into_iter()
        .filter_map(|(k, v)| Some((k, *v.last()?)))
        .collect())
}

/// Started while Kafka cannot be reached, a worker waits (alive, not ready, saying why)
/// instead of crash-looping, and runs as soon as Kafka answers.
#[test]
fn a_worker_started_without_kafka_waits_for_it() -> Result<()> {
    let app = unique("nokafka");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 2)?;
    create_topic(&output, 2)?;
    produce(&input, &keyed(0, 1000, 10))?;
    // Nothing listens here yet; later a forwarder to the real broker does.
    let addr = format!("127.0.0.1:{}", free_port()?);
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start_with(
        &count_app(&app, &input, &output, "exactly_once"),
        dir.path(),
        &WorkerOptions {
            bootstrap: Some(addr.clone()),
            ..Default::default()
        },
    )?;
    wait_until(Duration::from_secs(60), || {
        Ok(w.logs().contains("cannot reach Kafka"))
    })
    .with_context(|| format!("the worker must say why it waits:\n{}", w.logs()))?;
    ensure!(w.running(), "the worker exited:\n{}", w.logs());
    let (healthz, readyz) = w.health()?;
    ensure!(healthz.0 == 200, "alive: {healthz:?}");
    ensure!(
        readyz.0 == 503 && readyz.1.contains("KafkaUnavailable"),
        "not ready, and says why: {readyz:?}"
    );
    let _kafka = Forwarder::start(&addr, &bootstrap()?)?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(final_counts(&output)?
            .values()
            .filter(|n| **n == 100)
            .count()
            == 10)
    })?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// A value of `len` bytes for record `i`: big ones carry `"big": true`.
fn sized(i: usize, len: usize) -> Input {
    let pad = "x".repeat(len);
    (
        Some(format!("r{i}").into_bytes()),
        Some(format!("{{\"i\":{i},\"big\":{},\"pad\":\"{pad}\"}}", len > 1000).into_bytes()),
    )
}

fn ids(topic: &str) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for r in read_all(topic)? {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        out.push(v["i"].as_i64().context("record without i")?);
    }
    out.sort_unstable();
    Ok(out)
}

fn pass_through(app: &str, input: &str, output: &str, guarantee: &str, on_error: &str) -> String {
    format!(
        "applicationId: {app}\nprocessingGuarantee: {guarantee}\nonError: {on_error}\ncommitIntervalMs: 200\ntopology:\n  - from: {{topic: {input}}}\n  - map: '. + {{seen: true}}'\n  - to: {{topic: {output}}}\n"
    )
}

/// An output topic that takes records of at most 2 KB: the oversized outputs follow
/// `onError` under exactly-once (skipped, or dead-lettered with the reason) while every other
/// record gets through; under at-least-once `fail` stops without committing past them, and
/// after the topic is fixed a restart delivers every record.
#[test]
fn outputs_the_broker_would_reject_follow_on_error() -> Result<()> {
    let app = unique("big");
    let input = format!("{app}-in");
    let _cleanup = Cleanup(vec![input.clone()], app.clone());
    create_topic(&input, 2)?;
    // 300 records, every 50th one 5 KB.
    let records: Vec<Input> = (0..300)
        .map(|i| sized(i, if i % 50 == 7 { 5000 } else { 50 }))
        .collect();
    let big: Vec<i64> = (0..300).filter(|i| i % 50 == 7).collect();
    let small: Vec<i64> = (0..300).filter(|i| i % 50 != 7).collect();
    produce(&input, &records)?;
    let dir = tempfile::tempdir()?;

    for (policy, outcome) in [("skip", "skip"), ("deadLetter", "dead_letter")] {
        let id = format!("{app}-{outcome}");
        let output = format!("{id}-out");
        create_topic(&output, 2)?;
        set_topic_config(&output, "max.message.bytes", "2048")?;
        let mut w = Worker::start(
            &pass_through(&id, &input, &output, "exactly_once", policy),
            &dir.path().join(outcome),
        )?;
        w.wait_ready(READY)?;
        wait_until(DONE, || {
            Ok(w.metric(
                "eddy_bad_records_total",
                &[&format!("outcome=\"{outcome}\"")],
            )? == big.len() as f64)
        })
        .with_context(|| w.logs())?;
        wait_until(DONE, || Ok(ids(&output)? == small))
            .with_context(|| format!("{policy}: every small record is delivered once"))?;
        ensure!(w.running(), "{policy}: the worker keeps running");
        ensure!(w.stop()? == 0);
        if policy == "deadLetter" {
            let dlq = read_all(&format!("{id}-dlq"))?;
            ensure!(dlq.len() == big.len(), "{} dead letters", dlq.len());
            let reason = dlq[0].headers.get("eddy.error.reason").cloned();
            ensure!(
                reason
                    .as_deref()
                    .is_some_and(|r| r.contains("max.message.bytes")),
                "the dead letter says why: {reason:?}"
            );
        }
    }

    // at-least-once, onError: fail: stops on the first oversized output, commits nothing
    // past it; once the topic takes larger records, a restart delivers everything.
    let id = format!("{app}-fail");
    let output = format!("{id}-out");
    create_topic(&output, 2)?;
    set_topic_config(&output, "max.message.bytes", "2048")?;
    let yaml = pass_through(&id, &input, &output, "at_least_once", "fail");
    let mut w = Worker::start(&yaml, &dir.path().join("fail"))?;
    let code = w.wait_exit(DONE)?;
    let logs = w.logs();
    ensure!(code != 0, "onError: fail stops the worker:\n{logs}");
    ensure!(
        logs.contains("max.message.bytes") && logs.contains(&format!("{input}[")),
        "the error names the record and the limit:\n{logs}"
    );
    set_topic_config(&output, "max.message.bytes", "1048588")?;
    let mut w = Worker::start(&yaml, &dir.path().join("fail"))?;
    w.wait_ready(READY)?;
    let all: Vec<i64> = (0..300).collect();
    wait_until(DONE, || {
        let mut seen = ids(&output)?;
        seen.dedup();
        Ok(seen == all)
    })
    .context("at-least-once: every record delivered after the fix")?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// Bytes free on the filesystem holding `path`.
fn free_bytes(path: &Path) -> Result<u64> {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .context("df printed no size")
}

/// A small tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()?;
        ensure!(
            st.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN): this test fills a small disk"
        );
        Ok(Tmpfs(path.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(&self.0)
            .status();
    }
}

/// Another process filling the disk: keeps taking every byte that gets free (RocksDB frees
/// some when it deletes obsolete files) until stopped, then deletes its file.
struct Filler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    file: std::path::PathBuf,
}

impl Filler {
    fn start(file: &Path) -> Result<Filler> {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut f = std::fs::File::create(file)?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || -> Result<()> {
            let chunk = vec![0u8; 64 << 10];
            while !flag.load(Ordering::Relaxed) {
                match f.write(&chunk) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        });
        Ok(Filler {
            stop,
            thread: Some(thread),
            file: file.to_path_buf(),
        })
    }

    fn stop(mut self) -> Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| anyhow::anyhow!("the filler thread panicked"))??;
        }
        std::fs::remove_file(&self.file)?;
        Ok(())
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The state directory's disk fills up while the worker processes: it stops processing,
/// says why, keeps its process, and when space returns resumes with exact counts
/// (exactly-once), having lost nothing.
#[test]
fn a_full_state_disk_pauses_processing_until_space_returns() -> Result<()> {
    let app = unique("disk");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    let _cleanup = Cleanup(vec![input.clone(), output.clone()], app.clone());
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let _tmpfs = Tmpfs::mount(&state, "96m")?;
    // 2 KB values that compress poorly: the store's log grows fast.
    let yaml = format!(
        "applicationId: {app}\nprocessingGuarantee: exactly_once\ncommitIntervalMs: 200\ntopology:\n  - from: {{topic: {input}}}\n  - aggregate: {{store: s, initial: '{{n: 0}}', add: '{{n: ($agg.n + 1), pad: .pad}}'}}\n  - map: '.n'\n  - to: {{topic: {output}}}\n"
    );
    let records = |from: usize, n: usize| -> Vec<Input> {
        (from..from + n)
            .map(|i| {
                let pad: String = (0..256)
                    .map(|j| format!("{:08x}", (i * 7919 + j * 104_729) % 0xffff_ffff))
                    .collect();
                // A key per record: every record adds 2 KB to the store.
                (
                    Some(format!("k{i}").into_bytes()),
                    Some(format!("{{\"pad\":\"{pad}\"}}").into_bytes()),
                )
            })
            .collect()
    };
    let counts = |topic: &str| -> Result<HashMap<String, i64>> {
        let mut m = HashMap::new();
        for r in read_all(topic)? {
            if let (Some(k), Some(v)) = (r.key, r.value) {
                m.insert(
                    String::from_utf8_lossy(&k).to_string(),
                    String::from_utf8_lossy(&v).parse::<i64>()?,
                );
            }
        }
        Ok(m)
    };
    produce(&input, &records(0, 2000))?;
    let mut w = Worker::start_with(
        &yaml,
        dir.path(),
        &WorkerOptions {
            state_dir: Some(state.clone()),
            ..Default::default()
        },
    )?;
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 2000.0)
    })?;

    let filler = Filler::start(&state.join("filler"))?;
    // Input keeps coming until the worker hits the full disk: how much RocksDB gets through
    // first depends on races with the filler over the space it frees (obsolete WAL files),
    // so no fixed amount of input is sure to hit it. Every record adds state, so one does.
    let mut produced = 2000;
    let noticed = || -> Result<bool> {
        Ok(w.metric(
            "eddy_recoveries_total",
            &["reason=\"StateStoreUnavailable\""],
        )? >= 3.0)
    };
    let deadline = Instant::now() + DONE;
    while !noticed()? {
        ensure!(
            Instant::now() < deadline && produced < 400_000,
            "the full disk must be noticed ({produced} records produced, {:?} processed, {:?} bytes free):\n{}",
            w.metric("eddy_records_processed_total", &[]),
            free_bytes(&state),
            w.logs()
        );
        if w.metric("eddy_records_processed_total", &[])? + 4000.0 >= produced as f64 {
            produce(&input, &records(produced, 2000))?;
            produced += 2000;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    ensure!(w.running(), "the worker keeps its process:\n{}", w.logs());
    ensure!(
        w.logs().contains("No space left on device"),
        "the log says why:\n{}",
        w.logs()
    );
    let (_, readyz) = w.health()?;
    ensure!(
        readyz.0 == 503 && readyz.1.contains("StateStoreUnavailable"),
        "{readyz:?}"
    );

    filler.stop()?;
    ensure!(free_bytes(&state)? > 32 << 20, "space is back");
    w.wait_ready(READY)?;
    wait_until(DONE, || {
        let c = counts(&output)?;
        Ok(c.len() == produced && c.values().all(|n| *n == 1))
    })
    .with_context(|| format!("exact counts after the disk recovered:\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);
    Ok(())
}

/// Under exactly-once a commit interval longer than half the transaction timeout would make
/// the brokers abort transactions: `check` and `run` refuse it, saying what to change.
#[test]
fn a_commit_interval_the_transaction_timeout_cannot_cover_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("app.yaml");
    std::fs::write(
        &file,
        "applicationId: x\nprocessingGuarantee: exactly_once\ncommitIntervalMs: 30000\ntopology:\n  - from: {topic: a}\n",
    )?;
    for args in [
        vec!["check", "-f"],
        vec!["run", "--bootstrap-servers", "127.0.0.1:1", "-f"],
    ] {
        let out = std::process::Command::new(binary("eddy-worker")?)
            .args(&args)
            .arg(&file)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{args:?} must fail");
        ensure!(
            err.contains("commitIntervalMs") && err.contains("transactionTimeoutMs"),
            "{args:?}: {err}"
        );
    }
    Ok(())
}

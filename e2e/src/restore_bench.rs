//! The large-state restore benchmark (`eddy-bench --large-restore`, docs/benchmarks.md): a
//! store of several million keys with values of a few hundred bytes (over 1 GiB on disk),
//! restored by eddy from an empty state dir and from a checkpoint a known number of records
//! behind, against a raw read of the same changelog (restore's ceiling) and against Kafka
//! Streams (`bench/kstreams`, case `latest`) restoring the same changelog.
//!
//! The changelog is written directly, as the app's store would have written it (one record per
//! key, then `tail` updates of existing keys): running millions of records through both engines
//! first would take minutes and twice the disk, and restore only reads the changelog. Both
//! engines run the same application id and store name, so they restore the very same topic.

use crate::compare::{CONTAINER_JVM, EDDY_PROCESSING_THREADS, kstreams_jar, run_java};
use crate::*;
use anyhow::{Context as _, Result, bail};
use eddy_worker::collector::PRODUCER_TUNING;
use eddy_worker::restore::RESTORE_CONSUMER_TUNING;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Options {
    /// Keys in the store (one changelog record each).
    pub keys: usize,
    /// Bytes of each value (a JSON string of random letters and digits: incompressible for
    /// RocksDB's LZ4, so the state on disk is about keys × value size).
    pub value_bytes: usize,
    /// Updates appended to the changelog after the first restore: the checkpoint-behind case.
    pub tail: usize,
    pub partitions: i32,
    /// Also run Kafka Streams (the reference app's jar: built by `bench/kstreams/build.sh`
    /// unless given).
    pub kstreams: bool,
    pub jar: Option<PathBuf>,
}

/// One measured read or restore.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub name: String,
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub cpu: f64,
    pub rss: u64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

const STORE: &str = "latest";

/// Run the benchmark, print its tables and return them as JSON; deletes its topics and state
/// dirs at the end.
pub fn run(o: &Options) -> Result<serde_json::Value> {
    if o.value_bytes < 3 {
        bail!("--value-bytes must be at least 3 (a JSON string)");
    }
    let bs = bootstrap()?;
    let app = unique("bench-large-restore");
    let (input, output) = (format!("{app}-input"), format!("{app}-out"));
    let changelog = format!("{app}-{STORE}-changelog");
    let result = run_with(o, &bs, &app, &input, &output, &changelog);
    let mut topics = topics_with_prefix(&app).unwrap_or_default();
    topics.extend([input, output, changelog]);
    topics.sort();
    topics.dedup();
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    delete_topics(&refs)?;
    eprintln!("deleted topics {}", topics.join(", "));
    result
}

fn run_with(
    o: &Options,
    bs: &str,
    app: &str,
    input: &str,
    output: &str,
    changelog: &str,
) -> Result<serde_json::Value> {
    let jar = match (&o.jar, o.kstreams) {
        (Some(j), true) => Some(j.clone()),
        (None, true) => Some(kstreams_jar()?),
        (_, false) => None,
    };
    create_topic(input, o.partitions)?;
    create_topic(output, o.partitions)?;
    create_topic(changelog, o.partitions)?;
    // Compacted like every changelog, but not while the benchmark runs: the broker's log
    // cleaner rewriting a fresh GiB would compete with the reads for the same two cores.
    alter_topic(
        changelog,
        &[
            ("cleanup.policy", "compact"),
            ("min.compaction.lag.ms", "86400000"),
        ],
    )?;
    eprintln!(
        "writing {} keys with {}-byte values to {changelog}",
        o.keys, o.value_bytes
    );
    let started = Instant::now();
    let written = produce_values(changelog, o.partitions, (0..o.keys).collect(), o, 1)?;
    eprintln!(
        "wrote {} MB in {:.1} s",
        written / 1_000_000,
        started.elapsed().as_secs_f64()
    );
    let yaml = format!(
        "applicationId: {app}\ntopology:\n  - from: {{topic: {input}, key: string, value: json}}\n  - aggregate: {{store: {STORE}, initial: 'null', add: '.'}}\n  - to: {{topic: {output}, value: json}}\n"
    );
    let edir = tempfile::Builder::new()
        .prefix("eddy-large-restore-")
        .tempdir()?;
    let kdir = tempfile::Builder::new()
        .prefix("eddy-large-restore-ks-")
        .tempdir()?;
    let ks_args = |keep: bool| {
        let mut a: Vec<String> = [
            "--bootstrap",
            bs,
            "--app-id",
            app,
            "--case",
            STORE,
            "--guarantee",
            "at_least_once",
            "--input",
            input,
            "--output",
            output,
            "--state-dir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.push(kdir.path().join("state").display().to_string());
        a.extend([
            "--config".into(),
            format!("num.stream.threads={EDDY_PROCESSING_THREADS}"),
            "--restore-only".into(),
        ]);
        if keep {
            a.push("--keep-state".into());
        }
        a
    };
    let jvm: Vec<String> = CONTAINER_JVM.iter().map(|s| s.to_string()).collect();

    let mut rows = Vec::new();
    // Empty state dir: the whole changelog.
    let raw = raw_read(changelog, o.partitions, None, "raw read of the changelog")?;
    rows.push(raw.clone());
    let full = eddy_restore(&yaml, edir.path(), "eddy restore, empty state dir")?;
    if full.records != raw.records {
        bail!(
            "eddy restored {} records, the changelog holds {}",
            full.records,
            raw.records
        );
    }
    let eddy_disk = dir_bytes(&edir.path().join("state"))?;
    rows.push(full.clone());
    let ks_full = match &jar {
        Some(jar) => {
            let m = ks_restore(
                jar,
                &jvm,
                &ks_args(false),
                kdir.path(),
                "Kafka Streams restore, empty state dir",
            )?;
            rows.push(m.clone());
            Some(m)
        }
        None => None,
    };
    let ks_disk = match jar {
        Some(_) => Some(dir_bytes(&kdir.path().join("state"))?),
        None => None,
    };

    // Checkpoint behind: `tail` updates of existing keys appended after both engines stopped.
    let mut from = Vec::new();
    for p in 0..o.partitions {
        from.push((p, watermarks(changelog, p)?.1));
    }
    let keys: Vec<usize> = (0..o.tail)
        .map(|i| i.wrapping_mul(2_654_435_761) % o.keys.max(1))
        .collect();
    produce_values(changelog, o.partitions, keys, o, 2)?;
    let raw_tail = raw_read(
        changelog,
        o.partitions,
        Some(&from),
        "raw read of the tail past the checkpoint",
    )?;
    rows.push(raw_tail.clone());
    let tail = eddy_restore(
        &yaml,
        edir.path(),
        &format!("eddy restore, checkpoint {} records behind", o.tail),
    )?;
    if tail.records != o.tail as u64 {
        bail!(
            "eddy restored {} records from its checkpoint, {} were appended",
            tail.records,
            o.tail
        );
    }
    rows.push(tail.clone());
    let ks_tail = match &jar {
        Some(jar) => {
            let m = ks_restore(
                jar,
                &jvm,
                &ks_args(true),
                kdir.path(),
                &format!(
                    "Kafka Streams restore, checkpoint {} records behind",
                    o.tail
                ),
            )?;
            rows.push(m.clone());
            Some(m)
        }
        None => None,
    };

    let mut md = format!(
        "{} keys, {}-byte values, {} partitions; eddy's state on disk after the restore: {:.2} GiB{}\n\n",
        o.keys,
        o.value_bytes,
        o.partitions,
        eddy_disk as f64 / GIB,
        ks_disk.map_or(String::new(), |d| format!(
            ", Kafka Streams': {:.2} GiB",
            d as f64 / GIB
        ))
    );
    md += "| case | records | MB read | seconds | records/s | CPU s | peak RSS MiB |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|\n";
    for r in &rows {
        md += &format!(
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} |\n",
            r.name,
            r.records,
            if r.bytes > 0 {
                format!("{:.0}", r.bytes as f64 / 1e6)
            } else {
                "–".into()
            },
            r.seconds,
            r.rate(),
            if r.cpu > 0.0 {
                format!("{:.2}", r.cpu)
            } else {
                "–".into()
            },
            if r.rss > 0 {
                format!("{:.0}", r.rss as f64 / 1048576.0)
            } else {
                "–".into()
            },
        );
    }
    // (id, what, value, target, at least the target (else at most))
    let mut ratios: Vec<(&str, &str, f64, Option<f64>, bool)> = vec![
        (
            "full_over_raw_read",
            "eddy restore / raw read, empty state dir",
            raw.seconds / full.seconds,
            Some(0.8),
            true,
        ),
        (
            "tail_over_raw_read",
            "eddy restore / raw read, checkpoint behind",
            raw_tail.seconds / tail.seconds,
            None,
            true,
        ),
    ];
    if let (Some(k), Some(kt)) = (&ks_full, &ks_tail) {
        ratios.push((
            "full_time_over_kstreams",
            "eddy time / Kafka Streams', empty state dir",
            full.seconds / k.seconds,
            Some(0.5),
            false,
        ));
        ratios.push((
            "tail_time_over_kstreams",
            "eddy time / Kafka Streams', checkpoint behind",
            tail.seconds / kt.seconds,
            Some(0.5),
            false,
        ));
    }
    md += "\n| ratio | measured | target |\n|---|---:|---:|\n";
    for (_, what, v, t, at_least) in &ratios {
        let (mark, target) = match t {
            Some(t) if *at_least => (if *v >= *t { "" } else { " ✗" }, format!("≥ {t}")),
            Some(t) => (if *v <= *t { "" } else { " ✗" }, format!("≤ {t}")),
            None => ("", String::new()),
        };
        md += &format!("| {what} | {v:.2}{mark} | {target} |\n");
    }
    let beaten = full.rate() > raw.rate();
    if beaten {
        md += "\nCeiling beaten (the baseline is wrong): eddy's restore beats the raw read.\n";
    }
    println!("\n{md}");
    Ok(serde_json::json!({
        "benchmark": "restore",
        "keys": o.keys,
        "value_bytes": o.value_bytes,
        "tail": o.tail,
        "partitions": o.partitions,
        "kafka_streams": o.kstreams,
        "eddy_state_bytes": eddy_disk,
        "kafka_streams_state_bytes": ks_disk,
        "rows": rows.iter().map(|r| serde_json::json!({
            "case": r.name,
            "records": r.records,
            "bytes": r.bytes,
            "seconds": r.seconds,
            "records_per_second": r.rate(),
            "cpu_seconds": r.cpu,
            "peak_rss_bytes": r.rss,
        })).collect::<Vec<_>>(),
        "ratios": ratios.iter().map(|(id, what, v, t, at_least)| serde_json::json!({
            "id": id, "what": what, "value": v, "target": t, "at_least": at_least,
        })).collect::<Vec<_>>(),
        "ceiling_beaten": beaten,
        "markdown": md,
    }))
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Set several configs of a topic at once.
fn alter_topic(topic: &str, configs: &[(&str, &str)]) -> Result<()> {
    use rdkafka::admin::{AlterConfig, ResourceSpecifier};
    let admin: AdminClient<DefaultClientContext> = client(&[])?.create()?;
    let mut change = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in configs {
        change = change.set(k, v);
    }
    for r in block_on(admin.alter_configs(&[change], &AdminOptions::new()))?? {
        r.map_err(|(res, e)| anyhow::anyhow!("altering {res:?}: {e}"))?;
    }
    Ok(())
}

/// Write `key-<i>` = a random JSON string of `value_bytes` for each i of `keys`, each to the
/// partition Kafka's Java client picks, with the worker's producer settings. Returns bytes.
fn produce_values(
    topic: &str,
    partitions: i32,
    keys: Vec<usize>,
    o: &Options,
    seed: u64,
) -> Result<u64> {
    let mut cfg = client(PRODUCER_TUNING)?;
    let p: ThreadedProducer<DefaultProducerContext> =
        cfg.set("enable.idempotence", "true").create()?;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    let mut value = vec![b'"'; o.value_bytes];
    let mut bytes = 0u64;
    for i in keys {
        let key = format!("key-{i:09}");
        incompressible_text(&mut rng, &mut value[1..o.value_bytes - 1]);
        let part = eddy_worker::partitioner::partition_for(key.as_bytes(), partitions);
        let rec = BaseRecord::to(topic)
            .key(key.as_bytes())
            .payload(value.as_slice())
            .partition(part);
        send(&p, rec)?;
        bytes += (key.len() + value.len()) as u64;
    }
    let ms = 300_000;
    // SAFETY: the pointer is the live client `p` owns; rd_kafka_flush is thread-safe.
    let err = unsafe { rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), ms) };
    if err != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        bail!("flushing the changelog writes to {topic}: {err:?}");
    }
    Ok(bytes)
}

/// Read a changelog (read_committed) from `from` (default: the beginning) to its end with the
/// restore consumer's settings, touching every key and value: restore's ceiling. Timed from the
/// consumer's creation (no process start).
fn raw_read(
    topic: &str,
    partitions: i32,
    from: Option<&[(i32, i64)]>,
    name: &str,
) -> Result<Measured> {
    eprintln!("running {name}");
    let started = Instant::now();
    let mut cfg = client(RESTORE_CONSUMER_TUNING)?;
    let c: BaseConsumer = cfg
        .set("group.id", unique("eddy-bench-raw"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    c.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let offset = from
            .and_then(|f| f.iter().find(|(q, _)| *q == p))
            .map_or(Offset::Beginning, |(_, o)| Offset::Offset(*o));
        tpl.add_partition_offset(topic, p, offset)?;
    }
    c.assign(&tpl)?;
    let (mut open, mut records, mut bytes) = (partitions, 0u64, 0u64);
    while open > 0 {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                records += 1;
                bytes +=
                    (m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len)) as u64;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => open -= 1,
            Some(Err(e)) => bail!("reading {topic}: {e}"),
            None => {}
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("{name}: not done after 30 minutes");
        }
    }
    Ok(Measured {
        name: name.into(),
        records,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        ..Measured::default()
    })
}

/// Start a worker on `dir` (its state dir as it is), time process start → `/readyz` 200, then
/// stop it cleanly (SIGTERM: the stores flush, so the next start restores only what is new).
fn eddy_restore(yaml: &str, dir: &Path, name: &str) -> Result<Measured> {
    eprintln!("running {name}");
    let started = Instant::now();
    let mut w = Worker::start(yaml, dir)?;
    let pid = w.pid().context("worker pid")?;
    let sampler = Sampling::start(pid);
    w.wait_ready(Duration::from_secs(1800))?;
    let seconds = started.elapsed().as_secs_f64();
    let (rss, cpu) = sampler.stop();
    let records = w.metric("eddy_restored_records_total", &[])? as u64;
    let code = w.stop()?;
    if code != 0 {
        bail!("{name}: worker exited with {code}:\n{}", w.logs());
    }
    // Restore's own judgement of the data (see docs/architecture.md, "Restore").
    let logs = w.logs();
    if logs.lines().any(|l| l.contains("could not shrink")) {
        eprintln!(
            "{name}: the data did not compress; restore wrote its later SST files uncompressed"
        );
    }
    Ok(Measured {
        name: name.into(),
        records,
        seconds,
        cpu,
        rss,
        ..Measured::default()
    })
}

/// Kafka Streams' `--restore-only` (JVM start → RUNNING, which it reaches once every task is
/// restored); its clean close writes the checkpoint the next run starts from.
fn ks_restore(
    jar: &Path,
    jvm: &[String],
    args: &[String],
    dir: &Path,
    name: &str,
) -> Result<Measured> {
    eprintln!("running {name}");
    let log = dir.join(format!("{}.log", unique("refapp")));
    let (_, cpu, rss, line) = run_java(jar, jvm, args, &log)?;
    Ok(Measured {
        name: name.into(),
        records: line["restored_records"].as_f64().unwrap_or(0.0) as u64,
        seconds: line["process_to_running_seconds"]
            .as_f64()
            .context("the reference app printed no process_to_running_seconds")?,
        // Whole run (the close included): its CPU and RSS are only indicative.
        cpu,
        rss,
        ..Measured::default()
    })
}

/// Peak RSS and CPU of a process, sampled every 20 ms on a thread until stopped.
struct Sampling {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, f64)>,
}

impl Sampling {
    fn start(pid: u32) -> Sampling {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut rss, mut cpu) = (0, 0.0);
            while !flag.load(Ordering::Relaxed) {
                if let Ok((r, c)) = proc_stats(pid) {
                    rss = r.max(rss);
                    cpu = c;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok((r, c)) = proc_stats(pid) {
                rss = r.max(rss);
                cpu = c;
            }
            (rss, cpu)
        });
        Sampling { stop, thread }
    }

    fn stop(self) -> (u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or((0, 0.0))
    }
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let meta = e.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&e.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

//! `eddy-bench`: the engine benchmark on a local broker. Prints records/s, CPU seconds per
//! million records and peak RSS for (a) a raw librdkafka consume→produce pass-through (the
//! limit of this machine), (b) `from → count → to` at-least-once, (c) the same exactly-once,
//! (d) restore of the resulting changelog against a raw read of it, and (e) peak RSS with 32
//! partitions and two stores against the memory budget. Figures are ratios measured in one
//! run: absolute numbers on a shared machine are noise.

use anyhow::{Context, Result, bail};
use eddy_e2e::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

struct Args {
    records: usize,
    keys: usize,
    partitions: i32,
}

fn arg(name: &str, default: usize) -> Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a value"))?
            .parse()
            .with_context(|| format!("{name} must be a number")),
        None => Ok(default),
    }
}

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("passthrough") {
        return passthrough_child();
    }
    let a = Args {
        records: arg("--records", 2_000_000)?,
        keys: arg("--keys", 100_000)?,
        partitions: arg("--partitions", 12)? as i32,
    };
    let bs = bootstrap()?;
    eprintln!(
        "kafka at {bs}; {} records, {} keys, {} partitions",
        a.records, a.keys, a.partitions
    );
    let input = ensure_input(a.records, a.keys, a.partitions, "bench-input")?;
    let mut rows = Vec::new();

    // (a) the limit: consume and produce every record, no processing.
    let out = unique("bench-pass-out");
    create_topic(&out, a.partitions)?;
    let started = Instant::now();
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["passthrough", &bs, &input, &out, &a.records.to_string()])
        .spawn()?;
    let pid = child.id();
    let mut peak = 0;
    let mut cpu = 0.0;
    loop {
        if let Some(st) = child.try_wait()? {
            if !st.success() {
                bail!("pass-through failed: {st}");
            }
            break;
        }
        if let Ok(p) = proc_stats(pid) {
            peak = peak.max(p.0);
            cpu = p.1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let raw = Run {
        name: "(a) raw consume→produce".into(),
        seconds: started.elapsed().as_secs_f64(),
        records: a.records,
        cpu,
        rss: peak,
    };
    rows.push(raw.clone());
    delete_topics(&[&out])?;

    // (b), (c): count per key, each from empty state with a fresh application id.
    let mut restore_app = None;
    for guarantee in ["at_least_once", "exactly_once"] {
        let app = unique("bench-count");
        let out = format!("{app}-out");
        create_topic(&out, a.partitions)?;
        let yaml = format!(
            "applicationId: {app}\nprocessingGuarantee: {guarantee}\ntopology:\n  - from: {{topic: {input}}}\n  - count: {{store: counts}}\n  - to: {{topic: {out}, value: i64}}\n"
        );
        let dir = tempfile::tempdir()?;
        let run = run_worker(
            &yaml,
            dir.path(),
            a.records,
            &format!(
                "({}) count {guarantee}",
                if guarantee == "at_least_once" {
                    "b"
                } else {
                    "c"
                }
            ),
        )?;
        rows.push(run);
        if guarantee == "at_least_once" {
            restore_app = Some((app, yaml, dir, out));
        } else {
            cleanup(&app, &[&out])?;
        }
    }

    // (d) restore of the at-least-once run's changelog, against a raw read of it.
    let (app, yaml, dir, out) = restore_app.context("no count run")?;
    let changelog = format!("{app}-counts-changelog");
    let started = Instant::now();
    let n = read_count(&changelog)?;
    let raw_read = Run {
        name: "(d) raw read of the changelog".into(),
        seconds: started.elapsed().as_secs_f64(),
        records: n,
        cpu: 0.0,
        rss: 0,
    };
    std::fs::remove_dir_all(dir.path().join("state"))?;
    let started = Instant::now();
    let mut w = Worker::start(&yaml, dir.path())?;
    let pid = w.pid().context("worker pid")?;
    w.wait_ready(Duration::from_secs(600))?;
    let restore = Run {
        name: "(d) restore of the changelog".into(),
        seconds: started.elapsed().as_secs_f64(),
        records: w.metric("eddy_restored_records_total", &[])? as usize,
        cpu: proc_stats(pid).map(|p| p.1).unwrap_or(0.0),
        rss: proc_stats(pid).map(|p| p.0).unwrap_or(0),
    };
    w.stop()?;
    rows.push(raw_read.clone());
    rows.push(restore.clone());
    cleanup(&app, &[&out])?;

    // (e) memory: 32 partitions, two stores, default 256 MiB budget.
    let input32 = ensure_input(a.records / 2, a.keys, 32, "bench-input32")?;
    let app = unique("bench-mem");
    let out = format!("{app}-out");
    create_topic(&out, 32)?;
    let yaml = format!(
        "applicationId: {app}\nmemory: {{budget: 256Mi}}\ntopology:\n  - from: {{topic: {input32}}}\n  - count: {{store: counts}}\n  - aggregate: {{store: doubled, initial: '0', add: '. * 2'}}\n  - to: {{topic: {out}, value: json}}\n"
    );
    let dir = tempfile::tempdir()?;
    let mem = run_worker(
        &yaml,
        dir.path(),
        a.records / 2,
        "(e) 32 partitions, 2 stores",
    )?;
    rows.push(mem.clone());
    cleanup(&app, &[&out])?;

    println!("\n| case | records | seconds | records/s | CPU s per M records | peak RSS MiB |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.2} | {:.0} |",
            r.name,
            r.records,
            r.seconds,
            r.rate(),
            r.cpu / (r.records as f64 / 1e6),
            r.rss as f64 / 1048576.0
        );
    }
    let ratio = |x: &Run, y: &Run| x.rate() / y.rate();
    println!("\nratios (targets in parentheses):");
    println!(
        "  (b) count at-least-once / raw: {:.2} (≥ 0.60)",
        ratio(&rows[1], &raw)
    );
    println!(
        "  (c) count exactly-once / raw:  {:.2} (≥ 0.40)",
        ratio(&rows[2], &raw)
    );
    println!(
        "  (d) restore / raw read:        {:.2} (≥ 0.70)",
        ratio(&restore, &raw_read)
    );
    println!(
        "  (e) peak RSS - budget:         {:.0} MiB (≤ 128 MiB over the 256 MiB budget)",
        mem.rss as f64 / 1048576.0 - 256.0
    );
    Ok(())
}

#[derive(Clone)]
struct Run {
    name: String,
    seconds: f64,
    records: usize,
    cpu: f64,
    rss: u64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

fn cleanup(app: &str, extra: &[&str]) -> Result<()> {
    let mut all: Vec<String> = topics_with_prefix(app)?;
    all.extend(extra.iter().map(|s| s.to_string()));
    all.sort();
    all.dedup();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    delete_topics(&refs)
}

/// Run a worker from start until every input record is processed and committed (SIGTERM
/// commits and exits), sampling its peak RSS and CPU time.
fn run_worker(yaml: &str, dir: &std::path::Path, records: usize, name: &str) -> Result<Run> {
    eprintln!("running {name}");
    let started = Instant::now();
    let mut w = Worker::start(yaml, dir)?;
    let pid = w.pid().context("worker pid")?;
    w.wait_ready(Duration::from_secs(600))?;
    let mut stats = (0, 0.0);
    loop {
        if let Ok(p) = proc_stats(pid) {
            stats = p;
        }
        // Processed counts both sub-topologies; the count topology has one.
        if w.metric("eddy_records_processed_total", &[])? >= records as f64 {
            break;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("{name}: not done after 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Ok(p) = proc_stats(pid) {
        stats = p;
    }
    let code = w.stop()?;
    if code != 0 {
        bail!("{name}: worker exited with {code}:\n{}", w.logs());
    }
    Ok(Run {
        name: name.into(),
        seconds: started.elapsed().as_secs_f64(),
        records,
        cpu: stats.1,
        rss: stats.0,
    })
}

/// Read a whole topic (read_committed) as fast as librdkafka goes, counting records.
fn read_count(topic: &str) -> Result<usize> {
    let n = partition_count(topic)?;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap()?)
        .set("group.id", "eddy-bench-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .set("queued.max.messages.kbytes", "65536")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let (mut open, mut count) = (n, 0usize);
    while open > 0 {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                // Touch the bytes as a restore would copy them.
                count += usize::from(m.payload().is_some() || m.key().is_some());
            }
            Some(Err(KafkaError::PartitionEOF(_))) => open -= 1,
            Some(Err(e)) => bail!("reading {topic}: {e}"),
            None => {}
        }
    }
    Ok(count)
}

/// `eddy-bench passthrough BOOTSTRAP INPUT OUTPUT N`: consume N records and produce each one
/// unchanged to the same partition of OUTPUT, then commit: the ceiling for any processor.
fn passthrough_child() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, _, bs, input, output, n] = args.as_slice() else {
        bail!("usage: eddy-bench passthrough BOOTSTRAP INPUT OUTPUT N");
    };
    let n: usize = n.parse()?;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("group.id", unique("eddy-bench-pass"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.max.bytes", "52428800")
        .create()?;
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("linger.ms", "10")
        .set("batch.num.messages", "10000")
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.kbytes", "32768")
        .create()?;
    c.subscribe(&[input])?;
    let mut seen = 0;
    while seen < n {
        let Some(m) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m?;
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output).partition(m.partition());
        if let Some(k) = m.key() {
            rec = rec.key(k);
        }
        if let Some(v) = m.payload() {
            rec = rec.payload(v);
        }
        send(&p, rec)?;
        seen += 1;
    }
    p.flush(Duration::from_secs(120))?;
    c.commit_consumer_state(CommitMode::Sync)?;
    Ok(())
}

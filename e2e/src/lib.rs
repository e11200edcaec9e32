//! Test harness for eddy's end-to-end tests: a real Kafka broker started by
//! `e2e/kafka/kafka.sh`, topics, producing and reading records, and `eddy-worker` processes
//! started, scraped, stopped and killed like a user would.

pub mod chart;

pub mod k8s;

pub mod node;

pub mod operated;

pub mod prometheus;

pub mod compare;

pub mod windowed;

pub mod joins;

pub mod curve;

pub mod report;

pub mod restore_bench;

pub mod scaling;

pub mod seen;

use anyhow::{Context as _, Result, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Root of the repository: found at run time first, because a target directory shared by
/// several clones (CI's warm cache) can hold a binary compiled in another clone.
pub fn repo_root() -> PathBuf {
    let is_root = |p: &Path| p.join("e2e/kafka/kafka.sh").is_file();
    let from_cargo = std::env::var("CARGO_MANIFEST_DIR")
        .ok()
        .and_then(|d| Path::new(&d).parent().map(Path::to_path_buf));
    let from_cwd = std::env::current_dir().ok();
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf);
    [from_cargo, from_cwd, built_in.clone()]
        .into_iter()
        .flatten()
        .find(|p| is_root(p))
        .or(built_in)
        .unwrap_or_default()
}

static ADDR: OnceLock<std::result::Result<String, String>> = OnceLock::new();

/// Bootstrap address of the test broker: `EDDY_TEST_BOOTSTRAP` if set, else a broker named
/// `test` started (or found running) by `e2e/kafka/kafka.sh`. `.ci/run` stops it at the end.
pub fn bootstrap() -> Result<String> {
    ADDR.get_or_init(|| {
        if let Ok(a) = std::env::var("EDDY_TEST_BOOTSTRAP") {
            return Ok(a);
        }
        start_cluster(1, "test", &[])
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

fn start_cluster(
    brokers: usize,
    name: &str,
    options: &[&str],
) -> std::result::Result<String, String> {
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/kafka/kafka.sh"))
        .args(["start", "--brokers", &brokers.to_string(), "--name", name])
        .args(options)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running e2e/kafka/kafka.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("e2e/kafka/kafka.sh start failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| l.trim().to_string())
        .ok_or_else(|| "kafka.sh printed no bootstrap address".to_string())
}

/// A cluster of its own for this test process (e.g. 3 brokers where replication matters);
/// every harness function then talks to it. Stopped when the guard drops.
pub fn own_cluster(brokers: usize, name: &str) -> Result<ClusterGuard> {
    own_cluster_with(brokers, name, &[])
}

/// A one-broker cluster of its own whose clients' listener is on `host` (an address of this
/// machine, e.g. a real node's bridge, which pods reach) instead of 127.0.0.1; every harness
/// function then talks to it.
pub fn own_cluster_on(name: &str, host: &str) -> Result<ClusterGuard> {
    own_cluster_with(1, name, &["--host", host])
}

fn own_cluster_with(brokers: usize, name: &str, options: &[&str]) -> Result<ClusterGuard> {
    let addr = start_cluster(brokers, name, options).map_err(anyhow::Error::msg)?;
    let guard = ClusterGuard(name.to_string());
    if ADDR.set(Ok(addr.clone())).is_err() && bootstrap()? != addr {
        bail!("own_cluster must be called before any other harness function");
    }
    Ok(guard)
}

/// A one-broker cluster of its own with secured listeners (`options`: `--sasl`, `--tls`, as
/// `kafka.sh start` takes them); the harness functions use its PLAINTEXT listener. Returns
/// what `kafka.sh info` prints: the `sasl_plaintext`, `ssl` and `sasl_ssl` addresses,
/// `sasl_username`, `sasl_password`, and the PEM files `ca_file`, `client_cert_file`,
/// `client_key_file`.
pub fn own_secured_cluster(
    name: &str,
    options: &[&str],
) -> Result<(ClusterGuard, HashMap<String, String>)> {
    let guard = own_cluster_with(1, name, options)?;
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/kafka/kafka.sh"))
        .args(["info", "--name", name])
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("kafka.sh info --name {name} failed ({})", out.status);
    }
    let info = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok((guard, info))
}

pub struct ClusterGuard(String);

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("e2e/kafka/kafka.sh"))
            .args(["stop", "--name", &self.0])
            .output();
    }
}

/// Replication factor of each partition of a topic.
pub fn replication_factors(topic: &str) -> Result<Vec<usize>> {
    let c: BaseConsumer = client(&[])?.create()?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(md
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.replicas().len()).collect())
        .unwrap_or_default())
}

/// A unique name so tests can run in parallel and twice in a row.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

fn client(extra: &[(&str, &str)]) -> Result<ClientConfig> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap()?);
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c)
}

fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

pub fn create_topic(name: &str, partitions: i32) -> Result<()> {
    create_topic_rf(name, partitions, 1)
}

/// Create a topic with `rf` replicas per partition (where a broker may go away).
pub fn create_topic_rf(name: &str, partitions: i32, rf: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(&[])?.create()?;
    let res = block_on(admin.create_topics(
        &[NewTopic::new(name, partitions, TopicReplication::Fixed(rf))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))??;
    for r in res {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    wait_until(Duration::from_secs(30), || {
        Ok(partition_count(name)? == partitions)
    })
}

/// Delete topics (missing ones are fine): tests clean up after themselves.
pub fn delete_topics(names: &[&str]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(&[])?.create()?;
    block_on(admin.delete_topics(names, &AdminOptions::new()))??;
    Ok(())
}

/// Every topic whose name starts with `prefix` (an app's internal topics).
pub fn topics_with_prefix(prefix: &str) -> Result<Vec<String>> {
    let c: BaseConsumer = client(&[])?.create()?;
    let md = c.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(md
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect())
}

pub fn partition_count(topic: &str) -> Result<i32> {
    let c: BaseConsumer = client(&[])?.create()?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(md.topics().first().map_or(0, |t| {
        if t.error().is_some() {
            0
        } else {
            t.partitions().len() as i32
        }
    }))
}

/// (low, high) watermarks of one partition.
pub fn watermarks(topic: &str, partition: i32) -> Result<(i64, i64)> {
    let c: BaseConsumer = client(&[])?.create()?;
    Ok(c.fetch_watermarks(topic, partition, Duration::from_secs(10))?)
}

/// Set a topic config (replaces the topic's other dynamic configs).
pub fn set_topic_config(topic: &str, key: &str, value: &str) -> Result<()> {
    set_topic_configs(topic, &[(key, value)])
}

/// Set a topic's dynamic configs to exactly `configs` (the others go back to the broker's
/// defaults).
pub fn set_topic_configs(topic: &str, configs: &[(&str, &str)]) -> Result<()> {
    use rdkafka::admin::{AlterConfig, ResourceSpecifier};
    let admin: AdminClient<DefaultClientContext> = client(&[])?.create()?;
    let change = configs.iter().fold(
        AlterConfig::new(ResourceSpecifier::Topic(topic)),
        |c, (k, v)| c.set(k, v),
    );
    for r in block_on(admin.alter_configs(&[change], &AdminOptions::new()))?? {
        r.map_err(|(res, e)| anyhow::anyhow!("altering {res:?}: {e}"))?;
    }
    Ok(())
}

/// Remove all records of a partition before `offset` (Kafka's DeleteRecords; the broker only
/// allows it on topics whose cleanup.policy includes `delete`).
pub fn delete_records(topic: &str, partition: i32, offset: i64) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(&[])?.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    let res = block_on(admin.delete_records(&tpl, &AdminOptions::new()))??;
    for e in res.elements() {
        if let Err(err) = e.error() {
            bail!("deleting records of {topic}[{partition}] before {offset}: {err}");
        }
    }
    let c: BaseConsumer = client(&[])?.create()?;
    wait_until(Duration::from_secs(30), || {
        Ok(
            c.fetch_watermarks(topic, partition, Duration::from_secs(10))?
                .0
                >= offset,
        )
    })
}

/// A record to produce: optional key and value bytes.
pub type Input = (Option<Vec<u8>>, Option<Vec<u8>>);

/// A StatefulStreamApp of `replicas` workers counting `input`'s records by key into `output`
/// (i64 values), committing every 200 ms; `extra`: more spec lines, indented by two.
pub fn counting_app_yaml(
    name: &str,
    replicas: i32,
    bs: &str,
    input: &str,
    output: &str,
    extra: &str,
) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  kafka: {{bootstrapServers: "{bs}"}}
  commitIntervalMs: 200
{extra}  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

/// `n` records over `keys` keys (`k0`, `k1`, ...) into `topic`.
pub fn produce_counts(topic: &str, n: usize, keys: usize) -> Result<()> {
    let records: Vec<Input> = (0..n)
        .map(|i| {
            (
                Some(format!("k{}", i % keys).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(topic, &records)
}

/// Produce records, each to the partition Kafka's Java client would pick for its key.
pub fn produce(topic: &str, records: &[Input]) -> Result<()> {
    produce_with(topic, records, &[])
}

/// [`produce`] with more producer settings (e.g. `batch.size`).
pub fn produce_with(topic: &str, records: &[Input], settings: &[(&str, &str)]) -> Result<()> {
    let n = partition_count(topic)?;
    let mut config = vec![("linger.ms", "20"), ("enable.idempotence", "true")];
    config.extend_from_slice(settings);
    let p: ThreadedProducer<DefaultProducerContext> = client(&config)?.create()?;
    for (k, v) in records {
        let part = k
            .as_deref()
            .map_or(0, |k| eddy_worker::partitioner::partition_for(k, n));
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(part);
        if let Some(k) = k {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = v {
            rec = rec.payload(v.as_slice());
        }
        send(&p, rec)?;
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Produce keyed records with the given timestamps (ms), each to the partition Kafka's Java
/// client would pick for its key.
pub fn produce_at(topic: &str, records: &[(Vec<u8>, Vec<u8>, i64)]) -> Result<()> {
    let n = partition_count(topic)?;
    let p: ThreadedProducer<DefaultProducerContext> =
        client(&[("linger.ms", "20"), ("enable.idempotence", "true")])?.create()?;
    for (k, v, ts) in records {
        let part = eddy_worker::partitioner::partition_for(k, n);
        let rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(part)
            .key(k.as_slice())
            .payload(v.as_slice())
            .timestamp(*ts);
        send(&p, rec)?;
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Produce tombstones (a key, no value) with the given timestamps, each to its key's
/// partition as Kafka's Java client would pick it.
pub fn produce_tombstones(topic: &str, records: &[(Vec<u8>, i64)]) -> Result<()> {
    let n = partition_count(topic)?;
    let p: ThreadedProducer<DefaultProducerContext> =
        client(&[("linger.ms", "20"), ("enable.idempotence", "true")])?.create()?;
    for (k, ts) in records {
        let part = eddy_worker::partitioner::partition_for(k, n);
        let rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .partition(part)
            .key(k.as_slice())
            .timestamp(*ts);
        send(&p, rec)?;
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Send a record, waiting for queue space when librdkafka's queue is full.
pub fn send<'a>(
    p: &ThreadedProducer<DefaultProducerContext>,
    mut rec: BaseRecord<'a, [u8], [u8]>,
) -> Result<()> {
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                r,
            )) => {
                p.poll(Duration::from_millis(5));
                rec = r;
            }
            Err((e, r)) => bail!("producing to {}: {e}", r.topic),
        }
    }
}

/// A record read back from a topic.
#[derive(Clone, Debug)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
    /// The record's timestamp (ms; -1 if it has none).
    pub timestamp: i64,
}

/// Every committed record of a topic, in partition and offset order.
pub fn read_all(topic: &str) -> Result<Vec<Consumed>> {
    let n = partition_count(topic)?;
    let c: BaseConsumer = client(&[
        ("group.id", "eddy-e2e-reader"),
        ("enable.auto.commit", "false"),
        ("isolation.level", "read_committed"),
        ("enable.partition.eof", "true"),
    ])?
    .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut open: std::collections::HashSet<i32> = (0..n).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !open.is_empty() {
        if Instant::now() > deadline {
            bail!("reading {topic}: partitions {open:?} did not reach their end in 120 s");
        }
        match c.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            // A broker going away (a fault test) is retried by librdkafka, as in the worker.
            Some(Err(e)) if !eddy_worker::fault::is_fatal(&e) => {}
            Some(Err(e)) => bail!("reading {topic}: {e}"),
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_string(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default())
                                        .to_string(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                    timestamp: m.timestamp().to_millis().unwrap_or(-1),
                });
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// The last value per key of a topic (what a compacted view of it shows).
pub fn latest_by_key(topic: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>> {
    let mut m = HashMap::new();
    for r in read_all(topic)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            m.insert(k, v);
        }
    }
    Ok(m)
}

/// Topics a test made (and every topic named with the app's prefix: its internal ones),
/// deleted when the guard drops, even when the test fails.
pub struct Cleanup(pub Vec<String>, pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let mut all = self.0.clone();
        all.extend(topics_with_prefix(&self.1).unwrap_or_default());
        // librdkafka crashes on a DeleteTopics request naming a topic twice.
        all.sort();
        all.dedup();
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let _ = delete_topics(&refs);
    }
}

/// Wait for a condition instead of sleeping a fixed time.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("condition not met within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Path of a binary of the workspace, built next to the test executable.
pub fn binary(name: &str) -> Result<PathBuf> {
    // Tests run from target/<profile>/deps/, binaries from target/<profile>/.
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("executable has no parent dir")?;
    [dir.join(name), dir.parent().unwrap_or(dir).join(name)]
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| {
            format!(
                "{name} not found next to {}: build it first with `cargo build --release --workspace --bins`",
                exe.display()
            )
        })
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How to start a worker other than the defaults (the test broker, state under its dir).
#[derive(Clone, Debug, Default)]
pub struct WorkerOptions {
    pub bootstrap: Option<String>,
    pub state_dir: Option<PathBuf>,
    /// Extra environment (e.g. what the operator gives a pod: `EDDY_ASSIGNMENT`, ...).
    pub env: Vec<(String, String)>,
}

/// A running `eddy-worker run` process.
pub struct Worker {
    child: Option<Child>,
    pub http: String,
    pub log: PathBuf,
}

impl Worker {
    /// Start a worker on `app` (file contents) with its state in `state_dir`.
    pub fn start(app: &str, state_dir: &Path) -> Result<Worker> {
        Self::start_with(app, state_dir, &WorkerOptions::default())
    }

    /// Start a worker with its files (app, log) in `dir` and the options given.
    pub fn start_with(app: &str, dir: &Path, o: &WorkerOptions) -> Result<Worker> {
        std::fs::create_dir_all(dir)?;
        let file = dir.join("app.yaml");
        std::fs::write(&file, app)?;
        let http = format!("127.0.0.1:{}", free_port()?);
        let log = dir.join(format!("worker-{}.log", unique("w")));
        let out = std::fs::File::create(&log)?;
        let bootstrap = match &o.bootstrap {
            Some(b) => b.clone(),
            None => bootstrap()?,
        };
        let child = Command::new(binary("eddy-worker")?)
            .args(["run", "-f"])
            .arg(&file)
            .arg("--bootstrap-servers")
            .arg(bootstrap)
            .arg("--state-dir")
            .arg(o.state_dir.clone().unwrap_or_else(|| dir.join("state")))
            .args(["--http-addr", &http])
            .env("EDDY_LOG", "info,librdkafka=warn")
            .envs(o.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        Ok(Worker {
            child: Some(child),
            http,
            log,
        })
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `/healthz` and `/readyz` as (status code, body).
    pub fn health(&self) -> Result<((u16, String), (u16, String))> {
        Ok((self.get("/healthz")?, self.get("/readyz")?))
    }

    /// Process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(&self.http, path)
    }

    /// Wait until `/readyz` answers 200 (every task RUNNING); fails early if the worker exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "worker exited with {st} before it was ready:\n{}",
                    self.logs()
                );
            }
            if matches!(self.get("/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("worker not ready within {timeout:?}:\n{}", self.logs());
            }
            // Short: the benchmark times restores with this loop.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn metrics(&self) -> Result<String> {
        Ok(self.get("/metrics")?.1)
    }

    /// Sum of a metric's samples whose line contains every one of `filters`.
    pub fn metric(&self, name: &str, filters: &[&str]) -> Result<f64> {
        Ok(sum_metric(&self.metrics()?, name, filters))
    }

    /// SIGTERM and wait: returns the exit code.
    pub fn stop(&mut self) -> Result<i32> {
        let Some(mut c) = self.child.take() else {
            return Ok(0);
        };
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()?;
        let st = c.wait()?;
        Ok(st.code().unwrap_or(-1))
    }

    /// SIGKILL: a crash.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Wait for the worker to exit by itself; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Ok(st.code().unwrap_or(-1));
            }
            if Instant::now() > deadline {
                bail!("worker still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

/// A plain HTTP/1.0 GET on a local address: (status code, body).
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    http_get_with_headers(addr, path).map(|(code, _, body)| (code, body))
}

/// [`http_get`], with the response's header lines too: (status code, headers, body).
pub fn http_get_with_headers(addr: &str, path: &str) -> Result<(u16, String, String)> {
    http_get_as(addr, path, None)
}

/// [`http_get_with_headers`] sending a bearer token, if any.
pub fn http_get_as(addr: &str, path: &str, token: Option<&str>) -> Result<(u16, String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n")?;
    let mut all = String::new();
    s.read_to_string(&mut all)?;
    let code = all
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (headers, body) = all.split_once("\r\n\r\n").unwrap_or((all.as_str(), ""));
    Ok((code, headers.to_string(), body.to_string()))
}

/// Sum of the samples of `name` in OpenMetrics text whose line contains all `filters`.
pub fn sum_metric(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

// ---- benchmark helpers (eddy-bench, eddy-vs-kstreams) ----

/// (peak RSS bytes, user+sys CPU seconds) of a process, from /proc.
pub fn proc_stats(pid: u32) -> Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .context("no VmHWM")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("bad /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the ')'; 100 Hz ticks.
    Ok((hwm * 1024, (ticks(11) + ticks(12)) / 100.0))
}

/// The benchmark input: `records` JSON values of ~100 bytes over `keys` keys, made once and
/// reused by later runs with the same sizes.
pub fn ensure_input(records: usize, keys: usize, partitions: i32, prefix: &str) -> Result<String> {
    let topic = format!("{prefix}-{records}-{keys}-{partitions}");
    if partition_count(&topic)? == partitions && read_count_fast(&topic)? == records as i64 {
        eprintln!("reusing input topic {topic}");
        return Ok(topic);
    }
    let _ = delete_topics(&[&topic]);
    wait_until(
        Duration::from_secs(30),
        || Ok(partition_count(&topic)? == 0),
    )?;
    create_topic(&topic, partitions)?;
    eprintln!("producing {} records to {topic}", records);
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap()?)
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .create()?;
    for i in 0..records {
        let key = format!("user-{}", (i.wrapping_mul(2_654_435_761)) % keys);
        let value = format!(
            r#"{{"user":"{key}","amount":{},"status":{},"page":"/products/{:05}","ts":{}}}"#,
            i % 97,
            if i % 10 == 0 { 404 } else { 200 },
            i % 50_000,
            1_700_000_000_000u64 + i as u64
        );
        let part = eddy_worker::partitioner::partition_for(key.as_bytes(), partitions);
        let rec = BaseRecord::to(&topic)
            .key(key.as_bytes())
            .payload(value.as_bytes())
            .partition(part);
        send(&p, rec)?;
    }
    p.flush(Duration::from_secs(120))?;
    Ok(topic)
}

/// Records in a topic from its watermarks (no transactions in the input).
pub fn read_count_fast(topic: &str) -> Result<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap()?)
        .create()?;
    let n = partition_count(topic)?;
    let mut total = 0;
    for p in 0..n {
        let (lo, hi) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        total += hi - lo;
    }
    Ok(total)
}

/// A TCP forwarder from a local port to `target`: lets a test make an address unreachable
/// and then reachable (Kafka clients bootstrap through it, then use the brokers' advertised
/// addresses). Stops accepting when dropped.
pub struct Forwarder {
    pub addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Forwarder {
    /// Listen on `addr` (e.g. a port that was free, so clients failed to connect so far).
    pub fn start(addr: &str, target: &str) -> Result<Forwarder> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (flag, target) = (stop.clone(), target.to_string());
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let _ = client.set_nonblocking(false);
                        for (mut from, mut to) in [
                            (client.try_clone(), server.try_clone()),
                            (server.try_clone(), client.try_clone()),
                        ]
                        .into_iter()
                        .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                        {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = to.shutdown(std::net::Shutdown::Both);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Forwarder {
            addr: addr.to_string(),
            stop,
        })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `e2e/kafka/kafka.sh tool <args>` against the test broker: a Kafka CLI tool, e.g. `configs`
/// for what the admin API of librdkafka lacks (client quotas). `--bootstrap-server` goes right
/// after the tool's name, where tools with subcommands (`transactions list`) require it.
pub fn kafka_tool(args: &[&str]) -> Result<String> {
    let bs = bootstrap()?;
    let (tool, rest) = args.split_first().context("kafka_tool: no tool named")?;
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/kafka/kafka.sh"))
        .args(["tool", tool, "--bootstrap-server", &bs])
        .args(rest)
        .output()?;
    if !out.status.success() {
        bail!(
            "kafka.sh tool {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `e2e/kafka/kafka.sh node <action> --name <cluster> --node <n>`: stop, start, pause or
/// resume one broker of a cluster started by the harness, keeping its data and ports.
pub fn kafka_node(cluster: &str, node: usize, action: &str) -> Result<()> {
    let st = Command::new("bash")
        .arg(repo_root().join("e2e/kafka/kafka.sh"))
        .args([
            "node",
            action,
            "--name",
            cluster,
            "--node",
            &node.to_string(),
        ])
        .stderr(Stdio::inherit())
        .status()?;
    if !st.success() {
        bail!("kafka.sh node {action} --name {cluster} --node {node} failed");
    }
    Ok(())
}

/// Fill `out` with letters and digits from the xorshift64 generator at `state`: cheap, and
/// random enough that LZ4 finds nothing to compress (like encrypted or hashed values).
pub fn incompressible_text(state: &mut u64, out: &mut [u8]) {
    const ALPHABET: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for b in out {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *b = ALPHABET[(*state % 62) as usize];
    }
}

/// Records produced in the background at a steady rate until [`Load::stop`]: keys `k0..kN`
/// (partitioned like Kafka's Java client), JSON values. It keeps producing through broker
/// outages (librdkafka buffers and retries for 10 minutes), so a test can break things under
/// load and then check every record's effect. Not idempotent: librdkafka's idempotent
/// producer can stall every partition while a broker is gone; a retry may then write a
/// record twice, so [`Load::stop`] counts what the topic holds, not what was sent.
pub struct Load {
    topic: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Load {
    /// About `per_second` records a second to `topic` over `keys` keys.
    pub fn start(topic: &str, keys: usize, per_second: u64) -> Result<Load> {
        let n = partition_count(topic)?;
        let p: ThreadedProducer<DefaultProducerContext> = client(&[
            ("linger.ms", "5"),
            ("acks", "all"),
            ("message.timeout.ms", "600000"),
        ])?
        .create()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, to) = (stop.clone(), topic.to_string());
        let thread = std::thread::spawn(move || -> Result<()> {
            let started = Instant::now();
            let mut i: u64 = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                // Steady: never ahead of the rate, so an outage does not pile up a burst.
                let due = started.elapsed().as_millis() as u64 * per_second / 1000;
                if i >= due {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let key = format!("k{}", i % keys as u64);
                let value = format!("{{\"i\":{i}}}");
                let part = eddy_worker::partitioner::partition_for(key.as_bytes(), n);
                send(
                    &p,
                    BaseRecord::to(&to)
                        .key(key.as_bytes())
                        .payload(value.as_bytes())
                        .partition(part),
                )?;
                i += 1;
            }
            p.flush(Duration::from_secs(600))?;
            Ok(())
        });
        Ok(Load {
            topic: topic.to_string(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stop, wait until every record is acknowledged, and return how many records of each
    /// key the topic holds (all of them, not only this load's).
    pub fn stop(mut self) -> Result<HashMap<String, i64>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => bail!("the load thread panicked"),
            None => bail!("load already stopped"),
        }
        let mut per_key: HashMap<String, i64> = HashMap::new();
        for r in read_all(&self.topic)? {
            if let Some(k) = r.key {
                *per_key
                    .entry(String::from_utf8_lossy(&k).to_string())
                    .or_default() += 1;
            }
        }
        Ok(per_key)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Every committed i64 output value per key of `topic`, in offset order.
pub fn i64_values_by_key(topic: &str) -> Result<HashMap<String, Vec<i64>>> {
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for r in read_all(topic)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            let v: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| anyhow::anyhow!("an i64 output must be 8 bytes"))?;
            seen.entry(String::from_utf8_lossy(&k).to_string())
                .or_default()
                .push(i64::from_be_bytes(v));
        }
    }
    Ok(seen)
}

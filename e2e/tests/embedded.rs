//! Embedding the engine as a library with a custom processor: the Processor API gets the
//! task's stores (cached, changelogged, restored) and sends records to topics.

use anyhow::{Result, ensure};
use eddy_crds::Format;
use eddy_e2e::*;
use eddy_worker::topology::{Source, StoreDef, SubTopology, Topology};
use eddy_worker::{Context, Overrides, ProcessError, Processor, Record, Status, WorkerConfig};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Forwards the first record of each key only, remembering seen keys in a store.
struct FirstPerKey {
    output: String,
}

impl Processor for FirstPerKey {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = r
            .key
            .as_ref()
            .map(|k| k.to_bytes(Format::Bytes))
            .transpose()
            .map_err(ProcessError::bad)?
        else {
            return Ok(());
        };
        let mut seen = ctx.store("seen")?;
        if seen.get(&key)?.is_some() {
            return Ok(());
        }
        seen.put(&key, b"1", r.timestamp);
        let value = r
            .value
            .as_ref()
            .map(|v| v.to_bytes(Format::Bytes))
            .transpose()
            .map_err(ProcessError::bad)?;
        ctx.send(&self.output, Some(&key), value.as_deref(), r.timestamp)
    }
}

/// A worker for `app` with `spec` (YAML lines, e.g. the guarantee), its state in `dir`,
/// running one sub-topology that reads `input` as bytes through what `sub` adds.
fn config(
    app: &str,
    spec: &str,
    input: &str,
    dir: &std::path::Path,
    sub: impl FnOnce(SubTopology) -> SubTopology,
) -> Result<WorkerConfig> {
    let mut cfg = WorkerConfig::from_text(
        &format!(
            "applicationId: {app}\n{spec}commitIntervalMs: 100\ntopology: [{{from: {{topic: {input}, value: bytes}}}}]\n"
        ),
        std::path::Path::new("embedded"),
        Overrides {
            bootstrap_servers: Some(bootstrap()?),
            state_dir: Some(dir.to_path_buf()),
            ..Default::default()
        },
    )?;
    let source = Source {
        topic: input.to_string(),
        key_format: Format::Bytes,
        value_format: Format::Bytes,
        internal: false,
    };
    cfg.topology = Topology {
        subtopologies: vec![sub(SubTopology::new(0, source))],
        ..Default::default()
    };
    Ok(cfg)
}

/// Run the worker until `done(records processed)` holds, then stop it cleanly.
fn run_until(cfg: WorkerConfig, done: impl Fn(f64) -> bool) -> Result<()> {
    let status = Arc::new(Status::default());
    let metrics = Arc::new(eddy_worker::metrics::Metrics::new());
    let (s, m) = (status.clone(), metrics.clone());
    let worker = std::thread::spawn(move || eddy_worker::run(&cfg, m, s));
    let processed = || eddy_e2e::sum_metric(&metrics.encode(), "eddy_records_processed_total", &[]);
    let waited = wait_until(Duration::from_secs(120), || Ok(done(processed())));
    let seen = processed();
    status.shutdown.store(true, Ordering::Relaxed);
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("worker panicked"))??;
    waited.map_err(|e| e.context(format!("{seen} records processed")))
}

#[test]
fn a_custom_processor_uses_a_store_and_survives_a_restart() -> Result<()> {
    let app = unique("embedded");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic(&input, 2)?;
    create_topic(&output, 2)?;
    let records: Vec<Input> = (0..1000)
        .map(|i| {
            (
                Some(format!("k{}", i % 40).into_bytes()),
                Some(format!("v{i}").into_bytes()),
            )
        })
        .collect();
    produce(&input, &records)?;
    let dir = tempfile::tempdir()?;
    let run = || -> Result<()> {
        let out = output.clone();
        let cfg = config(&app, "", &input, dir.path(), |sub| {
            sub.processor(move || {
                Box::new(FirstPerKey {
                    output: out.clone(),
                })
            })
            .store(StoreDef::key_value("seen", Format::Bytes, Format::Bytes))
            .sink(&output)
        })?;
        run_until(cfg, |processed| processed >= 1000.0)
    };
    run()?;
    ensure!(read_all(&output)?.len() == 40, "one record per key");
    // The store survives: the same input again forwards nothing new.
    produce(&input, &records)?;
    run()?;
    let out = read_all(&output)?;
    ensure!(
        out.len() == 40,
        "{} records: the store forgot what it saw",
        out.len()
    );
    ensure!(
        out.iter()
            .all(|r| r.value.as_deref().is_some_and(|v| v.starts_with(b"v")))
    );
    let mut names = topics_with_prefix(&app)?;
    names.sort();
    names.dedup();
    delete_topics(&names.iter().map(String::as_str).collect::<Vec<_>>())?;
    Ok(())
}

/// Counts per key in 10 s windows of a window store, emits each window's count once stream
/// time has passed its end (stream-time punctuation) and removes it, keeps each key's session
/// (5 s gap) in a session store, and writes a tick every 100 ms of wall-clock time.
struct Summaries {
    output: String,
}

const WINDOW: i64 = 10_000;

impl Processor for Summaries {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let key = match &r.key {
            Some(k) => k
                .to_bytes(Format::Bytes)
                .map_err(ProcessError::bad)?
                .into_owned(),
            None => return Ok(()),
        };
        let start = r.timestamp / WINDOW * WINDOW;
        let mut counts = ctx.window_store("counts")?;
        let n = counts
            .get(&key, start)?
            .map_or(0, |b| i64::from_be_bytes(b.try_into().unwrap_or_default()));
        counts.put(&key, start, &(n + 1).to_be_bytes(), r.timestamp);
        let mut sessions = ctx.session_store("sessions")?;
        let near = sessions.find_sessions(&key, r.timestamp - 5_000, r.timestamp + 5_000)?;
        let mut merged = eddy_worker::window::Window {
            start: r.timestamp,
            end: r.timestamp,
        };
        let mut n = 1;
        for (w, v) in near {
            merged.start = merged.start.min(w.start);
            merged.end = merged.end.max(w.end);
            n += i64::from_be_bytes(v.try_into().unwrap_or_default());
            sessions.remove(&key, w, r.timestamp);
        }
        sessions.put(&key, merged, &n.to_be_bytes(), r.timestamp);
        Ok(())
    }

    fn schedule(&self) -> Option<eddy_worker::Punctuation> {
        Some(eddy_worker::Punctuation::StreamTime(Duration::from_secs(
            10,
        )))
    }

    fn punctuate(&mut self, time: i64, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let mut counts = ctx.window_store("counts")?;
        let closed = counts.fetch_all(0, time - WINDOW)?;
        for (key, w, _) in &closed {
            counts.remove(key, w.start, time);
        }
        for (key, w, v) in closed {
            let line = format!(
                "{}@{}={}",
                String::from_utf8_lossy(&key),
                w.start,
                i64::from_be_bytes(v.try_into().unwrap_or_default())
            );
            ctx.send(&self.output, Some(b"summary"), Some(line.as_bytes()), time)?;
        }
        Ok(())
    }
}

/// Writes a tick every 100 ms of wall-clock time, and counts them.
struct Ticks {
    output: String,
    ticks: Arc<std::sync::atomic::AtomicUsize>,
}

impl Processor for Ticks {
    fn process(&mut self, _: Record, _: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    fn schedule(&self) -> Option<eddy_worker::Punctuation> {
        Some(eddy_worker::Punctuation::WallClock(Duration::from_millis(
            100,
        )))
    }

    fn punctuate(&mut self, time: i64, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        ctx.send(
            &self.output,
            Some(b"tick"),
            Some(time.to_string().as_bytes()),
            time,
        )
    }
}

#[test]
fn custom_processors_use_window_and_session_stores_and_punctuate() -> Result<()> {
    let app = unique("punctuate");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    // 60 s of event time an hour ago, one record a second over three keys.
    let t0 = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64
        - 3_600_000)
        / WINDOW
        * WINDOW
        + 3_500;
    let records: Vec<(Vec<u8>, Vec<u8>, i64)> = (0..60)
        .map(|i| {
            (
                format!("k{}", i % 3).into_bytes(),
                b"x".to_vec(),
                t0 + i * 1_000,
            )
        })
        .collect();
    produce_at(&input, &records)?;
    let dir = tempfile::tempdir()?;
    let (out, out2) = (output.clone(), output.clone());
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = ticks.clone();
    let retention = eddy_crds::Duration::from_millis(3_600_000);
    let cfg = config(
        &app,
        "processingGuarantee: exactly_once\n",
        &input,
        dir.path(),
        |sub| {
            sub.processor(move || {
                Box::new(Summaries {
                    output: out.clone(),
                })
            })
            .processor(move || {
                Box::new(Ticks {
                    output: out2.clone(),
                    ticks: counted.clone(),
                })
            })
            .store(StoreDef::window(
                "counts",
                Format::Bytes,
                Format::I64,
                eddy_crds::Duration::from_millis(WINDOW as u64),
                retention,
            ))
            .store(StoreDef::session(
                "sessions",
                Format::Bytes,
                Format::I64,
                retention,
            ))
            .sink(&output)
        },
    )?;
    // The output grows every 100 ms while the worker runs: it is read after it stops.
    run_until(cfg, |processed| {
        processed >= 60.0 && ticks.load(Ordering::Relaxed) >= 3
    })
    .map_err(|e| e.context(format!("{} ticks", ticks.load(Ordering::Relaxed))))?;
    let out = read_all(&output)?;
    let written = out
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"tick"))
        .count();
    ensure!(
        written >= 3,
        "{written} ticks committed: wall-clock punctuation's output must be committed even without input"
    );
    // Stream time ends at t0 + 59 s; punctuations ran at t0, t0 + 10 s, ..., t0 + 50 s, so
    // every window ending by t0 + 50 s was summarised once, complete.
    let mut got: Vec<String> = out
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"summary"))
        .filter_map(|r| {
            r.value
                .as_deref()
                .map(|v| String::from_utf8_lossy(v).to_string())
        })
        .collect();
    got.sort();
    let mut want = Vec::new();
    let mut start = t0 / WINDOW * WINDOW;
    while start + WINDOW <= t0 + 50_000 {
        for k in 0..3 {
            let n = records
                .iter()
                .filter(|(key, _, ts)| {
                    *key == format!("k{k}").into_bytes() && start <= *ts && *ts < start + WINDOW
                })
                .count();
            if n > 0 {
                want.push(format!("k{k}@{start}={n}"));
            }
        }
        start += WINDOW;
    }
    want.sort();
    ensure!(got == want, "summaries:\n{got:?}\nwant:\n{want:?}");
    // Each key's records are 3 s apart: one session each, whole, in the changelog.
    let mut sessions = std::collections::BTreeMap::new();
    for r in read_all(&format!("{app}-sessions-changelog"))? {
        let k = r.key.unwrap_or_default();
        match r.value {
            Some(v) => sessions.insert(k, v),
            None => sessions.remove(&k),
        };
    }
    let first = |k: i64| t0 + k * 1_000;
    let want: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = (0..3)
        .map(|k| {
            let key = [
                format!("k{k}").as_bytes(),
                &(first(k) + 57_000).to_be_bytes(),
                &first(k).to_be_bytes(),
            ]
            .concat();
            (key, 20i64.to_be_bytes().to_vec())
        })
        .collect();
    ensure!(sessions == want, "sessions in the changelog: {sessions:?}");
    let mut names = topics_with_prefix(&app)?;
    names.sort();
    names.dedup();
    delete_topics(&names.iter().map(String::as_str).collect::<Vec<_>>())?;
    Ok(())
}

/// Sends the stream time of each stream-time punctuation.
struct StreamTicks {
    output: String,
}

impl Processor for StreamTicks {
    fn process(&mut self, _: Record, _: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    fn schedule(&self) -> Option<eddy_worker::Punctuation> {
        Some(eddy_worker::Punctuation::StreamTime(Duration::from_secs(
            10,
        )))
    }

    fn punctuate(&mut self, time: i64, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.send(&self.output, None, Some(time.to_string().as_bytes()), time)
    }
}

/// With `from.timestamp`, stream time is the event time in the values, as with a Kafka
/// Streams `TimestampExtractor`: 60 s of it, produced within a moment, punctuate every 10 s.
#[test]
fn stream_time_punctuation_follows_the_extracted_event_time() -> Result<()> {
    let app = unique("eventtime");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    let t0 = 1_700_000_000_000i64;
    let records: Vec<Input> = (0..60)
        .map(|i| {
            (
                Some(b"k".to_vec()),
                Some(format!(r#"{{"t": {}}}"#, t0 + i * 1_000).into_bytes()),
            )
        })
        .collect();
    produce(&input, &records)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = WorkerConfig::from_text(
        &format!(
            "applicationId: {app}\ncommitIntervalMs: 100\ntopology: [{{from: {{topic: {input}, value: json, timestamp: '.t'}}}}]\n"
        ),
        std::path::Path::new("embedded"),
        Overrides {
            bootstrap_servers: Some(bootstrap()?),
            state_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        },
    )?;
    let out = output.clone();
    let sub = cfg.topology.subtopologies.remove(0);
    cfg.topology.subtopologies = vec![
        sub.processor(move || {
            Box::new(StreamTicks {
                output: out.clone(),
            })
        })
        .sink(&output),
    ];
    run_until(cfg, |processed| processed >= 60.0)?;
    let got: Vec<String> = read_all(&output)?
        .iter()
        .filter_map(|r| Some(String::from_utf8_lossy(r.value.as_deref()?).to_string()))
        .collect();
    let want: Vec<String> = (0..6).map(|i| (t0 + i * 10_000).to_string()).collect();
    ensure!(got == want, "punctuated at {got:?}, want {want:?}");
    delete_topics(&[&input, &output])?;
    Ok(())
}

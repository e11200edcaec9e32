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
        let mut cfg = WorkerConfig::from_text(
            &format!(
                "applicationId: {app}\ncommitIntervalMs: 100\ntopology: [{{from: {{topic: {input}, value: bytes}}}}]\n"
            ),
            std::path::Path::new("embedded"),
            Overrides {
                bootstrap_servers: Some(bootstrap()?),
                state_dir: Some(dir.path().to_path_buf()),
                ..Default::default()
            },
        )?;
        let out = output.clone();
        cfg.topology = Topology {
            subtopologies: vec![
                SubTopology::new(
                    0,
                    Source {
                        topic: input.clone(),
                        key_format: Format::Bytes,
                        value_format: Format::Bytes,
                        internal: false,
                    },
                )
                .processor(move || {
                    Box::new(FirstPerKey {
                        output: out.clone(),
                    })
                })
                .store(StoreDef {
                    name: "seen".into(),
                    in_memory: false,
                    key_format: Format::Bytes,
                    value_format: Format::Bytes,
                    forward_to: None,
                    window: None,
                })
                .sink(&output),
            ],
        };
        let status = Arc::new(Status::default());
        let metrics = Arc::new(eddy_worker::metrics::Metrics::new());
        let (s, m) = (status.clone(), metrics.clone());
        let worker = std::thread::spawn(move || eddy_worker::run(&cfg, m, s));
        wait_until(Duration::from_secs(120), || {
            Ok(
                eddy_e2e::sum_metric(&metrics.encode(), "eddy_records_processed_total", &[])
                    >= 1000.0,
            )
        })?;
        status.shutdown.store(true, Ordering::Relaxed);
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("worker panicked"))??;
        Ok(())
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

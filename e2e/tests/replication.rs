//! On a 3-broker cluster, where replication matters: internal topics get replication factor
//! 3 by default, an in-memory store is rebuilt in full from its replicated changelog at every
//! start, and losing one broker under load changes nothing a user sees. A test binary of its
//! own, because it runs its own cluster.

use anyhow::{Result, ensure};
use eddy_e2e::*;
use std::time::Duration;

#[test]
fn internal_topics_are_replicated_and_in_memory_stores_restore_in_full() -> Result<()> {
    let cluster = format!("repl-{}", std::process::id());
    let _cluster = own_cluster(3, &cluster)?;
    let app = unique("repl");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic_rf(&input, 3, 3)?;
    create_topic_rf(&output, 3, 3)?;
    let yaml = format!(
        "applicationId: {app}\ncommitIntervalMs: 200\nprocessingGuarantee: exactly_once\ntopology:\n  - from: {{topic: {input}}}\n  - count: {{store: counts, inMemory: true}}\n  - to: {{topic: {output}, value: i64}}\n"
    );
    let records: Vec<Input> = (0..3000)
        .map(|i| {
            (
                Some(format!("k{}", i % 30).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(&input, &records)?;
    let dir = tempfile::tempdir()?;
    let out = output.as_str();
    let done = |n: i64| {
        move || -> Result<bool> {
            let last = latest_by_key(out)?;
            Ok(last.len() == 30 && last.values().all(|v| v.as_slice() == n.to_be_bytes()))
        }
    };

    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(Duration::from_secs(120))?;
    wait_until(Duration::from_secs(120), done(100))?;
    ensure!(w.stop()? == 0);
    let changelog = format!("{app}-counts-changelog");
    let rf = replication_factors(&changelog)?;
    ensure!(
        rf == vec![3, 3, 3],
        "changelog replication factors {rf:?}, expected 3 per partition"
    );

    // In memory: nothing on disk, so a restart restores every changelog record.
    let changelog_records = read_all(&changelog)?.len() as f64;
    produce(&input, &records)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(Duration::from_secs(120))?;
    let restored = w.metric("eddy_restored_records_total", &[])?;
    ensure!(
        restored == changelog_records,
        "restored {restored} of {changelog_records}"
    );
    wait_until(Duration::from_secs(120), done(200))?;

    // One broker of three goes away under load (and its partitions' leadership with it):
    // exactly-once counts stay exact, the worker keeps running.
    let load = Load::start(&input, 30, 300)?;
    wait_until(Duration::from_secs(60), || {
        Ok(w.metric("eddy_records_processed_total", &[])? > 1000.0)
    })?;
    kafka_node(&cluster, 2, "stop")?;
    let processed = w.metric("eddy_records_processed_total", &[])?;
    wait_until(Duration::from_secs(120), || {
        Ok(w.metric("eddy_records_processed_total", &[])? > processed + 3000.0)
    })
    .map_err(|e| anyhow::anyhow!("no progress with one broker down: {e}\n{}", w.logs()))?;
    let sent = load.stop()?;
    ensure!(
        w.running(),
        "the worker survived losing a broker:\n{}",
        w.logs()
    );
    wait_until(Duration::from_secs(180), || {
        let seen = i64_values_by_key(&output)?;
        Ok(sent
            .iter()
            .all(|(k, n)| seen.get(k).and_then(|v| v.last()) == Some(n)))
    })?;
    for (k, values) in i64_values_by_key(&output)? {
        ensure!(
            values.windows(2).all(|w| w[0] < w[1]),
            "key {k}: committed counts not strictly increasing: {values:?}"
        );
    }
    kafka_node(&cluster, 2, "start")?;
    ensure!(w.stop()? == 0);
    Ok(())
}

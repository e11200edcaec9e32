//! On a 3-broker cluster, where replication matters: internal topics get replication factor
//! 3 by default, and an in-memory store is rebuilt in full from its replicated changelog at
//! every start. A test binary of its own, because it runs its own cluster.

use anyhow::{Result, ensure};
use eddy_e2e::*;
use std::time::Duration;

#[test]
fn internal_topics_are_replicated_and_in_memory_stores_restore_in_full() -> Result<()> {
    let _cluster = own_cluster(3, &format!("repl-{}", std::process::id()))?;
    let app = unique("repl");
    let (input, output) = (format!("{app}-in"), format!("{app}-out"));
    create_topic(&input, 3)?;
    create_topic(&output, 3)?;
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
    ensure!(w.stop()? == 0);
    Ok(())
}

//! eddy against Kafka Streams on a small input: both engines really run (one after the other)
//! for count and sum under both guarantees, and their final tables must be equal (same keys,
//! same value bytes, same output partition per key). Correctness only: no timing targets.

use eddy_e2e::compare::*;
use eddy_e2e::unique;

#[test]
fn eddy_matches_kafka_streams() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let o = Options {
        records: 20_000,
        keys: 2_000,
        partitions: 4,
        check_only: true,
        runs: ALL.to_vec(),
        input_prefix: unique("cmp-test-input"),
        delete_input: true,
        verify: true,
        jar: kstreams_jar()?,
        jvm_opts: CONTAINER_JVM.iter().map(|s| s.to_string()).collect(),
    };
    let rows = run(&o)?;
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert!(r.output_keys > 0, "{}: empty output", r.label());
    }
    eprintln!("{}", markdown(&rows, false));
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

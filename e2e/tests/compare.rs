//! eddy against Kafka Streams on a small input: both engines really run (one after the other)
//! under both guarantees. Keyed cases (count, sum): their final tables must be equal (same
//! keys, same value bytes, same output partition per key). Windowed cases (`WINDOWED`):
//! their outputs must agree window by window (with
//! suppress, record by record) and with the model of Kafka Streams' window semantics.
//! Correctness only: no timing targets.

use eddy_e2e::compare::*;
use eddy_e2e::unique;

fn options(runs: Vec<(Case, Guarantee)>, prefix: &str) -> anyhow::Result<Options> {
    Ok(Options {
        records: 20_000,
        keys: 2_000,
        partitions: 4,
        check_only: true,
        runs,
        input_prefix: unique(prefix),
        delete_input: true,
        verify: true,
        jar: kstreams_jar()?,
        jvm_opts: CONTAINER_JVM.iter().map(|s| s.to_string()).collect(),
    })
}

#[test]
fn eddy_matches_kafka_streams() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let rows = run(&options(ALL.to_vec(), "cmp-test-input")?)?;
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert!(r.output_keys > 0, "{}: empty output", r.label());
    }
    eprintln!("{}", markdown(&rows, false));
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// 20k events over 200 users and ~7 minutes of event time, some out of order within grace,
/// 1% later than grace, some bridging two sessions.
#[test]
fn eddy_matches_kafka_streams_on_windows() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let runs = windowed_runs();
    let rows = run(&options(runs.clone(), "cmp-test-windowed")?)?;
    assert_eq!(rows.len(), runs.len());
    for r in &rows {
        let c = r.windowed.as_ref().expect("windowed cases are checked");
        assert!(c.windows > 0, "{}: no windows", r.label());
        // The model counts late records for every case but sliding windows (bounds only).
        assert!(
            c.dropped > 0 || r.case == Case::SlidingCount,
            "{}: no record was late",
            r.label()
        );
    }
    eprintln!("{}", markdown(&rows, false));
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

//! eddy against Kafka Streams on a small input: both engines really run (one after the other)
//! under both guarantees. Keyed cases (count, sum): their final tables must be equal (same
//! keys, same value bytes, same output partition per key). Windowed cases (`WINDOWED`):
//! their outputs must agree window by window (with
//! suppress, record by record) and with the model of Kafka Streams' window semantics. Join
//! cases (`JOINS`): both engines record by record per key (the table-table join: the final
//! table) and against the model of Kafka Streams' join semantics. Correctness only: no timing targets.

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
        kstreams_only: false,
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

/// The join rows' checks: every case wrote something, both engines' table-table output is the
/// model's, inner joins dropped orders a left join kept with null, and the input exercised what
/// it is made for.
fn check_join_rows(rows: &[Row], runs: &[(Case, Guarantee)]) {
    assert_eq!(rows.len(), runs.len());
    for r in rows {
        let c = r.joined.as_ref().expect("join cases are checked");
        assert!(
            c.outputs > 0 && c.joined > 0,
            "{}: nothing joined",
            r.label()
        );
        // At this size Kafka Streams' table-table output is the model's too (it varies only
        // at a million records), so both engines agree.
        assert_eq!(
            c.kstreams_deviations,
            0,
            "{}: Kafka Streams differs from the model: {}",
            r.label(),
            c.summary
        );
        match r.case {
            Case::StreamTableLeft
            | Case::StreamStream
            | Case::TableTable
            | Case::StreamTableVersioned => {
                assert!(c.unjoined > 0, "{}: no null right side", r.label())
            }
            _ => assert!(c.dropped > 0, "{}: no order was dropped", r.label()),
        }
    }
}

/// Both engines on the join input (10k orders over 1000 customers, 4 partitions, the global
/// table on 3), every join case under both guarantees: the same records per key in the same
/// order, byte for byte, and the model's (the table-table join: the same final table).
#[test]
fn eddy_matches_kafka_streams_on_joins() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let runs = join_runs();
    let mut o = options(runs.clone(), "cmp-test-joins")?;
    o.records = 10_000;
    let rows = run(&o)?;
    check_join_rows(&rows, &runs);
    eprintln!("{}", markdown(&rows, false));
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

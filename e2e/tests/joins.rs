//! End-to-end tests of tables and joins on a real broker: a stream enriched from a table whose
//! updates and deletes interleave with the stream in time, the table restored from its
//! changelog, a versioned table answering as of each order's time across a wiped disk, topics
//! that are not co-partitioned refused with what to do, a global table, and a windowed
//! stream-stream join whose stores come back from their changelogs.

use anyhow::{Context, Result, ensure};
use eddy_e2e::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

const READY: Duration = Duration::from_secs(120);

/// Topics `<name>-<suffix>` with these partition counts, deleted (with the app's internal
/// topics) when the returned guard is dropped.
fn topics(name: &str, specs: [(&str, i32); 3]) -> Result<([String; 3], Cleanup)> {
    let names = specs.map(|(suffix, _)| format!("{name}-{suffix}"));
    let cleanup = Cleanup(names.to_vec(), name.to_string());
    for (topic, (_, partitions)) in names.iter().zip(specs) {
        create_topic(topic, partitions)?;
    }
    Ok((names, cleanup))
}

/// A record time an hour ago: timestamps older than the broker's retention (7 days) would
/// have their segments deleted under the test (the log start passing the committed offsets).
fn recent() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    now - 3_600_000
}
const DONE: Duration = Duration::from_secs(240);

/// What was produced, in time order: customer updates (odd ms) and orders (even ms).
enum Event {
    /// A customer's new name, or its deletion (`None`).
    Customer(String, Option<String>),
    /// An order: its id and customer.
    Order(i64, String),
}

/// Events of `customers` customers over `n` steps, one ms apart from `start`: mostly orders,
/// a customer update every few, a deletion now and then; customers 0..3 never exist.
fn events(n: usize, customers: usize, start: i64) -> Vec<(i64, Event)> {
    let mut seed = 7u64;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let c = format!("c{}", next(customers as u64));
        let at = start + 2 * i as i64;
        let ev = match next(10) {
            0 | 1 if !matches!(c.as_str(), "c0" | "c1" | "c2") => {
                (at + 1, Event::Customer(c, Some(format!("name-{i}"))))
            }
            2 if next(3) == 0 => (at + 1, Event::Customer(c, None)),
            _ => (at, Event::Order(i as i64, c)),
        };
        out.push(ev);
    }
    out
}

fn produce_events(customers: &str, orders: &str, events: &[(i64, Event)]) -> Result<()> {
    let mut table = Vec::new();
    let mut stream = Vec::new();
    for (at, e) in events {
        match e {
            Event::Customer(c, name) => table.push((c.clone(), name.clone(), *at)),
            Event::Order(id, c) => stream.push((
                c.clone().into_bytes(),
                json!({"order": id, "customer": c}).to_string().into_bytes(),
                *at,
            )),
        }
    }
    produce_table(customers, &table)?;
    produce_at(orders, &stream)
}

/// Customer records (a `None` name is a tombstone), each to its key's partition.
fn produce_table(topic: &str, records: &[(String, Option<String>, i64)]) -> Result<()> {
    let (mut sets, mut deletes) = (Vec::new(), Vec::new());
    // Tombstones go through `produce_tombstones` (no value), in the same time order: split
    // into runs so the order per key is kept.
    for (c, name, at) in records {
        match name {
            Some(n) => {
                if !deletes.is_empty() {
                    produce_tombstones(topic, &std::mem::take(&mut deletes))?;
                }
                sets.push((
                    c.clone().into_bytes(),
                    json!({"name": n}).to_string().into_bytes(),
                    *at,
                ));
            }
            None => {
                if !sets.is_empty() {
                    produce_at(topic, &std::mem::take(&mut sets))?;
                }
                deletes.push((c.clone().into_bytes(), *at));
            }
        }
    }
    produce_at(topic, &sets)?;
    produce_tombstones(topic, &deletes)
}

/// Each order's customer name as Kafka Streams defines a stream-table join: the table as of
/// the order's time (records of a task's partitions go in timestamp order). Inner joins drop
/// orders without a customer; left joins give them a null name.
fn model(events: &[(i64, Event)], left: bool) -> BTreeMap<i64, Value> {
    let mut table: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (_, e) in events {
        match e {
            Event::Customer(c, Some(n)) => {
                table.insert(c, n);
            }
            Event::Customer(c, None) => {
                table.remove(c.as_str());
            }
            Event::Order(id, c) => match table.get(c.as_str()) {
                Some(n) => {
                    out.insert(*id, json!(n));
                }
                None if left => {
                    out.insert(*id, Value::Null);
                }
                None => {}
            },
        }
    }
    out
}

/// Order id -> name, from the output; fails on an order written twice.
fn joined(topic: &str) -> Result<BTreeMap<i64, Value>> {
    let mut out = BTreeMap::new();
    for r in read_all(topic)? {
        let v: Value = serde_json::from_slice(&r.value.context("a joined value")?)?;
        let id = v["order"].as_i64().context("order id")?;
        ensure!(
            out.insert(id, v["name"].clone()).is_none(),
            "order {id} written twice"
        );
    }
    Ok(out)
}

fn app(name: &str, customers: &str, orders: &str, output: &str, kind: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  commitIntervalMs: 200
  processingGuarantee: exactly_once
  tables:
    customers: {{topic: {customers}}}
  topology:
    - from: {{topic: {orders}}}
    - join: {{table: customers, type: {kind}, as: '{{order: .order, name: $right.name}}'}}
    - to: {{topic: {output}}}
"#
    )
}

#[test]
fn orders_meet_the_customer_as_of_their_time_and_the_table_survives_a_wiped_disk() -> Result<()> {
    let name = unique("enrich");
    let ([customers, orders, output], _cleanup) =
        topics(&name, [("customers", 3), ("orders", 3), ("out", 1)])?;
    let all = events(3_000, 40, recent());
    let (first, rest) = all.split_at(2_000);
    // Everything is in Kafka before the worker starts: only processing in timestamp order
    // across the two topics gives each order the customer of its time.
    produce_events(&customers, &orders, first)?;
    let yaml = app(&name, &customers, &orders, &output, "left");
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let expected = model(first, true);
    ensure!(
        expected.values().any(Value::is_null) && expected.values().any(|v| !v.is_null()),
        "the input has hits and misses"
    );
    wait_until(DONE, || Ok(joined(&output)?.len() >= expected.len()))
        .with_context(|| format!("joined orders\n{}", w.logs()))?;
    let got = joined(&output)?;
    ensure!(
        got == expected,
        "each order joined with the customer of its time: {} results, {} expected; first differences (got, expected): {:?}\n{}",
        got.len(),
        expected.len(),
        expected
            .iter()
            .filter(|(k, v)| got.get(k) != Some(v))
            .take(5)
            .map(|(k, v)| (k, got.get(k), v))
            .collect::<Vec<_>>(),
        w.logs()
    );
    ensure!(w.stop()? == 0);

    // The table comes back from its changelog: later orders still find their customers.
    std::fs::remove_dir_all(dir.path().join("state"))?;
    produce_events(&customers, &orders, rest)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? > 0.0,
        "a wiped state dir restores the table from its changelog"
    );
    let expected = model(&all, true);
    wait_until(DONE, || Ok(joined(&output)?.len() >= expected.len())).with_context(|| {
        format!(
            "joined orders after the restore: {:?} of {}\n{}",
            joined(&output).map(|j| j.len()),
            expected.len(),
            w.logs()
        )
    })?;
    ensure!(joined(&output)? == expected, "{}", w.logs());
    ensure!(w.stop()? == 0);
    Ok(())
}

/// A versioned table: late orders meet the customer as they were at the order's time, out of
/// order updates go into the history, and both the history and the table's stream time come
/// back from the changelog after a wiped disk (an update older than the history is dropped).
#[test]
fn a_versioned_table_answers_as_of_the_order_and_keeps_its_history_across_a_wiped_disk()
-> Result<()> {
    let name = unique("as-of");
    let ([customers, orders, output], _cleanup) =
        topics(&name, [("customers", 2), ("orders", 2), ("out", 1)])?;
    let t = recent();
    let c = |n: &str, at: i64| ("c1".to_string(), Some(n.to_string()), t + at);
    produce_table(
        &customers,
        &[c("Ada", 0), c("Bea", 10_000), c("Cy", 20_000)],
    )?;
    let order = |id: i64, at: i64| {
        (
            b"c1".to_vec(),
            json!({"order": id}).to_string().into_bytes(),
            t + at,
        )
    };
    produce_at(&orders, &[order(1, 25_000)])?;
    let yaml = app(&name, &customers, &orders, &output, "left").replace(
        &format!("{{topic: {customers}}}"),
        &format!("{{topic: {customers}, versioned: {{history: 1m}}}}"),
    );
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || Ok(!joined(&output)?.is_empty())).with_context(|| w.logs())?;
    ensure!(w.stop()? == 0);

    std::fs::remove_dir_all(dir.path().join("state"))?;
    // Dee from 12 s (out of order: Cy's 20 s is newer); Old from 70 s before Ada, more than
    // the history (1 min) behind the table's stream time (20 s): dropped.
    produce_table(&customers, &[c("Dee", 12_000), c("Old", -70_000)])?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? > 0.0,
        "a wiped state dir restores the table from its changelog"
    );
    wait_until(DONE, || {
        Ok(w.metric("eddy_records_processed_total", &[])? >= 2.0)
    })
    .with_context(|| w.logs())?;
    produce_at(
        &orders,
        &[
            order(2, 5_000),
            order(3, 13_000),
            order(4, 15_000),
            order(5, 25_000),
            order(6, -60_000),
        ],
    )?;
    wait_until(DONE, || Ok(joined(&output)?.len() >= 6)).with_context(|| w.logs())?;
    let want: BTreeMap<i64, Value> = [
        (1, json!("Cy")),
        (2, json!("Ada")),
        (3, json!("Dee")),
        (4, json!("Dee")),
        (5, json!("Cy")),
        (6, Value::Null),
    ]
    .into_iter()
    .collect();
    ensure!(
        joined(&output)? == want,
        "{:?}\n{}",
        joined(&output)?,
        w.logs()
    );
    ensure!(w.stop()? == 0);
    Ok(())
}

#[test]
fn an_inner_join_drops_orders_without_a_customer() -> Result<()> {
    let name = unique("inner");
    let ([customers, orders, output], _cleanup) =
        topics(&name, [("customers", 2), ("orders", 2), ("out", 1)])?;
    let all = events(600, 10, recent());
    produce_events(&customers, &orders, &all)?;
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(
        &app(&name, &customers, &orders, &output, "inner"),
        dir.path(),
    )?;
    w.wait_ready(READY)?;
    let expected = model(&all, false);
    wait_until(DONE, || Ok(joined(&output)?.len() >= expected.len()))
        .with_context(|| format!("joined orders\n{}", w.logs()))?;
    // The last order is processed once the worker is idle: nothing else comes.
    ensure!(joined(&output)? == expected, "{}", w.logs());
    ensure!(w.stop()? == 0);
    Ok(())
}

#[test]
fn a_table_with_another_partition_count_is_refused_with_what_to_do() -> Result<()> {
    let name = unique("copart");
    let ([customers, orders, output], _cleanup) =
        topics(&name, [("customers", 2), ("orders", 3), ("out", 1)])?;
    let dir = tempfile::tempdir()?;
    let yaml = app(&name, &customers, &orders, &output, "left");
    // `check` refuses it before anything runs...
    let file = dir.path().join("check.yaml");
    std::fs::write(&file, &yaml)?;
    let out = std::process::Command::new(binary("eddy-worker")?)
        .args(["check", "-f"])
        .arg(&file)
        .args(["--bootstrap-servers", &bootstrap()?])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("co-partitioning"),
        "check exits non-zero naming the problem\n{err}"
    );
    ensure!(
        err.contains(&format!("give \"{customers}\" 3 partitions")),
        "{err}"
    );
    // ...and so does the worker.
    let mut w = Worker::start(&yaml, dir.path())?;
    let code = w.wait_exit(READY)?;
    let logs = w.logs();
    ensure!(code != 0, "the worker refuses to start\n{logs}");
    ensure!(
        logs.contains(&format!(
            "table \"customers\" (topic \"{customers}\", 2 partitions)"
        )) && logs.contains(&format!("give \"{customers}\" 3 partitions")),
        "the error names the topics and what to do\n{logs}"
    );
    Ok(())
}

fn global_app(name: &str, countries: &str, payments: &str, output: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  commitIntervalMs: 200
  tables:
    countries: {{topic: {countries}, global: true}}
  topology:
    - from: {{topic: {payments}}}
    - join: {{table: countries, key: '.country', as: '{{id: .id, country: $right.name}}'}}
    - to: {{topic: {output}}}
"#
    )
}

/// Payment id -> country name, from the output.
fn countries_of(topic: &str) -> Result<BTreeMap<i64, String>> {
    let mut out = BTreeMap::new();
    for r in read_all(topic)? {
        let v: Value = serde_json::from_slice(&r.value.context("a joined value")?)?;
        out.insert(
            v["id"].as_i64().context("payment id")?,
            v["country"].as_str().context("country name")?.to_string(),
        );
    }
    Ok(out)
}

fn produce_payments(topic: &str, ids: std::ops::Range<i64>, codes: &[&str]) -> Result<()> {
    let records: Vec<(Vec<u8>, Vec<u8>, i64)> = ids
        .map(|id| {
            let code = codes[id as usize % codes.len()];
            (
                format!("user-{}", id % 7).into_bytes(),
                json!({"id": id, "country": code}).to_string().into_bytes(),
                recent() + id,
            )
        })
        .collect();
    produce_at(topic, &records)
}

#[test]
fn a_global_table_is_restored_before_processing_and_kept_up_to_date() -> Result<()> {
    let name = unique("lookup");
    // Not co-partitioned, and needs not be: every worker holds every country.
    let ([countries, payments, output], _cleanup) =
        topics(&name, [("countries", 2), ("payments", 3), ("out", 1)])?;
    let t = recent() - 60_000;
    let named = |code: &str, name: &str| {
        (
            code.as_bytes().to_vec(),
            json!({"name": name}).to_string().into_bytes(),
            t,
        )
    };
    produce_at(
        &countries,
        &[
            named("DE", "Germany"),
            named("FR", "France"),
            named("XX", "Nowhere"),
        ],
    )?;
    produce_tombstones(&countries, &[(b"XX".to_vec(), t + 1)])?;
    // Payments are there first: they must wait for the table, not miss it.
    produce_payments(&payments, 0..300, &["DE", "FR", "XX", "ZZ"])?;
    let yaml = global_app(&name, &countries, &payments, &output);
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    // Inner join: the deleted and the unknown country drop their payments.
    let expected: BTreeMap<i64, String> = (0..300)
        .filter_map(|id| match id % 4 {
            0 => Some((id, "Germany".to_string())),
            1 => Some((id, "France".to_string())),
            _ => None,
        })
        .collect();
    wait_until(DONE, || Ok(countries_of(&output)?.len() >= expected.len()))
        .with_context(|| format!("joined payments\n{}", w.logs()))?;
    let got = countries_of(&output)?;
    ensure!(
        got == expected,
        "payments joined with their country: {} results, {} expected; first differences: {:?}\n{}",
        got.len(),
        expected.len(),
        got.iter()
            .filter(|(k, v)| expected.get(k) != Some(v))
            .take(5)
            .collect::<Vec<_>>(),
        w.logs()
    );

    // An update reaches the running worker: payments made after it see it.
    produce_at(&countries, &[named("DE", "Deutschland")])?;
    let mut next = 300;
    wait_until(DONE, || {
        produce_payments(&payments, next..next + 4, &["DE", "FR", "XX", "ZZ"])?;
        next += 4;
        Ok(countries_of(&output)?.values().any(|c| c == "Deutschland"))
    })
    .with_context(|| format!("the update reaches lookups\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);

    // A restart reads only what the checkpoints lack; a wiped disk reads it all again.
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let restored = w.metric("eddy_restored_records_total", &["task=\"global\""])?;
    ensure!(
        restored == 0.0,
        "restored {restored} records after a clean stop\n{}",
        w.logs()
    );
    ensure!(w.stop()? == 0);
    std::fs::remove_dir_all(dir.path().join("state"))?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    let restored = w.metric("eddy_restored_records_total", &["task=\"global\""])?;
    ensure!(
        restored == 5.0,
        "restored {restored} records from a wiped disk\n{}",
        w.logs()
    );
    let before = countries_of(&output)?.len();
    produce_payments(&payments, 10_000..10_004, &["DE", "FR", "XX", "ZZ"])?;
    wait_until(DONE, || Ok(countries_of(&output)?.len() >= before + 2))?;
    ensure!(
        countries_of(&output)?.get(&10_000).map(String::as_str) == Some("Deutschland"),
        "{}",
        w.logs()
    );
    ensure!(w.stop()? == 0);
    Ok(())
}

/// Every output record of a stream join as (order, shipment) text, in output order.
fn pairs(topic: &str) -> Result<Vec<(String, String)>> {
    read_all(topic)?
        .into_iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.value.context("a joined value")?)?;
            Ok((v["order"].to_string(), v["shipment"].to_string()))
        })
        .collect()
}

fn at(topic: &str, key: &str, field: &str, id: &str, ts: i64) -> Result<()> {
    produce_at(
        topic,
        &[(
            key.as_bytes().to_vec(),
            json!({ field: id }).to_string().into_bytes(),
            ts,
        )],
    )
}

/// A left stream-stream join keeps what it holds across a wiped disk: both sides' records
/// within the window and the orders still waiting for a shipment come back from their
/// changelogs, so a late shipment joins an order from before the restart, and an order
/// nothing shipped comes out once, unjoined, when stream time passes its window and grace.
#[test]
fn a_left_stream_join_keeps_its_window_and_waiting_orders_across_a_wiped_disk() -> Result<()> {
    let name = unique("shipped");
    let ([orders, shipments, output], _cleanup) =
        topics(&name, [("orders", 2), ("shipments", 2), ("out", 1)])?;
    let yaml = format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  commitIntervalMs: 200
  processingGuarantee: exactly_once
  topology:
    - from: {{topic: {orders}}}
    - join: {{stream: {{topic: {shipments}}}, within: 10s, grace: 5s, type: left, as: '{{order: .order, shipment: $right.shipment}}'}}
    - to: {{topic: {output}}}
"#
    );
    let t = recent();
    // a: never shipped; b: shipped within the window; d: shipped only after the restart.
    // z (below) moves stream time past a's window: it must go to a's task.
    let partition = |k: &str| eddy_worker::partitioner::partition_for(k.as_bytes(), 2);
    ensure!(
        partition("a") == partition("z"),
        "a and z share a partition"
    );
    at(&orders, "a", "order", "a", t)?;
    at(&orders, "b", "order", "b", t + 1_000)?;
    at(&orders, "d", "order", "d", t + 2_000)?;
    at(&shipments, "b", "shipment", "sb", t + 1_500)?;
    let dir = tempfile::tempdir()?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    wait_until(DONE, || Ok(!pairs(&output)?.is_empty()))
        .with_context(|| format!("the joined order b\n{}", w.logs()))?;
    ensure!(w.stop()? == 0);
    ensure!(
        pairs(&output)? == [("\"b\"".to_string(), "\"sb\"".to_string())],
        "only b joined so far; a and d wait: {:?}",
        pairs(&output)?
    );

    std::fs::remove_dir_all(dir.path().join("state"))?;
    // d's shipment comes within its window; then an order far later moves stream time past
    // a's window and grace (and d's, which must not come out unjoined: it was joined).
    at(&shipments, "d", "shipment", "sd", t + 2_500)?;
    at(&orders, "z", "order", "z", t + 60_000)?;
    let mut w = Worker::start(&yaml, dir.path())?;
    w.wait_ready(READY)?;
    ensure!(
        w.metric("eddy_restored_records_total", &[])? > 0.0,
        "a wiped state dir restores the join's stores from their changelogs"
    );
    let want = [("b", "\"sb\""), ("d", "\"sd\""), ("a", "null")]
        .map(|(o, s)| (format!("\"{o}\""), s.to_string()));
    wait_until(DONE, || Ok(pairs(&output)?.len() >= want.len()))
        .with_context(|| format!("{:?}\n{}", pairs(&output), w.logs()))?;
    ensure!(w.stop()? == 0);
    let got = pairs(&output)?;
    let mut sorted = got.clone();
    sorted.sort();
    let mut want_sorted = want.to_vec();
    want_sorted.sort();
    ensure!(
        sorted == want_sorted,
        "each order once: b and d joined, a unjoined; z still waits. got {got:?}"
    );
    Ok(())
}

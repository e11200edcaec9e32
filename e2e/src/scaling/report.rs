//! The scaling benchmark's results as Markdown, and the Kafka Streams / eddy ratios of the
//! figures both engines have.

use super::Settings;
use super::stage::round3;
use serde_json::{Value, json};

fn find<'a>(results: &'a [Value], engine: &str, case: &str) -> Option<&'a Value> {
    results
        .iter()
        .find(|r| r["engine"] == engine && r["case"] == case)
}

/// Kafka Streams / eddy for the figures both engines have: how many times longer Kafka
/// Streams pauses or takes.
pub fn ratios(results: &[Value]) -> Value {
    let pairs = [
        (
            "scale-out pause p99",
            "scale-out",
            "scale-out",
            "pause_p99_s",
        ),
        (
            "scale-out: time until balanced",
            "scale-out",
            "scale-out",
            "balanced_after_s",
        ),
        (
            "failover, graceful stop: tasks process again",
            "failover-delete",
            "failover-term",
            "resumed_max_s",
        ),
        (
            "failover, SIGKILL: tasks process again",
            "failover-kill",
            "failover-kill",
            "resumed_max_s",
        ),
        (
            "failover, SIGKILL: tasks process again (Kafka Streams with session.timeout.ms=6000)",
            "failover-kill",
            "failover-kill-session-6s",
            "resumed_max_s",
        ),
        (
            "rolling update, one standby: longest pause",
            "rollout",
            "rollout-standby",
            "pause_max_s",
        ),
        (
            "rolling update, one standby: time until done",
            "rollout",
            "rollout-standby",
            "rolled_out_after_s",
        ),
        (
            "rolling update, no standby (Kafka Streams' defaults): longest pause",
            "rollout-no-standby",
            "rollout",
            "pause_max_s",
        ),
        (
            "rolling update, no standby (Kafka Streams' defaults): time until done",
            "rollout-no-standby",
            "rollout",
            "rolled_out_after_s",
        ),
    ];
    let mut m = serde_json::Map::new();
    for (label, eddy_case, ks_case, field) in pairs {
        let (Some(e), Some(k)) = (
            find(results, "eddy", eddy_case),
            find(results, "kafka-streams", ks_case),
        ) else {
            continue;
        };
        let ratio = match (e[field].as_f64(), k[field].as_f64()) {
            (Some(e), Some(k)) if e > 0.0 => json!(round3(k / e)),
            _ => Value::Null,
        };
        m.insert(
            label.to_string(),
            json!({"eddy": e[field], "kafka_streams": k[field], "ks_over_eddy": ratio}),
        );
    }
    Value::Object(m)
}

fn secs(v: &Value) -> String {
    v.as_f64().map_or("—".into(), |v| format!("{v:.2}"))
}

pub fn markdown(args: &Settings, results: &[Value]) -> String {
    let mut s = format!(
        "{} keys, {} partitions, {} input records/s, exactly-once; seconds.\n\n",
        args.keys, args.partitions, args.rate
    );
    s.push_str("| engine | case | event | tasks | pause p99 | pause max | of it at the move (p99) | other tasks' longest gap | processing again after (max) | balanced (or rollout done) after | normal gap (p99 over tasks) | target |\n");
    s.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in results {
        let case = r["case"].as_str().unwrap_or_default();
        let eddy = r["engine"] == "eddy";
        let resumed = if case.starts_with("failover") {
            match r["resumed_max_s"].as_f64() {
                Some(v) => format!("{v:.2}"),
                None => format!("not within {} s", r["resume_wait_s"]),
            }
        } else {
            "—".into()
        };
        let balanced = if case.starts_with("scale-out") {
            match r["balanced_after_s"].as_f64() {
                Some(v) => format!("{v:.2}"),
                None => format!("not within {} s", r["balance_wait_s"]),
            }
        } else if case.starts_with("rollout") {
            match r["rolled_out_after_s"].as_f64() {
                Some(v) => format!("{v:.2} (done)"),
                None => format!("not done within {} s", r["rollout_wait_s"]),
            }
        } else {
            "—".into()
        };
        let target = match (eddy, case) {
            (true, "scale-out") => match r["pause_p99_s"].as_f64() {
                Some(v) if v < 1.0 => "< 1 s ✓".to_string(),
                _ => "< 1 s ✗".to_string(),
            },
            (true, c) if c.starts_with("failover") => match r["resumed_max_s"].as_f64() {
                Some(v) if v < 5.0 => "< 5 s ✓".to_string(),
                _ => "< 5 s ✗".to_string(),
            },
            (true, "rollout") => match r["pause_max_s"].as_f64() {
                Some(v) if v < 1.0 => "pause max < 1 s ✓".to_string(),
                _ => "pause max < 1 s ✗".to_string(),
            },
            _ => String::new(),
        };
        s.push_str(&format!(
            "| {} | {case} | {} | {} | {} | {} | {} | {} | {resumed} | {balanced} | {} | {target} |\n",
            if eddy { "eddy" } else { "Kafka Streams" },
            r["event"].as_str().unwrap_or_default(),
            r["tasks"],
            secs(&r["pause_p99_s"]),
            secs(&r["pause_max_s"]),
            secs(&r["pause_at_move_p99_s"]),
            secs(&r["unmoved_gap_max_s"]),
            secs(&r["baseline"]["gap_p99_s"]),
        ));
    }
    let ratios = ratios(results);
    if let Some(m) = ratios.as_object().filter(|m| !m.is_empty()) {
        s.push_str(
            "\n| Kafka Streams / eddy | eddy | Kafka Streams | ratio |\n|---|---:|---:|---:|\n",
        );
        for (label, v) in m {
            s.push_str(&format!(
                "| {label} | {} | {} | {} |\n",
                secs(&v["eddy"]),
                secs(&v["kafka_streams"]),
                v["ks_over_eddy"]
                    .as_f64()
                    .map_or("—".into(), |r| format!("{r:.1}×"))
            ));
        }
    }
    s
}

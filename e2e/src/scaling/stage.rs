//! One case of the scaling benchmark: its input and output topics, the load on the input, the
//! watch on the output, and the figures every case computes alike.

use super::Settings;
use super::measure::{
    Gap, OutputWatch, Steady, gaps, group_lag, longest, longest_gap, percentile, prepopulate, since,
};
use crate::{create_topic, delete_topics, unique, wait_until};
use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// Progress on stderr.
pub fn log(msg: &str) {
    eprintln!("scaling-bench: {msg}");
}

/// Wall-clock time (UTC, ms) of a moment `t` seconds after the stage's epoch, to find it in
/// the processes' logs.
pub fn wall(stage: &Stage, t: f64) -> String {
    let at = std::time::SystemTime::now() - Duration::from_secs_f64((stage.now() - t).max(0.0));
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}.{:03}", ms / 1000, ms % 1000),
            "+%Y-%m-%dT%H:%M:%S.%3NZ",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// A case's input and output topics, the load on the input and the watch on the output.
pub struct Stage {
    /// Every time of the case is in seconds since this.
    pub epoch: Instant,
    pub input: String,
    pub output: String,
    steady: Option<Steady>,
    /// Started by [`Stage::load`].
    pub watch: Option<OutputWatch>,
}

impl Stage {
    pub fn new(prefix: &str, partitions: i32) -> Result<Stage> {
        let (input, output) = (
            unique(&format!("{prefix}-in")),
            unique(&format!("{prefix}-out")),
        );
        create_topic(&input, partitions)?;
        create_topic(&output, partitions)?;
        Ok(Stage {
            epoch: Instant::now(),
            input,
            output,
            steady: None,
            watch: None,
        })
    }

    pub fn now(&self) -> f64 {
        since(self.epoch)
    }

    /// Fill the state, start the steady load, wait until the app (consumer group `group`) has
    /// caught up, then watch the output.
    pub fn load(&mut self, args: &Settings, group: &str) -> Result<()> {
        log(&format!("producing {} keys to {}", args.keys, self.input));
        prepopulate(&self.input, args.keys)?;
        self.steady = Some(Steady::start(&self.input, args.keys, args.rate)?);
        let t = Instant::now();
        let mut last = Instant::now();
        wait_until(Duration::from_secs(1800), || {
            let lag = group_lag(group, &self.input)?;
            if last.elapsed() > Duration::from_secs(10) {
                log(&format!("waiting for {group} to catch up: lag {lag:?}"));
                last = Instant::now();
            }
            // Caught up: less than a second of input left.
            Ok(lag.is_some_and(|l| l <= args.rate as i64))
        })
        .with_context(|| format!("{group} did not catch up with its input"))?;
        log(&format!(
            "{group} caught up with {} keys in {:.1} s",
            args.keys,
            t.elapsed().as_secs_f64()
        ));
        self.watch = Some(OutputWatch::start(&self.output, self.epoch)?);
        Ok(())
    }

    pub fn watch(&self) -> Result<&OutputWatch> {
        self.watch.as_ref().context("the output is not watched yet")
    }

    /// Per partition, the longest gap in `[from, to]` (the normal cadence of commits).
    fn gaps(&self, from: f64, to: f64, partitions: i32) -> Result<Vec<f64>> {
        let w = self.watch()?;
        Ok((0..partitions)
            .map(|p| longest_gap(&w.arrivals(p), from, to).seconds())
            .collect())
    }

    pub fn finish(mut self, extra_topics: &[String]) -> Result<()> {
        if let Some(w) = self.watch.take() {
            w.stop()?;
        }
        if let Some(s) = self.steady.take() {
            s.stop()?;
        }
        let mut all = vec![self.input.as_str(), self.output.as_str()];
        all.extend(extra_topics.iter().map(String::as_str));
        delete_topics(&all)
    }
}

pub fn partition_of(task: &str) -> i32 {
    task.rsplit('_')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(-1)
}

pub fn all_tasks(partitions: i32) -> Vec<String> {
    (0..partitions).map(|p| format!("0_{p}")).collect()
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn opt3(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |v| json!(round3(v)))
}

/// The pause at a move: the longest gap that began within 5 s of the moment `m` the task
/// changed hands (eddy: the assignment moved it; Kafka Streams: its new owner reported it
/// active), however long it lasted. Apart from the move's own pause it sees only the
/// machine's noise nearby, not all of it since the event.
pub fn near(arrivals: &[f64], m: f64, t0: f64, t_end: f64) -> Gap {
    longest(
        gaps(arrivals, t0, t_end)
            .into_iter()
            .filter(|g| (g.start - m).abs() <= 5.0),
    )
    .unwrap_or_else(|| longest_gap(arrivals, t0, t_end))
}

/// Baseline of a stage: p99 and max over partitions of the longest gap in the `secs` before
/// `t0`.
pub fn baseline(stage: &Stage, t0: f64, secs: f64, partitions: i32) -> Result<Value> {
    let g = stage.gaps(t0 - secs, t0, partitions)?;
    Ok(json!({
        "seconds": secs,
        "gap_p99_s": opt3(percentile(&g, 0.99)),
        "gap_max_s": opt3(g.iter().copied().reduce(f64::max)),
    }))
}

/// Sleep while a condition of the system settles (a benchmark, not a test: it waits on purpose).
pub fn pause(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
}

/// The figures of a scale-out that both engines share, between `t0` (the event) and `t_end`:
/// per task that changed hands between `before` and `after` (task → owner) its pause, the
/// pause at the move (`moved_at(task, new owner)`: when the move happened) and what
/// `detail(task, new owner, move time)` adds as its (key, value); the longest gap of the tasks
/// that did not move.
pub fn scale_out_figures(
    stage: &Stage,
    partitions: i32,
    (t0, t_end): (f64, f64),
    (before, after): (&BTreeMap<String, String>, &BTreeMap<String, String>),
    moved_at: impl Fn(&str, &str) -> Option<f64>,
    detail: impl Fn(&str, &str, Option<f64>) -> (&'static str, Value),
) -> Result<serde_json::Map<String, Value>> {
    let mut moved = Vec::new();
    let mut pauses = Vec::new();
    let mut handoffs = Vec::new();
    let mut unmoved = Vec::new();
    for task in all_tasks(partitions) {
        let arrivals = stage.watch()?.arrivals(partition_of(&task));
        let gap = longest_gap(&arrivals, t0, t_end);
        match (before.get(&task), after.get(&task)) {
            (Some(from), Some(to)) if from != to => {
                pauses.push(gap.seconds());
                let m = moved_at(&task, to);
                let at_move = m.map(|m| near(&arrivals, m, t0, t_end));
                if let Some(g) = at_move {
                    handoffs.push(g.seconds());
                }
                let (key, value) = detail(&task, to, m);
                let mut one = json!({
                    "task": task, "from": from, "to": to,
                    "pause_s": round3(gap.seconds()),
                    "pause_from_s": round3(gap.start - t0),
                    "pause_to_s": round3(gap.end - t0),
                    "resumed": gap.resumed,
                    "pause_at_move_s": opt3(at_move.map(|g| g.seconds())),
                });
                one[key] = value;
                moved.push(one);
            }
            _ => unmoved.push(gap.seconds()),
        }
    }
    let Value::Object(figures) = json!({
        "tasks": moved.len(),
        "pause_p99_s": opt3(percentile(&pauses, 0.99)),
        "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
        "pause_at_move_p99_s": opt3(percentile(&handoffs, 0.99)),
        "unmoved_gap_max_s": opt3(unmoved.iter().copied().reduce(f64::max)),
        "moved": moved,
    }) else {
        unreachable!("json! of an object literal")
    };
    Ok(figures)
}

/// The figures of a rolling update that both engines share, between `t0` (the change) and
/// `t_end`: every task's longest pause (a rollout restarts every instance, so every task may
/// pause), their p99 and maximum.
pub fn rollout_figures(
    stage: &Stage,
    partitions: i32,
    (t0, t_end): (f64, f64),
) -> Result<serde_json::Map<String, Value>> {
    let mut pauses = Vec::new();
    let mut per_task = Vec::new();
    for task in all_tasks(partitions) {
        let gap = longest_gap(&stage.watch()?.arrivals(partition_of(&task)), t0, t_end);
        pauses.push(gap.seconds());
        per_task.push(json!({
            "task": task,
            "pause_s": round3(gap.seconds()),
            "pause_from_s": round3(gap.start - t0),
            "pause_to_s": round3(gap.end - t0),
            "resumed": gap.resumed,
        }));
    }
    let Value::Object(figures) = json!({
        "tasks": per_task.len(),
        "pause_p99_s": opt3(percentile(&pauses, 0.99)),
        "pause_max_s": opt3(pauses.iter().copied().reduce(f64::max)),
        "pauses": per_task,
    }) else {
        unreachable!("json! of an object literal")
    };
    Ok(figures)
}

//! The benchmark report (`bench/report`, `bench-report`; docs/benchmarks.md, "The report"):
//! merges what each benchmark of one run wrote into a run directory into one `report.json`
//! (machine, versions, command lines, each benchmark's own JSON, and a flat list of figures),
//! renders it as Markdown blocks and SVG charts for docs/benchmarks.md, and compares two
//! reports figure by figure, flagging regressions.
//!
//! A run directory holds `meta.json` ([`meta`]), `<section>.cmd` (the exact command line of
//! each benchmark run) and each benchmark's output: `engine.json`, `restore.json`,
//! `operator.json` (`--json` of eddy-bench, eddy-bench --large-restore, operator-bench),
//! `compare/results.{json,md}` and `ratios.svg` (eddy-vs-kstreams), `curves/curve-*.{json,svg}`
//! (eddy-vs-kstreams --curve) and `scaling/results.{json,md}` (scaling-bench).

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The sections of a report, in the order of docs/benchmarks.md.
pub const SECTIONS: &[&str] = &[
    "engine", "restore", "operator", "compare", "curves", "scaling",
];

/// Whether a larger value of a figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One number of a report that a later run can be compared against.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// Stable across runs of the same sizes: `section.case.metric`.
    pub id: String,
    pub value: f64,
    pub unit: &'static str,
    pub better: Better,
    /// A baseline (raw clients, Kafka's tools, Kafka Streams), not eddy: its change is shown,
    /// never flagged as a regression of eddy.
    pub reference: bool,
}

impl Figure {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "value": self.value,
            "unit": self.unit,
            "better": match self.better { Better::Higher => "higher", Better::Lower => "lower" },
            "reference": self.reference,
        })
    }

    fn from_json(v: &Value) -> Option<Figure> {
        Some(Figure {
            id: v["id"].as_str()?.to_string(),
            value: v["value"].as_f64()?,
            unit: match v["unit"].as_str()? {
                "records/s" => "records/s",
                "s" => "s",
                "MiB" => "MiB",
                "CPU s/M" => "CPU s/M",
                _ => "",
            },
            better: if v["better"] == "lower" {
                Better::Lower
            } else {
                Better::Higher
            },
            reference: v["reference"].as_bool().unwrap_or(false),
        })
    }
}

/// `(b) count at_least_once` → `b_count_at_least_once`.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    out.trim_end_matches('_').to_string()
}

fn fig(
    id: String,
    value: Option<f64>,
    unit: &'static str,
    better: Better,
    reference: bool,
) -> Option<Figure> {
    value.filter(|v| v.is_finite()).map(|value| Figure {
        id,
        value,
        unit,
        better,
        reference,
    })
}

const MIB: f64 = 1024.0 * 1024.0;

fn mib(v: &Value) -> Option<f64> {
    v.as_f64().filter(|b| *b > 0.0).map(|b| b / MIB)
}

/// The figures of one section's JSON (as its benchmark wrote it).
pub fn figures(section: &str, v: &Value) -> Vec<Figure> {
    use Better::*;
    let mut out: Vec<Option<Figure>> = Vec::new();
    let rows = |v: &Value| v.as_array().cloned().unwrap_or_default();
    match section {
        "engine" => {
            for r in rows(&v["rows"]) {
                let case = r["case"].as_str().unwrap_or_default();
                let id = format!("engine.{}", slug(case));
                let reference = case.contains(" raw ");
                out.push(fig(
                    format!("{id}.records_per_s"),
                    r["records_per_second"].as_f64(),
                    "records/s",
                    Higher,
                    reference,
                ));
                let cpu = r["cpu_seconds_per_million"].as_f64().filter(|c| *c > 0.0);
                out.push(fig(
                    format!("{id}.cpu_s_per_m"),
                    cpu,
                    "CPU s/M",
                    Lower,
                    reference,
                ));
                out.push(fig(
                    format!("{id}.peak_rss_mib"),
                    mib(&r["peak_rss_bytes"]),
                    "MiB",
                    Lower,
                    reference,
                ));
            }
            for t in rows(&v["tools"]) {
                let id = format!(
                    "engine.tool.{}",
                    slug(t["tool"].as_str().unwrap_or_default())
                );
                out.push(fig(
                    format!("{id}.records_per_s"),
                    t["records_per_second"].as_f64(),
                    "records/s",
                    Higher,
                    true,
                ));
            }
            // Every engine ratio is eddy over a ceiling: higher is better.
            for r in rows(&v["ratios"]) {
                let id = r["id"].as_str().unwrap_or_default();
                out.push(fig(
                    format!("engine.ratio.{id}"),
                    r["value"].as_f64(),
                    "",
                    Higher,
                    false,
                ));
            }
            out.push(fig(
                "engine.peak_rss_over_budget_mib".into(),
                v["peak_rss_over_budget_mib"].as_f64(),
                "MiB",
                Lower,
                false,
            ));
        }
        "restore" => {
            for r in rows(&v["rows"]) {
                let case = r["case"].as_str().unwrap_or_default();
                let reference = !case.starts_with("eddy");
                out.push(fig(
                    format!("restore.{}.seconds", slug(case)),
                    r["seconds"].as_f64(),
                    "s",
                    Lower,
                    reference,
                ));
                if !reference {
                    out.push(fig(
                        format!("restore.{}.peak_rss_mib", slug(case)),
                        mib(&r["peak_rss_bytes"]),
                        "MiB",
                        Lower,
                        false,
                    ));
                }
            }
            for r in rows(&v["ratios"]) {
                let better = if r["at_least"].as_bool().unwrap_or(true) {
                    Higher
                } else {
                    Lower
                };
                let id = r["id"].as_str().unwrap_or_default();
                out.push(fig(
                    format!("restore.ratio.{id}"),
                    r["value"].as_f64(),
                    "",
                    better,
                    false,
                ));
            }
        }
        "operator" => {
            out.push(fig(
                "operator.all_assigned_s".into(),
                v["all_assigned_seconds"].as_f64(),
                "s",
                Lower,
                false,
            ));
            out.push(fig(
                "operator.spec_change_median_s".into(),
                v["spec_change_median_seconds"].as_f64(),
                "s",
                Lower,
                false,
            ));
            out.push(fig(
                "operator.spec_change_slowest_s".into(),
                v["spec_change_slowest_seconds"].as_f64(),
                "s",
                Lower,
                false,
            ));
            out.push(fig(
                "operator.peak_rss_mib".into(),
                mib(&v["operator_peak_rss_bytes"]),
                "MiB",
                Lower,
                false,
            ));
        }
        "compare" => {
            for r in rows(&v["runs"]) {
                let id = format!(
                    "compare.{}_{}",
                    r["case"].as_str().unwrap_or_default(),
                    r["guarantee"].as_str().unwrap_or_default()
                );
                for (engine, reference) in [("eddy", false), ("kafka_streams", true)] {
                    let m = &r[engine];
                    out.push(fig(
                        format!("{id}.{engine}.records_per_s"),
                        m["records_per_second"].as_f64(),
                        "records/s",
                        Higher,
                        reference,
                    ));
                    out.push(fig(
                        format!("{id}.{engine}.cpu_s_per_m"),
                        m["cpu_seconds_per_million"].as_f64(),
                        "CPU s/M",
                        Lower,
                        reference,
                    ));
                    out.push(fig(
                        format!("{id}.{engine}.peak_rss_mib"),
                        mib(&m["peak_rss_bytes"]),
                        "MiB",
                        Lower,
                        reference,
                    ));
                    out.push(fig(
                        format!("{id}.{engine}.restore_s"),
                        m["restore_seconds"].as_f64(),
                        "s",
                        Lower,
                        reference,
                    ));
                    out.push(fig(
                        format!("{id}.{engine}.state_disk_mib"),
                        mib(&m["state_disk_bytes"]),
                        "MiB",
                        Lower,
                        reference,
                    ));
                }
                for q in rows(&r["ratios"]) {
                    let metric = q["metric"].as_str().unwrap_or_default();
                    let better = if metric == "throughput" {
                        Higher
                    } else {
                        Lower
                    };
                    out.push(fig(
                        format!("{id}.ratio.{}", slug(metric)),
                        q["eddy_over_kstreams"].as_f64(),
                        "",
                        better,
                        false,
                    ));
                }
            }
        }
        "curves" => {
            for c in rows(&v["curves"]) {
                let name = c["curve"].as_str().unwrap_or_default();
                for p in rows(&c["points"]) {
                    let id = format!("curve.{name}.{}", p["x"]);
                    for (engine, reference) in [("eddy", false), ("kafka_streams", true)] {
                        let m = &p[engine];
                        out.push(fig(
                            format!("{id}.{engine}.records_per_s"),
                            m["records_per_second"].as_f64(),
                            "records/s",
                            Higher,
                            reference,
                        ));
                        out.push(fig(
                            format!("{id}.{engine}.peak_rss_mib"),
                            mib(&m["peak_rss_bytes"]),
                            "MiB",
                            Lower,
                            reference,
                        ));
                    }
                }
            }
        }
        "scaling" => {
            for r in rows(&v["results"]) {
                let engine = r["engine"].as_str().unwrap_or_default();
                let id = format!(
                    "scaling.{}.{}",
                    slug(engine),
                    slug(r["case"].as_str().unwrap_or_default())
                );
                let reference = engine != "eddy";
                for f in [
                    "pause_p99_s",
                    "pause_max_s",
                    "balanced_after_s",
                    "resumed_max_s",
                    "rolled_out_after_s",
                ] {
                    out.push(fig(
                        format!("{id}.{f}"),
                        r[f].as_f64(),
                        "s",
                        Lower,
                        reference,
                    ));
                }
            }
        }
        _ => {}
    }
    out.into_iter().flatten().collect()
}

/// What a section's figures depend on besides the code: runs with different sizes are not
/// comparable.
pub fn sizes(section: &str, v: &Value) -> Value {
    let pick = |keys: &[&str]| {
        let mut m = serde_json::Map::new();
        for k in keys {
            m.insert(k.to_string(), v[*k].clone());
        }
        Value::Object(m)
    };
    match section {
        "engine" => pick(&["records", "keys", "partitions"]),
        "restore" => pick(&["keys", "value_bytes", "tail", "partitions", "kafka_streams"]),
        "operator" => pick(&["apps"]),
        "compare" => pick(&["records", "keys", "partitions", "kafka_streams_jvm_options"]),
        "curves" => Value::Array(
            v["curves"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    json!({
                        "curve": c["curve"], "records": c["records"], "keys": c["keys"],
                        "partitions": c["partitions"],
                        "points": c["points"].as_array().into_iter().flatten().map(|p| p["x"].clone()).collect::<Vec<_>>(),
                        "kafka_streams_jvm_options": c["kafka_streams_jvm_options"],
                    })
                })
                .collect(),
        ),
        "scaling" => pick(&["keys", "partitions", "rate"]),
        _ => Value::Null,
    }
}

// ------------------------------------------------------------------------------ the run

fn cmd_out(program: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).output().ok()?;
    let text = if o.stdout.is_empty() {
        o.stderr
    } else {
        o.stdout
    };
    let s = String::from_utf8_lossy(&text)
        .lines()
        .next()?
        .trim()
        .to_string();
    (o.status.success() && !s.is_empty()).then_some(s)
}

/// The Kafka version kafka.sh runs: `EDDY_KAFKA_VERSION`, else its default.
fn kafka_version(root: &Path) -> Option<String> {
    if let Ok(v) = std::env::var("EDDY_KAFKA_VERSION") {
        return Some(v);
    }
    let script = std::fs::read_to_string(root.join("e2e/kafka/kafka.sh")).ok()?;
    let line = script.lines().find(|l| l.starts_with("KAFKA_VERSION="))?;
    let v = line.split(":-").nth(1)?.split('}').next()?;
    Some(v.to_string())
}

/// Machine and versions of this run, and its command line.
pub fn meta(command: &str) -> Value {
    let root = crate::repo_root();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo.lines().find_map(|l| {
        l.strip_prefix("model name")
            .and_then(|r| r.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
    });
    let cores = std::thread::available_parallelism().map(|n| n.get()).ok();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    let git = |args: &[&str]| {
        let mut a = vec!["-C", root.to_str().unwrap_or(".")];
        a.extend_from_slice(args);
        cmd_out("git", &a)
    };
    let dirty = Command::new("git")
        .args([
            "-C",
            root.to_str().unwrap_or("."),
            "status",
            "--porcelain",
            "--untracked-files=no",
        ])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    json!({
        "started": crate::scaling::stage::utc_now(),
        "command": command,
        "machine": {
            "cpu": cpu,
            "cores": cores,
            "memory_bytes": memory,
            "kernel": cmd_out("uname", &["-sr"]),
        },
        "versions": {
            "eddy": git(&["rev-parse", "--short=12", "HEAD"]).map(|r| if dirty { format!("{r}-dirty") } else { r }),
            "kafka": kafka_version(&root),
            "java": cmd_out("java", &["-version"]),
            "rustc": cmd_out("rustc", &["--version"]),
        },
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// A section's JSON in a run directory, with its Markdown (from `results.md` where the
/// benchmark writes it there), or None when the section did not run.
fn load_section(dir: &Path, section: &str) -> Result<Option<Value>> {
    let mut v = match section {
        "engine" | "restore" | "operator" => {
            let p = dir.join(format!("{section}.json"));
            if !p.exists() {
                return Ok(None);
            }
            read_json(&p)?
        }
        "compare" | "scaling" => {
            let p = dir.join(section).join("results.json");
            if !p.exists() {
                return Ok(None);
            }
            let mut v = read_json(&p)?;
            let md =
                std::fs::read_to_string(dir.join(section).join("results.md")).unwrap_or_default();
            v["markdown"] = json!(md);
            v
        }
        "curves" => {
            let mut curves = Vec::new();
            for name in ["partitions", "keys"] {
                let p = dir.join("curves").join(format!("curve-{name}.json"));
                if p.exists() {
                    curves.push(read_json(&p)?);
                }
            }
            if curves.is_empty() {
                return Ok(None);
            }
            json!({ "curves": curves })
        }
        other => bail!("unknown section '{other}'"),
    };
    let cmd = dir.join(format!("{section}.cmd"));
    if let Ok(c) = std::fs::read_to_string(&cmd) {
        v["command"] = json!(c.trim());
    }
    Ok(Some(v))
}

/// Merge a run directory into one report: `{meta, sections: {name: {sizes, command, source}},
/// figures: [...]}`.
pub fn merge(dir: &Path) -> Result<Value> {
    let meta = read_json(&dir.join("meta.json")).unwrap_or_else(|_| meta(""));
    let mut sections = serde_json::Map::new();
    let mut figs = Vec::new();
    for s in SECTIONS {
        if let Some(v) = load_section(dir, s)? {
            figs.extend(figures(s, &v).iter().map(Figure::to_json));
            sections.insert(
                s.to_string(),
                json!({ "sizes": sizes(s, &v), "command": v["command"].clone(), "source": v }),
            );
        }
    }
    if sections.is_empty() {
        bail!("{} holds no benchmark results", dir.display());
    }
    Ok(json!({ "meta": meta, "sections": sections, "figures": figs }))
}

/// A report from a `report.json` file, or from a run directory (its `report.json`, merged from
/// its files if missing), or from the results root (its newest run).
pub fn load(path: &Path) -> Result<Value> {
    if path.is_file() {
        return read_json(path);
    }
    if !path.is_dir() {
        bail!("{}: no such report file or run directory", path.display());
    }
    if path.join("report.json").is_file() {
        return read_json(&path.join("report.json"));
    }
    if path.join("meta.json").is_file() {
        return merge(path);
    }
    match latest_run(path, None)? {
        Some(d) => load(&d),
        None => bail!(
            "{}: neither a report.json nor a run directory (no meta.json), and no run directory in it",
            path.display()
        ),
    }
}

/// The newest run directory (a child with a `meta.json`, by name: timestamps sort) under
/// `root`, other than `except`.
pub fn latest_run(root: &Path, except: Option<&Path>) -> Result<Option<PathBuf>> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(root)
        .with_context(|| format!("reading {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").is_file() && p.join("report.json").is_file())
        .filter(|p| except.is_none_or(|x| !same_path(p, x)))
        .collect();
    runs.sort();
    Ok(runs.pop())
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

// ------------------------------------------------------------------------------ compare

/// One figure in both reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub id: String,
    pub unit: &'static str,
    pub old: f64,
    pub new: f64,
    /// Relative change, new/old − 1 (None when old is 0).
    pub change: Option<f64>,
    /// Worse by more than the threshold, the section's sizes equal, not a reference figure.
    pub regression: bool,
    pub improvement: bool,
    pub reference: bool,
    /// The section ran with other sizes: the change says little.
    pub sizes_differ: bool,
}

pub struct Comparison {
    pub changes: Vec<Change>,
    pub only_old: Vec<String>,
    pub only_new: Vec<String>,
    /// Sections whose sizes differ, with both sizes.
    pub sizes_differ: Vec<(String, Value, Value)>,
    pub threshold: f64,
}

impl Comparison {
    pub fn regressions(&self) -> Vec<&Change> {
        self.changes.iter().filter(|c| c.regression).collect()
    }
}

fn report_figures(r: &Value) -> Vec<Figure> {
    r["figures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Figure::from_json)
        .collect()
}

/// Compare two reports figure by figure. `threshold` is relative (0.10: 10 % worse flags).
pub fn compare(old: &Value, new: &Value, threshold: f64) -> Comparison {
    let (of, nf) = (report_figures(old), report_figures(new));
    let mut sizes_differ = Vec::new();
    for s in SECTIONS {
        let (a, b) = (&old["sections"][*s]["sizes"], &new["sections"][*s]["sizes"]);
        if !a.is_null() && !b.is_null() && a != b {
            sizes_differ.push((s.to_string(), a.clone(), b.clone()));
        }
    }
    let section_of = |id: &str| {
        let first = id.split('.').next().unwrap_or_default();
        if first == "curve" {
            "curves".to_string()
        } else {
            first.to_string()
        }
    };
    let mut changes = Vec::new();
    for n in &nf {
        let Some(o) = of.iter().find(|o| o.id == n.id) else {
            continue;
        };
        let change = (o.value != 0.0).then(|| n.value / o.value - 1.0);
        let worse = match (n.better, change) {
            (Better::Higher, Some(c)) => c < -threshold,
            (Better::Lower, Some(c)) => c > threshold,
            (Better::Lower, None) => n.value > 0.0,
            (Better::Higher, None) => false,
        };
        let better = match (n.better, change) {
            (Better::Higher, Some(c)) => c > threshold,
            (Better::Lower, Some(c)) => c < -threshold,
            _ => false,
        };
        let differ = sizes_differ.iter().any(|(s, _, _)| *s == section_of(&n.id));
        changes.push(Change {
            id: n.id.clone(),
            unit: n.unit,
            old: o.value,
            new: n.value,
            change,
            regression: worse && !n.reference && !differ,
            improvement: better && !n.reference && !differ,
            reference: n.reference,
            sizes_differ: differ,
        });
    }
    let only_old = of
        .iter()
        .filter(|o| !nf.iter().any(|n| n.id == o.id))
        .map(|o| o.id.clone())
        .collect();
    let only_new = nf
        .iter()
        .filter(|n| !of.iter().any(|o| o.id == n.id))
        .map(|n| n.id.clone())
        .collect();
    Comparison {
        changes,
        only_old,
        only_new,
        sizes_differ,
        threshold,
    }
}

/// `12 figures of restore, 4 of operator` (a few ids in full).
fn by_section(ids: &[String]) -> String {
    if ids.len() <= 4 {
        return ids.join(", ");
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    for id in ids {
        let sec = id.split('.').next().unwrap_or_default().to_string();
        match counts.iter_mut().find(|(s, _)| *s == sec) {
            Some((_, n)) => *n += 1,
            None => counts.push((sec, 1)),
        }
    }
    counts
        .iter()
        .map(|(s, n)| format!("{n} figures of {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn num(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    }
}

fn run_label(r: &Value) -> String {
    format!(
        "{} (eddy {})",
        r["meta"]["started"].as_str().unwrap_or("?"),
        r["meta"]["versions"]["eddy"].as_str().unwrap_or("?")
    )
}

/// The comparison as text: a table of every figure in both reports, then the verdict.
pub fn comparison_text(c: &Comparison, old: &Value, new: &Value) -> String {
    let mut s = format!(
        "old: {}\nnew: {}\nregression: more than {:.0} % worse (reference figures — raw clients, Kafka's tools, Kafka Streams — are shown, never flagged)\n\n",
        run_label(old),
        run_label(new),
        c.threshold * 100.0
    );
    for (sec, a, b) in &c.sizes_differ {
        s += &format!(
            "{sec}: sizes differ, its figures are not compared for regressions: old {a}, new {b}\n"
        );
    }
    if !c.sizes_differ.is_empty() {
        s.push('\n');
    }
    let w = c
        .changes
        .iter()
        .map(|x| x.id.len())
        .max()
        .unwrap_or(10)
        .max(6);
    s += &format!(
        "{:<w$}  {:>12}  {:>12}  {:>8}  \n",
        "figure", "old", "new", "change"
    );
    for x in &c.changes {
        let flag = if x.regression {
            "REGRESSION"
        } else if x.improvement {
            "better"
        } else if x.reference {
            "(reference)"
        } else if x.sizes_differ {
            "(other sizes)"
        } else {
            ""
        };
        s += &format!(
            "{:<w$}  {:>12}  {:>12}  {:>8}  {flag}\n",
            x.id,
            format!(
                "{}{}",
                num(x.old),
                if x.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", x.unit)
                }
            ),
            num(x.new),
            x.change
                .map_or("–".into(), |c| format!("{:+.1}%", c * 100.0)),
        );
    }
    for (which, ids) in [("old", &c.only_old), ("new", &c.only_new)] {
        if !ids.is_empty() {
            s += &format!("\nonly in {which}: {}\n", by_section(ids));
        }
    }
    let r = c.regressions();
    if r.is_empty() {
        s += &format!(
            "\nno regressions (of {} figures compared)\n",
            c.changes.len()
        );
    } else {
        s += &format!(
            "\n{} regression(s): {}\n",
            r.len(),
            r.iter()
                .map(|x| x.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s
}

// ------------------------------------------------------------------------------ rendering

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart: one bar per `(label, value, color)`, the value written after it.
pub fn bars_svg(title: &str, unit: &str, bars: &[(String, f64, &str)]) -> String {
    let (width, left, right, bar, gap) = (760.0, 300.0, 90.0, 16.0, 4.0);
    let height = 40.0 + bars.len() as f64 * (bar + gap) + 16.0;
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.05;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
    for (i, (label, v, color)) in bars.iter().enumerate() {
        let y = 36.0 + i as f64 * (bar + gap);
        let w = ((width - left - right) * v / max).max(1.0);
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<rect x=\"{left}\" y=\"{y}\" width=\"{w:.1}\" height=\"{bar}\" fill=\"{color}\"/>\n<text x=\"{:.1}\" y=\"{}\">{} {}</text>\n",
            left - 6.0,
            y + bar - 4.0,
            esc(label),
            left + w + 4.0,
            y + bar - 4.0,
            num(*v),
            esc(unit)
        );
    }
    let bottom = 36.0 + bars.len() as f64 * (bar + gap);
    s += &format!(
        "<line x1=\"{left}\" y1=\"32\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"#333\"/>\n</svg>\n"
    );
    s
}

const EDDY: &str = "#4c78a8";
const BASELINE: &str = "#9d9d9d";
const KS: &str = "#f58518";

/// The charts of a section: (file name, SVG). `dir` is the run directory (for the SVGs the
/// benchmarks wrote themselves).
pub fn charts(section: &str, v: &Value, dir: &Path) -> Vec<(String, String)> {
    let rows = |v: &Value| v.as_array().cloned().unwrap_or_default();
    match section {
        "engine" => {
            let bars: Vec<(String, f64, &str)> = rows(&v["rows"])
                .iter()
                .map(|r| {
                    let case = r["case"].as_str().unwrap_or_default().to_string();
                    let color = if case.contains(" raw ") {
                        BASELINE
                    } else {
                        EDDY
                    };
                    (case, r["records_per_second"].as_f64().unwrap_or(0.0), color)
                })
                .collect();
            vec![(
                "engine.svg".into(),
                bars_svg(
                    "engine benchmark: records/s (grey: the raw clients' ceilings)",
                    "/s",
                    &bars,
                ),
            )]
        }
        "restore" => {
            let bars: Vec<(String, f64, &str)> = rows(&v["rows"])
                .iter()
                .map(|r| {
                    let case = r["case"].as_str().unwrap_or_default().to_string();
                    let color = if case.starts_with("eddy") {
                        EDDY
                    } else if case.starts_with("Kafka Streams") {
                        KS
                    } else {
                        BASELINE
                    };
                    (case, r["seconds"].as_f64().unwrap_or(0.0), color)
                })
                .collect();
            vec![(
                "restore.svg".into(),
                bars_svg(
                    "large-state restore: seconds (shorter is better)",
                    "s",
                    &bars,
                ),
            )]
        }
        "compare" => std::fs::read_to_string(dir.join("compare/ratios.svg"))
            .map(|s| vec![("eddy-vs-kstreams.svg".to_string(), s)])
            .unwrap_or_default(),
        "curves" => rows(&v["curves"])
            .iter()
            .filter_map(|c| {
                let name = format!("curve-{}.svg", c["curve"].as_str()?);
                let svg = std::fs::read_to_string(dir.join("curves").join(&name)).ok()?;
                Some((name, svg))
            })
            .collect(),
        "scaling" => {
            let mut bars: Vec<(String, f64, &str)> = Vec::new();
            for r in rows(&v["results"]) {
                let eddy = r["engine"] == "eddy";
                let case = r["case"].as_str().unwrap_or_default();
                let (what, value) = if case.starts_with("scale-out") {
                    ("pause p99", r["pause_p99_s"].as_f64())
                } else if case.starts_with("rollout") {
                    ("longest pause", r["pause_max_s"].as_f64())
                } else {
                    ("processing again after", r["resumed_max_s"].as_f64())
                };
                if let Some(value) = value {
                    bars.push((
                        format!(
                            "{} {case}: {what}",
                            if eddy { "eddy" } else { "Kafka Streams" }
                        ),
                        value,
                        if eddy { EDDY } else { KS },
                    ));
                }
            }
            vec![(
                "scaling.svg".into(),
                bars_svg(
                    "scale-out, failover and rolling update: seconds (shorter is better)",
                    "s",
                    &bars,
                ),
            )]
        }
        _ => Vec::new(),
    }
}

const TITLES: &[(&str, &str)] = &[
    ("engine", "The engine benchmark"),
    ("restore", "Large-state restore"),
    ("operator", "The operator benchmark"),
    ("compare", "eddy vs Kafka Streams"),
    ("curves", "Scaling curves"),
    ("scaling", "Scaling and failover"),
];

fn title(section: &str) -> &str {
    TITLES
        .iter()
        .find(|(s, _)| *s == section)
        .map_or(section, |(_, t)| t)
}

/// The machine and versions of a report, as a Markdown list.
pub fn meta_markdown(meta: &Value) -> String {
    let m = &meta["machine"];
    let v = &meta["versions"];
    let s = |x: &Value| x.as_str().unwrap_or("unknown").to_string();
    format!(
        "- run: {} · `{}`\n- machine: {}, {} cores, {:.1} GiB memory, {}\n- versions: eddy `{}`, Kafka {}, {}, {}\n",
        s(&meta["started"]),
        s(&meta["command"]),
        s(&m["cpu"]),
        m["cores"],
        m["memory_bytes"].as_f64().unwrap_or(0.0) / (1024.0 * MIB),
        s(&m["kernel"]),
        s(&v["eddy"]),
        s(&v["kafka"]),
        s(&v["java"]),
        s(&v["rustc"]),
    )
}

/// One section's block for docs/benchmarks.md: provenance, its tables, its charts
/// (`chart_dir` relative to docs/).
pub fn section_markdown(report: &Value, section: &str, chart_dir: &str) -> Option<String> {
    let sec = &report["sections"][section];
    if sec.is_null() {
        return None;
    }
    let src = &sec["source"];
    let meta = &report["meta"];
    let mut s = format!(
        "Generated by `bench/report` ({}, eddy `{}`, Kafka {}); command: `{}`\n\n",
        meta["started"].as_str().unwrap_or("?"),
        meta["versions"]["eddy"].as_str().unwrap_or("?"),
        meta["versions"]["kafka"].as_str().unwrap_or("?"),
        sec["command"].as_str().unwrap_or("?"),
    );
    if section == "curves" {
        for c in src["curves"].as_array().into_iter().flatten() {
            let name = c["curve"].as_str().unwrap_or_default();
            s += &format!(
                "**{name}**: {}\n",
                c["markdown"].as_str().unwrap_or_default().trim()
            );
            s += &format!(
                "\n![count at-least-once as {name} grow]({chart_dir}/curve-{name}.svg)\n\n"
            );
        }
        return Some(s.trim_end().to_string() + "\n");
    }
    s += src["markdown"].as_str().unwrap_or_default().trim();
    s.push('\n');
    let chart = match section {
        "engine" => Some("engine.svg"),
        "restore" => Some("restore.svg"),
        "compare" => Some("eddy-vs-kstreams.svg"),
        "scaling" => Some("scaling.svg"),
        _ => None,
    };
    if let Some(c) = chart {
        s += &format!("\n![{}]({chart_dir}/{c})\n", title(section));
    }
    Some(s)
}

/// The whole report as one Markdown page (the run directory's `report.md`).
pub fn report_markdown(report: &Value) -> String {
    let mut s = format!("# Benchmark report\n\n{}\n", meta_markdown(&report["meta"]));
    for sec in SECTIONS {
        if let Some(b) = section_markdown(report, sec, ".") {
            s += &format!("## {}\n\n{b}\n", title(sec));
        }
    }
    s
}

fn markers(name: &str) -> (String, String) {
    (
        format!(
            "<!-- bench-report:{name}:begin (generated by bench/report --publish; edit outside the markers) -->"
        ),
        format!("<!-- bench-report:{name}:end -->"),
    )
}

/// Replace the text between a block's markers in `doc`. Err when the markers are missing.
pub fn replace_block(doc: &str, name: &str, content: &str) -> Result<String> {
    let (begin, end) = markers(name);
    let b = doc.find(&begin).with_context(|| {
        format!("marker '{begin}' not found: put it (and '{end}') where the block belongs")
    })?;
    let e = doc[b..]
        .find(&end)
        .map(|i| b + i)
        .with_context(|| format!("marker '{end}' not found after '{begin}'"))?;
    Ok(format!(
        "{}{begin}\n{}{}",
        &doc[..b],
        content.trim_end().to_string() + "\n",
        &doc[e..]
    ))
}

/// Write the report's blocks into `doc_path` (docs/benchmarks.md): the `machine` block and
/// the block of every section the report has; sections it lacks keep their last figures.
pub fn publish(report: &Value, doc_path: &Path, chart_dir: &str) -> Result<Vec<String>> {
    let mut doc = std::fs::read_to_string(doc_path)
        .with_context(|| format!("reading {}", doc_path.display()))?;
    let mut done = Vec::new();
    let ran: Vec<&str> = SECTIONS
        .iter()
        .copied()
        .filter(|s| !report["sections"][*s].is_null())
        .collect();
    let header = format!(
        "The last `bench/report --publish` ran {} on this machine, at these versions (each block below names its own run: blocks of benchmarks a run left out keep their figures):\n\n{}",
        ran.join(", "),
        meta_markdown(&report["meta"])
    );
    doc = replace_block(&doc, "machine", &header)?;
    for sec in ran {
        if let Some(b) = section_markdown(report, sec, chart_dir) {
            doc = replace_block(&doc, sec, &b)?;
            done.push(sec.to_string());
        }
    }
    std::fs::write(doc_path, doc).with_context(|| format!("writing {}", doc_path.display()))?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(figs: &[(&str, f64, &str, bool)], engine_records: u64) -> Value {
        json!({
            "meta": {"started": "t", "versions": {"eddy": "abc"}},
            "sections": {"engine": {"sizes": {"records": engine_records}}, "operator": {"sizes": {"apps": 50}}},
            "figures": figs.iter().map(|(id, v, better, reference)| json!({
                "id": id, "value": v, "unit": "", "better": better, "reference": reference,
            })).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn regressions_are_worse_by_more_than_the_threshold() {
        let old = report(
            &[
                ("engine.b_count.records_per_s", 100.0, "higher", false),
                ("engine.c_count.records_per_s", 100.0, "higher", false),
                ("engine.b_count.peak_rss_mib", 200.0, "lower", false),
                ("operator.spec_change_median_s", 0.40, "lower", false),
                ("engine.a_raw.records_per_s", 100.0, "higher", true),
                ("engine.gone", 1.0, "higher", false),
            ],
            1000,
        );
        let new = report(
            &[
                ("engine.b_count.records_per_s", 85.0, "higher", false), // 15 % slower
                ("engine.c_count.records_per_s", 95.0, "higher", false), // within 10 %
                ("engine.b_count.peak_rss_mib", 230.0, "lower", false),  // 15 % more memory
                ("operator.spec_change_median_s", 0.30, "lower", false), // 25 % faster
                ("engine.a_raw.records_per_s", 50.0, "higher", true),    // a ceiling
                ("engine.new", 1.0, "higher", false),
            ],
            1000,
        );
        let c = compare(&old, &new, 0.10);
        let ids: Vec<&str> = c.regressions().iter().map(|x| x.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "engine.b_count.records_per_s",
                "engine.b_count.peak_rss_mib"
            ]
        );
        let better: Vec<&str> = c
            .changes
            .iter()
            .filter(|x| x.improvement)
            .map(|x| x.id.as_str())
            .collect();
        assert_eq!(better, ["operator.spec_change_median_s"]);
        assert_eq!(c.only_old, ["engine.gone"]);
        assert_eq!(c.only_new, ["engine.new"]);
        let text = comparison_text(&c, &old, &new);
        assert!(text.contains("2 regression(s)"), "{text}");
        assert!(text.contains("-15.0%"), "{text}");
        // A looser threshold lets both through.
        assert!(compare(&old, &new, 0.20).regressions().is_empty());
    }

    #[test]
    fn other_sizes_are_not_regressions() {
        let old = report(
            &[("engine.b_count.records_per_s", 100.0, "higher", false)],
            1000,
        );
        let new = report(
            &[("engine.b_count.records_per_s", 50.0, "higher", false)],
            100,
        );
        let c = compare(&old, &new, 0.10);
        assert!(c.regressions().is_empty());
        assert_eq!(c.sizes_differ.len(), 1);
        assert!(c.changes[0].sizes_differ);
        assert!(comparison_text(&c, &old, &new).contains("engine: sizes differ"));
    }

    #[test]
    fn engine_figures_from_its_json() {
        let v = json!({
            "records": 1000, "keys": 10, "partitions": 2,
            "rows": [
                {"case": "(a) raw consume of the input", "records_per_second": 2000.0, "cpu_seconds_per_million": 0.5, "peak_rss_bytes": 104857600},
                {"case": "(b) count at_least_once", "records_per_second": 1000.0, "cpu_seconds_per_million": 1.0, "peak_rss_bytes": 209715200},
            ],
            "tools": [], "ratios": [{"id": "count_alo_over_raw_pass", "value": 0.6}],
            "peak_rss_over_budget_mib": -40.0,
        });
        let f = figures("engine", &v);
        let get = |id: &str| {
            f.iter()
                .find(|x| x.id == id)
                .unwrap_or_else(|| panic!("{id} in {f:?}"))
        };
        assert!(get("engine.a_raw_consume_of_the_input.records_per_s").reference);
        let b = get("engine.b_count_at_least_once.records_per_s");
        assert_eq!(
            (b.value, b.better, b.reference),
            (1000.0, Better::Higher, false)
        );
        assert_eq!(
            get("engine.b_count_at_least_once.peak_rss_mib").value,
            200.0
        );
        assert_eq!(
            get("engine.ratio.count_alo_over_raw_pass").better,
            Better::Higher
        );
        assert_eq!(
            sizes("engine", &v),
            json!({"records": 1000, "keys": 10, "partitions": 2})
        );
    }

    #[test]
    fn blocks_are_replaced_between_their_markers_only() {
        let (b, e) = markers("engine");
        let doc =
            format!("# Benchmarks\n\nhand-written\n\n{b}\nold figures\n{e}\n\nmore hand-written\n");
        let out = replace_block(&doc, "engine", "new figures").expect("markers present");
        assert_eq!(
            out,
            format!("# Benchmarks\n\nhand-written\n\n{b}\nnew figures\n{e}\n\nmore hand-written\n")
        );
        let err = replace_block(&doc, "restore", "x").expect_err("no markers");
        assert!(
            format!("{err}").contains("bench-report:restore:begin"),
            "{err}"
        );
    }
}

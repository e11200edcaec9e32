//! Scaling curves (`eddy-vs-kstreams --curve partitions|keys`, docs/benchmarks.md): throughput
//! and peak RSS of `count` at-least-once, eddy and Kafka Streams one after the other on the same
//! input, as the input's partitions grow (4, 16, 64) or its distinct keys grow (10k, 1M, 10M),
//! so that the growth of each engine's cost shows, not one point. Each point is a
//! [`crate::compare`] run of that one case without restores.

use crate::compare::{self, Case, Guarantee, Measure, Options};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Curve {
    /// Input partitions grow; keys fixed.
    Partitions,
    /// Distinct keys grow; partitions fixed.
    Keys,
}

impl Curve {
    pub fn name(self) -> &'static str {
        match self {
            Curve::Partitions => "partitions",
            Curve::Keys => "keys",
        }
    }
    pub fn default_points(self) -> Vec<usize> {
        match self {
            Curve::Partitions => vec![4, 16, 64],
            Curve::Keys => vec![10_000, 1_000_000, 10_000_000],
        }
    }
    /// Input records of every point: the keys curve needs at least as many records as its
    /// largest key count (the generator then writes each of 10M keys once).
    pub fn default_records(self) -> usize {
        match self {
            Curve::Partitions => 2_000_000,
            Curve::Keys => 10_000_000,
        }
    }
}

pub struct CurveOptions {
    pub curve: Curve,
    pub points: Vec<usize>,
    pub records: usize,
    /// Keys of the partitions curve.
    pub keys: usize,
    /// Partitions of the keys curve.
    pub partitions: i32,
    pub jar: PathBuf,
    pub jvm_opts: Vec<String>,
    /// Points with more keys than this skip the final-table comparison (both tables are
    /// read whole into memory).
    pub verify_max_keys: usize,
}

pub struct Point {
    pub x: usize,
    pub records: usize,
    pub keys: usize,
    pub partitions: i32,
    pub verified: bool,
    /// Both engines' figures, or why the point failed.
    pub result: std::result::Result<(Measure, Measure), String>,
}

impl Point {
    fn measured(&self) -> Option<(&Measure, &Measure)> {
        self.result.as_ref().ok().map(|(e, k)| (e, k))
    }
}

/// Run every point of the curve, in order. A point that fails (e.g. an engine that stops
/// making progress) is recorded with its error and the next one runs.
pub fn run(o: &CurveOptions) -> Result<Vec<Point>> {
    if o.points.is_empty() {
        bail!("--points: no points given");
    }
    let mut out = Vec::new();
    for &x in &o.points {
        let (keys, partitions) = match o.curve {
            Curve::Partitions => (o.keys, x as i32),
            Curve::Keys => (x, o.partitions),
        };
        if keys == 0 || partitions < 1 || o.records == 0 {
            bail!("curve point {x}: records, keys and partitions must all be at least 1");
        }
        eprintln!(
            "curve {} point {x}: {} records, {keys} keys, {partitions} partitions",
            o.curve.name(),
            o.records
        );
        let verify = keys <= o.verify_max_keys;
        let opts = Options {
            records: o.records,
            keys,
            partitions,
            check_only: true,
            runs: vec![(Case::Count, Guarantee::AtLeastOnce)],
            input_prefix: "curve-input".into(),
            // Up to a GiB per point on a shared disk: made again by the next run.
            delete_input: true,
            verify,
            jar: o.jar.clone(),
            jvm_opts: o.jvm_opts.clone(),
            kstreams_only: false,
        };
        let result = match compare::run(&opts) {
            Ok(mut rows) => match rows.pop() {
                Some(row) => Ok((row.eddy, row.ks)),
                None => Err("no result".to_string()),
            },
            Err(e) => {
                eprintln!("curve point {x} failed: {e:#}");
                Err(format!("{e:#}")
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string())
            }
        };
        out.push(Point {
            x,
            records: o.records,
            keys,
            partitions,
            verified: verify,
            result,
        });
    }
    Ok(out)
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b.max(1e-9)
}

pub fn markdown(curve: Curve, points: &[Point]) -> String {
    let mut s = format!(
        "| {} | records | records/s eddy | KS | eddy / KS | peak RSS MiB eddy | KS | eddy / KS | CPU s/M eddy | KS | tables compared |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        curve.name()
    );
    for p in points {
        let n = p.records;
        let Some((eddy, ks)) = p.measured() else {
            s += &format!(
                "| {} | {n} | failed: {} | | | | | | | | |\n",
                p.x,
                p.result
                    .as_ref()
                    .err()
                    .map_or("", |e| e.as_str())
                    .replace('|', "/")
            );
            continue;
        };
        s += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |\n",
            p.x,
            n,
            eddy.rate(n),
            ks.rate(n),
            ratio(eddy.rate(n), ks.rate(n)),
            eddy.rss_mib(),
            ks.rss_mib(),
            ratio(eddy.rss_mib(), ks.rss_mib()),
            eddy.cpu_per_m(n),
            ks.cpu_per_m(n),
            if p.verified { "equal" } else { "not compared" }
        );
    }
    s
}

pub fn to_json(o: &CurveOptions, points: &[Point]) -> Value {
    json!({
        "benchmark": "curve",
        "curve": o.curve.name(),
        "case": "count",
        "guarantee": "at_least_once",
        "records": o.records,
        "keys": if o.curve == Curve::Partitions { json!(o.keys) } else { Value::Null },
        "partitions": if o.curve == Curve::Keys { json!(o.partitions) } else { Value::Null },
        "points": points.iter().map(|p| json!({
            "x": p.x,
            "records": p.records,
            "keys": p.keys,
            "partitions": p.partitions,
            "tables_compared": p.verified && p.result.is_ok(),
            "eddy": p.measured().map(|(e, _)| compare::measure_json(e, p.records)),
            "kafka_streams": p.measured().map(|(_, k)| compare::measure_json(k, p.records)),
            "error": p.result.as_ref().err(),
        })).collect::<Vec<_>>(),
        "kafka_streams_jvm_options": o.jvm_opts,
        "num_stream_threads": compare::EDDY_PROCESSING_THREADS,
        "markdown": markdown(o.curve, points),
    })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `10000` → `10k`, `10000000` → `10M`.
pub fn short(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// (eddy, Kafka Streams) of one figure of a point.
type Pair = fn(&Point) -> (f64, f64);

/// A hand-written SVG in the style of `compare::svg`: two panels (records/s, peak RSS MiB),
/// the points evenly spaced along x (the curves' points grow by a factor each), one line per
/// engine, each value written at its point.
pub fn svg(curve: Curve, points: &[Point]) -> String {
    const EDDY: &str = "#4c78a8";
    const KS: &str = "#f58518";
    let (width, left, right, panel_h, top) = (760.0, 70.0, 40.0, 190.0, 54.0);
    let height = top + 2.0 * (panel_h + 40.0) + 10.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">count at-least-once as {} grow</text>\n<rect x=\"10\" y=\"32\" width=\"12\" height=\"12\" fill=\"{EDDY}\"/><text x=\"26\" y=\"42\">eddy</text>\n<rect x=\"76\" y=\"32\" width=\"12\" height=\"12\" fill=\"{KS}\"/><text x=\"92\" y=\"42\">Kafka Streams</text>\n",
        esc(match curve {
            Curve::Partitions => "input partitions",
            Curve::Keys => "distinct keys",
        })
    );
    // Failed points are left out of the chart (the table says why).
    let points: Vec<&Point> = points.iter().filter(|p| p.result.is_ok()).collect();
    let n = points.len().max(1);
    let x = |i: usize| {
        if n == 1 {
            left + (width - left - right) / 2.0
        } else {
            left + 30.0 + (width - left - right - 60.0) * i as f64 / (n - 1) as f64
        }
    };
    let panels: [(&str, Pair); 2] = [
        ("records/s", |p| match p.measured() {
            Some((e, k)) => (e.rate(p.records), k.rate(p.records)),
            None => (0.0, 0.0),
        }),
        ("peak RSS MiB", |p| match p.measured() {
            Some((e, k)) => (e.rss_mib(), k.rss_mib()),
            None => (0.0, 0.0),
        }),
    ];
    for (pi, (title, get)) in panels.iter().enumerate() {
        let y0 = top + pi as f64 * (panel_h + 40.0);
        let (plot_top, plot_bottom) = (y0 + 24.0, y0 + panel_h);
        let max = points
            .iter()
            .map(|p| {
                let (a, b) = get(p);
                a.max(b)
            })
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.15;
        let y = |v: f64| plot_bottom - (plot_bottom - plot_top) * v / max;
        s += &format!(
            "<text x=\"10\" y=\"{}\" font-weight=\"bold\">{}</text>\n<line x1=\"{left}\" y1=\"{plot_top}\" x2=\"{left}\" y2=\"{plot_bottom}\" stroke=\"#333\"/>\n<line x1=\"{left}\" y1=\"{plot_bottom}\" x2=\"{}\" y2=\"{plot_bottom}\" stroke=\"#333\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666\">{:.0}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666\">0</text>\n",
            y0 + 14.0,
            esc(title),
            width - right,
            left - 4.0,
            plot_top + 4.0,
            max,
            left - 4.0,
            plot_bottom
        );
        for (i, p) in points.iter().enumerate() {
            s += &format!(
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{} {}</text>\n",
                x(i),
                plot_bottom + 16.0,
                short(p.x),
                curve.name()
            );
        }
        for (color, which) in [(EDDY, 0), (KS, 1)] {
            let pts: Vec<(f64, f64, f64)> = points
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let (a, b) = get(p);
                    let v = if which == 0 { a } else { b };
                    (x(i), y(v), v)
                })
                .collect();
            let path: Vec<String> = pts
                .iter()
                .map(|(px, py, _)| format!("{px:.1},{py:.1}"))
                .collect();
            s += &format!(
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>\n",
                path.join(" ")
            );
            for (px, py, v) in pts {
                s += &format!(
                    "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3.5\" fill=\"{color}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{v:.0}</text>\n",
                    px + 6.0,
                    py - 6.0
                );
            }
        }
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(x: usize, eddy_s: f64, ks_s: f64) -> Point {
        let m = |s: f64, rss: u64| Measure {
            seconds: s,
            rss,
            ..Measure::default()
        };
        Point {
            x,
            records: 1000,
            keys: x,
            partitions: 4,
            verified: true,
            result: Ok((m(eddy_s, 100 << 20), m(ks_s, 400 << 20))),
        }
    }

    #[test]
    fn svg_has_both_engines_and_every_point() {
        let pts = [point(10_000, 1.0, 4.0), point(1_000_000, 2.0, 8.0)];
        let svg = svg(Curve::Keys, &pts);
        assert!(svg.contains("10k keys") && svg.contains("1M keys"), "{svg}");
        // Two panels × two engines.
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains(">1000<") && svg.contains(">250<"), "{svg}");
        let md = markdown(Curve::Keys, &pts);
        assert!(md.contains("| 10000 | 1000 | 1000 | 250 | 4.00 |"), "{md}");
    }

    #[test]
    fn a_failed_point_is_reported_not_drawn() {
        let mut failed = point(10_000_000, 1.0, 1.0);
        failed.result = Err("eddy: no progress for 120 s".into());
        let pts = [point(10_000, 1.0, 4.0), failed];
        let md = markdown(Curve::Keys, &pts);
        assert!(
            md.contains("| 10000000 | 1000 | failed: eddy: no progress for 120 s |"),
            "{md}"
        );
        let svg = svg(Curve::Keys, &pts);
        assert!(!svg.contains("10M keys"), "{svg}");
    }
}

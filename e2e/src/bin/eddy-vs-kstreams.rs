//! `eddy-vs-kstreams`: eddy against Kafka Streams (`bench/kstreams`) on the same input, for
//! `count` and `sum`, the windowed cases (`compare::WINDOWED`) and the join cases
//! (`compare::JOINS`, `--cases joins`) under at-least-once and exactly-once. Prints a markdown table of throughput, CPU seconds per
//! million records, peak RSS, restore time (keyed cases) and state on disk (windowed cases)
//! with the ratio eddy/KS, and writes `results.json`, `results.md` and `ratios.svg` to `--out`.
//! Fails (exit 1) if the two engines' results differ. See docs/benchmarks.md.
//!
//! `--curve partitions|keys` runs the scaling curves instead (`eddy_e2e::curve`): count
//! at-least-once as the input's partitions (4, 16, 64) or distinct keys (10k, 1M, 10M) grow,
//! written as `curve-<name>.{json,md,svg}` to `--out`.
//!
//! Kafka Streams' JVM runs with `-Xmx512m` (a 2 GiB container's default heap) unless
//! `--jvm-defaults`, and as many stream threads as eddy has processing threads.

use anyhow::{Context, Result, bail};
use clap::Parser;
use eddy_e2e::compare::*;
use eddy_e2e::curve::{self, Curve, CurveOptions};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "eddy against Kafka Streams on the same input (a broker from EDDY_TEST_BOOTSTRAP, else one named `test`); see docs/benchmarks.md"
)]
struct Args {
    /// Input records [default: 2000000; with --curve keys 10000000, so that each of 10M keys
    /// appears once].
    #[arg(long)]
    records: Option<usize>,
    /// Distinct keys [default: 100000] (with --curve partitions: the keys of every point).
    #[arg(long)]
    keys: Option<usize>,
    /// Input partitions [default: 12] (with --curve keys: the partitions of every point).
    #[arg(long)]
    partitions: Option<i32>,
    /// Results directory.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Correctness only: no restores, targets not applied.
    #[arg(long, conflicts_with = "curve")]
    check_only: bool,
    /// Also copy results.md and ratios.svg to docs/eddy-vs-kstreams.{md,svg}.
    #[arg(long, conflicts_with = "curve")]
    publish: bool,
    /// The reference app's jar (default: built by bench/kstreams/build.sh).
    #[arg(long)]
    jar: Option<PathBuf>,
    /// Cases to run, comma-separated CASE:GUARANTEE (count, sum, tumbling-count,
    /// tumbling-suppress, hopping-aggregate, sliding-count, session-count, windowed-reduce,
    /// stream-table-inner, stream-table-left, global-table, stream-stream, stream-stream-inner,
    /// table-table, stream-table-versioned : at_least_once|exactly_once) or a bare CASE (both guarantees), or `keyed`
    /// (count and sum), `windowed` (the six windowed cases), `joins` (the seven join cases), `all`
    /// (keyed and windowed) [default: all].
    #[arg(long, conflicts_with = "curve")]
    cases: Option<String>,
    /// Which engines run: `both`, or `kstreams` alone (join cases only: Kafka Streams' output
    /// is checked against the model of its semantics, no eddy, no ratios).
    #[arg(long, value_enum, default_value = "both", conflicts_with = "curve")]
    engine: Engine,
    /// Run Kafka Streams' JVM without options (heap up to a quarter of the machine's memory).
    #[arg(long)]
    jvm_defaults: bool,
    /// Run a scaling curve instead: count at-least-once as partitions or keys grow.
    #[arg(long, value_enum)]
    curve: Option<Curve>,
    /// --curve: the points, comma-separated [default: 4,16,64 partitions; 10000,1000000,10000000
    /// keys].
    #[arg(long, value_delimiter = ',', requires = "curve")]
    points: Option<Vec<usize>>,
    /// --curve: points with more keys skip the comparison of both final tables (read whole
    /// into memory).
    #[arg(long, default_value_t = 1_000_000, requires = "curve")]
    verify_max_keys: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Both,
    Kstreams,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("eddy-vs-kstreams: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let args = Args::parse();
    // `--keys` with the keys curve (or `--partitions` with the partitions curve) would be
    // ignored: refuse it.
    match args.curve {
        Some(Curve::Keys) if args.keys.is_some() => {
            bail!("--keys does not apply to --curve keys: its points are the keys (--points)")
        }
        Some(Curve::Partitions) if args.partitions.is_some() => bail!(
            "--partitions does not apply to --curve partitions: its points are the partitions (--points)"
        ),
        _ => {}
    }
    let runs = match &args.cases {
        Some(c) => parse_runs(c)?,
        None => parse_runs("all")?,
    };
    let jar = match &args.jar {
        Some(j) => j.clone(),
        None => kstreams_jar()?,
    };
    let jvm_opts: Vec<String> = if args.jvm_defaults {
        Vec::new()
    } else {
        CONTAINER_JVM.iter().map(|s| s.to_string()).collect()
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if let Some(c) = args.curve {
        return run_curve(&args, c, jar, jvm_opts);
    }
    let check_only = args.check_only;
    let o = Options {
        records: args.records.unwrap_or(2_000_000),
        keys: args.keys.unwrap_or(100_000),
        partitions: args.partitions.unwrap_or(12),
        check_only,
        runs,
        input_prefix: "cmp-input".into(),
        delete_input: false,
        verify: true,
        jar,
        jvm_opts,
        kstreams_only: args.engine == Engine::Kstreams,
    };
    eprintln!("{}", o.kstreams_settings());
    let rows = run(&o)?;
    let md = markdown(&rows, !check_only);
    println!("\n{}\n\n{md}", o.kstreams_settings());
    let out = &args.out;
    let header = format!(
        "{} records over {} keys (windowed cases: {} keys, event time in the value; join cases: {} orders over {} customers, records/s counting both sides' records), {} partitions; {}; ratios are eddy / Kafka Streams{}.\n\n",
        o.records,
        o.keys,
        eddy_e2e::windowed::windowed_keys(o.records),
        o.records,
        eddy_e2e::joins::join_keys(o.records),
        o.partitions,
        o.kstreams_settings(),
        if check_only {
            " (--check-only: correctness run, no restores, targets not applied)"
        } else {
            ""
        }
    );
    std::fs::write(out.join("results.md"), format!("{header}{md}"))?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&to_json(&o, &rows))?,
    )?;
    std::fs::write(out.join("ratios.svg"), svg(&rows))?;
    eprintln!(
        "wrote {}/results.json, results.md, ratios.svg",
        out.display()
    );
    if args.publish {
        let docs = eddy_e2e::repo_root().join("docs");
        std::fs::copy(out.join("results.md"), docs.join("eddy-vs-kstreams.md"))?;
        std::fs::copy(out.join("ratios.svg"), docs.join("eddy-vs-kstreams.svg"))?;
        eprintln!("copied to docs/eddy-vs-kstreams.md and docs/eddy-vs-kstreams.svg");
    }
    if !check_only && !o.kstreams_only {
        let misses: Vec<String> = rows
            .iter()
            .flat_map(|r| {
                r.ratios()
                    .into_iter()
                    .filter_map(move |(m, v, t, at_least)| match v {
                        Some(v) if (at_least && v < t) || (!at_least && v > t) => Some(format!(
                            "  {}: {m} {v:.2} (target {} {t})",
                            r.label(),
                            if at_least { "≥" } else { "≤" }
                        )),
                        _ => None,
                    })
            })
            .collect();
        if misses.is_empty() {
            println!("all targets met");
        } else {
            println!("targets missed:\n{}", misses.join("\n"));
        }
    }
    Ok(())
}

fn run_curve(args: &Args, c: Curve, jar: PathBuf, jvm_opts: Vec<String>) -> Result<()> {
    let o = CurveOptions {
        curve: c,
        points: args.points.clone().unwrap_or_else(|| c.default_points()),
        records: args.records.unwrap_or_else(|| c.default_records()),
        keys: args.keys.unwrap_or(100_000),
        partitions: args.partitions.unwrap_or(12),
        jar,
        jvm_opts,
        verify_max_keys: args.verify_max_keys,
    };
    let settings = Options {
        records: o.records,
        keys: o.keys,
        partitions: o.partitions,
        check_only: true,
        runs: Vec::new(),
        input_prefix: String::new(),
        delete_input: false,
        verify: false,
        jar: o.jar.clone(),
        jvm_opts: o.jvm_opts.clone(),
        kstreams_only: false,
    }
    .kstreams_settings();
    eprintln!("{settings}");
    let points = curve::run(&o)?;
    let fixed = match c {
        Curve::Partitions => format!("{} keys", o.keys),
        Curve::Keys => format!("{} partitions", o.partitions),
    };
    let md = format!(
        "count at-least-once, {} records per point, {fixed}; {settings}.\n\n{}",
        o.records,
        curve::markdown(c, &points)
    );
    println!("\n{md}");
    let base = args.out.join(format!("curve-{}", c.name()));
    let mut doc = curve::to_json(&o, &points);
    doc["markdown"] = serde_json::json!(md);
    std::fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    std::fs::write(base.with_extension("md"), &md)?;
    std::fs::write(base.with_extension("svg"), curve::svg(c, &points))?;
    eprintln!("wrote {}.{{json,md,svg}}", base.display());
    let failed: Vec<String> = points
        .iter()
        .filter_map(|p| p.result.as_ref().err().map(|e| format!("{}: {e}", p.x)))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} curve point(s) failed: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

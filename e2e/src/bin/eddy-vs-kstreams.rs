//! `eddy-vs-kstreams`: eddy against Kafka Streams (`bench/kstreams`) on the same input, for
//! `count` and `sum` under at-least-once and exactly-once. Prints a markdown table of
//! throughput, CPU seconds per million records, peak RSS and restore time with the ratio
//! eddy/KS, and writes `results.json`, `results.md` and `ratios.svg` to `--out`. Fails (exit 1)
//! if the two engines' final tables differ. See docs/benchmarks.md.
//!
//! ```text
//! eddy-vs-kstreams [--records N (2000000)] [--keys K (100000)] [--partitions P (12)]
//!                  [--out DIR (bench/results)] [--check-only] [--publish] [--jar PATH]
//!                  [--cases count:at_least_once,sum:exactly_once,... (all four)]
//!                  [--jvm-defaults]
//! ```
//!
//! Kafka Streams' JVM runs with `-Xmx512m` (a 2 GiB container's default heap) unless
//! `--jvm-defaults`, and as many stream threads as eddy has processing threads.

use anyhow::{Context, Result, bail};
use eddy_e2e::compare::*;
use std::path::PathBuf;

fn value(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(name: &str, default: usize) -> Result<usize> {
    match value(name) {
        Some(v) => v
            .parse()
            .with_context(|| format!("{name} must be a number, got '{v}'")),
        None if std::env::args().any(|a| a == name) => bail!("{name} needs a value"),
        None => Ok(default),
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("eddy-vs-kstreams: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let known = [
        "--records",
        "--keys",
        "--partitions",
        "--out",
        "--jar",
        "--check-only",
        "--publish",
        "--cases",
        "--jvm-defaults",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        if !known.contains(&args[i].as_str()) {
            bail!(
                "unknown argument '{}' (usage: eddy-vs-kstreams [--records N] [--keys K] [--partitions P] [--out DIR] [--check-only] [--publish] [--jar PATH] [--cases CASE:GUARANTEE,...] [--jvm-defaults])",
                args[i]
            );
        }
        i += if matches!(
            args[i].as_str(),
            "--check-only" | "--publish" | "--jvm-defaults"
        ) {
            1
        } else {
            2
        };
    }
    let check_only = args.iter().any(|a| a == "--check-only");
    let publish = args.iter().any(|a| a == "--publish");
    let out = PathBuf::from(value("--out").unwrap_or_else(|| "bench/results".into()));
    let jar = match value("--jar") {
        Some(j) => PathBuf::from(j),
        None => kstreams_jar()?,
    };
    let o = Options {
        records: num("--records", 2_000_000)?,
        keys: num("--keys", 100_000)?,
        partitions: num("--partitions", 12)? as i32,
        check_only,
        runs: match value("--cases") {
            Some(v) => parse_runs(&v)?,
            None => ALL.to_vec(),
        },
        input_prefix: "cmp-input".into(),
        delete_input: false,
        jar,
        jvm_opts: if args.iter().any(|a| a == "--jvm-defaults") {
            Vec::new()
        } else {
            CONTAINER_JVM.iter().map(|s| s.to_string()).collect()
        },
    };
    eprintln!("{}", o.kstreams_settings());
    let rows = run(&o)?;
    let md = markdown(&rows, !check_only);
    println!("\n{}\n\n{md}", o.kstreams_settings());
    std::fs::create_dir_all(&out)?;
    let header = format!(
        "{} records over {} keys, {} partitions; {}; ratios are eddy / Kafka Streams{}.\n\n",
        o.records,
        o.keys,
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
    if publish {
        let docs = eddy_e2e::repo_root().join("docs");
        std::fs::copy(out.join("results.md"), docs.join("eddy-vs-kstreams.md"))?;
        std::fs::copy(out.join("ratios.svg"), docs.join("eddy-vs-kstreams.svg"))?;
        eprintln!("copied to docs/eddy-vs-kstreams.md and docs/eddy-vs-kstreams.svg");
    }
    if !check_only {
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

//! `eddy-worker check`, as a user runs it before a rolling update (no Kafka needed): the
//! internal topics of an app, and with `--previous` what the update would strand or drop,
//! with an exit status a CI pipeline can gate on.

use anyhow::{Context, Result, ensure};
use eddy_e2e::binary;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// Exit status of `check --previous` when the update would lose records or state.
const WOULD_LOSE_DATA: i32 = 3;

fn app(steps: &str) -> String {
    format!(
        "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: pv}}\nspec:\n  topology:\n    - from: {{topic: page-views}}\n{steps}    - count: {{store: views}}\n    - to: {{topic: views-per-user, value: i64}}\n"
    )
}

/// `eddy-worker check -f <new> [--previous <old>]`: (exit status, stdout, stderr). `old` of
/// `Some("-")` with `stdin` reads the previous version from standard input.
fn check(
    dir: &Path,
    new: &str,
    previous: Option<&str>,
    stdin: Option<&str>,
) -> Result<(i32, String, String)> {
    let file = dir.join("new.yaml");
    std::fs::write(&file, new)?;
    let mut cmd = Command::new(binary("eddy-worker")?);
    cmd.args(["check", "-f"]).arg(&file);
    if let Some(old) = previous {
        if old == "-" {
            cmd.args(["--previous", "-"]);
        } else {
            let old_file = dir.join("old.yaml");
            std::fs::write(&old_file, old)?;
            cmd.arg("--previous").arg(&old_file);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut input = child.stdin.take().context("stdin of check")?;
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    ))
}

/// A filter inserted before an unnamed groupBy renames its repartition topic: check warns
/// with the topic, the step and the exact step that keeps it, and exits 3. With that step
/// pasted in (or with the groupBy named in both versions), nothing is stranded: exit 0.
#[test]
fn check_warns_when_an_inserted_step_would_strand_records() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let old = app("    - groupBy: '.user'\n");
    let new = app("    - filter: '.status == 200'\n    - groupBy: '.user'\n");

    let (code, out, err) = check(dir.path(), &new, None, None)?;
    ensure!(code == 0, "check without --previous: {code}\n{out}{err}");
    ensure!(
        out.contains("internal topics:\n  pv-2-repartition (repartition, topology[2] groupBy)\n  pv-views-changelog (changelog of store views, topology[3] count)\n"),
        "{out}"
    );

    let (code, out, err) = check(dir.path(), &new, Some(&old), None)?;
    ensure!(code == WOULD_LOSE_DATA, "exit {code}\n{out}{err}");
    let warning = out
        .lines()
        .find(|l| l.starts_with("warning: "))
        .with_context(|| format!("no warning in:\n{out}"))?;
    ensure!(
        warning.contains("pv-1-repartition")
            && warning.contains("topology[1] groupBy")
            && warning.contains("pv-2-repartition")
            && warning.contains("stranded"),
        "{warning}"
    );
    // The advice is a step to paste: take it from the output as a user would.
    let fix = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("- groupBy:"))
        .with_context(|| format!("no step to paste in:\n{out}"))?;
    ensure!(fix == "- groupBy: {key: '.user', name: '1'}", "{fix}");
    let fixed = app(&format!("    - filter: '.status == 200'\n    {fix}\n"));
    let (code, out, err) = check(dir.path(), &fixed, Some(&old), None)?;
    ensure!(code == 0, "exit {code} with the advice applied\n{out}{err}");
    ensure!(
        !out.contains("warning") && out.contains("pv-1-repartition (repartition, topology[2]"),
        "{out}"
    );

    // Named from the start: the topic is the same in both versions, whatever is inserted.
    let named = "groupBy: {key: '.user', name: by-user}";
    let (old_named, new_named) = (
        old.replace("groupBy: '.user'", named),
        new.replace("groupBy: '.user'", named),
    );
    let (code, out, err) = check(dir.path(), &new_named, Some(&old_named), None)?;
    ensure!(code == 0, "exit {code}\n{out}{err}");
    ensure!(
        !out.contains("warning") && out.contains("pv-by-user-repartition"),
        "{out}"
    );
    Ok(())
}

/// A removed store drops its state (exit 3); the previous version can come from standard
/// input (`kubectl get ssapp pv -o yaml | eddy-worker check -f app.yaml --previous -`); an
/// invalid previous version is an error (exit 1) naming it.
#[test]
fn check_reports_dropped_state_and_reads_the_previous_version_from_stdin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let old = app("    - groupBy: {key: '.user', name: by-user}\n");
    let new = old.replace("store: views", "store: views-v2");
    let (code, out, err) = check(dir.path(), &new, Some("-"), Some(&old))?;
    ensure!(code == WOULD_LOSE_DATA, "exit {code}\n{out}{err}");
    ensure!(
        out.contains(
            "warning: store views (old topology[2]) is not in the new version: its state is dropped"
        ) && out.contains("views-v2 start empty"),
        "{out}"
    );

    let (code, out, err) = check(dir.path(), &new, Some("-"), Some("topology: []\n"))?;
    ensure!(code == 1, "exit {code}\n{out}{err}");
    ensure!(
        err.contains("previous version") && err.contains("topology"),
        "{err}"
    );
    Ok(())
}

/// A join draws as a graph, as Kafka Streams' `Topology#describe` does: the table's topic is
/// a second source of the join's sub-topology, feeding the store the join reads; a global
/// table is held whole by every worker and has no changelog.
#[test]
fn check_draws_joins_as_a_graph_with_their_tables() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: shop}\nspec:\n  tables:\n    customers: {topic: customers}\n    countries: {topic: countries, global: true}\n  topology:\n    - from: {topic: orders}\n    - join: {table: countries, key: '.country', as: '. + {country: $right.name}'}\n    - groupBy: '.customer'\n    - join: {table: customers, type: left, as: '. + {customer: $right}'}\n    - to: {topic: enriched}\n";
    let (code, out, err) = check(dir.path(), app, None, None)?;
    ensure!(code == 0, "exit {code}\n{out}{err}");
    for want in [
        "sub-topology 0: a task per partition of orders\n  source orders\n    --> join-1\n  processor join-1 (stores: countries)\n    --> groupBy-2\n",
        "sub-topology 1: a task per partition of shop-2-repartition\n  source shop-2-repartition (repartition)\n    --> join-3\n  source customers (table customers)\n    --> table-customers\n",
        "  processor join-3 (stores: customers)\n    --> to-4\n",
        "  processor table-customers (stores: customers)\n    --> none\n",
        "  store customers -> shop-customers-changelog\n  to enriched\n",
        "global table countries: every worker holds all of countries in store countries",
        "  shop-customers-changelog (changelog of store customers, tables.customers)\n",
    ] {
        ensure!(out.contains(want), "missing {want:?} in\n{out}");
    }
    ensure!(!out.contains("shop-countries-changelog"), "{out}");

    // A stream join: the other stream enters the same join, which keeps both sides' records.
    let app = "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: ship}\nspec:\n  topology:\n    - from: {topic: orders}\n    - join: {stream: {topic: shipments, timestamp: '.at'}, within: 5m, grace: 1m, type: left, as: '{order: ., shipment: $right}'}\n    - to: {topic: shipped}\n";
    let (code, out, err) = check(dir.path(), app, None, None)?;
    ensure!(code == 0, "exit {code}\n{out}{err}");
    for want in [
        "  source orders\n    --> join-1\n  source shipments (joined stream)\n    --> join-1.stream.timestamp\n",
        "  processor join-1 (stores: join-1-left, join-1-right, join-1-outer)\n    --> to-2\n",
        "  processor join-1.stream.timestamp\n    --> join-1\n",
        "  join window store join-1-left (one side's records by key and time, retention 11m) -> ship-join-1-left-changelog\n",
        "  join store join-1-outer (records waiting for a partner) -> ship-join-1-outer-changelog\n",
    ] {
        ensure!(out.contains(want), "missing {want:?} in\n{out}");
    }
    Ok(())
}

/// A bad app file gets one line on stderr: what is wrong, where (the step and the line), and
/// each cause once, exactly as written here; the exit status is 1 and nothing is printed on
/// stdout.
#[test]
fn check_says_each_error_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("new.yaml");
    let path = file.display();
    let unknown_field = app("    - filter: {where: '.ok'}\n");
    let bad_expression = app("    - filter: '.a =='\n");
    let no_from = "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  topology:\n    - count: {store: views}\n";
    for (text, want) in [
        (
            unknown_field.as_str(),
            format!(
                "error: app file {path}: spec.topology[1].filter: invalid type: map, expected a string at line 7 column 15\n"
            ),
        ),
        (
            "apiVersion: eddy.dev/v1alpha1\nspec: [\n",
            format!(
                "error: app file {path}: not valid YAML: did not find expected node content at line 3 column 1, while parsing a flow node\n"
            ),
        ),
        (
            no_from,
            format!(
                "error: app file {path}: spec.topology[0]: the first step must be `from: {{topic: ...}}`\n"
            ),
        ),
        (bad_expression.as_str(), String::new()),
    ] {
        let (code, out, err) = check(dir.path(), text, None, None)?;
        ensure!(code == 1 && out.is_empty(), "exit {code}\n{out}{err}");
        if want.is_empty() {
            // jq's own message may change with jaq: the step, the expression, said once.
            ensure!(
                err.starts_with(&format!(
                    "error: app file {path}: spec.topology[1]: invalid jq expression `.a ==`"
                )) && err.matches(".a ==").count() == 1
                    && err.lines().count() == 1,
                "{err}"
            );
        } else {
            ensure!(err == want, "got  {err:?}\nwant {want:?}");
        }
    }
    let missing = dir.path().join("missing.yaml");
    let out = Command::new(binary("eddy-worker")?)
        .args(["check", "-f"])
        .arg(&missing)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1)
            && err
                == format!(
                    "error: cannot read app file {}: No such file or directory (os error 2)\n",
                    missing.display()
                ),
        "{err}"
    );
    Ok(())
}

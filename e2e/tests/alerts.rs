//! The alert rules as shipped: `charts/eddy-operator/files/alerts.yaml` (a plain Prometheus
//! rules file) and the chart's PrometheusRule rendered from it by `helm template` (helm built
//! by `e2e/k8s/cluster.sh bin`, no cluster). The two must not drift, the chart values must
//! reach the rules, and every alert needs a runbook and promtool unit tests that see it fire
//! and stay quiet (`e2e/prometheus/alerts_test.yaml`; `e2e/prometheus/check-alerts.sh` runs
//! promtool itself).

use anyhow::{Context, Result, bail, ensure};
use eddy_e2e::repo_root;
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

const RULES: &str = "charts/eddy-operator/files/alerts.yaml";
const TESTS: &str = "e2e/prometheus/alerts_test.yaml";
const DEFAULT_RUNBOOKS: &str = "https://github.com/eddy-dev/eddy/blob/main/docs/runbooks";

fn helm_bin() -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/k8s/cluster.sh"))
        .arg("bin")
        .stderr(std::process::Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "e2e/k8s/cluster.sh bin failed");
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(PathBuf::from(dir).join("helm"))
}

/// `helm template` of the chart's PrometheusRule with these extra arguments: Ok(stdout) or
/// Err(stderr).
fn render(args: &[&str]) -> Result<std::result::Result<String, String>> {
    let out = Command::new(helm_bin()?)
        .current_dir(repo_root())
        .args([
            "template",
            "t",
            "charts/eddy-operator",
            "--show-only",
            "templates/prometheusrule.yaml",
        ])
        .args(args)
        .output()?;
    Ok(if out.status.success() {
        Ok(String::from_utf8(out.stdout)?)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

fn rendered(args: &[&str]) -> Result<Value> {
    match render(args)? {
        Ok(text) => serde_yaml::from_str(&text).with_context(|| format!("parsing\n{text}")),
        Err(e) => bail!("helm template {args:?} failed: {e}"),
    }
}

fn plain() -> Result<Value> {
    Ok(serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join(RULES),
    )?)?)
}

/// Every rule of a rules document (`groups: [{rules: [...]}]`), by alert name.
fn alerts(groups: &Value) -> BTreeMap<String, Value> {
    groups["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|r| Some((r["alert"].as_str()?.to_string(), r)))
        .collect()
}

/// The settings files/alerts.yaml marks: (alert, setting) → the value written before it.
fn markers() -> Result<BTreeMap<(String, String), String>> {
    let text = std::fs::read_to_string(repo_root().join(RULES))?;
    let mut found = BTreeMap::new();
    for line in text.lines() {
        let Some((before, marker)) = line.rsplit_once(" # alerts.rules.") else {
            continue;
        };
        let (alert, setting) = marker
            .split_once('.')
            .with_context(|| format!("bad marker in {line:?}"))?;
        let value = before
            .split_whitespace()
            .last()
            .with_context(|| format!("no value before the marker in {line:?}"))?;
        found.insert((alert.to_string(), setting.to_string()), value.to_string());
    }
    Ok(found)
}

#[test]
fn the_prometheusrule_is_the_plain_rules_file_with_the_default_values() -> Result<()> {
    let rule = rendered(&["--set", "alerts.force=true"])?;
    ensure!(rule["kind"] == "PrometheusRule", "{rule:?}");
    ensure!(rule["apiVersion"] == "monitoring.coreos.com/v1");
    ensure!(
        rule["spec"] == plain()?,
        "templates/prometheusrule.yaml with the default values differs from {RULES}: \
         values.yaml's alerts.rules and the file's marked values must agree\nrendered: {:#?}",
        rule["spec"]
    );

    // values.yaml names exactly the settings the file marks, with the file's values.
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("charts/eddy-operator/values.yaml"),
    )?)?;
    let mut in_values = BTreeMap::new();
    for (alert, settings) in values["alerts"]["rules"]
        .as_mapping()
        .context("alerts.rules")?
    {
        for (setting, value) in settings.as_mapping().context("an alert's settings")? {
            let (alert, setting) = (
                alert.as_str().unwrap_or_default().to_string(),
                setting.as_str().unwrap_or_default().to_string(),
            );
            if setting != "enabled" {
                let value = match value {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)?.trim().to_string(),
                };
                in_values.insert((alert, setting), value);
            }
        }
    }
    ensure!(
        in_values == markers()?,
        "values.yaml alerts.rules and the settings marked in {RULES} differ:\nvalues: {in_values:?}\nfile: {:?}",
        markers()?
    );
    Ok(())
}

#[test]
fn chart_values_reach_the_rules() -> Result<()> {
    // Rendered only where the prometheus-operator's kind exists (or when forced).
    match render(&[])? {
        Ok(text) => ensure!(
            !text.contains("PrometheusRule"),
            "rendered without the CRD: {text}"
        ),
        // helm fails --show-only of a template that renders nothing.
        Err(e) => ensure!(e.contains("could not find template"), "{e}"),
    }
    let with_crd = rendered(&["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"])?;
    ensure!(with_crd["kind"] == "PrometheusRule");
    match render(&[
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
        "--set",
        "alerts.enabled=false",
    ])? {
        Ok(text) => ensure!(!text.contains("PrometheusRule"), "{text}"),
        Err(e) => ensure!(e.contains("could not find template"), "{e}"),
    }

    let rule = rendered(&[
        "--set",
        "alerts.force=true",
        "--set",
        "alerts.rules.EddyRestoreBacklogHigh.records=5",
        "--set",
        "alerts.rules.EddyConsumerLagHigh.records=25000000",
        "--set",
        "alerts.rules.EddyStateVolumeFull.ratio=0.9",
        "--set",
        "alerts.rules.EddyAppDegraded.for=1m",
        "--set",
        "alerts.rules.EddyAppDegraded.severity=page",
        "--set",
        "alerts.rules.EddyOperatorDown.enabled=false",
        "--set",
        "alerts.runbookBaseUrl=https://wiki.example.com/eddy/",
        "--set",
        "alerts.labels.release=prometheus",
    ])?;
    ensure!(rule["metadata"]["labels"]["release"] == "prometheus");
    let by_name = alerts(&rule["spec"]);
    let expr = |a: &str| by_name[a]["expr"].as_str().unwrap_or_default().to_string();
    ensure!(
        expr("EddyRestoreBacklogHigh")
            .contains("> 5 # alerts.rules.EddyRestoreBacklogHigh.records"),
        "{}",
        expr("EddyRestoreBacklogHigh")
    );
    // Not 2.5e+07: PromQL reads it, but it must say what the user wrote.
    ensure!(
        expr("EddyConsumerLagHigh").contains("> 25000000 #"),
        "{}",
        expr("EddyConsumerLagHigh")
    );
    ensure!(expr("EddyStateVolumeFull").contains("> 0.9 #"));
    ensure!(by_name["EddyAppDegraded"]["for"] == "1m");
    ensure!(by_name["EddyAppDegraded"]["labels"]["severity"] == "page");
    ensure!(
        by_name["EddyRestoreStalled"]["for"] == "10m",
        "others keep theirs"
    );
    ensure!(
        !by_name.contains_key("EddyOperatorDown"),
        "a disabled alert is left out"
    );
    ensure!(by_name.len() == alerts(&plain()?).len() - 1);
    ensure!(
        by_name["EddyAppDegraded"]["annotations"]["runbook_url"]
            == "https://wiki.example.com/eddy/EddyAppDegraded.md"
    );

    // A setting the file does not mark, and a malformed duration, are refused with the key.
    let typo = render(&[
        "--set",
        "alerts.force=true",
        "--set",
        "alerts.rules.EddyAppDegraded.threshold=3",
    ])?;
    ensure!(
        typo.as_ref()
            .is_err_and(|e| e.contains("alerts.rules.EddyAppDegraded.threshold")),
        "{typo:?}"
    );
    let bad_for = render(&[
        "--set",
        "alerts.force=true",
        "--set",
        "alerts.rules.EddyAppDegraded.for=soon",
    ])?;
    ensure!(
        bad_for
            .as_ref()
            .is_err_and(|e| e.contains("EddyAppDegraded") && e.contains("soon")),
        "{bad_for:?}"
    );
    Ok(())
}

#[test]
fn every_alert_has_a_runbook_labels_annotations_and_unit_tests() -> Result<()> {
    let rules = alerts(&plain()?);
    ensure!(rules.len() >= 15, "{} alerts", rules.len());
    let tests: Value = serde_yaml::from_str(&std::fs::read_to_string(repo_root().join(TESTS))?)?;
    // Per alert: (a check that expects it firing, a check that expects it quiet).
    let mut checks: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for t in tests["tests"].as_sequence().context("tests")? {
        for c in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = c["alertname"].as_str().unwrap_or_default().to_string();
            let firing = c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty());
            let e = checks.entry(name).or_default();
            if firing {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
    }
    let runbooks = repo_root().join("docs/runbooks");
    for (name, rule) in &rules {
        ensure!(name.starts_with("Eddy"), "{name}");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        ensure!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let a = &rule["annotations"];
        for key in ["summary", "description"] {
            ensure!(
                a[key].as_str().is_some_and(|s| s.len() > 20),
                "{name}: no {key}"
            );
        }
        let names_app = |s: &str| s.contains("$labels.app") && s.contains("$labels.namespace");
        let summary = a["summary"].as_str().unwrap_or_default();
        if !name.starts_with("EddyOperator") {
            ensure!(
                names_app(summary),
                "{name}: the summary names no app: {summary}"
            );
        }
        if rule["expr"]
            .as_str()
            .is_some_and(|e| e.contains("by (namespace, pod, task"))
        {
            ensure!(
                summary.contains("$labels.task"),
                "{name}: the summary names no task: {summary}"
            );
        }
        ensure!(
            a["runbook_url"].as_str() == Some(format!("{DEFAULT_RUNBOOKS}/{name}.md").as_str()),
            "{name}: runbook_url {:?}",
            a["runbook_url"]
        );
        let page = std::fs::read_to_string(runbooks.join(format!("{name}.md")))
            .with_context(|| format!("{name}: no docs/runbooks/{name}.md"))?;
        for section in ["## Meaning", "## Confirm", "## What to do"] {
            ensure!(
                page.contains(section),
                "docs/runbooks/{name}.md has no {section:?} section"
            );
        }
        ensure!(
            checks.get(name) == Some(&(true, true)),
            "{TESTS} must check that {name} fires and that it stays quiet (found {:?})",
            checks.get(name)
        );
    }
    // No runbook of an alert that no longer exists.
    let pages: BTreeSet<String> = std::fs::read_dir(&runbooks)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".md")
                .map(str::to_string)
        })
        .filter(|n| n != "README")
        .collect();
    let names: BTreeSet<String> = rules.keys().cloned().collect();
    ensure!(
        pages == names,
        "docs/runbooks/ and the alerts differ: {:?}",
        pages.symmetric_difference(&names).collect::<Vec<_>>()
    );
    Ok(())
}

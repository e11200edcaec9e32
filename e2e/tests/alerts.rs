//! The alert rules as shipped: `charts/eddy-operator/files/alerts.yaml` (a plain Prometheus
//! rules file) and the chart's PrometheusRule rendered from it by `helm template` (helm built
//! by `e2e/k8s/cluster.sh bin`, no cluster). The two must not drift, the chart values must
//! reach the rules, and every alert needs a runbook and promtool unit tests that see it fire
//! and stay quiet (`e2e/prometheus/alerts_test.yaml`; `e2e/prometheus/check-alerts.sh` runs
//! promtool itself). And a real Prometheus server, scraping the operator and its worker pods
//! on a local control plane the way the chart's monitors say, fires the chart's alerts for a
//! degraded app and a slowed restore.

use anyhow::{Context, Result, bail, ensure};
use eddy_e2e::operated::{Namespace, OPERATOR_NS, Operated, Setup, WAIT};
use eddy_e2e::prometheus::{Alert, Prometheus};
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

/// The control plane of the real-Prometheus test: one operator, which logs in JSON and has
/// its worker pods log in JSON (`logFormat: json` in the chart).
fn env() -> Result<&'static Operated> {
    eddy_e2e::operated::shared_with(
        &Setup {
            operators: 1,
            args: &["--log-format", "json", "--worker-log-format", "json"],
            ..Setup::default()
        },
        |_, _| Ok(()),
    )
}

fn app_yaml(name: &str, bs: &str, input: &str, output: &str, properties: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 1
  kafka: {{bootstrapServers: "{bs}", properties: {{{properties}}}}}
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

/// A broker quota on what one client id may fetch per second, removed when dropped.
struct FetchQuota(String);

impl FetchQuota {
    fn set(client_id: &str, bytes_per_second: u64) -> Result<Self> {
        eddy_e2e::kafka_tool(&[
            "configs",
            "--alter",
            "--add-config",
            &format!("consumer_byte_rate={bytes_per_second}"),
            "--entity-type",
            "clients",
            "--entity-name",
            client_id,
        ])?;
        Ok(Self(client_id.to_string()))
    }
}

impl Drop for FetchQuota {
    fn drop(&mut self) {
        let _ = eddy_e2e::kafka_tool(&[
            "configs",
            "--alter",
            "--delete-config",
            "consumer_byte_rate",
            "--entity-type",
            "clients",
            "--entity-name",
            &self.0,
        ]);
    }
}

/// Records of the app's state in its changelog before it starts (about 2.3 MB).
const STATE_RECORDS: usize = 100_000;

#[test]
fn a_real_prometheus_scraping_as_the_chart_says_fires_its_alerts_for_a_degraded_app_and_a_slow_restore()
-> Result<()> {
    use eddy_e2e::*;
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();

    // The chart's rules, rendered with values that make the two alerts fire at once (a
    // restore backlog of more than 1000 records).
    let rendered = chart::documents(&chart::template(
        &env.cp,
        OPERATOR_NS,
        &[
            "--show-only",
            "templates/prometheusrule.yaml",
            "--set",
            "alerts.force=true",
            "--set",
            "alerts.rules.EddyAppDegraded.for=0s",
            "--set",
            "alerts.rules.EddyAppMisconfigured.for=0s",
            "--set",
            "alerts.rules.EddyRestoreBacklogHigh.for=0s",
            "--set",
            "alerts.rules.EddyRestoreBacklogHigh.records=1000",
        ],
    )?)?;
    let rules = serde_yaml::to_string(&rendered.first().context("no PrometheusRule")?["spec"])?;
    ensure!(
        rules.contains("> 1000"),
        "the threshold did not reach the rules:\n{rules}"
    );
    // The scrape jobs the prometheus-operator would make of the chart's monitors: the
    // operator (honor_labels) and every worker pod, found through the API server.
    let monitors = chart::documents(&chart::template(
        &env.cp,
        OPERATOR_NS,
        &[
            "--show-only",
            "templates/monitoring.yaml",
            "--set",
            "monitoring.serviceMonitor.enabled=true",
            "--set",
            "monitoring.podMonitor.enabled=true",
            "--set",
            "monitoring.dashboard.enabled=false",
        ],
    )?)?;
    let monitor = |kind: &str| {
        monitors
            .iter()
            .find(|m| m["kind"] == kind)
            .with_context(|| format!("no {kind} in the chart"))
    };
    let sm = monitor("ServiceMonitor")?;
    let service = format!(
        "{}-metrics",
        sm["metadata"]["name"].as_str().unwrap_or_default()
    );
    let operators: Vec<String> = env
        .operators
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["eddy-rules.yaml"],
        "scrape_configs": [
            prometheus::service_monitor_job(sm, &service, &operators, "1s")?,
            prometheus::pod_monitor_job(
                monitor("PodMonitor")?,
                &env.cp.kubeconfig,
                "1s",
                Some(eddy_e2e::k8s::POD_HTTP_ANNOTATION),
            )?,
        ],
    });
    let prom = Prometheus::start(
        &serde_json::to_string_pretty(&config)?,
        &[("eddy-rules.yaml", &rules)],
    )?;
    let firing = |name: &str, labels: &[(&str, &str)]| -> Result<Option<Alert>> {
        Ok(prom.alerts()?.into_iter().find(|a| {
            a.name == name && a.state == "firing" && labels.iter().all(|(k, v)| a.labels[*k] == *v)
        }))
    };
    let explain = |what: &str| {
        format!(
            "{what}\nalerts: {:?}\ntargets: {:?}\n{}\n--- prometheus\n{}",
            prom.alerts(),
            prom.targets(),
            env.logs(),
            prom.logs()
        )
    };

    // An app whose source topic does not exist: Degraded.
    let degraded = "no-input";
    env.apply(
        ns,
        &app_yaml(
            degraded,
            &env.bs,
            &unique("never-created"),
            "never-written",
            "",
        ),
    )?;

    // An app whose state is already in its changelog, as for a pod that lost its volume, and
    // a restore slowed down: the broker lets its pod's client fetch 64 KB/s (after a first
    // burst of about ten seconds' worth), one small batch per fetch.
    let slow = unique("slow");
    let pod = format!("{slow}-0");
    let (input, output) = (space.topic("slow-in", 1)?, space.topic("slow-out", 1)?);
    let changelog = format!("{ns}.{slow}-counts-changelog");
    create_topic(&changelog, 1)?;
    set_topic_config(&changelog, "cleanup.policy", "compact")?;
    let state: Vec<Input> = (0..STATE_RECORDS)
        .map(|i| {
            (
                Some(format!("k{i:06}").into_bytes()),
                Some(1i64.to_be_bytes().to_vec()),
            )
        })
        .collect();
    produce_with(&changelog, &state, &[("batch.size", "16384")])?;
    let quota = FetchQuota::set(&pod, 64 << 10)?;
    env.apply(
        ns,
        &app_yaml(
            &slow,
            &env.bs,
            &input,
            &output,
            r#"max.partition.fetch.bytes: "16384""#,
        ),
    )?;

    // A missing source topic is the app owner's to fix: a warning, not a page.
    let of_app = [("namespace", ns), ("app", degraded)];
    wait_until(WAIT, || {
        Ok(firing("EddyAppMisconfigured", &of_app)?.is_some())
    })
    .with_context(|| explain("EddyAppMisconfigured never fired"))?;
    let alert = firing("EddyAppMisconfigured", &of_app)?.context("EddyAppMisconfigured")?;
    ensure!(
        alert.labels["severity"] == "warning"
            && alert.labels["reason"] == "SourceTopicMissing"
            && alert.annotations["summary"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("{ns}/{degraded} needs a fix of its own")))
            && alert.annotations["runbook_url"]
                .as_str()
                .is_some_and(|u| u.ends_with("/EddyAppMisconfigured.md")),
        "{alert:?}"
    );
    ensure!(
        firing("EddyAppDegraded", &of_app)?.is_none(),
        "a missing source topic paged"
    );

    let restoring = [
        ("namespace", ns),
        ("app", slow.as_str()),
        ("pod", pod.as_str()),
        ("task", "0_0"),
    ];
    wait_until(WAIT, || {
        Ok(firing("EddyRestoreBacklogHigh", &restoring)?.is_some())
    })
    .with_context(|| explain("EddyRestoreBacklogHigh never fired"))?;
    let alert = firing("EddyRestoreBacklogHigh", &restoring)?.context("EddyRestoreBacklogHigh")?;
    let left: f64 = alert.value.parse().unwrap_or(0.0);
    ensure!(
        left > 1000.0 && left <= STATE_RECORDS as f64,
        "the alert says {left} records are left: {alert:?}"
    );
    ensure!(
        alert.annotations["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("Task 0_0 of {ns}/{slow}"))),
        "{alert:?}"
    );
    // The worker was found and labelled as the PodMonitor says.
    let targets = prom.targets()?;
    let target = targets
        .iter()
        .find(|t| t["labels"]["pod"] == pod.as_str())
        .with_context(|| format!("no target for {pod}: {targets:?}"))?;
    ensure!(
        target["labels"]["app"] == slow.as_str()
            && target["labels"]["namespace"] == ns
            && target["health"] == "up",
        "{target}"
    );

    // At full speed the restore ends: the task runs and the alert is resolved.
    drop(quota);
    wait_until(WAIT, || {
        let resolved = prom
            .alerts()?
            .iter()
            .all(|a| !(a.name == "EddyRestoreBacklogHigh" && a.labels["app"] == slow.as_str()));
        Ok(resolved && env.get(ns, &format!("ssapp/{slow}"), "{.status.phase}") == "Running")
    })
    .with_context(|| explain("the restore never ended, or its alert stayed"))?;
    let others: Vec<Alert> = prom
        .alerts()?
        .into_iter()
        .filter(|a| a.state == "firing" && a.name != "EddyAppMisconfigured")
        .collect();
    ensure!(others.is_empty(), "other alerts fired: {others:?}");

    // Both binaries logged JSON, one object per line, the fields beside the message.
    let json_lines = |text: &str| -> Result<Vec<serde_json::Value>> {
        text.lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("--- pod-runner"))
            .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
            .collect()
    };
    let operator = json_lines(&std::fs::read_to_string(env.dir.path().join("op-0.log"))?)?;
    ensure!(
        operator
            .iter()
            .any(|l| l["level"] == "INFO" && l["message"] == "became the leader"),
        "{operator:?}"
    );
    let worker = json_lines(&std::fs::read_to_string(env.pod_dir(ns, &pod).join("log"))?)?;
    ensure!(
        worker.iter().any(|l| l["message"] == "restored"
            && l["task"] == "0_0"
            && l["records"] == STATE_RECORDS),
        "no JSON line of the restore in {pod}'s log: {worker:?}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

//! The Helm chart as the tests see it: its Grafana dashboard (the metric names its queries
//! use) and its rendering with `helm template`.

use crate::k8s::ControlPlane;
use crate::repo_root;
use anyhow::{Context as _, Result};
use std::collections::BTreeSet;

/// Metrics the dashboard uses that no registry of eddy shows in a unit test. Empty now that
/// the operator's per-app and both binaries' process metrics exist; kept for the next ones.
pub const PENDING_METRICS: &[&str] = &[];

pub const CHART: &str = "charts/eddy-operator";

/// `charts/eddy-operator/files/dashboard.json`, parsed.
pub fn dashboard() -> Result<serde_json::Value> {
    let path = repo_root().join(CHART).join("files/dashboard.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// Every PromQL query of a dashboard: its panels' targets (rows' nested panels included) and
/// its query variables (`label_values(SELECTOR, LABEL)` as its selector).
pub fn queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn panels(list: &serde_json::Value, out: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        if let Some(q) = q {
            let q = q.trim();
            match q
                .strip_prefix("label_values(")
                .and_then(|args| args.rsplit_once(','))
            {
                Some((selector, _label)) => out.push(selector.to_string()),
                None => out.push(q.to_string()),
            }
        }
    }
    out
}

/// The metric names a PromQL expression reads: identifiers outside label matchers, ranges and
/// strings that are not functions, keywords, numbers or Grafana variables.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
    ];
    const LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Skips from an opening bracket to just past its closing one (strings inside respected).
    let skip = |i: &mut usize, open: char, close: char| {
        let mut depth = 0;
        while *i < chars.len() {
            match chars[*i] {
                '"' | '\'' | '`' => {
                    let q = chars[*i];
                    *i += 1;
                    while *i < chars.len() && chars[*i] != q {
                        *i += usize::from(chars[*i] == '\\') + 1;
                    }
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        *i += 1;
                        return;
                    }
                }
                _ => {}
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => skip(&mut i, '{', '}'),
            '[' => skip(&mut i, '[', ']'),
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += usize::from(chars[i] == '\\') + 1;
                }
                i += 1;
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                // `sum by (x) (...)`: an aggregation whose grouping comes first.
                let rest: String = chars[next..].iter().take(8).collect();
                let grouping = ["by", "without"].iter().any(|k| {
                    rest.strip_prefix(k)
                        .is_some_and(|r| r.starts_with([' ', '(']))
                });
                let call = chars.get(next) == Some(&'(') || grouping;
                if call && LISTS.contains(&word.as_str()) {
                    i = next;
                    skip(&mut i, '(', ')');
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The series names an OpenMetrics text declares (`# TYPE` lines): a counter's `_total`, a
/// histogram's `_bucket`, `_sum` and `_count`, a gauge's own name.
pub fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" | "summary" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            "info" => {
                out.insert(format!("{name}_info"));
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// `helm template` of the chart (release `t`) in `ns` with `--set` values (and
/// `--api-versions`, ...): the manifests as one YAML stream.
pub fn template(cp: &ControlPlane, ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["template", "t", CHART, "--namespace", ns];
    all.extend_from_slice(args);
    cp.tool("helm", &all, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_skip_functions_labels_ranges_and_variables() {
        let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (namespace, app, le) (rate(eddy_commit_duration_seconds_bucket{namespace=~"$namespace", app=~"a|b"}[$__rate_interval])))"#
            ),
            ["eddy_commit_duration_seconds_bucket"]
        );
        assert_eq!(
            names(
                "process_resident_memory_bytes and on (job, instance) eddy_operator_leader offset 5m"
            ),
            ["eddy_operator_leader", "process_resident_memory_bytes"]
        );
        assert_eq!(
            names("max by (phase) (eddy_operator_app_phase{x=\"}\"}) == 1"),
            ["eddy_operator_app_phase"]
        );
        assert_eq!(
            names("sum(rate(x_total[5m])) without (pod) / 1e3"),
            ["x_total"]
        );
    }

    #[test]
    fn exported_names_follow_the_metric_types() {
        let text = "# HELP a_x X.\n# TYPE a_x counter\n# TYPE a_h histogram\n# TYPE a_g gauge\na_x_total 1\n";
        let names: Vec<String> = exported(text).into_iter().collect();
        assert_eq!(
            names,
            ["a_g", "a_h_bucket", "a_h_count", "a_h_sum", "a_x_total"]
        );
    }

    /// Every series name a worker exports. A family without members is not encoded, so each
    /// gets one (a new family must be added here before the dashboard may use it).
    fn worker_metrics() -> BTreeSet<String> {
        use eddy_worker::metrics::*;
        let m = Metrics::new();
        let task = TaskLabels { task: "0_0".into() };
        let store = StoreLabels {
            task: "0_0".into(),
            store: "s".into(),
        };
        let _ = m.records_processed.get_or_create(&task);
        m.set_task_state("0_0", TaskStateLabel::RUNNING);
        for gauge in [
            &m.restore_remaining,
            &m.store_keys,
            &m.store_bytes,
            &m.standby_lag,
        ] {
            let _ = gauge.get_or_create(&store);
        }
        let _ = m.restore_rate.get_or_create(&store);
        for counter in [
            &m.restored_records,
            &m.cache_hits,
            &m.cache_misses,
            &m.standby_updated,
        ] {
            let _ = counter.get_or_create(&store);
        }
        let _ = m.stores_rebuilt.get_or_create(&RebuiltLabels {
            task: "0_0".into(),
            store: "s".into(),
            reason: "changelog_truncated".into(),
        });
        let _ = m.consumer_lag.get_or_create(&PartitionLabels {
            topic: "t".into(),
            partition: 0,
            task: "0_0".into(),
        });
        let _ = m.bad_records.get_or_create(&OutcomeLabels {
            task: "0_0".into(),
            outcome: "skip".into(),
        });
        let _ = m.recoveries.get_or_create(&ReasonLabels {
            reason: "KafkaUnavailable".into(),
        });
        let _ = m.standby_tasks.get_or_create(&RoleLabels {
            role: "standby".into(),
        });
        exported(&m.encode())
    }

    fn operator_metrics() -> BTreeSet<String> {
        let m = eddy_operator::metrics::Metrics::default();
        m.observe(std::time::Duration::ZERO, "ok");
        // The per-app families are empty until an app is set.
        let series = eddy_operator::metrics::AppSeries {
            phase: vec![("Running".into(), 1)],
            conditions: vec![("Ready".into(), "True".into(), 1)],
            assignment_generation: Some(1),
            acceptable_recovery_lag: Some(10_000),
            standby_lag: vec![("0_0".into(), "p-1".into(), "standby".into(), 0)],
            ..Default::default()
        };
        m.set_app("ns", "app", &series);
        exported(&m.encode())
    }

    /// The dashboard parses, and every metric it queries is one the worker or the operator
    /// exports (read from their registries), or one the metrics branch adds.
    #[test]
    fn the_dashboard_queries_only_metrics_eddy_exports() {
        let d = dashboard().expect("dashboard.json");
        assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
        let queries = queries(&d);
        assert!(queries.len() >= 15, "{queries:?}");
        let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();

        let mut known = worker_metrics();
        known.extend(operator_metrics());
        assert!(known.contains("eddy_records_processed_total"), "{known:?}");
        let pending: BTreeSet<String> = PENDING_METRICS.iter().map(|m| m.to_string()).collect();
        let unknown: Vec<&String> = used
            .iter()
            .filter(|m| !known.contains(*m) && !pending.contains(*m))
            .collect();
        assert!(
            unknown.is_empty(),
            "the dashboard queries metrics nothing exports: {unknown:?} (exported: {known:?})"
        );
        let unused: Vec<&String> = pending.difference(&used).collect();
        assert!(
            unused.is_empty(),
            "PENDING_METRICS lists metrics the dashboard does not use: {unused:?}"
        );
        for m in [
            "eddy_records_processed_total",
            "eddy_consumer_lag_records",
            "eddy_restore_remaining_records",
            "eddy_restored_records_total",
            "eddy_standby_lag_records",
            "eddy_commit_duration_seconds_bucket",
            "eddy_store_bytes_estimate",
            "eddy_bad_records_total",
        ] {
            assert!(used.contains(m), "the dashboard shows no {m}");
        }
    }

    /// Each panel is drawn by Grafana: a unique id, a place on the grid, a data source, and
    /// each query its own refId.
    #[test]
    fn every_dashboard_panel_is_complete() {
        let d = dashboard().expect("dashboard.json");
        let mut ids = BTreeSet::new();
        for p in d["panels"].as_array().expect("panels") {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(
                ids.insert(p["id"].as_i64().expect("id")),
                "duplicate id at {title}"
            );
            for k in ["x", "y", "w", "h"] {
                assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
            }
            if p["type"] == "row" {
                continue;
            }
            assert!(p["datasource"]["uid"].is_string(), "{title}: datasource");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{title}: no query");
            let refs: BTreeSet<&str> = targets.iter().filter_map(|t| t["refId"].as_str()).collect();
            assert_eq!(refs.len(), targets.len(), "{title}: refIds");
        }
    }

    /// The worker status policy compares every field of the status but `workers` between the
    /// old and the new object, by name (CEL cannot drop one field of an object): a status field
    /// added to the CRD and not to the policy would be writable by every worker.
    #[test]
    fn the_worker_status_policy_names_every_status_field() {
        let path = repo_root()
            .join(CHART)
            .join("templates/worker-status-policy.yaml");
        let policy = std::fs::read_to_string(&path).expect("the policy template");
        let crd = serde_json::to_value(eddy_crds::resource::crd()).expect("the CRD");
        let fields = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["status"]["properties"]
            .as_object()
            .expect("status properties");
        let named: BTreeSet<&str> = policy
            .lines()
            .filter(|l| l.trim_start().starts_with("{{- range list"))
            .flat_map(|l| l.split('"').skip(1).step_by(2))
            .collect();
        for f in fields.keys().filter(|f| *f != "workers") {
            assert!(
                named.contains(f.as_str()),
                "the policy does not compare status.{f}"
            );
        }
        assert_eq!(named.len(), fields.len() - 1, "{named:?}");
    }
}

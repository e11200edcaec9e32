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

/// The documents of a multi-document YAML (a file, or `helm template`'s output; split at
/// lines `---`), as JSON values; empty documents (comments only) left out.
pub fn documents(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            let v: serde_json::Value = serde_yaml::from_str(&current)
                .with_context(|| format!("parsing a YAML document:\n{current}"))?;
            if !v.is_null() {
                docs.push(v);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    Ok(docs)
}

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

/// The first line of the chart README's generated part (the values table).
pub const VALUES_BEGIN: &str =
    "<!-- values: generated from values.yaml by e2e/src/chart.rs; do not edit -->";
/// The last line of the chart README's generated part.
pub const VALUES_END: &str = "<!-- end of values -->";

/// One leaf of the chart's values.yaml: a scalar, a list, an empty map or a flow map (`{a: 1}`,
/// kept whole). Its default is the YAML text of values.yaml; its description the `#` lines
/// directly above its key and the comment after it, or, without them, its nearest ancestor's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartValue {
    /// The keys from the top level down.
    pub keys: Vec<String>,
    pub default: String,
    pub description: String,
}

impl ChartValue {
    /// The dotted path `--set` takes (`image.repository`), a dot in a key escaped (`a\.b`).
    pub fn path(&self) -> String {
        self.keys
            .iter()
            .map(|k| k.replace('.', "\\."))
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// A key line of values.yaml, its value already folded (a block list or block scalar).
struct ValuesEntry {
    indent: usize,
    key: String,
    value: String,
    comment: String,
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Splits `value  # comment` at the first `#` that follows a blank and is outside quotes.
fn split_comment(s: &str) -> (&str, &str) {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' if prev.is_whitespace() || "[{,:".contains(prev) => quote = Some(c),
                '#' if prev.is_whitespace() => return (s[..i].trim(), s[i + 1..].trim()),
                _ => {}
            },
        }
        prev = c;
    }
    (s.trim(), "")
}

/// `key: rest` (a key plain or quoted) split at the colon, or None when the line holds none.
fn split_key(line: &str) -> Option<(String, &str)> {
    if let Some(q) = line.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let end = line[1..].find(q)? + 1;
        let rest = line[end + 1..].trim_start().strip_prefix(':')?;
        return Some((line[1..end].to_string(), rest));
    }
    let bytes = line.as_bytes();
    let colon = (0..bytes.len())
        .find(|&i| bytes[i] == b':' && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace()))?;
    Some((line[..colon].trim().to_string(), &line[colon + 1..]))
}

/// A comment line's text (`# text`), or None when the line is not a comment.
fn comment_text(trimmed: &str) -> Option<&str> {
    trimmed.strip_prefix('#').map(|c| c.trim())
}

/// The next line at or after `from` that is neither blank nor a comment.
fn next_significant(lines: &[&str], from: usize) -> Option<usize> {
    (from..lines.len()).find(|&j| {
        let t = lines[j].trim();
        !t.is_empty() && !t.starts_with('#')
    })
}

/// The key lines of a simple block YAML text, in order. A key without a value followed by a
/// block list (`- a` lines) gets the list as a flow list (`[a, {b: 1, c: 2}]`); one followed by
/// a block scalar (`|`, `>`) gets its lines as a quoted string.
fn values_entries(yaml: &str) -> Vec<ValuesEntry> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut above: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let t = line.trim();
        if let Some(c) = comment_text(t) {
            if !c.is_empty() {
                above.push(c);
            }
            continue;
        }
        if t.is_empty() || t.starts_with("---") || t == "-" || t.starts_with("- ") {
            above.clear();
            continue;
        }
        let Some((key, rest)) = split_key(t) else {
            above.clear();
            continue;
        };
        let indent = indent_of(line);
        let (value, trailing) = split_comment(rest);
        let mut value = value.to_string();
        if value.is_empty() {
            // A block list: `- ` items at the list's indent, each with its deeper lines.
            let first = next_significant(&lines, i).filter(|&j| {
                let l = lines[j];
                let lt = l.trim();
                indent_of(l) >= indent && (lt == "-" || lt.starts_with("- "))
            });
            if let Some(j) = first {
                let item_indent = indent_of(lines[j]);
                let mut items: Vec<Vec<String>> = Vec::new();
                while let Some(j) = next_significant(&lines, i) {
                    let l = lines[j];
                    let (li, lt) = (indent_of(l), l.trim());
                    if li == item_indent && (lt == "-" || lt.starts_with("- ")) {
                        items.push(Vec::new());
                        let part = split_comment(lt.trim_start_matches('-')).0;
                        if let Some(item) = items.last_mut().filter(|_| !part.is_empty()) {
                            item.push(part.to_string());
                        }
                    } else if li > item_indent {
                        if let Some(item) = items.last_mut() {
                            item.push(split_comment(lt).0.to_string());
                        }
                    } else {
                        break;
                    }
                    i = j + 1;
                }
                let items: Vec<String> = items
                    .into_iter()
                    .map(|parts| {
                        let map = parts.len() > 1 || parts.iter().any(|p| split_key(p).is_some());
                        if map {
                            format!("{{{}}}", parts.join(", "))
                        } else {
                            parts.concat()
                        }
                    })
                    .collect();
                value = format!("[{}]", items.join(", "));
            }
        } else if value.starts_with('|') || value.starts_with('>') {
            let mut text = Vec::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent_of(lines[i]) > indent) {
                text.push(lines[i].trim());
                i += 1;
            }
            let sep = if value.starts_with('|') { "\n" } else { " " };
            value = format!("{:?}", text.join(sep).trim());
        }
        let comment = above
            .drain(..)
            .chain((!trailing.is_empty()).then_some(trailing))
            .collect::<Vec<_>>()
            .join(" ");
        out.push(ValuesEntry {
            indent,
            key,
            value,
            comment,
        });
    }
    out
}

/// The leaves of a chart's values.yaml, in its order, read line by line: the file is simple
/// block YAML (maps by indentation, flow maps and lists on one line, comments above keys).
pub fn chart_values(values_yaml: &str) -> Vec<ChartValue> {
    let entries = values_entries(values_yaml);
    // The open maps: (indent, key, comment).
    let mut open: Vec<(usize, &str, &str)> = Vec::new();
    let mut out = Vec::new();
    for (n, e) in entries.iter().enumerate() {
        while open
            .last()
            .is_some_and(|(indent, _, _)| *indent >= e.indent)
        {
            open.pop();
        }
        let is_map = e.value.is_empty()
            && entries
                .get(n + 1)
                .is_some_and(|next| next.indent > e.indent);
        if is_map {
            open.push((e.indent, &e.key, &e.comment));
            continue;
        }
        let description = if e.comment.is_empty() {
            open.iter()
                .rev()
                .map(|(_, _, c)| *c)
                .find(|c| !c.is_empty())
                .unwrap_or_default()
        } else {
            &e.comment
        };
        let mut keys: Vec<String> = open.iter().map(|(_, k, _)| k.to_string()).collect();
        keys.push(e.key.clone());
        out.push(ChartValue {
            keys,
            default: if e.value.is_empty() {
                "null".to_string()
            } else {
                e.value.clone()
            },
            description: description.to_string(),
        });
    }
    out
}

/// Markdown inline code of `s` in a table cell.
fn md_code(s: &str) -> String {
    let s = s.replace('|', "\\|");
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// Markdown text of `s` in a table cell: `|` escaped, and `<`, `>` outside code spans (else
/// `<AlertName>` is taken for an HTML tag and disappears).
fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut code = false;
    for c in s.chars() {
        match c {
            '`' => {
                code = !code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !code => out.push_str("&lt;"),
            '>' if !code => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// The generated part of the chart's README: a table of every value of `values_yaml` (path,
/// default, description; "As above." for the previous row's), between [`VALUES_BEGIN`] and [`VALUES_END`] (both included, a newline
/// after the end).
pub fn values_readme(values_yaml: &str) -> String {
    let mut s = format!("{VALUES_BEGIN}\n\n| Value | Default | Description |\n|---|---|---|\n");
    let mut previous = String::new();
    for v in chart_values(values_yaml) {
        // A description inherited by several rows in a row is written once.
        let description = if !v.description.is_empty() && v.description == previous {
            "As above.".to_string()
        } else {
            md_text(&v.description)
        };
        s.push_str(&format!(
            "| {} | {} | {} |\n",
            md_code(&v.path()),
            md_code(&v.default),
            description
        ));
        previous = v.description;
    }
    s.push('\n');
    s.push_str(VALUES_END);
    s.push('\n');
    s
}

/// `readme` with its generated part (from [`VALUES_BEGIN`] to the line of [`VALUES_END`])
/// replaced by the one `values_yaml` gives, or that part appended when it has none.
pub fn with_values_readme(readme: &str, values_yaml: &str) -> String {
    let generated = values_readme(values_yaml);
    let Some(begin) = readme.find(VALUES_BEGIN) else {
        let sep = if readme.is_empty() || readme.ends_with("\n\n") {
            ""
        } else if readme.ends_with('\n') {
            "\n"
        } else {
            "\n\n"
        };
        return format!("{readme}{sep}{generated}");
    };
    let after = match readme[begin..].find(VALUES_END) {
        Some(end) => {
            let end = begin + end + VALUES_END.len();
            end + usize::from(readme[end..].starts_with('\n'))
        }
        None => readme.len(),
    };
    format!("{}{generated}{}", &readme[..begin], &readme[after..])
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

    /// The line parser of values.yaml: comments above a key and after it, nested maps, flow
    /// maps and lists kept whole, block lists folded, descriptions inherited.
    #[test]
    fn chart_values_reads_keys_defaults_and_comments() {
        let yaml = r#"# Names of
# the objects.
name: ""
count: 2   # how many
image:
  repository: ghcr.io/x/y
  # The tag;
  # empty: the appVersion.
  tag: "a # b"
# Resources.
resources:
  requests: {cpu: 50m, memory: 64Mi}
list: []

# Extra env.
env:
  - name: A
    value: "1"
  - B
monitoring:
  # A monitor.
  monitor:
    enabled: null
    labels: {}
  it's: x   # 'quoted' it's
empty:
"a.b": {x: [1, 2]}
"#;
        let got: Vec<(String, String, String)> = chart_values(yaml)
            .into_iter()
            .map(|v| (v.path(), v.default, v.description))
            .collect();
        let want = [
            ("name", "\"\"", "Names of the objects."),
            ("count", "2", "how many"),
            ("image.repository", "ghcr.io/x/y", ""),
            ("image.tag", "\"a # b\"", "The tag; empty: the appVersion."),
            (
                "resources.requests",
                "{cpu: 50m, memory: 64Mi}",
                "Resources.",
            ),
            ("list", "[]", ""),
            ("env", "[{name: A, value: \"1\"}, B]", "Extra env."),
            ("monitoring.monitor.enabled", "null", "A monitor."),
            ("monitoring.monitor.labels", "{}", "A monitor."),
            ("monitoring.it's", "x", "'quoted' it's"),
            ("empty", "null", ""),
            ("a\\.b", "{x: [1, 2]}", ""),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|(p, d, c)| (p.to_string(), d.to_string(), c.to_string()))
            .collect();
        assert_eq!(got, want);

        let table = values_readme("# See <AlertName>, `<x>` | y.\na:\n  b: {c: 1}\n  d: 2\n");
        assert_eq!(
            table,
            format!(
                "{VALUES_BEGIN}\n\n| Value | Default | Description |\n|---|---|---|\n\
                 | `a.b` | `{{c: 1}}` | See &lt;AlertName&gt;, `<x>` \\| y. |\n\
                 | `a.d` | `2` | As above. |\n\n{VALUES_END}\n"
            )
        );
        let readme = format!("# Chart\n\nIntro.\n\n{VALUES_BEGIN}\nold\n{VALUES_END}\nAfter.\n");
        assert_eq!(
            with_values_readme(&readme, "a: 1\n"),
            format!("# Chart\n\nIntro.\n\n{}After.\n", values_readme("a: 1\n"))
        );
        assert_eq!(
            with_values_readme("# Chart\n", "a: 1\n"),
            format!("# Chart\n\n{}", values_readme("a: 1\n"))
        );
    }

    fn values_yaml() -> String {
        let path = repo_root().join(CHART).join("values.yaml");
        std::fs::read_to_string(&path).expect("the chart's values.yaml")
    }

    /// The line parser agrees with a YAML parser on the chart's values.yaml: each row's default
    /// is the value at its path, and every leaf of the file is in a row.
    #[test]
    fn chart_values_agree_with_a_yaml_parser() {
        use serde_yaml::Value;
        let text = values_yaml();
        let parsed: Value = serde_yaml::from_str(&text).expect("values.yaml is YAML");
        let rows = chart_values(&text);
        let paths: BTreeSet<String> = rows.iter().map(ChartValue::path).collect();
        assert_eq!(paths.len(), rows.len(), "duplicate paths: {paths:?}");
        for p in [
            "image.repository",
            "replicaCount",
            "monitoring.dashboard.labels.grafana_dashboard",
            "alerts.rules.EddyAppDegraded",
        ] {
            assert!(paths.contains(p), "no row {p}: {paths:?}");
        }
        for row in &rows {
            let at = row
                .keys
                .iter()
                .try_fold(&parsed, |v, k| v.get(k.as_str()))
                .unwrap_or_else(|| panic!("{} is not in values.yaml", row.path()));
            let default: Value = serde_yaml::from_str(&row.default)
                .unwrap_or_else(|e| panic!("{}: default {:?}: {e}", row.path(), row.default));
            assert_eq!(&default, at, "{}", row.path());
        }
        // Every leaf of the parsed file is in a row (or under a row's flow map).
        fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            match v {
                Value::Mapping(m) if !m.is_empty() => {
                    for (k, v) in m {
                        path.push(k.as_str().unwrap_or_default().to_string());
                        leaves(v, path, out);
                        path.pop();
                    }
                }
                _ => out.push(path.clone()),
            }
        }
        let mut all = Vec::new();
        leaves(&parsed, &mut Vec::new(), &mut all);
        for leaf in all {
            assert!(
                rows.iter().any(|r| leaf.starts_with(&r.keys)),
                "values.yaml's {} is in no row",
                leaf.join(".")
            );
        }
        // Every row says something: its own comment or an ancestor's.
        let bare: Vec<String> = rows
            .iter()
            .filter(|r| r.description.is_empty())
            .map(ChartValue::path)
            .collect();
        assert!(bare.len() < rows.len() / 2, "undescribed: {bare:?}");
    }

    /// charts/eddy-operator/README.md's values table is the one values.yaml gives; with
    /// `EDDY_WRITE_CHART_README=1` the test writes it instead.
    #[test]
    fn the_chart_readme_lists_the_values_of_values_yaml() {
        let path = repo_root().join(CHART).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap_or_default();
        let want = with_values_readme(&readme, &values_yaml());
        if std::env::var("EDDY_WRITE_CHART_README").as_deref() == Ok("1") {
            if want != readme {
                std::fs::write(&path, &want).expect("writing the chart's README.md");
            }
            return;
        }
        if want != readme {
            let first = want
                .lines()
                .zip(readme.lines().chain(std::iter::repeat("")))
                .position(|(w, r)| w != r)
                .unwrap_or(want.lines().count());
            panic!(
                "{} is not up to date with values.yaml (first difference at line {}: {:?}, \
                 generated: {:?}); regenerate its values table with \
                 `EDDY_WRITE_CHART_README=1 cargo test --release -p eddy-e2e --lib \
                 chart::tests::the_chart_readme`",
                path.display(),
                first + 1,
                readme.lines().nth(first).unwrap_or("<end of file>"),
                want.lines().nth(first).unwrap_or("<end of file>"),
            );
        }
    }
}

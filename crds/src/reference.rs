//! docs/reference.md, written from the CRD's schema: one row per field with its path, type,
//! default and description, so the reference page says what `kubectl explain` says and cannot
//! drift from it (a test compares the committed page with [`markdown`]).
//!
//! Defaults come from the schema's `default`, else from the description's `(default X)`, the
//! way the descriptions state the defaults the code applies (the API server cannot know them:
//! several depend on other fields).

use serde_json::Value;
use std::fmt::Write as _;

/// The command that rewrites the page.
pub const REGENERATE: &str =
    "$CARGO_TARGET_DIR/release/eddy-operator reference > docs/reference.md";

/// Fields shown as one row, not field by field: Kubernetes' own types, described by
/// Kubernetes (`kubectl explain pod.spec.containers.resources`).
const KUBERNETES_TYPES: &[(&str, &str)] = &[(
    "spec.resources",
    "ResourceRequirements (`requests`, `limits`), as in a container",
)];

/// The reference page of the CRD.
pub fn markdown() -> String {
    let crd = serde_json::to_value(crate::resource::crd()).unwrap_or(Value::Null);
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# StatefulStreamApp reference\n\n\
         <!-- Generated from the CRD by crds/src/reference.rs: do not edit. Regenerate with\n     \
         {REGENERATE} -->\n\n\
         `apiVersion: {}`, `kind: {}` (plural `{}`, short name `{}`), namespaced. {}.\n\n\
         Every field below is also what `kubectl explain ssapp.<path>` prints. A default is\n\
         what applies when the field is left out; fields without one are off or empty unless\n\
         set. In a path, `[]` stands for any item of a list and `*` for any key of a map (a\n\
         pod name, a task id). `spec` is the app file `eddy-worker run -f` reads as well\n\
         (fields marked \"operator only\" are ignored there). `status` is written by the\n\
         operator and the workers, never by users.",
        crate::API_VERSION,
        crate::KIND,
        crd["spec"]["names"]["plural"].as_str().unwrap_or_default(),
        crd["spec"]["names"]["shortNames"][0]
            .as_str()
            .unwrap_or_default(),
        one_line(schema["description"].as_str().unwrap_or_default()),
    );

    out.push_str("\n## `kubectl get` columns\n\n| Column | From | Description |\n|---|---|---|\n");
    for c in version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let path = c["jsonPath"].as_str().unwrap_or_default();
        // A column without a description of its own shows its field's.
        let field = path
            .strip_prefix('.')
            .filter(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
            .map(|p| p.split('.').fold(schema, |s, name| &s["properties"][name]));
        let description = c["description"]
            .as_str()
            .or_else(|| field.and_then(|f| f["description"].as_str()))
            .unwrap_or(match path {
                ".metadata.creationTimestamp" => "time since the app was created",
                _ => "",
            });
        let _ = writeln!(
            out,
            "| {} | `{path}` | {} |",
            c["name"].as_str().unwrap_or_default(),
            cell(description),
        );
    }

    for (section, intro) in [
        ("spec", "What to run and how."),
        (
            "status",
            "What the operator and each worker report (read only).",
        ),
    ] {
        let field = &schema["properties"][section];
        let _ = writeln!(out, "\n## `{section}`\n\n{intro}");
        let _ = writeln!(
            out,
            "\n| Field | Type | Default | Description |\n|---|---|---|---|"
        );
        let mut rows = Vec::new();
        walk(field, section, &mut rows);
        for r in rows {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                r.path,
                cell(&r.ty),
                cell(&r.default),
                cell(&r.description)
            );
        }
        let rules: Vec<&str> = field["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["message"].as_str())
            .collect();
        if !rules.is_empty() {
            let _ = writeln!(
                out,
                "\nChecked at admission as well (the API server refuses the resource with this message):\n"
            );
            for m in rules {
                let _ = writeln!(out, "- {}", one_line(m));
            }
        }
    }
    out
}

struct Row {
    path: String,
    ty: String,
    default: String,
    description: String,
}

/// The rows of `field`'s properties, depth first in name order (the schema's order):
/// `a.b` for a property, `a[].b` inside list items, `a.*.b` inside map values.
fn walk(field: &Value, path: &str, rows: &mut Vec<Row>) {
    let required: Vec<&str> = field["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, f) in field["properties"].as_object().into_iter().flatten() {
        let here = format!("{path}.{name}");
        let kubernetes = KUBERNETES_TYPES.iter().find(|(p, _)| *p == here);
        let mut ty = match kubernetes {
            Some((_, ty)) => ty.to_string(),
            None => type_of(f),
        };
        if required.contains(&name.as_str()) {
            ty.push_str(", required");
        }
        let description = f["description"].as_str().unwrap_or_default();
        let rules: Vec<String> = f["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["message"].as_str())
            .map(|m| format!(" Admission: {m}."))
            .collect();
        rows.push(Row {
            path: here.clone(),
            ty,
            default: default_of(f),
            description: format!("{description}{}", rules.concat()),
        });
        if kubernetes.is_none() {
            children(f, &here, rows);
        }
    }
}

fn children(f: &Value, path: &str, rows: &mut Vec<Row>) {
    if f.get("properties").is_some() {
        walk(f, path, rows);
    }
    if let Some(items) = f.get("items") {
        children(items, &format!("{path}[]"), rows);
    }
    if let Some(values) = f.get("additionalProperties").filter(|v| v.is_object()) {
        children(values, &format!("{path}.*"), rows);
    }
}

/// `string`, `integer (int64), ≥ 0`, `list of string`, `map of string to object`, an enum's
/// values, a string's length and pattern.
fn type_of(f: &Value) -> String {
    let mut parts = vec![base_type(f)];
    if let Some(values) = f["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .filter_map(Value::as_str)
            .map(|v| format!("`{v}`"))
            .collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    if let Some(min) = f["minimum"].as_f64() {
        parts.push(format!("≥ {}", number(min)));
    }
    if let Some(max) = f["maximum"].as_f64() {
        parts.push(format!("≤ {}", number(max)));
    }
    match (f["minLength"].as_u64(), f["maxLength"].as_u64()) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max} characters")),
        (Some(1), None) => parts.push("not empty".into()),
        (Some(min), None) => parts.push(format!("at least {min} characters")),
        (None, Some(max)) => parts.push(format!("at most {max} characters")),
        (None, None) => {}
    }
    match (f["minItems"].as_u64(), f["maxItems"].as_u64()) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max} items")),
        (Some(min), None) => parts.push(format!("at least {min} items")),
        (None, Some(max)) => parts.push(format!("at most {max} items")),
        (None, None) => {}
    }
    if f["type"] == "object"
        && let Some(max) = f["maxProperties"].as_u64()
    {
        parts.push(format!("at most {max} entries"));
    }
    if let Some(pattern) = f["pattern"].as_str() {
        parts.push(format!("matching `{pattern}`"));
    }
    parts.join(", ")
}

/// The type alone: `integer (int64)`, `list of string`, `map of string to object`.
fn base_type(f: &Value) -> String {
    let base = match f["type"].as_str() {
        Some("array") => format!("list of {}", base_type(&f["items"])),
        Some("object") => match f.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) => format!("map of string to {}", base_type(values)),
            None if f.get("x-kubernetes-preserve-unknown-fields").is_some() => {
                "object (free-form)".to_string()
            }
            None => "object".to_string(),
        },
        Some(t) => t.to_string(),
        None if f.get("x-kubernetes-int-or-string").is_some() => "integer or string".into(),
        None if f.get("x-kubernetes-preserve-unknown-fields").is_some() => {
            "string or object".into()
        }
        None => "any".into(),
    };
    match f["format"].as_str() {
        Some(format) => format!("{base} ({format})"),
        None => base,
    }
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// The schema's default, else the description's `(default X)` (up to a `: ` that explains it).
/// Values a user writes (strings, objects) in backticks; numbers and prose as they are.
fn default_of(f: &Value) -> String {
    match f.get("default") {
        Some(Value::String(s)) => format!("`{s}`"),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        Some(v) => format!("`{v}`"),
        None => {
            let stated = f["description"]
                .as_str()
                .and_then(stated_default)
                .unwrap_or_default();
            let is_value = f["enum"]
                .as_array()
                .is_some_and(|values| values.iter().any(|v| v == stated.as_str()));
            if is_value {
                format!("`{stated}`")
            } else {
                stated
            }
        }
    }
}

/// `X` of the first `(default X)` in a description, parentheses inside `X` balanced.
pub fn stated_default(description: &str) -> Option<String> {
    let start = description.find("(default")?;
    let rest = &description[start + 1..];
    let mut depth = 1;
    let end = rest.char_indices().find_map(|(i, c)| {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        (depth == 0).then_some(i)
    })?;
    let value = rest[..end].strip_prefix("default")?;
    let value = value.trim_start_matches(':').trim();
    let value = value.split(": ").next().unwrap_or(value).trim();
    (!value.is_empty()).then(|| one_line(value))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text fit for one table cell.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_reference_page_is_the_generated_one() {
        // The run-time value first: a warm target directory may hold this test compiled in
        // another clone.
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let path = format!("{dir}/../docs/reference.md");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == markdown(),
            "docs/reference.md is not what the CRD says: regenerate it with `{REGENERATE}` (after building the workspace)"
        );
    }

    #[test]
    fn every_field_of_the_crd_has_a_row() {
        let page = markdown();
        for path in [
            "spec.kafka.sasl.password.secretKeyRef.name",
            "spec.topology[].aggregate.initial",
            "spec.topology[].groupBy",
            "spec.warmup.acceptableRecoveryLag",
            "spec.resources",
            "status.workers.*.tasks.*.lag",
            "status.assignment.pods.*.warmup",
            "status.conditions[].reason",
        ] {
            assert!(page.contains(&format!("| `{path}` |")), "no row for {path}");
        }
        assert!(
            !page.contains("spec.resources.limits"),
            "Kubernetes' own types are one row"
        );
    }

    #[test]
    fn defaults_come_from_the_schema_or_the_description() {
        let page = markdown();
        let row = |path: &str| {
            page.lines()
                .find(|l| l.starts_with(&format!("| `{path}` |")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            row("spec.onError").contains("| `fail` |"),
            "{}",
            row("spec.onError")
        );
        assert!(
            row("status.backlog").contains("| 0 |"),
            "{}",
            row("status.backlog")
        );
        assert!(
            row("spec.replicas").contains("| 1 |"),
            "{}",
            row("spec.replicas")
        );
        assert!(
            row("spec.kafka.replicationFactor").contains("| min(3, number of brokers) |"),
            "{}",
            row("spec.kafka.replicationFactor")
        );
        assert!(
            row("spec.storage.whenScaled").contains("| `Retain` |"),
            "{}",
            row("spec.storage.whenScaled")
        );
        assert_eq!(
            stated_default("CA (default: the system's CAs)."),
            Some("the system's CAs".into())
        );
        assert_eq!(
            stated_default("the name (the step's index by default)"),
            None
        );
        assert_eq!(stated_default("e.g. `256Mi` (default)"), None);
    }

    #[test]
    fn a_pipe_in_a_description_does_not_break_the_table() {
        assert_eq!(cell("a | b\n  c"), "a \\| b c");
    }
}

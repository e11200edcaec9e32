//! Reading an application file: a whole `StatefulStreamApp` manifest or its bare `spec`,
//! checked so that every mistake is reported with the field it concerns and what is expected.

use crate::spec::{AppSpec, Step};
use crate::{API_VERSION, KIND, topics};
use serde::Deserialize;
use std::collections::HashSet;

/// A parsed and validated application.
#[derive(Clone, Debug, PartialEq)]
pub struct AppManifest {
    /// `metadata.name`, when the file is a whole manifest.
    pub name: Option<String>,
    pub spec: AppSpec,
}

impl AppManifest {
    /// `spec.applicationId`, else `metadata.name` (a standalone worker knows no namespace).
    pub fn application_id(&self) -> Option<&str> {
        self.spec.application_id.as_deref().or(self.name.as_deref())
    }
}

/// The application id of an app: `explicit` (`spec.applicationId`) when set; otherwise, for a
/// resource in a namespace (under the operator), `<namespace>.<name>`, which no other app can
/// default to because a namespace name cannot contain '.'; without a namespace (a standalone
/// file), the name. Every name derived from it (internal topics, consumer group,
/// transactional ids, state dirs) is therefore unique per resource.
pub fn application_id(namespace: Option<&str>, name: &str, explicit: Option<&str>) -> String {
    match (explicit, namespace) {
        (Some(id), _) => id.to_string(),
        (None, Some(ns)) if !ns.is_empty() => format!("{ns}.{name}"),
        (None, _) => name.to_string(),
    }
}

/// Read a spec from the JSON the API server holds, as strictly as [`parse_app`] reads a file:
/// a value the CRD schema lets through but the types refuse (`groupBy: 42`, a field of the
/// wrong type stored before a schema change) comes back with its field path, e.g.
/// `spec.topology[1]: ...`. The caller validates.
pub fn spec_from_json(spec: &serde_json::Value) -> Result<AppSpec, ManifestError> {
    #[derive(Deserialize)]
    struct Doc {
        spec: AppSpec,
    }
    // Through YAML text, as `parse_app` does, for serde_yaml's field paths; positions in
    // that generated text mean nothing to the user, so they are cut off.
    let text = serde_yaml::to_string(&serde_json::json!({ "spec": spec }))
        .map_err(|e| ManifestError::Yaml(e.to_string()))?;
    serde_yaml::from_str::<Doc>(&text)
        .map(|d| d.spec)
        .map_err(|e| {
            let mut message = e.to_string();
            if let Some(l) = e.location() {
                let at = format!(" at line {} column {}", l.line(), l.column());
                if let Some(cut) = message.rfind(&at) {
                    message.replace_range(cut..cut + at.len(), "");
                }
            }
            ManifestError::Yaml(message)
        })
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Yaml(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Whole {
    #[serde(default)]
    metadata: Metadata,
    spec: Option<AppSpec>,
    // `apiVersion` and `kind` are checked before; `status` of a manifest read back from the
    // cluster is ignored.
}

#[derive(Default, Deserialize)]
struct Metadata {
    name: Option<String>,
}

/// Parse and validate an application file (YAML or JSON).
pub fn parse_app(text: &str) -> Result<AppManifest, ManifestError> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ManifestError::Yaml(format!("not valid YAML: {e}")))?;
    let field = |k: &str| {
        doc.get(k)
            .map(|v| v.as_str().unwrap_or_default().to_string())
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    // Typed parsing from the text (not from `doc`) keeps serde_yaml's field paths and
    // positions in error messages, e.g. `spec.topology[1]: unknown variant ...`.
    let yaml = |e: serde_yaml::Error| ManifestError::Yaml(e.to_string());
    if api_version.is_none() && kind.is_none() {
        let spec: AppSpec = serde_yaml::from_str(text).map_err(yaml)?;
        validate(&spec, "")?;
        return Ok(AppManifest { name: None, spec });
    }
    if api_version.as_deref() != Some(API_VERSION) {
        return Err(invalid(
            "apiVersion",
            format!(
                "expected {API_VERSION:?}, got {:?}",
                api_version.unwrap_or_default()
            ),
        ));
    }
    if kind.as_deref() != Some(KIND) {
        return Err(invalid(
            "kind",
            format!("expected {KIND:?}, got {:?}", kind.unwrap_or_default()),
        ));
    }
    let whole: Whole = serde_yaml::from_str(text).map_err(yaml)?;
    let spec = whole.spec.ok_or_else(|| {
        invalid(
            "spec",
            "missing: a StatefulStreamApp needs a spec with a topology",
        )
    })?;
    validate(&spec, "spec.")?;
    Ok(AppManifest {
        name: whole.metadata.name,
        spec,
    })
}

/// Checks a structural schema cannot express: step order, unique stores, legal names.
pub fn validate(spec: &AppSpec, prefix: &str) -> Result<(), ManifestError> {
    let f = |s: String| format!("{prefix}{s}");
    if let Some(id) = &spec.application_id {
        topics::check_name(id).map_err(|m| invalid(f("applicationId".into()), m))?;
    }
    if let Some(r) = spec.replicas
        && r < 0
    {
        return Err(invalid(
            f("replicas".into()),
            format!("must be 0 or more, got {r}"),
        ));
    }
    if let (Some(s), Some(r)) = (spec.num_standby_replicas, spec.replicas)
        && (s < 0 || (r > 0 && s >= r))
    {
        return Err(invalid(
            f("numStandbyReplicas".into()),
            format!("must be between 0 and replicas-1 ({}), got {s}", r - 1),
        ));
    }
    if spec.topology.is_empty() {
        return Err(invalid(
            f("topology".into()),
            "is empty: the first step must be `from: {topic: ...}`",
        ));
    }
    let mut stores = HashSet::new();
    for (i, step) in spec.topology.iter().enumerate() {
        let field = f(format!("topology[{i}]"));
        match step {
            Step::From(from) => {
                if i != 0 {
                    return Err(invalid(field, "`from` may only be the first step"));
                }
                topics::check_name(&from.topic)
                    .map_err(|m| invalid(format!("{field}.from.topic"), m))?;
            }
            _ if i == 0 => {
                return Err(invalid(
                    field,
                    "the first step must be `from: {topic: ...}`",
                ));
            }
            Step::To(to) => {
                if i + 1 != spec.topology.len() {
                    return Err(invalid(field, "`to` must be the last step"));
                }
                topics::check_name(&to.topic)
                    .map_err(|m| invalid(format!("{field}.to.topic"), m))?;
            }
            Step::Count(c) => check_store(&mut stores, &c.store, &format!("{field}.count.store"))?,
            Step::Aggregate(a) => {
                check_store(&mut stores, &a.store, &format!("{field}.aggregate.store"))?
            }
            Step::Filter(e) | Step::Map(e) => {
                if e.trim().is_empty() {
                    return Err(invalid(field, "the jq expression is empty"));
                }
            }
            Step::GroupBy(g) => {
                if g.expr().trim().is_empty() {
                    return Err(invalid(field, "the jq expression is empty"));
                }
            }
        }
    }
    Ok(())
}

fn check_store(seen: &mut HashSet<String>, store: &str, field: &str) -> Result<(), ManifestError> {
    topics::check_name(store).map_err(|m| invalid(field, m))?;
    if !seen.insert(store.to_string()) {
        return Err(invalid(
            field,
            format!("store {store:?} is defined twice: store names must be unique"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Format, ProcessingGuarantee};

    const DESIGN_EXAMPLE: &str = r#"
apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {name: page-views}
spec:
  replicas: 3
  kafka: {bootstrapServers: "kafka:9092"}
  processingGuarantee: exactly_once
  numStandbyReplicas: 1
  warmup: {maxWarmupReplicas: 2, acceptableRecoveryLag: 10000}
  storage: {size: 10Gi}
  topology:
    - from: {topic: page-views, key: string, value: json}
    - filter: '.status == 200'
    - groupBy: '.user'
    - count: {store: views-per-user}
    - to: {topic: views-per-user, value: i64}
"#;

    #[test]
    fn reads_the_design_example() {
        let app = parse_app(DESIGN_EXAMPLE).expect("valid");
        assert_eq!(app.application_id(), Some("page-views"));
        assert_eq!(
            app.spec.processing_guarantee,
            ProcessingGuarantee::ExactlyOnce
        );
        assert_eq!(app.spec.topology.len(), 5);
        match &app.spec.topology[4] {
            Step::To(to) => assert_eq!(to.value, Some(Format::I64)),
            other => panic!("expected to, got {other:?}"),
        }
    }

    #[test]
    fn reads_a_bare_spec() {
        let app = parse_app(
            "applicationId: spend\ntopology:\n  - from: {topic: payments}\n  - aggregate: {store: spend, initial: '0', add: '$agg + .amount'}\n  - to: {topic: spend-per-user, value: json}\n",
        )
        .expect("valid");
        assert_eq!(app.application_id(), Some("spend"));
        assert_eq!(app.name, None);
    }

    fn err(text: &str) -> String {
        parse_app(text).expect_err("must be rejected").to_string()
    }

    #[test]
    fn errors_name_the_field() {
        let e = err("topology:\n  - from: {topic: a}\n  - cont: {store: s}\n");
        assert!(
            e.contains("topology[1]") && e.contains("unknown variant `cont`"),
            "{e}"
        );
        let e = err("topology:\n  - from: {topic: a, value: xml}\n");
        assert!(e.contains("topology[0]") && e.contains("xml"), "{e}");
        let e = err("topology:\n  - filter: '.a'\n");
        assert!(
            e.contains("topology[0]") && e.contains("first step must be `from"),
            "{e}"
        );
        let e = err("topology:\n  - from: {topic: a}\n  - to: {topic: b}\n  - filter: '.a'\n");
        assert!(e.contains("topology[1]") && e.contains("last step"), "{e}");
        let e = err("topology:\n  - from: {topic: 'a b'}\n");
        assert!(e.contains("topology[0].from.topic"), "{e}");
        let e =
            err("topology:\n  - from: {topic: a}\n  - count: {store: s}\n  - count: {store: s}\n");
        assert!(
            e.contains("topology[2].count.store") && e.contains("twice"),
            "{e}"
        );
        let e = err("apiVersion: eddy.dev/v1\nkind: StatefulStreamApp\nspec: {topology: []}\n");
        assert!(
            e.contains("apiVersion") && e.contains("eddy.dev/v1alpha1"),
            "{e}"
        );
        let e = err(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nspec:\n  replicas: 2\n  numStandbyReplicas: 2\n  topology: [{from: {topic: a}}]\n",
        );
        assert!(e.contains("spec.numStandbyReplicas"), "{e}");
        let e = err("topology: []\nprocessingGuarantee: exactly-once\n");
        assert!(
            e.contains("processingGuarantee") && e.contains("exactly_once"),
            "{e}"
        );
    }

    #[test]
    fn the_default_application_id_is_unique_per_namespace() {
        assert_eq!(application_id(Some("team-a"), "pv", None), "team-a.pv");
        assert_eq!(application_id(Some("team-b"), "pv", None), "team-b.pv");
        assert_eq!(application_id(Some("team-a"), "pv", Some("views")), "views");
        assert_eq!(application_id(None, "pv", None), "pv");
        // A valid Kafka topic prefix for the longest names Kubernetes allows a StatefulSet
        // to have (63-character namespace, 52-character name).
        let id = application_id(Some(&"n".repeat(63)), &"a.b-c".repeat(10), None);
        assert!(topics::check_name(&id).is_ok(), "{id}");
    }

    #[test]
    fn a_stored_spec_the_types_refuse_is_named_by_its_field() {
        let spec = serde_json::json!({
            "replicas": 1,
            "topology": [{"from": {"topic": "a"}}, {"groupBy": 42}],
        });
        let e = spec_from_json(&spec)
            .expect_err("a number is no expression")
            .to_string();
        assert!(
            e.contains("spec.topology[1]") && e.contains("GroupBy"),
            "{e}"
        );
        assert!(!e.contains(" at line "), "{e}");
        let spec = serde_json::json!({"replicas": "two", "topology": [{"from": {"topic": "a"}}]});
        let e = spec_from_json(&spec).expect_err("not a number").to_string();
        assert!(
            e.contains("spec.replicas") && e.contains("invalid type"),
            "{e}"
        );
        let ok = spec_from_json(&serde_json::json!({"topology": [{"from": {"topic": "a"}}]}));
        assert_eq!(ok.expect("valid").topology.len(), 1);
    }
}

//! Reading apps leniently. The controller watches [`RawApp`]s, whose spec and status stay
//! JSON, so listing and watching cannot fail on one resource the types refuse (stored before
//! a schema change, or a value the schema lets through such as `groupBy: 42`): a typed watch
//! fails whole, which stopped every app in every namespace and blocked their deletion. Each
//! app is parsed on its own; one that does not parse is marked `InvalidSpec`, alone, and
//! stays deletable. That holds for JSON nested deeper than serde_json reads (128 levels,
//! which the API server allows in open fields such as `podTemplate`): see [`RawApp`]'s
//! `Deserialize`.

use eddy_crds::resource::{AppStatus, StatefulStreamApp};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A `StatefulStreamApp` as stored: typed metadata, spec and status as JSON.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RawApp {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// Paths of the spec's parts too deeply nested to read (`spec.podTemplate`, or `spec`
    /// itself): left out of `spec`, named by `parse`.
    #[serde(skip)]
    pub unreadable: Vec<String>,
}

/// serde_json refuses JSON nested deeper than 128 levels, so a `Value` spec made one such
/// app fail the whole list or watch (every app of its scope stalled). Each part is taken
/// as raw text first (skipping raw text has no depth limit) and read on its own; what
/// cannot be read is left out and named, never fatal.
impl<'de> Deserialize<'de> for RawApp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        use serde_json::value::RawValue;
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Option<Box<RawValue>>,
            #[serde(default)]
            spec: Option<Box<RawValue>>,
            #[serde(default)]
            status: Option<Box<RawValue>>,
        }
        let w = Wire::deserialize(d)?;
        let metadata = match &w.metadata {
            None => ObjectMeta::default(),
            Some(m) => read_metadata(m.get()).map_err(D::Error::custom)?,
        };
        let (spec, unreadable) = w.spec.as_deref().map_or_else(Default::default, read_spec);
        let status = w
            .status
            .as_deref()
            .and_then(|s| serde_json::from_str(s.get()).ok());
        Ok(RawApp {
            metadata,
            spec,
            status,
            unreadable,
        })
    }
}

/// The metadata, without `managedFields` if needed: their `fieldsV1` mirror the object's
/// fields, as deeply nested as the deepest, and the operator has no use for them.
fn read_metadata(text: &str) -> Result<ObjectMeta, serde_json::Error> {
    if let Ok(m) = serde_json::from_str(text) {
        return Ok(m);
    }
    let mut fields: BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(text)?;
    fields.remove("managedFields");
    serde_json::from_str(&serde_json::to_string(&fields)?)
}

/// The spec as JSON, or the fields of it that can be read and the names of those that cannot.
fn read_spec(raw: &serde_json::value::RawValue) -> (serde_json::Value, Vec<String>) {
    if let Ok(v) = serde_json::from_str(raw.get()) {
        return (v, Vec::new());
    }
    let Ok(fields) =
        serde_json::from_str::<BTreeMap<String, Box<serde_json::value::RawValue>>>(raw.get())
    else {
        return (serde_json::Value::Null, vec!["spec".into()]);
    };
    let (mut spec, mut unreadable) = (serde_json::Map::new(), Vec::new());
    for (k, v) in fields {
        match serde_json::from_str(v.get()) {
            Ok(v) => {
                spec.insert(k, v);
            }
            Err(_) => unreadable.push(format!("spec.{k}")),
        }
    }
    (serde_json::Value::Object(spec), unreadable)
}

impl Resource for RawApp {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        StatefulStreamApp::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        StatefulStreamApp::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        StatefulStreamApp::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        StatefulStreamApp::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Which application id an app holds, and since when: the older holder keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct AppClaim {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    pub application_id: String,
}

impl AppClaim {
    /// Ordering of claims on one id: creation time (unknown last), then namespace/name.
    pub fn precedence(&self) -> (bool, Option<k8s_openapi::jiff::Timestamp>, &str, &str) {
        (
            self.created.is_none(),
            self.created,
            &self.namespace,
            &self.name,
        )
    }

    /// `other` holds the same id and came first, so this app must give way.
    pub fn yields_to(&self, other: &AppClaim) -> bool {
        let same_app = match (&self.uid, &other.uid) {
            (Some(a), Some(b)) => a == b,
            _ => (&self.namespace, &self.name) == (&other.namespace, &other.name),
        };
        !same_app
            && self.application_id == other.application_id
            && other.precedence() < self.precedence()
    }
}

impl RawApp {
    /// The typed app, or why its spec cannot be read (with the field's path).
    pub fn parse(&self) -> Result<StatefulStreamApp, String> {
        if let Some(field) = self.unreadable.first() {
            return Err(format!(
                "{field} is nested more than 128 levels deep, deeper than eddy reads: flatten it"
            ));
        }
        let spec = eddy_crds::manifest::spec_from_json(&self.spec).map_err(|e| e.to_string())?;
        Ok(StatefulStreamApp {
            metadata: self.metadata.clone(),
            spec,
            status: Some(self.status_or_default()),
        })
    }

    /// The status, or an empty one if it cannot be read (the operator rewrites it whole;
    /// workers re-report their entries).
    pub fn status_or_default(&self) -> AppStatus {
        match &self.status {
            None => AppStatus::default(),
            Some(s) => serde_json::from_value(s.clone()).unwrap_or_else(|e| {
                tracing::warn!(app = %self.id(), "status cannot be read, starting afresh: {e}");
                AppStatus::default()
            }),
        }
    }

    /// `namespace/name`, for logs and messages.
    pub fn id(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// The application id this app holds, read from the raw spec so that an app whose spec
    /// does not parse (and whose workers may still run) keeps holding it.
    pub fn claim(&self) -> AppClaim {
        let name = self.metadata.name.clone().unwrap_or_default();
        let namespace = self.metadata.namespace.clone().unwrap_or_default();
        AppClaim {
            application_id: eddy_crds::manifest::application_id(
                Some(&namespace),
                &name,
                self.spec.get("applicationId").and_then(|v| v.as_str()),
            ),
            namespace,
            name,
            uid: self.metadata.uid.clone(),
            created: self.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// `spec.cleanupPolicy` as written, for deleting an app whose spec does not parse.
    pub fn deletes_topics(&self) -> bool {
        self.spec.get("cleanupPolicy").and_then(|v| v.as_str()) == Some("Delete")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(ns: &str, name: &str, created: &str, spec: serde_json::Value) -> RawApp {
        // As the API server sends it: text (raw parts cannot come from a `Value`).
        let text = json!({
            "apiVersion": "eddy.dev/v1alpha1", "kind": "StatefulStreamApp",
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}"),
                         "creationTimestamp": created},
            "spec": spec,
        })
        .to_string();
        serde_json::from_str(&text).expect("any spec reads")
    }

    fn nested(depth: usize) -> serde_json::Value {
        (0..depth).fold(json!("x"), |v, _| json!({ "a": v }))
    }

    #[test]
    fn json_nested_deeper_than_serde_reads_marks_only_its_app() {
        // What a list of two apps looks like: one with a pod template 200 levels deep, and
        // managedFields as deep (the API server mirrors every field there).
        let deep = nested(200);
        let list = json!({
            "apiVersion": "eddy.dev/v1alpha1", "kind": "StatefulStreamAppList", "metadata": {},
            "items": [
                {"metadata": {"name": "deep", "namespace": "a",
                              "managedFields": [{"manager": "kubectl", "operation": "Update",
                                                 "fieldsV1": {"f:spec": deep.clone()}}]},
                 "spec": {"applicationId": "deep-id", "cleanupPolicy": "Delete",
                          "podTemplate": deep, "topology": [{"from": {"topic": "t"}}]},
                 "status": {"phase": "Running", "x": nested(200)}},
                {"metadata": {"name": "fine", "namespace": "a"},
                 "spec": {"topology": [{"from": {"topic": "t"}}]}},
            ],
        })
        .to_string();
        assert!(
            serde_json::from_str::<serde_json::Value>(&list).is_err(),
            "too deep for serde_json"
        );
        let apps: kube::core::ObjectList<RawApp> =
            serde_json::from_str(&list).expect("the list reads");
        let (deep, fine) = (&apps.items[0], &apps.items[1]);
        assert_eq!(deep.metadata.name.as_deref(), Some("deep"));
        let e = deep.parse().expect_err("refused");
        assert!(
            e.contains("spec.podTemplate is nested more than 128 levels"),
            "{e}"
        );
        // What the operator reads for deleting it and holding its id is still there.
        assert_eq!(deep.claim().application_id, "deep-id");
        assert!(deep.deletes_topics());
        assert_eq!(deep.status, None, "an unreadable status starts afresh");
        assert_eq!(fine.parse().expect("valid").spec.topology.len(), 1);
        // So does a watch event.
        // The API server writes `type` before `object` (Go's field order), which lets serde
        // read the object without buffering it.
        let object = json!({"metadata": {"name": "deep", "namespace": "a"},
                            "spec": {"podTemplate": nested(300)}});
        let line = format!(r#"{{"type":"MODIFIED","object":{object}}}"#);
        match serde_json::from_str::<kube::core::WatchEvent<RawApp>>(&line).expect("reads") {
            kube::core::WatchEvent::Modified(a) => assert_eq!(a.unreadable, ["spec.podTemplate"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unreadable_spec_still_reads_as_a_raw_app_and_names_its_field() {
        let bad = raw(
            "a",
            "pv",
            "2024-01-01T00:00:00Z",
            json!({"topology": [{"from": {"topic": "t"}}, {"groupBy": 42}]}),
        );
        let e = bad.parse().expect_err("groupBy: 42 is no expression");
        assert!(e.contains("spec.topology[1]"), "{e}");
        assert_eq!(bad.claim().application_id, "a.pv");
        let good = raw(
            "a",
            "pv",
            "2024-01-01T00:00:00Z",
            json!({"topology": [{"from": {"topic": "t"}}]}),
        );
        assert_eq!(good.parse().expect("valid").spec.topology.len(), 1);
    }

    #[test]
    fn the_newer_app_yields_an_application_id() {
        let spec = json!({"applicationId": "shared", "topology": []});
        let old = raw("b", "x", "2024-01-01T00:00:00Z", spec.clone()).claim();
        let new = raw("a", "y", "2024-01-02T00:00:00Z", spec.clone()).claim();
        assert!(new.yields_to(&old));
        assert!(!old.yields_to(&new));
        assert!(!old.yields_to(&old), "an app never yields to itself");
        // Same second: namespace/name decides, the same way for both.
        let twin = raw("c", "z", "2024-01-01T00:00:00Z", spec).claim();
        assert!(twin.yields_to(&old) && !old.yields_to(&twin));
        // An explicit id equal to another app's default collides too.
        let by_default = raw("b", "x", "2024-01-01T00:00:00Z", json!({})).claim();
        let explicit = raw(
            "a",
            "q",
            "2024-01-03T00:00:00Z",
            json!({"applicationId": "b.x"}),
        )
        .claim();
        assert!(explicit.yields_to(&by_default));
        let elsewhere = raw("c", "x", "2024-01-03T00:00:00Z", json!({})).claim();
        assert!(
            !elsewhere.yields_to(&by_default),
            "same name, other namespace"
        );
    }
}

//! Reading apps leniently. The controller watches [`RawApp`]s, whose spec and status stay
//! JSON, so listing and watching cannot fail on one resource the types refuse (stored before
//! a schema change, or a value the schema lets through such as `groupBy: 42`): a typed watch
//! fails whole, which stopped every app in every namespace and blocked their deletion. Each
//! app is parsed on its own; one that does not parse is marked `InvalidSpec`, alone, and
//! stays deletable.

use eddy_crds::resource::{AppStatus, StatefulStreamApp};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A `StatefulStreamApp` as stored: typed metadata, spec and status as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RawApp {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
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
        serde_json::from_value(json!({
            "apiVersion": "eddy.dev/v1alpha1", "kind": "StatefulStreamApp",
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}"),
                         "creationTimestamp": created},
            "spec": spec,
        }))
        .expect("any spec reads")
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

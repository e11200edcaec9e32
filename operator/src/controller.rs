//! The thin layer around [`crate::reconcile::reconcile`]: gathers its inputs (the app, its
//! StatefulSet, what Kafka says), applies its outputs (objects by server-side apply, internal
//! topics through the Kafka admin API, status, events), and deletes internal topics on
//! delete when the app's `cleanupPolicy` says so (finalizer). One failing app only delays
//! itself: errors are reported on that app and retried with back-off.

use crate::kafka;
use crate::metrics::Metrics;
use crate::reconcile::{self, KafkaFacts, Observed};
use crate::resources::Objects;
use eddy_crds::resource::StatefulStreamApp;
use eddy_crds::spec::CleanupPolicy;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MANAGER: &str = "eddy-operator";
const FINALIZER: &str = "eddy.dev/cleanup";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Kafka(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

pub struct Ctx {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
}

/// Run the controller until the process stops.
pub async fn run(client: Client, metrics: Arc<Metrics>, identity: String) {
    let apps: Api<StatefulStreamApp> = Api::all(client.clone());
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance: Some(identity),
            },
        ),
        client: client.clone(),
        metrics,
    });
    Controller::new(apps, watcher::Config::default())
        .owns(Api::<StatefulSet>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile_app, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("reconcile: {e}");
            }
        })
        .await;
}

async fn reconcile_app(app: Arc<StatefulStreamApp>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = app.namespace().unwrap_or_default();
    let api: Api<StatefulStreamApp> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, app, |event| async {
        match event {
            Finalize::Apply(app) => apply(&app, &ctx).await,
            Finalize::Cleanup(app) => cleanup(&app, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(e.to_string()));
    ctx.metrics.observe(started.elapsed(), result.is_ok());
    result
}

fn error_policy(app: Arc<StatefulStreamApp>, error: &Error, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(app = %app.name_any(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(10))
}

async fn apply(app: &StatefulStreamApp, ctx: &Ctx) -> Result<Action, Error> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let sts: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let observed = Observed {
        ready_replicas: sts
            .get_opt(&name)
            .await?
            .and_then(|s| s.status)
            .map(|s| s.ready_replicas.unwrap_or(0)),
    };
    // Credentials are read from the app's Secrets on each reconcile and kept in memory.
    let conn = match kafka::connect(&ctx.client, &ns, &app.spec).await {
        Err(kafka::CredentialsError::Unavailable { source, .. }) => return Err(source.into()),
        conn => conn,
    };
    let facts = match &conn {
        Ok(conn) => kafka::facts(conn).await,
        Err(e) => KafkaFacts::CredentialsMissing(e.to_string()),
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut desired = reconcile::reconcile(app, &observed, &facts, &now);

    if !desired.topics.is_empty()
        && let KafkaFacts::Topics(_) = facts
        && let Ok(conn) = &conn
        && let Err(e) = kafka::create_topics(conn, &app.spec, &desired.topics).await
    {
        desired.events.push(reconcile::Event {
            warning: true,
            reason: "TopicCreationFailed".into(),
            message: e.clone(),
        });
    }
    if let Some(objects) = &desired.objects {
        apply_objects(ctx, &ns, objects).await?;
    }
    patch_status(app, ctx, &desired.status).await?;
    for e in &desired.events {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.clone(),
            note: Some(e.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &app.object_ref(&())).await {
            tracing::warn!(app = %name, "publishing an event: {err}");
        }
    }
    let degraded = desired.status.phase == Some(eddy_crds::resource::Phase::Degraded);
    // Degraded apps are retried with back-off; healthy ones are woken by watch events.
    Ok(Action::requeue(Duration::from_secs(if degraded {
        15
    } else {
        300
    })))
}

async fn apply_one<K>(ctx: &Ctx, ns: &str, obj: &K) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut v = serde_json::to_value(obj).map_err(|e| Error::Kafka(e.to_string()))?;
    let dt = K::DynamicType::default();
    v["apiVersion"] = K::api_version(&dt).into();
    v["kind"] = K::kind(&dt).into();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&v),
    )
    .await?;
    Ok(())
}

async fn apply_objects(ctx: &Ctx, ns: &str, o: &Objects) -> Result<(), Error> {
    apply_one(ctx, ns, &o.service_account).await?;
    apply_one(ctx, ns, &o.role).await?;
    apply_one(ctx, ns, &o.role_binding).await?;
    apply_one(ctx, ns, &o.config_map).await?;
    apply_one(ctx, ns, &o.service).await?;
    apply_one(ctx, ns, &o.pdb).await?;
    apply_one(ctx, ns, &o.stateful_set).await?;
    Ok(())
}

/// Patch the status by a JSON merge patch holding only what changed. Workers own their
/// `status.workers.<pod>` entries (server-side apply, one field manager per pod), so the
/// operator leaves them alone except to remove entries of pods that are gone; and a merge
/// patch only removes map keys it sets to null, which the diff does for every key dropped.
async fn patch_status(
    app: &StatefulStreamApp,
    ctx: &Ctx,
    status: &eddy_crds::resource::AppStatus,
) -> Result<(), Error> {
    let api: Api<StatefulStreamApp> =
        Api::namespaced(ctx.client.clone(), &app.namespace().unwrap_or_default());
    let old = serde_json::to_value(app.status.clone().unwrap_or_default())
        .map_err(|e| Error::Kafka(e.to_string()))?;
    let new = serde_json::to_value(status).map_err(|e| Error::Kafka(e.to_string()))?;
    let Some(diff) = merge_diff(&old, &new) else {
        return Ok(());
    };
    api.patch_status(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": diff})),
    )
    .await?;
    Ok(())
}

/// The RFC 7386 merge patch turning `old` into `new`, or None if they are equal.
pub fn merge_diff(old: &serde_json::Value, new: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, v) {
                            patch.insert(k.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        (o, n) if o == n => None,
        (_, n) => Some(n.clone()),
    }
}

/// On delete: remove internal topics if the app asked for it, then let Kubernetes' garbage
/// collector remove the owned objects.
async fn cleanup(app: &StatefulStreamApp, ctx: &Ctx) -> Result<Action, Error> {
    if app.spec.cleanup_policy == CleanupPolicy::Delete {
        let topics = kafka::internal_topics(&app.spec, &app.name_any()).await;
        let ns = app.namespace().unwrap_or_default();
        let deleted = match kafka::connect(&ctx.client, &ns, &app.spec).await {
            Ok(conn) => kafka::delete_topics(&conn, &topics).await,
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = deleted {
            // Never block deletion forever on an unreachable Kafka: report and go on.
            tracing::warn!(app = %app.name_any(), "deleting internal topics: {e}");
            let ev = Event {
                type_: EventType::Warning,
                reason: "TopicDeletionFailed".into(),
                note: Some(e),
                action: "Cleanup".into(),
                secondary: None,
            };
            let _ = ctx.recorder.publish(&ev, &app.object_ref(&())).await;
        }
    }
    Ok(Action::await_change())
}

/// Install the CRD (used by tests and `eddy-operator install-crd`).
pub async fn install_crd(client: Client) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let crd = eddy_crds::resource::crd();
    let mut v = serde_json::to_value(&crd).map_err(|e| Error::Kafka(e.to_string()))?;
    v["apiVersion"] = "apiextensions.k8s.io/v1".into();
    v["kind"] = "CustomResourceDefinition".into();
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&v),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::merge_diff;
    use serde_json::json;

    #[test]
    fn merge_diff_nulls_dropped_keys_and_omits_unchanged_ones() {
        let old =
            json!({"a": 1, "pods": {"p0": {"x": [1]}, "p1": {"x": [2]}}, "workers": {"p0": 1}});
        let new = json!({"a": 1, "pods": {"p0": {"x": [1, 2]}}, "workers": {"p0": 1}});
        assert_eq!(
            merge_diff(&old, &new),
            Some(json!({"pods": {"p0": {"x": [1, 2]}, "p1": null}}))
        );
        assert_eq!(merge_diff(&new, &new), None);
    }
}

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
    let facts = kafka::facts(&app.spec).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut desired = reconcile::reconcile(app, &observed, &facts, &now);

    if !desired.topics.is_empty()
        && let KafkaFacts::Topics(_) = facts
        && let Err(e) = kafka::create_topics(&app.spec, &desired.topics).await
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

/// Merge-patch the status the operator owns. Workers own their own `status.workers.<pod>`
/// entries (server-side apply, one field manager per pod), so the operator only removes
/// entries of pods that are gone.
async fn patch_status(
    app: &StatefulStreamApp,
    ctx: &Ctx,
    status: &eddy_crds::resource::AppStatus,
) -> Result<(), Error> {
    let api: Api<StatefulStreamApp> =
        Api::namespaced(ctx.client.clone(), &app.namespace().unwrap_or_default());
    let mut v = serde_json::to_value(status).map_err(|e| Error::Kafka(e.to_string()))?;
    let mut workers = serde_json::Map::new();
    for pod in app
        .status
        .as_ref()
        .map(|s| s.workers.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if !status.workers.contains_key(&pod) {
            workers.insert(pod, serde_json::Value::Null);
        }
    }
    v["workers"] = serde_json::Value::Object(workers);
    if app.status.as_ref() == Some(status) {
        return Ok(());
    }
    api.patch_status(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": v})),
    )
    .await?;
    Ok(())
}

/// On delete: remove internal topics if the app asked for it, then let Kubernetes' garbage
/// collector remove the owned objects.
async fn cleanup(app: &StatefulStreamApp, ctx: &Ctx) -> Result<Action, Error> {
    if app.spec.cleanup_policy == CleanupPolicy::Delete {
        let topics = kafka::internal_topics(&app.spec, &app.name_any()).await;
        if let Err(e) = kafka::delete_topics(&app.spec, &topics).await {
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

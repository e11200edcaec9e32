//! The thin layer around [`crate::reconcile::reconcile`]: gathers its inputs (the app, who
//! holds the names of its objects, its StatefulSet, every app's application id, what Kafka
//! says), applies its outputs (objects by server-side apply, internal topics through the Kafka
//! admin API, status, events), and deletes internal topics on delete when the app's
//! `cleanupPolicy` says so (finalizer). One failing app only delays itself: apps are read
//! leniently ([`RawApp`]), a refused object is a problem on its app, and errors are retried
//! with back-off.

use crate::app::RawApp;
use crate::kafka;
use crate::metrics::{AppSeries, Metrics};
use crate::placement::PodObserved;
use crate::reconcile::{self, Foreign, KafkaFacts, Observed, Problem, Reason};
use crate::resources::{self, Kind, Objects};
use eddy_crds::spec::CleanupPolicy;
use futures::{FutureExt, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

pub const MANAGER: &str = "eddy-operator";
const FINALIZER: &str = "eddy.dev/cleanup";
/// The label every object the operator creates carries (`resources::labels`).
const MANAGED: &str = "app.kubernetes.io/managed-by=eddy-operator";
/// The label every worker pod carries (`resources::selector_labels`, the StatefulSet's
/// selector, so a pod template override cannot remove it).
const WORKER_PODS: &str = "app.kubernetes.io/name=eddy-worker";
/// The label naming a worker pod's app.
const INSTANCE: &str = "app.kubernetes.io/instance";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    // Also the source: kube's error text leaves out its cause (the connection's), which the
    // binary's report then adds; the text itself is not said twice.
    Kube(#[source] kube::Error),
    #[error("{0}")]
    Kafka(String),
    #[error("encoding an object: {0}")]
    Json(serde_json::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The API server refused a status write that changes the assignment because what it
    /// was decided from changed since the reconcile read the app (the assignment generation,
    /// or a report of a pod it fails over): decided again from the newer app.
    #[error("the app changed since it was read: its assignment is decided again")]
    Conflict,
    /// A status write's JSON Patch does not apply to the status it was made from (a bug).
    #[error("the status patch does not apply to the status read: {0}")]
    StatusPatch(json_patch::PatchError),
}

// By hand rather than `#[from]`, which would also make the cause the error's `source()`:
// the text already holds it, and error reports print each cause once.
impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Json(e)
    }
}

impl From<json_patch::PatchError> for Error {
    fn from(e: json_patch::PatchError) -> Self {
        Error::StatusPatch(e)
    }
}

pub struct Ctx {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub events: crate::events::Events,
    /// Every app the operator watches, from the controllers' own watch caches (one per
    /// watched namespace, or one for all): who holds which application id.
    pub apps: Vec<Store<RawApp>>,
    pub owned: OwnedCache,
    /// Every worker pod, from a watch that also triggers its app's reconcile: the assignor
    /// sees pods go and come back (failover) without a request per reconcile.
    pub pods: Store<Pod>,
    /// Per app uid, the assignment generation this operator last wrote. The watch cache can
    /// lag behind our own status write; a reconcile deciding from the older status would be
    /// refused (its write tests the generation read) after asking Kafka for nothing, and
    /// where the older status had no assignment there is no generation to test: it would
    /// publish a different assignment under a generation already used (workers, which act
    /// on a new generation only, would never see it). Trusted for a few seconds only, so a
    /// status someone else reset does not stop the app's reconciles.
    pub written: std::sync::Mutex<std::collections::HashMap<String, (i64, Instant)>>,
    /// How every app's workers run (the operator's flags).
    pub workers: resources::WorkerSettings,
    /// When this operator first saw each worker's current report: silence is measured on
    /// its own clock.
    pub report_clock: crate::report_clock::ReportClock,
}

impl Ctx {
    fn all_apps(&self) -> Vec<Arc<RawApp>> {
        self.apps.iter().flat_map(Store::state).collect()
    }

    fn written_generation(&self, uid: &str) -> Option<i64> {
        let written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written
            .get(uid)
            .filter(|(_, at)| at.elapsed() < Duration::from_secs(10))
            .map(|(generation, _)| *generation)
    }

    fn wrote_generation(&self, uid: &str, generation: i64) {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.insert(uid.to_string(), (generation, Instant::now()));
    }

    fn forget(&self, uid: &str) {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.remove(uid);
    }
}

/// Metadata-only watch caches of the objects the operator labelled as its own, one per kind:
/// whether this app controls an object is known without a GET per object and reconcile. An
/// object missing from them (not created yet, or someone else's, unlabelled) costs one GET.
pub struct OwnedCache {
    service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    roles: Store<PartialObjectMeta<Role>>,
    role_bindings: Store<PartialObjectMeta<RoleBinding>>,
    config_maps: Store<PartialObjectMeta<ConfigMap>>,
    services: Store<PartialObjectMeta<Service>>,
    network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    pdbs: Store<PartialObjectMeta<PodDisruptionBudget>>,
}

impl OwnedCache {
    /// Caches of one namespace, or of all (`None`).
    pub fn start(client: &Client, ns: Option<&str>) -> Self {
        Self {
            service_accounts: cache(client, ns),
            roles: cache(client, ns),
            role_bindings: cache(client, ns),
            config_maps: cache(client, ns),
            services: cache(client, ns),
            network_policies: cache(client, ns),
            pdbs: cache(client, ns),
        }
    }

    fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<ObjectMeta> {
        fn one<K: Resource<DynamicType = ()> + Clone>(
            s: &Store<PartialObjectMeta<K>>,
            ns: &str,
            name: &str,
        ) -> Option<ObjectMeta> {
            s.get(&ObjectRef::new(name).within(ns))
                .map(|m| m.metadata.clone())
        }
        match kind {
            Kind::ServiceAccount => one(&self.service_accounts, ns, name),
            Kind::Role => one(&self.roles, ns, name),
            Kind::RoleBinding => one(&self.role_bindings, ns, name),
            Kind::ConfigMap => one(&self.config_maps, ns, name),
            Kind::Service | Kind::QueryService => one(&self.services, ns, name),
            Kind::NetworkPolicy => one(&self.network_policies, ns, name),
            Kind::PodDisruptionBudget => one(&self.pdbs, ns, name),
            Kind::StatefulSet => None,
        }
    }
}

fn cache<K>(client: &Client, ns: Option<&str>) -> Store<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        // An `Api` of `PartialObjectMeta` makes metadata-only requests.
        watcher(
            scoped_api::<PartialObjectMeta<K>>(client, ns),
            watcher::Config::default().labels(MANAGED),
        ),
    )
    .default_backoff();
    tokio::spawn(stream.for_each(|e| async move {
        if let Err(e) = e {
            tracing::debug!("watching {}: {e}", K::kind(&()));
        }
    }));
    reader
}

fn api_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::ServiceAccount => ApiResource::erase::<ServiceAccount>(&()),
        Kind::Role => ApiResource::erase::<Role>(&()),
        Kind::RoleBinding => ApiResource::erase::<RoleBinding>(&()),
        Kind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
        Kind::Service | Kind::QueryService => ApiResource::erase::<Service>(&()),
        Kind::NetworkPolicy => ApiResource::erase::<NetworkPolicy>(&()),
        Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
        Kind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
    }
}

/// The namespaces the operator watches: every one, or only those listed
/// (`--watch-namespaces`), so that it can run with Roles in those namespaces instead of a
/// ClusterRole, or several operators can split a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    #[default]
    All,
    Namespaces(Vec<String>),
}

#[derive(Debug, thiserror::Error)]
#[error(
    "watch namespaces: {0:?} is not a namespace name (lower-case letters, digits and '-', at most 63 characters, starting and ending with a letter or digit)"
)]
pub struct BadNamespace(String);

impl Scope {
    /// The namespaces given (empty entries ignored, duplicates dropped), checked to be valid
    /// names: a typo would otherwise watch a namespace that can never exist, silently.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Result<Self, BadNamespace> {
        let mut list: Vec<String> = Vec::new();
        for name in names.iter().map(|n| n.as_ref().trim()) {
            if name.is_empty() || list.iter().any(|n| n == name) {
                continue;
            }
            if !eddy_crds::resource::is_dns_label(name) {
                return Err(BadNamespace(name.to_string()));
            }
            list.push(name.to_string());
        }
        Ok(if list.is_empty() {
            Scope::All
        } else {
            Scope::Namespaces(list)
        })
    }

    /// One entry per watch: a namespace, or `None` for all of them.
    fn watches(&self) -> Vec<Option<String>> {
        match self {
            Scope::All => vec![None],
            Scope::Namespaces(list) => list.iter().cloned().map(Some).collect(),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::All => f.write_str("all namespaces"),
            Scope::Namespaces(list) => write!(f, "namespaces {}", list.join(", ")),
        }
    }
}

fn scoped_api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Run the controllers until `stop` turns true, then return once the reconciles under way
/// have finished: one controller over all namespaces, or one per watched namespace. kube's
/// watch caches hold one list each (merging several namespaces' watches into one store would
/// let each namespace's relist drop the others' objects), so each namespace gets its own
/// controller and caches; application ids are still checked across every watched namespace.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    identity: String,
    scope: Scope,
    workers: resources::WorkerSettings,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let controllers: Vec<_> = scope
        .watches()
        .into_iter()
        .map(|ns| controller(&client, ns.as_deref()))
        .collect();
    let apps: Vec<Store<RawApp>> = controllers.iter().map(|(c, ..)| c.store()).collect();
    let runs = controllers.into_iter().map(|(controller, pods, ns)| {
        let ctx = Arc::new(Ctx {
            events: crate::events::Events::new(client.clone(), MANAGER, &identity),
            apps: apps.clone(),
            owned: OwnedCache::start(&client, ns.as_deref()),
            pods,
            client: client.clone(),
            metrics: metrics.clone(),
            written: Default::default(),
            workers: workers.clone(),
            report_clock: Default::default(),
        });
        // kube wants a `Sync` trigger: a task's handle is one.
        let mut stop = stop.clone();
        let stopped = tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        controller
            .graceful_shutdown_on(stopped.map(|_| ()))
            .run(reconcile_app, error_policy, ctx)
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!("reconcile: {e}");
                }
            })
    });
    futures::future::join_all(runs).await;
}

/// The controller of one namespace (or all), with the pod cache its reconciles read.
fn controller(
    client: &Client,
    ns: Option<&str>,
) -> (Controller<RawApp>, Store<Pod>, Option<String>) {
    // Apps are watched as `RawApp`: one resource the types cannot read must not fail the
    // watch of all of them. Every change of an app triggers a reconcile, status included:
    // workers' reports are what the assignor acts on.
    let (pods, writer) = reflector::store();
    let pod_events = reflector::reflector(
        writer,
        watcher(
            scoped_api::<Pod>(client, ns),
            watcher::Config::default().labels(WORKER_PODS),
        ),
    )
    .default_backoff()
    .touched_objects();
    let controller = Controller::new(scoped_api::<RawApp>(client, ns), watcher::Config::default())
        .owns(
            scoped_api::<StatefulSet>(client, ns),
            watcher::Config::default(),
        )
        .watches_stream(pod_events, |pod: Pod| {
            let ns = pod.metadata.namespace.clone()?;
            let app = pod.labels().get(INSTANCE)?.clone();
            Some(ObjectRef::<RawApp>::new(&app).within(&ns))
        });
    (controller, pods, ns.map(str::to_string))
}

async fn reconcile_app(app: Arc<RawApp>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = app.namespace().unwrap_or_default();
    let api: Api<RawApp> = Api::namespaced(ctx.client.clone(), &ns);
    // The finalizer is added and removed whatever the spec says: an app whose spec cannot
    // be read stays deletable.
    let result = finalizer(&api, FINALIZER, app, |event| async {
        match event {
            Finalize::Apply(app) => apply(&app, &ctx).await,
            Finalize::Cleanup(app) => cleanup(&app, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(Error::Conflict) => Error::Conflict,
        e => Error::Finalizer(e.to_string()),
    });
    ctx.metrics.observe(
        started.elapsed(),
        match &result {
            Ok(_) => "ok",
            Err(Error::Conflict) => "conflict",
            Err(_) => "error",
        },
    );
    // An app gone without a cleanup this replica saw (its finalizer removed by hand).
    ctx.metrics.retain_apps(|ns, name| {
        let key = ObjectRef::<RawApp>::new(name).within(ns);
        ctx.apps.iter().any(|store| store.get(&key).is_some())
    });
    result
}

fn error_policy(app: Arc<RawApp>, error: &Error, _ctx: Arc<Ctx>) -> Action {
    if let Error::Conflict = error {
        // Nothing failed: what this reconcile decided from moved on meanwhile (a pod it
        // failed over reported, or another leader published an assignment); decide again.
        tracing::debug!(app = %app.id(), "{error}");
        // The newer app reaches the watch cache within milliseconds and triggers a reconcile
        // by itself; retrying at once would read the same stale copy (and ask Kafka again).
        return Action::requeue(Duration::from_millis(100));
    }
    tracing::warn!(app = %app.id(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(10))
}

/// True when `meta` names the app with this uid as its controller.
fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Who holds an object, for a NameConflict message about app `app`.
fn holder(meta: &ObjectMeta, app: &str) -> String {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    match refs.iter().find(|o| o.controller == Some(true)) {
        Some(o) if o.kind == eddy_crds::KIND && o.name == app => format!(
            "its controller is an earlier {} {app} (uid {}) that Kubernetes is still deleting: this resolves itself",
            o.kind, o.uid
        ),
        Some(o) => format!("its controller is {} {}", o.kind, o.name),
        None if refs.is_empty() => "it was created by someone else and has no owner".into(),
        None => format!(
            "it is owned by {}, without a controller",
            refs.iter()
                .map(|o| format!("{} {}", o.kind, o.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Queries switched off: the app's query Service and NetworkPolicy go (only if they are the
/// app's own).
async fn remove_query_objects(
    ctx: &Ctx,
    ns: &str,
    app: &eddy_crds::resource::StatefulStreamApp,
    uid: &str,
) -> Result<(), Error> {
    let name = resources::query_service_name(app);
    for kind in [Kind::QueryService, Kind::NetworkPolicy] {
        if !ctx
            .owned
            .get(kind, ns, &name)
            .is_some_and(|m| controlled_by(&m, uid))
        {
            continue;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), ns, &api_resource(kind));
        match api.delete(&name, &Default::default()).await {
            Ok(_) => tracing::info!(%kind, %name, ns, "queries switched off: deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether an object of this app's may be applied: None when it is the app's own or does
/// not exist, else who holds it. The watch cache answers for the app's own objects; anything
/// else is checked with one GET, so a stale cache never leads to touching another's object.
async fn held_by_other(
    ctx: &Ctx,
    ns: &str,
    kind: Kind,
    name: &str,
    app: &str,
    uid: &str,
) -> Result<Option<String>, Error> {
    if ctx
        .owned
        .get(kind, ns, name)
        .is_some_and(|m| controlled_by(&m, uid))
    {
        return Ok(None);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &api_resource(kind));
    Ok(match api.get_metadata_opt(name).await? {
        Some(m) if !controlled_by(&m.metadata, uid) => Some(holder(&m.metadata, app)),
        _ => None,
    })
}

async fn apply(raw: &RawApp, ctx: &Ctx) -> Result<Action, Error> {
    let ns = raw.namespace().unwrap_or_default();
    let name = raw.name_any();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let prev = raw.status_or_default();
    let app = match raw.parse() {
        Ok(app) => app,
        Err(e) => {
            tracing::warn!(app = %raw.id(), "spec cannot be read: {e}");
            let desired = reconcile::unreadable(&raw.metadata, &prev, &e, &now);
            patch_status(&ctx.client, raw, &desired.status).await?;
            ctx.metrics
                .set_app(&ns, &name, &AppSeries::of(&desired.status, None));
            publish(ctx, raw, &desired.events).await;
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    };
    let uid = raw.uid().unwrap_or_default();
    let seen = prev.assignment.as_ref().map_or(0, |a| a.generation);
    if ctx.written_generation(&uid).is_some_and(|w| seen < w) {
        // Our last write is on its way into the cache; its watch event reconciles again.
        return Ok(Action::requeue(Duration::from_millis(200)));
    }

    // The spec the workers run (the app's own ConfigMap): a change that would lose data is
    // held, and everything below (Kafka, topics, objects) then follows the running spec.
    let running = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&resources::config_map_name(&app))
        .await?
        .filter(|c| controlled_by(&c.metadata, &uid))
        .and_then(|c| running_spec(&c));
    let asked = app;
    let app = reconcile::gate::effective(&asked, running.as_ref());

    // What the cluster and Kafka say, asked at the same time: a reconcile takes as long as
    // the slowest answer, not their sum.
    let others: Vec<(Kind, String)> = resources::object_names(&app)
        .into_iter()
        .filter(|(kind, _)| *kind != Kind::StatefulSet)
        .collect();
    // Credentials are read from the app's Secrets on each reconcile and kept in memory.
    let conn = match kafka::connect(&ctx.client, &ns, &app.spec).await {
        Err(kafka::CredentialsError::Unavailable { cause: source, .. }) => {
            return Err(source.into());
        }
        conn => conn,
    };
    let kafka_facts = async {
        match &conn {
            Ok(conn) => kafka::facts(conn).await,
            Err(e @ kafka::CredentialsError::NotAllowed { .. }) => {
                KafkaFacts::CredentialsNotAllowed(e.to_string())
            }
            Err(e) => KafkaFacts::CredentialsMissing(e.to_string()),
        }
    };
    let (sts, held, facts) = futures::future::join3(
        Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns).get_opt(&name),
        futures::future::try_join_all(
            others
                .iter()
                .map(|(kind, object)| held_by_other(ctx, &ns, *kind, object, &name, &uid)),
        ),
        kafka_facts,
    )
    .await;
    let mut observed = Observed {
        claims: ctx.all_apps().iter().map(|a| a.claim()).collect(),
        pods: observe_pods(&ctx.pods, &ns, &name),
        revisions: pod_revisions(&ctx.pods, &ns, &name),
        credentials_digest: conn.as_ref().ok().and_then(|c| c.digest(&uid)),
        running,
        report_ages: ctx
            .report_clock
            .ages(&uid, &prev.workers, std::time::Instant::now()),
        ..Default::default()
    };
    let own_sts = match sts? {
        Some(s) if controlled_by(&s.metadata, &uid) => {
            observed.ready_replicas = Some(
                s.status
                    .as_ref()
                    .and_then(|st| st.ready_replicas)
                    .unwrap_or(0),
            );
            observed.stateful_set = Some(own_stateful_set(&s));
            Some(s)
        }
        Some(s) => {
            observed.foreign.push(Foreign {
                kind: Kind::StatefulSet,
                name: name.clone(),
                holder: holder(&s.metadata, &name),
            });
            None
        }
        None => None,
    };
    for ((kind, object), holder) in others.into_iter().zip(held?) {
        if let Some(holder) = holder {
            observed.foreign.push(Foreign {
                kind,
                name: object,
                holder,
            });
        }
    }

    let mut desired = reconcile::reconcile_with(&asked, &observed, &facts, &now, &ctx.workers);
    if !desired.distrusted.is_empty() {
        tracing::warn!(app = %raw.id(), "status.assignment holds what the operator did not write, ignored: {}", desired.distrusted.join("; "));
    }

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
    let mut sts_applied = false;
    if let Some(objects) = &desired.objects {
        let (refused, applied) =
            apply_objects(ctx, &ns, objects, &desired.hold, own_sts.as_ref()).await?;
        sts_applied = applied;
        desired.add_problems(&prev, app.metadata.generation, refused, &now);
    }
    if !app.spec.queries_enabled() {
        remove_query_objects(ctx, &ns, &app, &uid).await?;
    }
    patch_status(&ctx.client, raw, &desired.status).await?;
    ctx.metrics.set_app(
        &ns,
        &name,
        &AppSeries::of(&desired.status, Some(reconcile::acceptable_lag(&app))),
    );
    if let Some(a) = &desired.status.assignment {
        ctx.wrote_generation(&uid, a.generation);
    }
    publish(ctx, raw, &desired.events).await;
    if sts_applied {
        publish(ctx, raw, &desired.lifecycle).await;
    }
    // After the status: the assignment that empties the pod is written before it goes.
    if let Some(restart) = &desired.restart
        && restart_pod(ctx, &ns, &name, restart).await?
    {
        tracing::info!(app = %raw.id(), pod = %restart.pod, revision = %restart.revision, "rolling update: restarted the pod");
        let held = if restart.drained {
            "it held no active task"
        } else {
            "it restarts with its tasks (no other pod could take them)"
        };
        let message = format!(
            "evicted pod {} for the rolling update to revision {}: {held}; the StatefulSet recreates it from the new template on its volume",
            restart.pod, restart.revision
        );
        publish(
            ctx,
            raw,
            &[reconcile::Event {
                warning: false,
                reason: "PodRestarted".into(),
                message,
            }],
        )
        .await;
    }
    // Moves waiting for a catch-up are looked at every second (a report usually wakes the
    // reconcile sooner); otherwise every 10 s, since a worker that stops reporting sends
    // no event (`STALE_REPORT_SECONDS`); a Degraded app is retried as often.
    Ok(Action::requeue(if desired.in_flight() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    }))
}

/// The app's worker pods as the assignor sees them, from the watch cache; None until the
/// cache has synced (every pod then counts as up: no failover on an empty cache).
fn observe_pods(
    pods: &Store<Pod>,
    ns: &str,
    app: &str,
) -> Option<std::collections::BTreeMap<String, PodObserved>> {
    use futures::FutureExt;
    if pods.wait_until_ready().now_or_never().is_none() {
        tracing::info!(
            app,
            ns,
            "the pod cache has not synced yet: no failover this time"
        );
        return None;
    }
    Some(
        app_pods(pods, ns, app)
            .filter_map(|p| Some((p.metadata.name.clone()?, observe_pod(&p))))
            .collect(),
    )
}

/// The spec in the app's own ConfigMap: what its workers run (None if it cannot be read,
/// e.g. written by an operator that wrote it otherwise: nothing is then held).
fn running_spec(c: &ConfigMap) -> Option<eddy_crds::AppSpec> {
    let file = c.data.as_ref()?.get("app.yaml")?;
    let doc: serde_yaml::Value = serde_yaml::from_str(file).ok()?;
    serde_yaml::from_value(doc.get("spec")?.clone()).ok()
}

/// The label the StatefulSet controller gives each pod: the revision of its template.
const REVISION: &str = "controller-revision-hash";

/// The template revision each of the app's worker pods runs, from the watch cache.
fn pod_revisions(
    pods: &Store<Pod>,
    ns: &str,
    app: &str,
) -> std::collections::BTreeMap<String, String> {
    app_pods(pods, ns, app)
        .filter_map(|p| Some((p.metadata.name.clone()?, p.labels().get(REVISION)?.clone())))
        .collect()
}

/// The app's worker pods in the watch cache (only names of its StatefulSet's pods).
fn app_pods<'a>(
    pods: &'a Store<Pod>,
    ns: &'a str,
    app: &'a str,
) -> impl Iterator<Item = Arc<Pod>> + 'a {
    pods.state().into_iter().filter(move |p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(INSTANCE).map(String::as_str) == Some(app)
            && p.metadata
                .name
                .as_deref()
                .is_some_and(|n| crate::placement::sanitize::pod_ordinal(app, n).is_some())
    })
}

/// Evict a worker pod for the rolling update, if the cache still shows it running another
/// revision and not terminating. An eviction honours the app's PodDisruptionBudget: while
/// another of its pods is disrupted (a node drain, say) it is refused and retried on a later
/// reconcile. It is conditioned on that pod's uid, so a pod recreated meanwhile is never
/// removed by mistake. Returns whether it was evicted.
async fn restart_pod(
    ctx: &Ctx,
    ns: &str,
    app: &str,
    restart: &reconcile::Restart,
) -> Result<bool, Error> {
    let Some(pod) = app_pods(&ctx.pods, ns, app)
        .find(|p| p.metadata.name.as_deref() == Some(restart.pod.as_str()))
    else {
        return Ok(false);
    };
    if pod.metadata.deletion_timestamp.is_some()
        || pod.labels().get(REVISION) == Some(&restart.revision)
    {
        return Ok(false);
    }
    let params = kube::api::EvictParams {
        delete_options: Some(kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .evict(&restart.pod, &params)
        .await
    {
        Ok(_) => Ok(true),
        // Gone, replaced (the uid precondition failed), or the PodDisruptionBudget allows
        // no disruption now (429): tried again on a later reconcile.
        Err(kube::Error::Api(e)) if [404, 409, 429].contains(&e.code) => {
            tracing::info!(pod = %restart.pod, ns, "rolling update: the pod was not evicted now: {}", e.message);
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// One worker pod: terminating, starting, failing or running, by its `worker` container.
/// Readiness is left out on purpose: a restoring worker is not Ready and is not down.
pub fn observe_pod(pod: &Pod) -> PodObserved {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodObserved::Terminating;
    }
    let since = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(k8s_openapi::jiff::Timestamp::now, |t| t.0);
    let status = pod.status.as_ref();
    if let Some(phase @ ("Failed" | "Succeeded")) = status.and_then(|s| s.phase.as_deref()) {
        return PodObserved::Failing {
            reason: format!("pod phase {phase}"),
        };
    }
    let Some(c) = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.name == crate::resources::WORKER_CONTAINER)
        })
    else {
        return PodObserved::Starting { since };
    };
    let Some(state) = c.state.as_ref() else {
        return PodObserved::Starting { since };
    };
    if let Some(r) = &state.running {
        return PodObserved::Running {
            started: r.started_at.as_ref().map_or(since, |t| t.0),
        };
    }
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_else(|| "Waiting".into());
        let starting = matches!(reason.as_str(), "ContainerCreating" | "PodInitializing");
        return if starting && c.restart_count == 0 {
            PodObserved::Starting { since }
        } else {
            PodObserved::Failing { reason }
        };
    }
    if let Some(t) = &state.terminated {
        return PodObserved::Failing {
            reason: format!(
                "terminated ({})",
                t.reason
                    .clone()
                    .unwrap_or_else(|| format!("exit code {}", t.exit_code))
            ),
        };
    }
    PodObserved::Starting { since }
}

async fn publish(ctx: &Ctx, raw: &RawApp, events: &[reconcile::Event]) {
    for e in events {
        let regarding = raw.object_ref(&());
        let published = ctx
            .events
            .publish(&regarding, e.warning, &e.reason, "Reconcile", &e.message)
            .await;
        if let Err(err) = published {
            tracing::warn!(app = %raw.id(), "publishing an event: {err}");
        }
    }
}

/// What the app's own StatefulSet shows for the rollout and the lifecycle events: its
/// replicas, the revision of its current template once its controller has seen it, and the
/// revision last recorded rolled out.
fn own_stateful_set(s: &StatefulSet) -> reconcile::OwnStatefulSet {
    let replicas = s.spec.replicas.unwrap_or(1);
    let update_revision = s.status.as_ref().and_then(|st| {
        let current =
            st.observed_generation.is_some() && st.observed_generation >= s.metadata.generation;
        current.then(|| st.update_revision.clone()).flatten()
    });
    reconcile::OwnStatefulSet {
        replicas,
        update_revision,
        announced: s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(reconcile::ROLLED_OUT).cloned()),
        draining: s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::rollout::DRAINING).cloned()),
        restarted: s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::rollout::RESTARTED))
            .and_then(|v| {
                let (pod, at) = v.rsplit_once('@')?;
                Some((pod.to_string(), at.parse().ok()?))
            }),
    }
}

/// A StatefulSet made by an operator before rollouts: its `updateStrategy` was defaulted to
/// `RollingUpdate` with a `rollingUpdate` no field manager owns, which server-side apply
/// would keep beside `OnDelete` (and the API server refuses the pair). A merge patch clears
/// it first; pods are not restarted by a change of strategy.
async fn switch_to_on_delete(ctx: &Ctx, ns: &str, sts: &StatefulSet) -> Result<(), Error> {
    let strategy = sts.spec.update_strategy.as_ref();
    if strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
        return Ok(());
    }
    let name = sts.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({
        "spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}
    });
    Api::<StatefulSet>::namespaced(ctx.client.clone(), ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(ns, statefulset = %name, "switched the StatefulSet's updateStrategy to OnDelete: the operator rolls its pods");
    Ok(())
}

/// Server-side apply each object not held back, the StatefulSet last and only when the
/// objects its pods use are in place. An object the API server refuses is a problem of the
/// app (the others are still applied); a failure to reach the API server is an error.
/// Returns the problems and whether the StatefulSet was applied.
async fn apply_objects(
    ctx: &Ctx,
    ns: &str,
    objects: &Objects,
    hold: &std::collections::BTreeSet<Kind>,
    own_sts: Option<&StatefulSet>,
) -> Result<(Vec<Problem>, bool), Error> {
    let mut problems = Vec::new();
    let mut refused: Vec<Kind> = Vec::new();
    let mut sts_applied = false;
    for m in objects.manifests()? {
        if hold.contains(&m.kind)
            || (m.kind == Kind::StatefulSet && refused.iter().any(|k| k.needed_by_workers()))
        {
            continue;
        }
        if m.kind == Kind::StatefulSet
            && let Some(live) = own_sts
        {
            switch_to_on_delete(ctx, ns, live).await?;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), ns, &api_resource(m.kind));
        match api
            .patch(
                &m.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&m.body),
            )
            .await
        {
            Ok(_) => sts_applied |= m.kind == Kind::StatefulSet,
            // 4xx but throttling: the request itself is refused, retrying it as is won't help.
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                tracing::warn!(kind = %m.kind, name = %m.name, ns, "apply refused: {}", s.message);
                refused.push(m.kind);
                problems.push(Problem::new(
                    Reason::ApplyFailed,
                    reconcile::refusal(m.kind, &m.name, &s.message, objects, own_sts),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((problems, sts_applied))
}

/// Patch the status with only what changed since the stored one ([`status_patch`]).
/// Workers own their `status.workers.<pod>` entries (server-side apply, one field manager
/// per pod), so the operator leaves them alone except to remove entries of pods that are
/// gone.
///
/// A write that changes the assignment is conditioned on what the decision was made from:
/// the assignment generation read, and the last report of each pod it fails over. The API
/// server refuses it if either changed since ([`Error::Conflict`]): a deposed leader's
/// in-flight write, or one decided from a lagging watch cache, cannot publish a second
/// assignment under a generation already used, nor fail a pod over on a report older than
/// its newest (see `eddy_crds::resource::WORKER_LEASE_SECONDS`). Any other change of the app
/// (another pod's report, every 250 ms while it restores) leaves the write valid.
pub async fn patch_status(
    client: &Client,
    app: &RawApp,
    status: &eddy_crds::resource::AppStatus,
) -> Result<(), Error> {
    let api: Api<RawApp> = Api::namespaced(client.clone(), &app.namespace().unwrap_or_default());
    let new = serde_json::to_value(status)?;
    let patch = match status_patch(app.status.as_ref(), &new) {
        None => return Ok(()),
        Some(StatusPatch::Merge(patch)) => Patch::Merge(patch),
        Some(StatusPatch::Json(ops)) => {
            // The API server answers every JSON Patch that does not apply alike (422), so
            // ours must apply to the status read: then a refusal means the app changed.
            let mut read = serde_json::json!({ "status": app.status });
            json_patch::patch(&mut read, &ops)?;
            Patch::Json(json_patch::Patch(ops))
        }
    };
    let conditioned = matches!(patch, Patch::Json(_));
    match api
        .patch_status(&app.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Conflict),
        Err(kube::Error::Api(s)) if conditioned && did_not_apply(&s) => Err(Error::Conflict),
        Err(e) => Err(e.into()),
    }
}

/// Whether the API server refused a JSON Patch because an op did not apply to the stored
/// object (a `test` failed, or a path it removes is gone): kube-apiserver's patch handler
/// answers 422 with this fixed message and no causes, the json-patch error itself dropped.
/// A status the schema refuses is also 422, but names the app and its invalid fields.
fn did_not_apply(s: &kube::core::Status) -> bool {
    s.code == 422
        && s.message == "the server rejected our request due to an error in our request"
        && s.details.as_ref().is_none_or(|d| d.causes.is_empty())
}

/// A status write, as [`status_patch`] makes it.
#[derive(Debug, PartialEq)]
pub enum StatusPatch {
    /// A JSON merge patch of the app, without precondition.
    Merge(serde_json::Value),
    /// A JSON Patch (RFC 6902) of the app: [`assignment_ops`].
    Json(Vec<json_patch::PatchOperation>),
}

/// The write turning status `old` (None: the app has none yet) into `new`; None if nothing
/// changed. A change of the assignment of an app that has a status is a JSON Patch
/// conditioned on what the decision was made from ([`assignment_ops`]). Everything else is a
/// merge patch without precondition: workers report every 250 ms to 5 s, so a precondition
/// on every status write would be refused again and again on a busy app, and a write of
/// phase, conditions, the backlog or a gone pod's report decided from a status a moment old
/// is corrected by the next reconcile and publishes nothing workers act on.
pub fn status_patch(
    old: Option<&serde_json::Value>,
    new: &serde_json::Value,
) -> Option<StatusPatch> {
    let none = serde_json::json!({});
    let old = old.filter(|o| o.is_object());
    let diff = merge_diff(old.unwrap_or(&none), new)?;
    Some(match old {
        Some(old) if diff.get("assignment").is_some() => {
            StatusPatch::Json(assignment_ops(old, new))
        }
        _ => StatusPatch::Merge(serde_json::json!({ "status": diff })),
    })
}

/// The JSON Patch turning status `old` into `new` when the assignment changes. First `test`
/// ops on what the decision was made from: the assignment generation read (another leader
/// publishing one since refuses the write), and the `updated` of the read report of each pod
/// newly in `down` (a pod that reported since is not failed over on stale silence). Then,
/// per top-level field that changed, its new value set or its removal; of `workers` only
/// the reports of pods that are gone are removed, one by one: the others are their
/// workers' to write, maybe at this very moment.
pub fn assignment_ops(
    old: &serde_json::Value,
    new: &serde_json::Value,
) -> Vec<json_patch::PatchOperation> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
    use serde_json::Value;
    // Tokens are escaped (`~` as `~0`, `/` as `~1`): pod names are keys the status holds.
    let at = |tokens: &[&str]| {
        PointerBuf::from_tokens(std::iter::once("status").chain(tokens.iter().copied()))
    };
    fn down(s: &Value) -> std::collections::BTreeSet<&str> {
        let down = s.pointer("/assignment/down").and_then(Value::as_array);
        down.into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    }
    fn report<'a>(s: &'a Value, pod: &str) -> Option<&'a Value> {
        s.get("workers")?.get(pod)
    }

    let mut ops = Vec::new();
    if let Some(generation) = old.pointer("/assignment/generation") {
        ops.push(PatchOperation::Test(TestOperation {
            path: at(&["assignment", "generation"]),
            value: generation.clone(),
        }));
    }
    for pod in down(new).difference(&down(old)) {
        if let Some(updated) = report(old, pod)
            .and_then(|r| r.get("updated"))
            .filter(|u| u.as_str().is_some_and(same_in_go))
        {
            ops.push(PatchOperation::Test(TestOperation {
                path: at(&["workers", pod, "updated"]),
                value: updated.clone(),
            }));
        }
    }
    let Some(Value::Object(diff)) = merge_diff(old, new) else {
        return ops;
    };
    for field in diff.keys() {
        if field == "workers" {
            let read = old.get("workers").and_then(Value::as_object);
            for pod in read.into_iter().flat_map(|r| r.keys()) {
                if report(new, pod).is_none() {
                    ops.push(PatchOperation::Remove(RemoveOperation {
                        path: at(&["workers", pod]),
                    }));
                }
            }
        } else if let Some(value) = new.get(field) {
            // `add` sets a member whether or not it is there.
            ops.push(PatchOperation::Add(AddOperation {
                path: at(&[field]),
                value: value.clone(),
            }));
        } else {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: at(&[field]),
            }));
        }
    }
    ops
}

/// Whether Go's JSON encoder writes string `s` as serde_json does. The API server compares a
/// `test` op's string with the stored one by their JSON text, and Go escapes `<`, `>`, `&`,
/// U+2028 and U+2029 (control characters differ too): a report's `updated` that Go would
/// write otherwise (no worker writes one: it is an RFC 3339 time) is not tested, so a forged
/// one cannot keep its pod from being failed over.
fn same_in_go(s: &str) -> bool {
    !s.chars()
        .any(|c| c.is_control() || matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}'))
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
/// collector remove the owned objects. Never blocks deletion: an unreadable spec or an
/// unreachable Kafka is reported and the finalizer goes.
async fn cleanup(raw: &RawApp, ctx: &Ctx) -> Result<Action, Error> {
    ctx.forget(&raw.uid().unwrap_or_default());
    ctx.report_clock.forget(&raw.uid().unwrap_or_default());
    ctx.metrics
        .remove_app(&raw.namespace().unwrap_or_default(), &raw.name_any());
    let warn = |reason: &'static str, note: String| async move {
        tracing::warn!(app = %raw.id(), "{note}");
        let regarding = raw.object_ref(&());
        let _ = ctx
            .events
            .publish(&regarding, true, reason, "Cleanup", &note)
            .await;
    };
    let claim = raw.claim();
    let app = match raw.parse() {
        Ok(app) => app,
        Err(e) => {
            if raw.deletes_topics() {
                warn(
                    "TopicDeletionSkipped",
                    format!(
                        "the spec cannot be read ({e}), so the internal topics are not known: delete the topics named {:?} followed by a step or store by hand",
                        format!("{}-", claim.application_id)
                    ),
                )
                .await;
            }
            return Ok(Action::await_change());
        }
    };
    if app.spec.cleanup_policy != CleanupPolicy::Delete {
        return Ok(Action::await_change());
    }
    // An app refused for using another app's id must not delete that app's topics.
    if let Some(other) = ctx.all_apps().iter().find(|a| claim.yields_to(&a.claim())) {
        warn(
            "TopicDeletionSkipped",
            format!(
                "applicationId {:?} belongs to StatefulStreamApp {}: its internal topics are left alone",
                claim.application_id,
                other.id()
            ),
        )
        .await;
        return Ok(Action::await_change());
    }
    let topics = kafka::internal_topics(&app.spec, &claim.application_id).await;
    let ns = raw.namespace().unwrap_or_default();
    let deleted = match kafka::connect(&ctx.client, &ns, &app.spec).await {
        Ok(conn) => kafka::delete_topics(&conn, &topics).await,
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = deleted {
        warn(
            "TopicDeletionFailed",
            format!("deleting internal topics: {e}"),
        )
        .await;
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
    use super::{Scope, StatusPatch, assignment_ops, merge_diff, observe_pod, status_patch};
    use crate::placement::PodObserved;
    use serde_json::json;

    #[test]
    fn a_pod_is_seen_by_its_worker_container_not_its_readiness() {
        let pod = |status: serde_json::Value, deleting: bool| {
            let mut meta = json!({"name": "a-0", "creationTimestamp": "2026-01-01T00:00:00Z"});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
            }
            serde_json::from_value(json!({"metadata": meta, "status": status})).expect("pod")
        };
        let worker = |state: serde_json::Value, restarts: i32| {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "worker", "image": "i", "imageID": "", "ready": false,
                "restartCount": restarts, "state": state}]})
        };
        let t = |s: &str| s.parse().expect("time");
        assert_eq!(
            observe_pod(&pod(
                worker(json!({"running": {"startedAt": "2026-01-01T00:00:03Z"}}), 0),
                false
            )),
            PodObserved::Running {
                started: t("2026-01-01T00:00:03Z")
            },
            "running but not Ready (restoring) is running"
        );
        assert_eq!(
            observe_pod(&pod(worker(json!({"running": {}}), 0), true)),
            PodObserved::Terminating
        );
        assert_eq!(
            observe_pod(&pod(
                worker(json!({"waiting": {"reason": "CrashLoopBackOff"}}), 3),
                false
            )),
            PodObserved::Failing {
                reason: "CrashLoopBackOff".into()
            }
        );
        assert_eq!(
            observe_pod(&pod(
                worker(json!({"waiting": {"reason": "ContainerCreating"}}), 0),
                false
            )),
            PodObserved::Starting {
                since: t("2026-01-01T00:00:00Z")
            }
        );
        assert_eq!(
            observe_pod(&pod(
                worker(json!({"terminated": {"exitCode": 137}}), 0),
                false
            )),
            PodObserved::Failing {
                reason: "terminated (exit code 137)".into()
            }
        );
        assert_eq!(
            observe_pod(&pod(json!({"phase": "Pending"}), false)),
            PodObserved::Starting {
                since: t("2026-01-01T00:00:00Z")
            }
        );
    }

    #[test]
    fn watch_namespaces_are_checked_names_and_none_means_all() {
        assert_eq!(Scope::new::<&str>(&[]).expect("valid"), Scope::All);
        assert_eq!(Scope::new(&["", " "]).expect("valid"), Scope::All);
        assert_eq!(
            Scope::new(&["team-a", " team-b", "team-a"]).expect("valid"),
            Scope::Namespaces(vec!["team-a".into(), "team-b".into()])
        );
        for bad in ["Team-A", "team_a", "-a", "a-", &"a".repeat(64), "a.b"] {
            let e = Scope::new(&[bad]).expect_err(bad).to_string();
            assert!(
                e.contains(&format!("{bad:?} is not a namespace name")),
                "{e}"
            );
        }
    }

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

    #[test]
    fn only_a_change_of_the_assignment_of_a_status_is_conditioned() {
        let old = json!({"phase": "Running", "assignment": {"generation": 3, "pods": {}},
            "workers": {"a-0": {"appliedGeneration": 3}}});
        let mut new = old.clone();
        new["phase"] = json!("Pending");
        new["workers"] = json!({});
        assert_eq!(
            status_patch(Some(&old), &new),
            Some(StatusPatch::Merge(
                json!({"status": {"phase": "Pending", "workers": {"a-0": null}}})
            )),
            "reports and phase change every few seconds: no precondition"
        );
        assert_eq!(status_patch(Some(&old), &old), None);
        new["assignment"]["generation"] = json!(4);
        assert!(matches!(
            status_patch(Some(&old), &new),
            Some(StatusPatch::Json(_))
        ));
        assert_eq!(
            status_patch(None, &new),
            Some(StatusPatch::Merge(json!({"status": new}))),
            "the first write: nothing was decided from"
        );
    }

    #[test]
    fn an_assignment_write_tests_the_generation_and_the_reports_of_pods_newly_down() {
        let old = json!({
            "phase": "Running",
            "backlog": 5,
            "assignment": {"generation": 7, "pods": {"a-0": {"active": ["0_0"]},
                "a/1~x": {"active": ["0_1"]}, "a-2": {}}, "down": ["a-3"]},
            "workers": {
                "a-0": {"updated": "2026-01-01T00:00:05Z", "appliedGeneration": 7},
                "a/1~x": {"updated": "2026-01-01T00:00:01Z"},
                "a-2": {"appliedGeneration": 7},
                "a-3": {"updated": "2026-01-01T00:00:00Z"},
                "gone~/": {"updated": "2026-01-01T00:00:00Z"},
            }
        });
        let mut new = old.clone();
        new["assignment"] = json!({"generation": 8, "pods": {"a-0": {"active": ["0_0", "0_1"]}},
            "down": ["a-2", "a-3", "a/1~x", "never-reported"]});
        new.as_object_mut().expect("object").remove("backlog");
        new["phase"] = json!("Pending");
        // A kept report the operator would write otherwise is not the operator's to write.
        new["workers"]["a-0"]["appliedGeneration"] = json!(6);
        new["workers"]
            .as_object_mut()
            .expect("object")
            .remove("gone~/");
        let ops = assignment_ops(&old, &new);
        assert_eq!(
            serde_json::to_value(&ops).expect("ops"),
            json!([
                {"op": "test", "path": "/status/assignment/generation", "value": 7},
                // a-2 has no `updated`, never-reported no report, a-3 was down already.
                {"op": "test", "path": "/status/workers/a~11~0x/updated",
                    "value": "2026-01-01T00:00:01Z"},
                {"op": "add", "path": "/status/assignment", "value": new["assignment"]},
                {"op": "remove", "path": "/status/backlog"},
                {"op": "add", "path": "/status/phase", "value": "Pending"},
                {"op": "remove", "path": "/status/workers/gone~0~1"},
            ])
        );
        // What the API server does with it, on the status read.
        let mut doc = json!({"status": old});
        json_patch::patch(&mut doc, &ops).expect("applies to the status read");
        let mut expect = new.clone();
        expect["workers"]["a-0"]["appliedGeneration"] = json!(7);
        assert_eq!(doc["status"], expect);
    }

    #[test]
    fn an_assignment_write_removes_each_dropped_report_and_tests_no_generation_it_never_read() {
        let old = json!({"phase": "Pending", "workers": {"a-0": {"updated": "t0"},
            "a-9": {"updated": "t9"}}});
        let new = json!({"phase": "Pending",
            "assignment": {"generation": 1, "pods": {"a-1": {}}, "down": ["a-0"]}});
        assert_eq!(
            serde_json::to_value(assignment_ops(&old, &new)).expect("ops"),
            json!([
                {"op": "test", "path": "/status/workers/a-0/updated", "value": "t0"},
                {"op": "add", "path": "/status/assignment", "value": new["assignment"]},
                // One by one, never the map: a pod may be writing its own report meanwhile.
                {"op": "remove", "path": "/status/workers/a-0"},
                {"op": "remove", "path": "/status/workers/a-9"},
            ])
        );
        // A forged `updated` the API server would compare as other JSON text is not tested.
        let old = json!({"assignment": {"generation": 2, "pods": {}},
            "workers": {"a-0": {"updated": "<now>"}}});
        let mut new = old.clone();
        new["assignment"] = json!({"generation": 3, "pods": {}, "down": ["a-0"]});
        assert_eq!(
            serde_json::to_value(assignment_ops(&old, &new)).expect("ops"),
            json!([
                {"op": "test", "path": "/status/assignment/generation", "value": 2},
                {"op": "add", "path": "/status/assignment", "value": new["assignment"]},
            ])
        );
    }
}

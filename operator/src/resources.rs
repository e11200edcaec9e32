//! The Kubernetes objects an app is made of, one small builder per kind: the worker
//! StatefulSet (a volume per pod for the state dir), its headless Service, the ConfigMap
//! holding the app file, the ServiceAccount with a Role that lets a worker read its own app,
//! patch only its own app's status and query its own app (forwarding), and a
//! PodDisruptionBudget. Each is owned by the app,
//! so deleting the app deletes them. Worker pods pass the `restricted` Pod Security Standard.

mod pod_template;

use eddy_crds::resource::StatefulStreamApp;
use eddy_crds::spec::CleanupPolicy;
use eddy_telemetry::logging::LogFormat;
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use std::collections::BTreeMap;

/// Worker image when neither the spec nor the operator's `--worker-image` names one: what
/// images/build.sh tags, the crate version (a test below keeps them in step).
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/eddy-dev/eddy-worker:", env!("CARGO_PKG_VERSION"));
pub const HTTP_PORT: i32 = 9090;
pub use eddy_crds::query::QUERY_PORT;
/// The worker pods' main container (the assignor reads its state).
pub const WORKER_CONTAINER: &str = "worker";
pub const STATE_DIR: &str = "/var/lib/eddy";
pub const APP_FILE: &str = "/etc/eddy/app.yaml";
/// User and group the workers run as (distroless' `nonroot`); the state volume is made
/// writable for the group through `fsGroup`.
pub const WORKER_UID: i64 = 65532;

/// The kinds of object an app consists of, in the order they are applied: the StatefulSet
/// last, because its pods use the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ServiceAccount,
    Role,
    RoleBinding,
    ConfigMap,
    Service,
    /// The ClusterIP Service clients send queries to (`spec.queries.enabled`).
    QueryService,
    /// Who may reach the query port (`spec.queries.from`).
    NetworkPolicy,
    PodDisruptionBudget,
    StatefulSet,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Role => "Role",
            Kind::RoleBinding => "RoleBinding",
            Kind::ConfigMap => "ConfigMap",
            Kind::Service | Kind::QueryService => "Service",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
            Kind::StatefulSet => "StatefulSet",
        }
    }

    /// Objects the worker pods use: without this app's own one, pods would run with another
    /// object's app file or rights, so the StatefulSet is not applied.
    pub fn needed_by_workers(self) -> bool {
        matches!(
            self,
            Kind::ServiceAccount | Kind::Role | Kind::RoleBinding | Kind::ConfigMap
        )
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of each object of an app, known before they are built (to check who holds them).
pub fn object_names(app: &StatefulStreamApp) -> Vec<(Kind, String)> {
    let mut names = vec![
        (Kind::ServiceAccount, worker_account(app)),
        (Kind::Role, worker_account(app)),
        (Kind::RoleBinding, worker_account(app)),
        (Kind::ConfigMap, config_map_name(app)),
        (Kind::Service, service_name(app)),
        (Kind::PodDisruptionBudget, name(app)),
        (Kind::StatefulSet, name(app)),
    ];
    if app.spec.queries_enabled() {
        names.push((Kind::QueryService, query_service_name(app)));
        names.push((Kind::NetworkPolicy, query_service_name(app)));
    }
    names
}

pub fn query_service_name(app: &StatefulStreamApp) -> String {
    eddy_crds::query::query_service(&name(app))
}

/// One object to apply, as JSON with its `apiVersion` and `kind`.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub kind: Kind,
    pub name: String,
    pub body: serde_json::Value,
}

/// Everything one app consists of.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub config_map: ConfigMap,
    pub service: Service,
    /// None when the app's queries are switched off.
    pub query_service: Option<Service>,
    /// None when the app's queries are switched off.
    pub network_policy: Option<NetworkPolicy>,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub stateful_set: StatefulSet,
    pub pdb: PodDisruptionBudget,
}

impl Objects {
    /// Every object as a manifest for server-side apply, in [`Kind`] order.
    pub fn manifests(&self) -> Result<Vec<Manifest>, serde_json::Error> {
        fn one<K: Resource<DynamicType = ()> + serde::Serialize>(
            kind: Kind,
            obj: &K,
        ) -> Result<Manifest, serde_json::Error> {
            let mut body = serde_json::to_value(obj)?;
            body["apiVersion"] = K::api_version(&()).into();
            body["kind"] = K::kind(&()).into();
            Ok(Manifest {
                kind,
                name: obj.meta().name.clone().unwrap_or_default(),
                body,
            })
        }
        let mut all = vec![
            one(Kind::ServiceAccount, &self.service_account)?,
            one(Kind::Role, &self.role)?,
            one(Kind::RoleBinding, &self.role_binding)?,
            one(Kind::ConfigMap, &self.config_map)?,
            one(Kind::Service, &self.service)?,
        ];
        if let Some(q) = &self.query_service {
            all.push(one(Kind::QueryService, q)?);
        }
        if let Some(p) = &self.network_policy {
            all.push(one(Kind::NetworkPolicy, p)?);
        }
        all.push(one(Kind::PodDisruptionBudget, &self.pdb)?);
        all.push(one(Kind::StatefulSet, &self.stateful_set)?);
        Ok(all)
    }
}

pub fn name(app: &StatefulStreamApp) -> String {
    app.metadata.name.clone().unwrap_or_default()
}

/// Labels selecting an app's worker pods.
pub fn selector_labels(app: &StatefulStreamApp) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "eddy-worker".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), name(app)),
    ])
}

/// The selector as a string, for the scale subresource.
pub fn selector_string(app: &StatefulStreamApp) -> String {
    selector_labels(app)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn labels(app: &StatefulStreamApp) -> BTreeMap<String, String> {
    let mut l = selector_labels(app);
    l.insert(
        "app.kubernetes.io/managed-by".into(),
        "eddy-operator".into(),
    );
    l
}

fn meta(app: &StatefulStreamApp, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: app.metadata.namespace.clone(),
        labels: Some(labels(app)),
        owner_references: owner(app).map(|o| vec![o]),
        ..Default::default()
    }
}

fn owner(app: &StatefulStreamApp) -> Option<OwnerReference> {
    app.controller_owner_ref(&())
}

pub fn worker_account(app: &StatefulStreamApp) -> String {
    format!("{}-worker", name(app))
}

pub fn service_name(app: &StatefulStreamApp) -> String {
    eddy_crds::query::workers_service(&name(app))
}

pub fn config_map_name(app: &StatefulStreamApp) -> String {
    format!("{}-app", name(app))
}

/// How the operator runs every app's workers (its own flags), besides what the app says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerSettings {
    /// `EDDY_LOG_FORMAT` of the workers (`--worker-log-format`).
    pub log_format: LogFormat,
    /// Image of the apps that do not name one (`--worker-image`); `None`: [`DEFAULT_IMAGE`].
    pub image: Option<String>,
}

/// The app's objects; its workers run under `application_id`.
pub fn build(
    app: &StatefulStreamApp,
    spec_hash: &str,
    application_id: &str,
    workers: &WorkerSettings,
) -> Result<Objects, String> {
    Ok(Objects {
        config_map: config_map(app)?,
        service: service(app),
        query_service: app.spec.queries_enabled().then(|| query_service(app)),
        network_policy: app.spec.queries_enabled().then(|| network_policy(app)),
        service_account: ServiceAccount {
            metadata: meta(app, worker_account(app)),
            ..Default::default()
        },
        role: role(app),
        role_binding: role_binding(app),
        stateful_set: stateful_set(app, spec_hash, application_id, workers)?,
        pdb: pdb(app),
    })
}

/// The app file each worker reads: the resource itself, without status.
fn config_map(app: &StatefulStreamApp) -> Result<ConfigMap, String> {
    let file = serde_json::json!({
        "apiVersion": eddy_crds::API_VERSION,
        "kind": eddy_crds::KIND,
        "metadata": {"name": name(app), "namespace": app.metadata.namespace},
        "spec": app.spec,
    });
    let yaml =
        serde_yaml::to_string(&file).map_err(|e| format!("cannot write the app file: {e}"))?;
    Ok(ConfigMap {
        metadata: meta(app, config_map_name(app)),
        data: Some(BTreeMap::from([("app.yaml".to_string(), yaml)])),
        ..Default::default()
    })
}

fn service(app: &StatefulStreamApp) -> Service {
    Service {
        metadata: meta(app, service_name(app)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector_labels(app)),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::Int(HTTP_PORT)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Any ready worker answers any key (it forwards to the one holding it), so clients need one
/// address: this Service's, on the query port.
fn query_service(app: &StatefulStreamApp) -> Service {
    Service {
        metadata: meta(app, query_service_name(app)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(app)),
            ports: Some(vec![ServicePort {
                name: Some("query".into()),
                port: QUERY_PORT,
                target_port: Some(IntOrString::Int(QUERY_PORT)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The query port of the app's pods admits only the app's own pods (they forward to each
/// other) and `spec.queries.from`; every other port stays open to all (the kubelet's probes,
/// Prometheus, a sidecar's), which a NetworkPolicy can only say as the port ranges around it.
fn network_policy(app: &StatefulStreamApp) -> NetworkPolicy {
    let own = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(app)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut from = vec![own];
    if let Some(q) = &app.spec.queries {
        from.extend(q.from.iter().cloned());
    }
    let ports = |ranges: &[(i32, i32)]| -> Option<Vec<NetworkPolicyPort>> {
        Some(
            ranges
                .iter()
                .map(|&(port, end)| NetworkPolicyPort {
                    port: Some(IntOrString::Int(port)),
                    end_port: (end > port).then_some(end),
                    protocol: Some("TCP".into()),
                })
                .collect(),
        )
    };
    NetworkPolicy {
        metadata: meta(app, query_service_name(app)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(app)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(from),
                    ports: ports(&[(QUERY_PORT, QUERY_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: ports(&[(1, QUERY_PORT - 1), (QUERY_PORT + 1, 65535)]).map(|mut p| {
                        // Every port of the other protocols.
                        p.extend(["UDP", "SCTP"].map(|protocol| NetworkPolicyPort {
                            protocol: Some(protocol.into()),
                            ..Default::default()
                        }));
                        p
                    }),
                },
            ]),
            ..Default::default()
        }),
    }
}

fn role(app: &StatefulStreamApp) -> Role {
    let only_this = Some(vec![name(app)]);
    Role {
        metadata: meta(app, worker_account(app)),
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec!["eddy.dev".into()]),
                resources: Some(vec!["statefulstreamapps".into()]),
                resource_names: only_this.clone(),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec!["eddy.dev".into()]),
                resources: Some(vec!["statefulstreamapps/status".into()]),
                resource_names: only_this.clone(),
                verbs: vec!["get".into(), "patch".into()],
                ..Default::default()
            },
            // Workers forward queries to each other with their own token.
            PolicyRule {
                api_groups: Some(vec!["eddy.dev".into()]),
                resources: Some(vec!["statefulstreamapps/query".into()]),
                resource_names: only_this,
                verbs: vec!["get".into()],
                ..Default::default()
            },
        ]),
    }
}

fn role_binding(app: &StatefulStreamApp) -> RoleBinding {
    RoleBinding {
        metadata: meta(app, worker_account(app)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: worker_account(app),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: worker_account(app),
            namespace: app.metadata.namespace.clone(),
            ..Default::default()
        }]),
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn policy(p: Option<CleanupPolicy>, default: CleanupPolicy) -> String {
    match p.unwrap_or(default) {
        CleanupPolicy::Retain => "Retain".into(),
        CleanupPolicy::Delete => "Delete".into(),
    }
}

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(HTTP_PORT),
            ..Default::default()
        }),
        period_seconds: Some(5),
        ..Default::default()
    }
}

/// The `restricted` Pod Security Standard for every container: no privilege escalation, no
/// capabilities, nothing written outside volumes.
pub(crate) fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Non-root with a numeric user (so the kubelet can check runAsNonRoot without reading the
/// image), the runtime's seccomp profile, and `fsGroup` so the state volume is writable.
fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(WORKER_UID),
        run_as_group: Some(WORKER_UID),
        fs_group: Some(WORKER_UID),
        // Large state volumes: chown only when the volume root is not the group's yet.
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn stateful_set(
    app: &StatefulStreamApp,
    spec_hash: &str,
    application_id: &str,
    workers: &WorkerSettings,
) -> Result<StatefulSet, String> {
    let spec = &app.spec;
    let storage = spec.storage.clone().unwrap_or_default();
    // Workers are configured through the environment so that whatever runs the pod (a
    // kubelet, or the e2e pod runner) can point them elsewhere.
    let mut env_vars = vec![
        env("EDDY_APP_FILE", APP_FILE),
        // The operator's default id (`<namespace>.<name>`) is not in the app file, and one
        // function decides it for topics, cleanup and the workers alike.
        env("EDDY_APPLICATION_ID", application_id),
        env("EDDY_STATE_DIR", STATE_DIR),
        env("EDDY_HTTP_ADDR", &format!("0.0.0.0:{HTTP_PORT}")),
        env("EDDY_ASSIGNMENT", "operator"),
        field_env("EDDY_INSTANCE_ID", "metadata.name"),
        field_env("EDDY_NAMESPACE", "metadata.namespace"),
    ];
    let mut ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: HTTP_PORT,
        ..Default::default()
    }];
    if spec.queries_enabled() {
        env_vars.push(env("EDDY_QUERY_ADDR", &format!("0.0.0.0:{QUERY_PORT}")));
        ports.push(ContainerPort {
            name: Some("query".into()),
            container_port: QUERY_PORT,
            ..Default::default()
        });
    }
    // Only when not the default: pods of operators without the flag stay as they were (a
    // changed template would roll every app's pods).
    if workers.log_format != LogFormat::default() {
        env_vars.push(env(
            eddy_telemetry::logging::FORMAT_ENV,
            workers.log_format.as_str(),
        ));
    }
    let (kafka_env, kafka_volumes, kafka_mounts) = kafka_credentials(&spec.kafka);
    env_vars.extend(kafka_env);
    let container = Container {
        name: WORKER_CONTAINER.into(),
        image: Some(
            spec.image
                .as_deref()
                .or(workers.image.as_deref())
                .unwrap_or(DEFAULT_IMAGE)
                .into(),
        ),
        args: Some(vec!["run".into()]),
        env: Some(env_vars),
        ports: Some(ports),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: crate::memory::resources(spec),
        security_context: Some(container_security()),
        volume_mounts: Some(
            [
                VolumeMount {
                    name: "state".into(),
                    mount_path: STATE_DIR.into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "app".into(),
                    mount_path: "/etc/eddy".into(),
                    read_only: Some(true),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(kafka_mounts)
            .collect(),
        ),
        ..Default::default()
    };
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(app)),
            // A changed spec changes the hash, which rolls the pods one at a time.
            annotations: Some(BTreeMap::from([(
                "eddy.dev/spec-hash".to_string(),
                spec_hash.to_string(),
            )])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(worker_account(app)),
            termination_grace_period_seconds: Some(60),
            security_context: Some(pod_security()),
            containers: vec![container],
            volumes: Some(
                std::iter::once(Volume {
                    name: "app".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: config_map_name(app),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .chain(kafka_volumes)
                .collect(),
            ),
            ..Default::default()
        }),
    };
    if let Some(overrides) = &spec.pod_template {
        let mut base = serde_json::to_value(&template).map_err(|e| e.to_string())?;
        pod_template::merge(&mut base, overrides);
        template = serde_json::from_value(base).map_err(|e| format!("spec.podTemplate: {e}"))?;
    }
    Ok(StatefulSet {
        metadata: meta(app, name(app)),
        spec: StatefulSetSpec {
            replicas: Some(spec.replicas.unwrap_or(1)),
            service_name: Some(service_name(app)),
            // Pods start together.
            pod_management_policy: Some("Parallel".into()),
            // The operator restarts each pod for a new template itself, once it has moved
            // the pod's active tasks away (crate::rollout); a pod that is deleted or fails
            // comes back from the new template.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(selector_labels(app)),
                ..Default::default()
            },
            template,
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("state".into()),
                    labels: Some(labels(app)),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: storage.storage_class_name.clone(),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity(
                                storage
                                    .size
                                    .as_ref()
                                    .map_or_else(|| "1Gi".into(), |q| q.to_string()),
                            ),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_scaled: Some(policy(storage.when_scaled, CleanupPolicy::Retain)),
                    when_deleted: Some(policy(storage.when_deleted, CleanupPolicy::Delete)),
                },
            ),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// TLS material mounted from Secrets (the worker reads the files named by
/// `EDDY_KAFKA_*_FILE`), SASL credentials passed from Secrets as environment (a literal
/// username as a plain value): they never appear in the ConfigMap. Which property gets what
/// is `eddy_crds::security`, shared with the worker and the operator's admin client.
fn kafka_credentials(
    kafka: &eddy_crds::spec::KafkaSpec,
) -> (Vec<EnvVar>, Vec<Volume>, Vec<VolumeMount>) {
    use eddy_crds::security::{Source, client_security};
    let (mut envs, mut volumes, mut mounts) = (Vec::new(), Vec::new(), Vec::new());
    let security = client_security(kafka);
    for (setting, value) in &security.settings {
        envs.push(env(setting.env(), value));
    }
    for (credential, source) in &security.credentials {
        match (credential.file(), source) {
            (Some(f), Source::Secret(r)) => {
                let dir = format!("/etc/eddy/kafka/{}", f.dir);
                volumes.push(Volume {
                    name: format!("kafka-{}", f.dir),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(r.name.clone()),
                        items: Some(vec![KeyToPath {
                            key: r.key.clone(),
                            path: f.file.into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                mounts.push(VolumeMount {
                    name: format!("kafka-{}", f.dir),
                    mount_path: dir.clone(),
                    read_only: Some(true),
                    ..Default::default()
                });
                envs.push(env(credential.env(), &format!("{dir}/{}", f.file)));
            }
            (_, Source::Value(v)) => envs.push(env(credential.env(), v)),
            (None, Source::Secret(r)) => envs.push(EnvVar {
                name: credential.env().into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: r.name.clone(),
                        key: r.key.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }
    (envs, volumes, mounts)
}

fn pdb(app: &StatefulStreamApp) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(app, name(app)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(app)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::DEFAULT_IMAGE;
    use std::path::Path;

    fn repo_file(path: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn yaml(path: &str) -> serde_yaml::Value {
        serde_yaml::from_str(&repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// images/build.sh tags what it builds `<registry>/eddy-{worker,operator}:<crate version>`:
    /// the worker image the operator puts in StatefulSets and the operator image the chart
    /// deploys must be exactly those, or an install pulls images nobody built.
    #[test]
    fn chart_and_operator_name_the_images_build_sh_makes() {
        let version = env!("CARGO_PKG_VERSION");
        let script = repo_file("images/build.sh");
        let registry = script
            .lines()
            .find_map(|l| l.strip_prefix("default_registry="))
            .expect("images/build.sh has a default_registry= line");
        assert_eq!(
            DEFAULT_IMAGE,
            format!("{registry}/eddy-worker:{version}"),
            "the operator's default worker image"
        );
        let chart = yaml("charts/eddy-operator/Chart.yaml");
        assert_eq!(
            chart["appVersion"].as_str(),
            Some(version),
            "charts/eddy-operator/Chart.yaml: appVersion is the operator image's tag, the crate version"
        );
        let values = yaml("charts/eddy-operator/values.yaml");
        assert_eq!(
            values["image"]["repository"].as_str(),
            Some(format!("{registry}/eddy-operator").as_str()),
            "charts/eddy-operator/values.yaml: image.repository"
        );
        assert_eq!(
            values["image"]["tag"].as_str(),
            Some(""),
            "charts/eddy-operator/values.yaml: image.tag stays empty, so the tag follows appVersion"
        );
        assert_eq!(
            values["workerImage"]["repository"].as_str(),
            Some(format!("{registry}/eddy-worker").as_str()),
            "charts/eddy-operator/values.yaml: workerImage.repository"
        );
        assert_eq!(
            values["workerImage"]["tag"].as_str(),
            Some(""),
            "charts/eddy-operator/values.yaml: workerImage.tag stays empty, so the tag follows appVersion"
        );
    }
}

//! What the operator asks Kafka: partition counts of the app's topics (the number of tasks)
//! and creating or deleting its internal topics. librdkafka is blocking; calls run on the
//! blocking pool with short timeouts so an unreachable cluster delays only its own app.
//!
//! The admin client connects as the app's workers do: the TLS and SASL settings of
//! `spec.kafka` mapped by `eddy_crds::security`, with certificates, keys and passwords read
//! from the Secrets the app names (in its namespace, only those, on each reconcile) and
//! handed to librdkafka in memory (`ssl.*.pem`, `sasl.*`): never written to disk, into an
//! object, a status or a log.

use crate::reconcile::KafkaFacts;
use eddy_crds::AppSpec;
use eddy_crds::security::{Source, client_security};
use eddy_crds::topics::{self, InternalTopic};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach an app's Kafka: librdkafka properties, credentials included, held in memory
/// for one reconcile. `Debug` shows property names, never values.
#[derive(Clone)]
pub struct Connection {
    bootstrap_servers: Option<String>,
    properties: Vec<(String, String)>,
    /// The credentials read from Secrets (property, value), for [`Connection::digest`].
    from_secrets: Vec<(String, String)>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field(
                "properties",
                &self.properties.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why the credentials an app names could not be read. Messages name the field, the Secret
/// and the key, never a value.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "spec.{field}: secret {namespace}/{name} not found: create it in the app's namespace, or fix the reference"
    )]
    SecretMissing {
        field: &'static str,
        namespace: String,
        name: String,
    },
    #[error(
        "spec.{field}: secret {namespace}/{name} has no key {key:?} (it has: {keys}): add the key, or fix the reference"
    )]
    KeyMissing {
        field: &'static str,
        namespace: String,
        name: String,
        key: String,
        keys: String,
    },
    #[error(
        "spec.{field}: key {key:?} of secret {namespace}/{name} is not UTF-8 text (PEM or a password expected)"
    )]
    NotText {
        field: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error(
        "spec.{field}: secret {namespace}/{name} may not be used by this app: {why}; if this app may send it to its brokers, `kubectl -n {namespace} label secret {name} {label}=true` (see docs/operator.md, \"Secured Kafka\")",
        label = eddy_crds::security::CREDENTIAL_LABEL
    )]
    NotAllowed {
        field: &'static str,
        namespace: String,
        name: String,
        why: String,
    },
    #[error(
        "spec.{field}: the operator may not read secret {namespace}/{name}: grant its ServiceAccount `get` on secrets (the chart's ClusterRole does)"
    )]
    Forbidden {
        field: &'static str,
        namespace: String,
        name: String,
    },
    /// The API server did not answer: retried, not a problem of the app.
    #[error("reading secret {namespace}/{name}: {cause}")]
    Unavailable {
        namespace: String,
        name: String,
        #[source]
        cause: kube::Error,
    },
}

/// The connection settings of an app, its credentials read from the Secrets it names.
pub async fn connect(
    client: &kube::Client,
    namespace: &str,
    spec: &AppSpec,
) -> Result<Connection, CredentialsError> {
    let security = client_security(&spec.kafka);
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut secrets: HashMap<&str, BTreeMap<String, ByteString>> = HashMap::new();
    let mut from_secrets = Vec::new();
    let mut properties: Vec<(String, String)> = security
        .settings
        .iter()
        .map(|(s, v)| (s.property().to_string(), v.to_string()))
        .collect();
    for (credential, source) in &security.credentials {
        let field = credential.field();
        let value = match source {
            Source::Value(v) => v.to_string(),
            Source::Secret(r) => {
                if !secrets.contains_key(r.name.as_str()) {
                    let data = match api.get_opt(&r.name).await {
                        Ok(Some(secret)) => {
                            let m = &secret.metadata;
                            let servers = spec.kafka.bootstrap_servers.as_deref().unwrap_or("");
                            if let Some(why) = eddy_crds::security::credential_refusal(
                                m.labels.as_ref(),
                                m.annotations.as_ref(),
                                servers,
                            ) {
                                return Err(CredentialsError::NotAllowed {
                                    field,
                                    namespace: namespace.into(),
                                    name: r.name.clone(),
                                    why,
                                });
                            }
                            secret.data.unwrap_or_default()
                        }
                        Ok(None) => {
                            return Err(CredentialsError::SecretMissing {
                                field,
                                namespace: namespace.into(),
                                name: r.name.clone(),
                            });
                        }
                        Err(kube::Error::Api(e)) if e.code == 403 => {
                            return Err(CredentialsError::Forbidden {
                                field,
                                namespace: namespace.into(),
                                name: r.name.clone(),
                            });
                        }
                        Err(source) => {
                            return Err(CredentialsError::Unavailable {
                                namespace: namespace.into(),
                                name: r.name.clone(),
                                cause: source,
                            });
                        }
                    };
                    secrets.insert(&r.name, data);
                }
                let data = secrets.get(r.name.as_str()).cloned().unwrap_or_default();
                let bytes = data
                    .get(&r.key)
                    .ok_or_else(|| CredentialsError::KeyMissing {
                        field,
                        namespace: namespace.into(),
                        name: r.name.clone(),
                        key: r.key.clone(),
                        keys: data.keys().cloned().collect::<Vec<_>>().join(", "),
                    })?;
                String::from_utf8(bytes.0.clone()).map_err(|_| CredentialsError::NotText {
                    field,
                    namespace: namespace.into(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                })?
            }
        };
        if let Source::Secret(_) = source {
            from_secrets.push((credential.property().to_string(), value.clone()));
        }
        properties.push((credential.property().to_string(), value));
    }
    // The app's own properties win, as in the workers.
    properties.extend(
        spec.kafka
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    Ok(Connection {
        bootstrap_servers: spec.kafka.bootstrap_servers.clone(),
        properties,
        from_secrets,
    })
}

impl Connection {
    /// A digest of the credentials the app's Secrets hold (None: it names no Secret), for the
    /// pod template: a rotated Secret changes it, which rolls the pods. SHA-256, salted with
    /// `salt` (the app's uid) and cut to 128 bits: the template shows that a credential
    /// changed, never what it is.
    pub fn digest(&self, salt: &str) -> Option<String> {
        if self.from_secrets.is_empty() {
            return None;
        }
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"eddy credentials v1\0");
        ctx.update(salt.as_bytes());
        for (property, value) in &self.from_secrets {
            // Lengths first, so no two lists of pairs feed the same bytes.
            for part in [property, value] {
                ctx.update(&(part.len() as u64).to_be_bytes());
                ctx.update(part.as_bytes());
            }
        }
        let d = ctx.finish();
        Some(
            d.as_ref()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    fn config(&self) -> Result<ClientConfig, String> {
        let servers = self
            .bootstrap_servers
            .clone()
            .ok_or("spec.kafka.bootstrapServers is missing: the operator needs it to plan tasks")?;
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", servers)
            .set("client.id", "eddy-operator");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        Ok(c)
    }

    fn servers(&self) -> &str {
        self.bootstrap_servers.as_deref().unwrap_or("?")
    }
}

/// Keeps librdkafka's errors and error or warning log lines (`SASL authentication error:
/// ...`, `SSL handshake failed: ...`), so a failed call can say why, not only that it failed.
#[derive(Default)]
struct Diagnosis(Mutex<Vec<String>>);

impl Diagnosis {
    fn keep(&self, message: &str) {
        // "[thrd:sasl_ssl://host:port/bootstrap]: sasl_ssl://host:port/bootstrap: what (after
        // 181ms in state AUTH_REQ)": without the timing, so the condition's message (and its
        // event) stays the same while the problem does.
        let what = message
            .strip_prefix("[thrd:")
            .and_then(|m| m.split_once("]: "))
            .map_or(message, |(_, m)| m);
        let what = what.split(" (after ").next().unwrap_or(what).trim();
        if let Ok(mut seen) = self.0.lock()
            && seen.len() < 3
            && !seen.iter().any(|s| s == what)
        {
            seen.push(what.to_string());
        }
    }
}

impl ClientContext for Diagnosis {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel::*;
        if matches!(level, Emerg | Alert | Critical | Error | Warning) {
            tracing::debug!(target: "librdkafka", "{fac} {message}");
            self.keep(message);
        } else {
            tracing::trace!(target: "librdkafka", "{fac} {message}");
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::debug!(target: "librdkafka", "{error}: {reason}");
        self.keep(reason);
    }
}

impl ConsumerContext for Diagnosis {}

/// Why a call of `c` failed, from what librdkafka reported meanwhile: ` (librdkafka: ...)`,
/// or nothing. Its logs and errors wait in the client's queue until polled.
fn why(c: &BaseConsumer<Diagnosis>) -> String {
    let deadline = std::time::Instant::now() + Duration::from_millis(300);
    while std::time::Instant::now() < deadline {
        let _ = c.poll(Duration::from_millis(50));
    }
    match c.context().0.lock() {
        Ok(seen) if !seen.is_empty() => format!(" (librdkafka: {})", seen.join("; ")),
        _ => String::new(),
    }
}

/// Partition counts of every topic, and broker count, or why Kafka could not be asked.
pub async fn facts(conn: &Connection) -> KafkaFacts {
    let conn = conn.clone();
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer<Diagnosis> = conn
            .config()?
            .create_with_context(Diagnosis::default())
            .map_err(|e| e.to_string())?;
        let md = c
            .fetch_metadata(None, TIMEOUT)
            .map_err(|e| format!("cannot reach Kafka at {}: {e}{}", conn.servers(), why(&c)))?;
        let counts: HashMap<String, i32> = md
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| (t.name().to_string(), t.partitions().len() as i32))
            .collect();
        Ok::<_, String>(counts)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_or_else(KafkaFacts::Unreachable, KafkaFacts::Topics)
}

/// Create internal topics, replicated min(3, brokers) times unless the spec says otherwise.
pub async fn create_topics(
    conn: &Connection,
    spec: &AppSpec,
    topics: &[InternalTopic],
) -> Result<(), String> {
    let c = conn.clone();
    let brokers = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<Diagnosis> = c
            .config()?
            .create_with_context(Diagnosis::default())
            .map_err(|e| e.to_string())?;
        let md = consumer
            .fetch_metadata(None, TIMEOUT)
            .map_err(|e| format!("{e}{}", why(&consumer)))?;
        Ok::<_, String>(md.brokers().len() as i32)
    })
    .await
    .map_err(|e| e.to_string())??;
    let rf = spec.kafka.replication_factor.unwrap_or(brokers.clamp(1, 3));
    let admin: AdminClient<DefaultClientContext> =
        conn.config()?.create().map_err(|e| e.to_string())?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            t.config.iter().fold(
                NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(rf)),
                |nt, (k, v)| nt.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(|e| e.to_string())?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "created internal topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create topic {topic:?}: {code}")),
        }
    }
    Ok(())
}

/// Names of every internal topic an app running under `app_id` may have, whether or not it
/// exists (`app_id` from `eddy_crds::manifest::application_id`, as everywhere).
pub async fn internal_topics(spec: &AppSpec, app_id: &str) -> Vec<String> {
    let layout = topics::layout(app_id, spec);
    let mut names: Vec<String> = layout
        .iter()
        .flat_map(|s| {
            let repartition = s.internal.then(|| s.source.clone());
            repartition.into_iter().chain(
                s.stores
                    .iter()
                    .map(|st| topics::changelog(app_id, &st.name)),
            )
        })
        .collect();
    names.push(topics::dead_letter(app_id));
    names
}

pub async fn delete_topics(conn: &Connection, names: &[String]) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        conn.config()?.create().map_err(|e| e.to_string())?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let results = admin
        .delete_topics(&refs, &AdminOptions::new().operation_timeout(Some(TIMEOUT)))
        .await
        .map_err(|e| e.to_string())?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "deleted internal topic"),
            Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => return Err(format!("cannot delete topic {topic:?}: {code}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_reasons_are_kept_once_without_their_timing() {
        let d = Diagnosis::default();
        d.keep("[thrd:sasl_plaintext://127.0.0.1:1/bootstrap]: sasl_plaintext://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed (after 181ms in state AUTH_REQ)");
        d.keep("sasl_plaintext://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed (after 252ms in state AUTH_REQ, 1 identical error(s) suppressed)");
        let seen = d.0.lock().expect("lock").clone();
        assert_eq!(
            seen,
            [
                "sasl_plaintext://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed"
            ]
        );
    }

    #[test]
    fn a_connection_shows_property_names_never_values() {
        let c = Connection {
            bootstrap_servers: Some("k:9093".into()),
            properties: vec![("sasl.password".into(), "hunter2".into())],
            from_secrets: vec![("sasl.password".into(), "hunter2".into())],
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("sasl.password") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn the_digest_changes_with_a_credential_and_shows_none() {
        let c = |pairs: &[(&str, &str)]| Connection {
            bootstrap_servers: Some("k:9093".into()),
            properties: Vec::new(),
            from_secrets: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let d = c(&[("sasl.password", "hunter2")]).digest("uid-1");
        let d = d.expect("a digest");
        assert_eq!(d.len(), 32);
        assert!(!d.contains("hunter2"));
        assert_eq!(
            c(&[("sasl.password", "hunter2")])
                .digest("uid-1")
                .as_deref(),
            Some(d.as_str()),
            "stable"
        );
        for other in [
            c(&[("sasl.password", "hunter3")]).digest("uid-1"),
            c(&[("sasl.password", "hunter2")]).digest("uid-2"),
            c(&[("sasl.passwordh", "unter2")]).digest("uid-1"),
        ] {
            assert_ne!(other.as_deref(), Some(d.as_str()));
        }
        assert_eq!(c(&[]).digest("uid-1"), None, "no Secret, no annotation");
    }
}

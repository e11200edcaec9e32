//! The worker's resolved configuration: the app file, overridden by flags and `EDDY_*`
//! environment variables, with every default made explicit.

use crate::topology::{Topology, TopologyError};
use eddy_crds::spec::{AppSpec, OnError, ProcessingGuarantee};
use eddy_crds::{ManifestError, parse_app};
use rdkafka::ClientConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read app file {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("app file {path}: {cause}")]
    Manifest { path: PathBuf, cause: ManifestError },
    /// `spec` is where the spec's fields are in the file (`spec.` or nothing).
    #[error("app file {path}: {spec}{cause}")]
    Topology {
        path: PathBuf,
        spec: &'static str,
        cause: TopologyError,
    },
    /// A field of the file; `field` is its whole path in the file.
    #[error("app file {path}: {field}: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

/// Values given on the command line or in the environment; they win over the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `EDDY_KAFKA_*` variables (`_CA_FILE`, `_CERT_FILE`, `_KEY_FILE`, `_KEY_PASSWORD`,
    /// `_SASL_MECHANISM`, `_SASL_USERNAME`, `_SASL_PASSWORD`, `_SECURITY_PROTOCOL`: see
    /// `eddy_crds::security`), as (name, value).
    pub kafka_security: Vec<(String, String)>,
    pub bootstrap_servers: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub application_id: Option<String>,
    pub instance_id: Option<String>,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// `metadata.name` when the file is a whole manifest (the resource the operator manages).
    pub resource_name: Option<String>,
    pub application_id: String,
    pub instance_id: String,
    pub bootstrap_servers: String,
    pub state_dir: PathBuf,
    pub spec: AppSpec,
    pub topology: Topology,
    pub guarantee: ProcessingGuarantee,
    pub commit_interval: Duration,
    /// Exactly-once: the producer's `transaction.timeout.ms`.
    pub transaction_timeout: Duration,
    pub on_error: OnError,
    /// How long one evaluation of a jq expression may take (`expressionTimeoutMs`).
    pub expression_timeout: Duration,
    /// How long the processing thread may make no progress before `/healthz` fails
    /// (`livenessTimeoutMs`).
    pub liveness_timeout: Duration,
    /// Bytes for RocksDB (block cache incl. memtables) and for the record cache.
    pub rocksdb_bytes: usize,
    pub record_cache_bytes: usize,
    /// librdkafka security settings from `EDDY_KAFKA_*` (TLS files, SASL credentials, which
    /// the operator mounts from Secrets); the spec's `kafka.properties` win over them.
    pub security: std::collections::BTreeMap<String, String>,
}

impl WorkerConfig {
    /// Whether every credential `spec.kafka.tls` and `spec.kafka.sasl` keep in a Secret came
    /// as its `EDDY_KAFKA_*` variable. The operator passes each; run by hand without one,
    /// the worker must not connect without TLS or credentials, so it refuses to start.
    pub fn check_credentials(&self) -> Result<(), ConfigError> {
        use eddy_crds::security::{Source, client_security};
        for (c, source) in client_security(&self.spec.kafka).credentials {
            let property = c.file().map_or(c.property(), |f| f.property);
            if let Source::Secret(r) = source
                && !self.security.contains_key(property)
            {
                let what = if c.file().is_some() {
                    "the path of a file holding it"
                } else {
                    "its value"
                };
                return Err(ConfigError::Invalid {
                    field: c.field(),
                    message: format!(
                        "names key {:?} of Secret {:?}, which only the operator reads: run without it, set {} to {what}",
                        r.key,
                        r.name,
                        c.env()
                    ),
                });
            }
        }
        Ok(())
    }
}

impl WorkerConfig {
    pub fn load(path: &Path, o: Overrides) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            cause: source,
        })?;
        Self::from_text(&text, path, o)
    }

    pub fn from_text(text: &str, path: &Path, o: Overrides) -> Result<Self, ConfigError> {
        let manifest = parse_app(text).map_err(|source| ConfigError::Manifest {
            path: path.to_path_buf(),
            cause: source,
        })?;
        let at = manifest.spec_path;
        let bad = |field: &str, message: String| ConfigError::Field {
            path: path.to_path_buf(),
            field: format!("{at}{field}"),
            message,
        };
        let application_id = o
            .application_id
            .or_else(|| manifest.application_id().map(str::to_string))
            .ok_or_else(|| {
                bad(
                    "applicationId",
                    "missing: set spec.applicationId, metadata.name or --application-id".into(),
                )
            })?;
        eddy_crds::topics::check_name(&application_id)
            .map_err(|message| bad("applicationId", message))?;
        let resource_name = manifest.name.clone();
        let spec = manifest.spec;
        let bootstrap_servers = o
            .bootstrap_servers
            .or_else(|| spec.kafka.bootstrap_servers.clone())
            .ok_or_else(|| {
                bad(
                    "kafka.bootstrapServers",
                    "missing: set it in the app file or pass --bootstrap-servers".into(),
                )
            })?;
        let guarantee = spec.processing_guarantee;
        let commit_interval = Duration::from_millis(spec.commit_interval_ms());
        let transaction_timeout = Duration::from_millis(spec.transaction_timeout_ms());
        let memory = spec
            .memory_bytes()
            .map_err(|(field, message)| bad(field, message))?;
        let addressable = |field: &str, bytes: u64| {
            usize::try_from(bytes).map_err(|_| {
                bad(
                    field,
                    format!("{bytes} bytes is more than this machine can address"),
                )
            })
        };
        let budget = addressable("memory.budget", memory.budget)?;
        let record_cache_bytes = addressable("memory.recordCache", memory.record_cache)?;
        let topology = Topology::from_spec(&application_id, &spec).map_err(|source| {
            ConfigError::Topology {
                path: path.to_path_buf(),
                spec: at,
                cause: source,
            }
        })?;
        let security = kafka_security(&spec, &o.kafka_security);
        Ok(Self {
            security,
            resource_name,
            instance_id: o
                .instance_id
                .unwrap_or_else(|| format!("{application_id}-standalone")),
            application_id,
            bootstrap_servers,
            state_dir: o
                .state_dir
                .unwrap_or_else(|| PathBuf::from("/tmp/eddy-state")),
            on_error: spec.on_error,
            expression_timeout: Duration::from_millis(
                spec.expression_timeout_ms
                    .unwrap_or(eddy_crds::manifest::DEFAULT_EXPRESSION_TIMEOUT_MS),
            ),
            liveness_timeout: Duration::from_millis(
                spec.liveness_timeout_ms
                    .unwrap_or(eddy_crds::manifest::DEFAULT_LIVENESS_TIMEOUT_MS),
            ),
            guarantee,
            commit_interval,
            transaction_timeout,
            record_cache_bytes,
            rocksdb_bytes: budget - record_cache_bytes,
            topology,
            spec,
        })
    }

    pub fn exactly_once(&self) -> bool {
        self.guarantee == ProcessingGuarantee::ExactlyOnce
    }

    /// Base client properties: the brokers plus the app's extra librdkafka properties.
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_with(&[])
    }

    /// A client with eddy's tuning for one role (`defaults`), under the app's own
    /// `kafka.properties`, so a user can always override what eddy picked.
    pub fn client_config_with(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        c.set("client.id", &self.instance_id);
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        for (k, v) in self.security.iter().chain(&self.spec.kafka.properties) {
            c.set(k, v);
        }
        c
    }

    /// Directory of one task's RocksDB instance.
    pub fn task_dir(&self, task: eddy_crds::TaskId) -> PathBuf {
        self.state_dir
            .join(&self.application_id)
            .join(task.to_string())
    }
}

/// The librdkafka settings `spec.kafka.tls` and `spec.kafka.sasl` ask for: what came as
/// `EDDY_KAFKA_*` (the operator passes each), else what the spec holds itself (the protocol,
/// the mechanism, a written username). A credential kept in a Secret comes only as its
/// variable: [`WorkerConfig::check_credentials`] says if one is missing.
fn kafka_security(
    spec: &AppSpec,
    given: &[(String, String)],
) -> std::collections::BTreeMap<String, String> {
    use eddy_crds::security::{Source, client_security};
    let wanted = client_security(&spec.kafka);
    let from_spec = wanted
        .settings
        .iter()
        .map(|(s, v)| (s.env(), v.to_string()))
        .chain(
            wanted
                .credentials
                .iter()
                .filter_map(|(c, source)| match source {
                    Source::Value(v) => Some((c.env(), v.to_string())),
                    Source::Secret(_) => None,
                }),
        )
        .filter(|(env, _)| !given.iter().any(|(n, _)| n == env))
        .map(|(k, v)| (k.to_string(), v));
    let all: Vec<(String, String)> = given.iter().cloned().chain(from_spec).collect();
    security_properties(&all)
}

/// librdkafka settings for TLS and SASL given as `EDDY_KAFKA_*` values (the mapping is
/// `eddy_crds::security`, shared with the operator).
pub fn security_properties(
    given: &[(String, String)],
) -> std::collections::BTreeMap<String, String> {
    eddy_crds::security::properties_from_env(given)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_and_sasl_from_the_environment() {
        let given = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p = security_properties(&given(&[
            ("EDDY_KAFKA_CA_FILE", "/ca"),
            ("EDDY_KAFKA_SASL_MECHANISM", "PLAIN"),
            ("EDDY_KAFKA_SASL_USERNAME", "u"),
            ("EDDY_KAFKA_SASL_PASSWORD", "p"),
        ]));
        assert_eq!(p["security.protocol"], "sasl_ssl");
        assert_eq!(p["ssl.ca.location"], "/ca");
        assert_eq!(p["sasl.password"], "p");
        assert_eq!(
            security_properties(&given(&[("EDDY_KAFKA_CA_FILE", "/ca")]))["security.protocol"],
            "ssl"
        );
        assert!(security_properties(&[]).is_empty());
    }

    #[test]
    fn the_spec_s_tls_and_sasl_are_applied_or_refused_without_their_secrets() {
        let config = |kafka: &str, given: &[(&str, &str)]| {
            let text = format!(
                "applicationId: a\ntopology: [{{from: {{topic: a}}}}]\nkafka:\n  bootstrapServers: k:9093\n{kafka}"
            );
            let o = Overrides {
                kafka_security: given
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            };
            WorkerConfig::from_text(&text, Path::new("app.yaml"), o).expect("valid")
        };
        // `tls: {}` (the system's CAs) and a written username need nothing from outside.
        let c = config("  tls: {}\n", &[]);
        assert_eq!(c.security["security.protocol"], "ssl");
        c.check_credentials().expect("no Secret named");
        // A Secret's value: `check` and the query CLI read the file without it, `run` refuses.
        let sasl = "  sasl: {mechanism: PLAIN, username: u, password: {name: c, key: p}, sendPasswordInClear: true}\n";
        let e = config(sasl, &[])
            .check_credentials()
            .expect_err("the password is in a Secret");
        assert_eq!(
            e.to_string(),
            "kafka.sasl.password: names key \"p\" of Secret \"c\", which only the operator reads: run without it, set EDDY_KAFKA_SASL_PASSWORD to its value"
        );
        let c = config(sasl, &[("EDDY_KAFKA_SASL_PASSWORD", "pw")]);
        c.check_credentials().expect("given");
        let p = &c.security;
        assert_eq!(p["security.protocol"], "sasl_plaintext");
        assert_eq!(p["sasl.mechanisms"], "PLAIN");
        assert_eq!(
            (p["sasl.username"].as_str(), p["sasl.password"].as_str()),
            ("u", "pw")
        );
        let ca = "  tls: {ca: {name: certs, key: ca.crt}}\n";
        let e = config(ca, &[])
            .check_credentials()
            .expect_err("the CA is in a Secret");
        assert!(
            e.to_string()
                .contains("set EDDY_KAFKA_CA_FILE to the path of a file holding it"),
            "{e}"
        );
        // What the operator passes wins.
        let c = config(
            ca,
            &[
                ("EDDY_KAFKA_CA_FILE", "/ca"),
                ("EDDY_KAFKA_SECURITY_PROTOCOL", "ssl"),
            ],
        );
        c.check_credentials().expect("given");
        assert_eq!(
            (
                c.security["ssl.ca.location"].as_str(),
                c.security["security.protocol"].as_str()
            ),
            ("/ca", "ssl")
        );
    }

    #[test]
    fn flags_override_the_file_and_defaults_follow_the_guarantee() {
        let text = "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {name: pv}\nspec:\n  kafka: {bootstrapServers: 'k:9092'}\n  processingGuarantee: exactly_once\n  topology: [{from: {topic: a}}]\n";
        let c = WorkerConfig::from_text(
            text,
            Path::new("app.yaml"),
            Overrides {
                bootstrap_servers: Some("127.0.0.1:1".into()),
                ..Default::default()
            },
        )
        .expect("valid");
        assert_eq!(c.bootstrap_servers, "127.0.0.1:1");
        assert_eq!(c.application_id, "pv");
        assert_eq!(c.commit_interval, Duration::from_millis(100));
        assert_eq!(
            c.rocksdb_bytes + c.record_cache_bytes,
            256 << 20,
            "the default budget"
        );
    }

    #[test]
    fn missing_bootstrap_servers_says_how_to_fix() {
        let e = WorkerConfig::from_text(
            "applicationId: a\ntopology: [{from: {topic: a}}]\n",
            Path::new("f"),
            Overrides::default(),
        )
        .expect_err("no brokers")
        .to_string();
        assert!(
            e.contains("kafka.bootstrapServers") && e.contains("--bootstrap-servers"),
            "{e}"
        );
    }
}

//! How `spec.kafka.tls` and `spec.kafka.sasl` become librdkafka settings, described once for
//! every client: the operator's admin client (credentials read from Secrets, kept in memory),
//! the worker pods (TLS material mounted from Secrets as files, SASL values as environment
//! from Secrets) and the worker itself (those files and variables into properties). Pure:
//! which property takes which value, and where the value comes from; reading Secrets and
//! files is the caller's business.

use crate::spec::{KafkaSpec, SecretKeyRef, ValueSource};

/// A setting that holds no secret: written as a plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    SecurityProtocol,
    SaslMechanism,
}

impl Setting {
    pub const ALL: [Setting; 2] = [Setting::SecurityProtocol, Setting::SaslMechanism];

    /// The librdkafka property.
    pub fn property(self) -> &'static str {
        match self {
            Setting::SecurityProtocol => "security.protocol",
            Setting::SaslMechanism => "sasl.mechanisms",
        }
    }

    /// The environment variable that carries it into a worker.
    pub fn env(self) -> &'static str {
        match self {
            Setting::SecurityProtocol => "EDDY_KAFKA_SECURITY_PROTOCOL",
            Setting::SaslMechanism => "EDDY_KAFKA_SASL_MECHANISM",
        }
    }
}

/// A credential: its value comes from a Secret (the SASL username may also be written in the
/// spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    CaCert,
    ClientCert,
    ClientKey,
    KeyPassword,
    SaslUsername,
    SaslPassword,
}

/// A file a worker reads TLS material from: mounted from a Secret under
/// `/etc/eddy/kafka/<dir>/<file>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CredentialFile {
    /// Short name: the mount directory and the volume `kafka-<dir>`.
    pub dir: &'static str,
    pub file: &'static str,
    /// The librdkafka property that takes the file's path.
    pub property: &'static str,
}

impl Credential {
    pub const ALL: [Credential; 6] = [
        Credential::CaCert,
        Credential::ClientCert,
        Credential::ClientKey,
        Credential::KeyPassword,
        Credential::SaslUsername,
        Credential::SaslPassword,
    ];

    /// The spec field it comes from, for messages.
    pub fn field(self) -> &'static str {
        match self {
            Credential::CaCert => "kafka.tls.ca",
            Credential::ClientCert => "kafka.tls.cert",
            Credential::ClientKey => "kafka.tls.key",
            Credential::KeyPassword => "kafka.tls.keyPassword",
            Credential::SaslUsername => "kafka.sasl.username",
            Credential::SaslPassword => "kafka.sasl.password",
        }
    }

    /// The librdkafka property that takes the value itself (PEM text for certificates and
    /// keys): what a client holding the value in memory sets.
    pub fn property(self) -> &'static str {
        match self {
            Credential::CaCert => "ssl.ca.pem",
            Credential::ClientCert => "ssl.certificate.pem",
            Credential::ClientKey => "ssl.key.pem",
            Credential::KeyPassword => "ssl.key.password",
            Credential::SaslUsername => "sasl.username",
            Credential::SaslPassword => "sasl.password",
        }
    }

    /// Certificates and keys reach a worker as files; passwords and the username as values.
    pub fn file(self) -> Option<CredentialFile> {
        let (dir, file, property) = match self {
            Credential::CaCert => ("ca", "ca.crt", "ssl.ca.location"),
            Credential::ClientCert => ("cert", "tls.crt", "ssl.certificate.location"),
            Credential::ClientKey => ("key", "tls.key", "ssl.key.location"),
            _ => return None,
        };
        Some(CredentialFile {
            dir,
            file,
            property,
        })
    }

    /// The environment variable that carries it into a worker: the file's path for
    /// certificates and keys, else the value.
    pub fn env(self) -> &'static str {
        match self {
            Credential::CaCert => "EDDY_KAFKA_CA_FILE",
            Credential::ClientCert => "EDDY_KAFKA_CERT_FILE",
            Credential::ClientKey => "EDDY_KAFKA_KEY_FILE",
            Credential::KeyPassword => "EDDY_KAFKA_KEY_PASSWORD",
            Credential::SaslUsername => "EDDY_KAFKA_SASL_USERNAME",
            Credential::SaslPassword => "EDDY_KAFKA_SASL_PASSWORD",
        }
    }

    /// Part of TLS (as opposed to SASL).
    pub fn is_tls(self) -> bool {
        !matches!(self, Credential::SaslUsername | Credential::SaslPassword)
    }
}

/// Where a credential's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    /// Written in the spec (not a secret: the SASL username).
    Value(&'a str),
    Secret(&'a SecretKeyRef),
}

/// The security settings of a Kafka client for `spec.kafka`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientSecurity<'a> {
    pub settings: Vec<(Setting, &'static str)>,
    pub credentials: Vec<(Credential, Source<'a>)>,
}

/// `security.protocol` for a client with or without TLS and SASL; None for plaintext
/// (librdkafka's default).
pub fn security_protocol(tls: bool, sasl: bool) -> Option<&'static str> {
    match (tls, sasl) {
        (true, true) => Some("sasl_ssl"),
        (false, true) => Some("sasl_plaintext"),
        (true, false) => Some("ssl"),
        (false, false) => None,
    }
}

/// The password goes to the brokers in clear: SASL `PLAIN` without TLS, as the client will
/// connect (`kafka.properties` win over `tls` and `sasl`, as in every client). A `PLAIN`
/// client without a `tls` block counts as plaintext whatever the properties say, as the
/// CRD's admission rule (which does not read them) sees it: write `tls: {}` for TLS with the
/// system's CAs.
pub fn password_in_clear(kafka: &KafkaSpec) -> bool {
    let Some(sasl) = &kafka.sasl else {
        return false;
    };
    let property = |name: &str| {
        kafka
            .properties
            .get(name)
            .map(|v| v.trim().to_ascii_uppercase())
    };
    let mechanism = property("sasl.mechanisms")
        .or_else(|| property("sasl.mechanism"))
        .unwrap_or_else(|| sasl.mechanism.as_str().to_string());
    // With a `tls` block the protocol is sasl_ssl unless the properties say otherwise.
    mechanism == "PLAIN"
        && (kafka.tls.is_none()
            || property("security.protocol").as_deref() == Some("SASL_PLAINTEXT"))
}

/// What `spec.kafka.tls` and `spec.kafka.sasl` ask of a client. `tls: {}` alone means TLS
/// with the system's CAs.
pub fn client_security(kafka: &KafkaSpec) -> ClientSecurity<'_> {
    let mut out = ClientSecurity::default();
    if let Some(p) = security_protocol(kafka.tls.is_some(), kafka.sasl.is_some()) {
        out.settings.push((Setting::SecurityProtocol, p));
    }
    if let Some(tls) = &kafka.tls {
        for (c, r) in [
            (Credential::CaCert, &tls.ca),
            (Credential::ClientCert, &tls.cert),
            (Credential::ClientKey, &tls.key),
            (Credential::KeyPassword, &tls.key_password),
        ] {
            if let Some(r) = r {
                out.credentials.push((c, Source::Secret(r)));
            }
        }
    }
    if let Some(sasl) = &kafka.sasl {
        out.settings
            .push((Setting::SaslMechanism, sasl.mechanism.as_str()));
        let username = match &sasl.username {
            ValueSource::Value(v) => Source::Value(v),
            ValueSource::Secret(r) => Source::Secret(r),
        };
        out.credentials.push((Credential::SaslUsername, username));
        out.credentials
            .push((Credential::SaslPassword, Source::Secret(&sasl.password)));
    }
    out
}

/// The label that lets apps use a Secret as a Kafka credential (value `"true"`): without it
/// the operator neither reads the Secret nor makes pods that name it. Creating an app needs no
/// access to Secrets, so whoever may label the Secret decides which apps' brokers get it.
pub const CREDENTIAL_LABEL: &str = "eddy.dev/kafka-credential";
/// On such a Secret, the bootstrap servers it may be sent to (comma-separated `host:port`):
/// an app naming any other is refused. Without it, any broker an app of the namespace names.
pub const BROKERS_ANNOTATION: &str = "eddy.dev/kafka-brokers";

/// Why `secret` may not be sent to the brokers `bootstrap_servers` (None: it may), from its
/// labels and annotations.
pub fn credential_refusal(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    bootstrap_servers: &str,
) -> Option<String> {
    if labels
        .and_then(|l| l.get(CREDENTIAL_LABEL))
        .map(String::as_str)
        != Some("true")
    {
        return Some(format!(
            "it is not labelled {CREDENTIAL_LABEL}=true, which lets apps send it to the brokers they name"
        ));
    }
    let allowed = annotations.and_then(|a| a.get(BROKERS_ANNOTATION))?;
    let allowed: Vec<&str> = allowed.split(',').map(str::trim).collect();
    let known: Vec<String> = allowed.iter().map(|s| broker(s)).collect();
    let outside: Vec<&str> = bootstrap_servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && !known.contains(&broker(s)))
        .collect();
    (!outside.is_empty()).then(|| {
        format!(
            "its annotation {BROKERS_ANNOTATION} ({}) does not list {}",
            allowed.join(","),
            outside.join(", ")
        )
    })
}

/// A broker as librdkafka reads it, for comparing: no `proto://`, no trailing dot on the
/// host, lower case (host names are case-insensitive).
fn broker(s: &str) -> String {
    let s = s.rsplit_once("://").map_or(s, |(_, rest)| rest);
    let s = match s.rsplit_once(':') {
        Some((host, port)) => format!("{}:{port}", host.trim_end_matches('.')),
        None => s.trim_end_matches('.').to_string(),
    };
    s.to_ascii_lowercase()
}

/// librdkafka properties that say where the brokers are, refused in `kafka.properties`:
/// `kafka.bootstrapServers` is where, and what a Secret's brokers annotation is checked
/// against.
pub const BROKER_PROPERTIES: &[&str] = &["bootstrap.servers", "metadata.broker.list"];

/// librdkafka properties that hold credentials, refused in `kafka.properties` (they would be
/// stored in the app's ConfigMap, readable by anyone who may read it), with what to use
/// instead.
pub const CREDENTIAL_PROPERTIES: &[(&str, &str)] = &[
    (
        "sasl.password",
        "use kafka.sasl.password: {secretKeyRef: {name, key}}",
    ),
    (
        "ssl.key.pem",
        "use kafka.tls.key: {secretKeyRef: {name, key}}",
    ),
    (
        "ssl.key.password",
        "use kafka.tls.keyPassword: {secretKeyRef: {name, key}}",
    ),
    (
        "ssl.keystore.password",
        "use kafka.tls.cert and kafka.tls.key (PEM from Secrets) instead of a keystore",
    ),
    (
        "sasl.oauthbearer.client.secret",
        "SASL/OAUTHBEARER is not supported yet: use kafka.sasl (PLAIN or SCRAM)",
    ),
    (
        "sasl.oauthbearer.config",
        "SASL/OAUTHBEARER is not supported yet: use kafka.sasl (PLAIN or SCRAM)",
    ),
    (
        "sasl.oauthbearer.assertion.private.key.pem",
        "SASL/OAUTHBEARER is not supported yet: use kafka.sasl (PLAIN or SCRAM)",
    ),
    (
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "SASL/OAUTHBEARER is not supported yet: use kafka.sasl (PLAIN or SCRAM)",
    ),
];

/// Properties given to a worker as `EDDY_KAFKA_*` variables (`given`: name, value): TLS
/// files by path, SASL values as they are. An explicit `EDDY_KAFKA_SECURITY_PROTOCOL` (the
/// operator sets it) wins; otherwise the protocol follows from what was given, so a worker
/// run by hand needs only the credentials.
pub fn properties_from_env(given: &[(String, String)]) -> Vec<(&'static str, String)> {
    let get = |name: &str| {
        given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut out = Vec::new();
    let mut tls = false;
    for c in Credential::ALL {
        if let Some(v) = get(c.env()) {
            out.push((c.file().map_or(c.property(), |f| f.property), v));
            tls |= c.is_tls();
        }
    }
    let mechanism = get(Setting::SaslMechanism.env());
    let protocol = get(Setting::SecurityProtocol.env())
        .or_else(|| security_protocol(tls, mechanism.is_some()).map(str::to_string));
    if let Some(m) = mechanism {
        out.push((Setting::SaslMechanism.property(), m));
    }
    if let Some(p) = protocol {
        out.push((Setting::SecurityProtocol.property(), p));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{SaslMechanism, SaslSpec, TlsSpec};

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn plaintext_needs_nothing() {
        assert_eq!(
            client_security(&KafkaSpec::default()),
            ClientSecurity::default()
        );
    }

    #[test]
    fn sasl_over_tls_maps_every_credential_to_its_property() {
        let ca = secret("kafka-ca", "ca.crt");
        let pass = secret("creds", "password");
        let kafka = KafkaSpec {
            tls: Some(TlsSpec {
                ca: Some(ca.clone()),
                ..Default::default()
            }),
            sasl: Some(SaslSpec {
                mechanism: SaslMechanism::ScramSha512,
                username: ValueSource::Value("alice".into()),
                password: pass.clone(),
                send_password_in_clear: false,
            }),
            ..Default::default()
        };
        let s = client_security(&kafka);
        assert_eq!(
            s.settings,
            [
                (Setting::SecurityProtocol, "sasl_ssl"),
                (Setting::SaslMechanism, "SCRAM-SHA-512")
            ]
        );
        assert_eq!(
            s.credentials,
            [
                (Credential::CaCert, Source::Secret(&ca)),
                (Credential::SaslUsername, Source::Value("alice")),
                (Credential::SaslPassword, Source::Secret(&pass)),
            ]
        );
        let props: Vec<&str> = s.credentials.iter().map(|(c, _)| c.property()).collect();
        assert_eq!(props, ["ssl.ca.pem", "sasl.username", "sasl.password"]);
    }

    #[test]
    fn tls_alone_is_ssl_even_without_a_ca() {
        let kafka = KafkaSpec {
            tls: Some(TlsSpec::default()),
            ..Default::default()
        };
        let s = client_security(&kafka);
        assert_eq!(s.settings, [(Setting::SecurityProtocol, "ssl")]);
        assert!(s.credentials.is_empty());
    }

    #[test]
    fn worker_environment_becomes_file_and_value_properties() {
        let given = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p: std::collections::BTreeMap<_, _> = properties_from_env(&given(&[
            ("EDDY_KAFKA_CA_FILE", "/ca"),
            ("EDDY_KAFKA_KEY_FILE", "/key"),
            ("EDDY_KAFKA_KEY_PASSWORD", "kp"),
            ("EDDY_KAFKA_SASL_MECHANISM", "PLAIN"),
            ("EDDY_KAFKA_SASL_USERNAME", "u"),
            ("EDDY_KAFKA_SASL_PASSWORD", "p"),
            ("EDDY_KAFKA_VERSION", "ignored"),
        ]))
        .into_iter()
        .collect();
        assert_eq!(p["security.protocol"], "sasl_ssl");
        assert_eq!(p["ssl.ca.location"], "/ca");
        assert_eq!(p["ssl.key.location"], "/key");
        assert_eq!(p["ssl.key.password"], "kp");
        assert_eq!(p["sasl.mechanisms"], "PLAIN");
        assert_eq!(p["sasl.username"], "u");
        assert_eq!(p["sasl.password"], "p");
        assert_eq!(p.len(), 7);
        let only_ca = properties_from_env(&given(&[("EDDY_KAFKA_CA_FILE", "/ca")]));
        assert!(only_ca.contains(&("security.protocol", "ssl".into())));
        // The operator says so explicitly, e.g. for TLS with the system's CAs.
        let explicit = properties_from_env(&given(&[("EDDY_KAFKA_SECURITY_PROTOCOL", "ssl")]));
        assert_eq!(explicit, [("security.protocol", "ssl".to_string())]);
        assert!(properties_from_env(&[]).is_empty());
    }

    #[test]
    fn every_credential_has_its_own_property_and_variable() {
        let mut seen = std::collections::HashSet::new();
        for c in Credential::ALL {
            assert!(seen.insert(c.property()), "{c:?}");
            assert!(seen.insert(c.env()), "{c:?}");
            if let Some(f) = c.file() {
                assert!(seen.insert(f.property), "{c:?}");
            }
            assert!(
                !CREDENTIAL_PROPERTIES
                    .iter()
                    .any(|(p, _)| *p == c.file().map_or("", |f| f.property)),
                "a file path is no credential"
            );
        }
        for s in Setting::ALL {
            assert!(seen.insert(s.property()) && seen.insert(s.env()), "{s:?}");
        }
    }

    #[test]
    fn a_secret_is_a_credential_only_when_labelled_and_only_for_its_brokers() {
        use std::collections::BTreeMap;
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        let servers = "k1:9093, k2:9093";
        let why = credential_refusal(None, None, servers).expect("unlabelled");
        assert!(why.contains("eddy.dev/kafka-credential=true"), "{why}");
        let why = credential_refusal(Some(&map(CREDENTIAL_LABEL, "yes")), None, servers);
        assert!(why.is_some(), "only the value true opts in");
        let labelled = map(CREDENTIAL_LABEL, "true");
        assert_eq!(credential_refusal(Some(&labelled), None, servers), None);
        let brokers = map(BROKERS_ANNOTATION, "k1:9093,k2:9093,k3:9093");
        assert_eq!(
            credential_refusal(Some(&labelled), Some(&brokers), servers),
            None
        );
        // Written another way, the same brokers.
        assert_eq!(
            credential_refusal(
                Some(&labelled),
                Some(&brokers),
                "K1.:9093,SASL_SSL://k2:9093"
            ),
            None
        );
        let why = credential_refusal(Some(&labelled), Some(&brokers), "k1:9093,evil.example:9092")
            .expect("a broker outside the annotation");
        assert!(
            why.contains("does not list evil.example:9092") && !why.contains("k1:9093,evil"),
            "{why}"
        );
    }

    #[test]
    fn a_password_is_in_clear_with_plain_without_tls_as_the_client_connects() {
        let secret = SecretKeyRef {
            name: "c".into(),
            key: "p".into(),
        };
        let sasl = |mechanism| SaslSpec {
            mechanism,
            username: ValueSource::Value("u".into()),
            password: secret.clone(),
            send_password_in_clear: false,
        };
        let kafka = |sasl: Option<SaslSpec>, tls: bool, props: &[(&str, &str)]| KafkaSpec {
            sasl,
            tls: tls.then(TlsSpec::default),
            properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let plain = Some(sasl(SaslMechanism::Plain));
        let scram = Some(sasl(SaslMechanism::ScramSha512));
        assert!(password_in_clear(&kafka(plain.clone(), false, &[])));
        assert!(!password_in_clear(&kafka(plain.clone(), true, &[])));
        assert!(!password_in_clear(&kafka(scram.clone(), false, &[])));
        assert!(!password_in_clear(&kafka(None, false, &[])));
        // What kafka.properties say wins, as in the clients.
        assert!(password_in_clear(&kafka(
            plain.clone(),
            true,
            &[("security.protocol", "sasl_plaintext")]
        )));
        assert!(password_in_clear(&kafka(
            scram,
            false,
            &[("sasl.mechanisms", "plain")]
        )));
        assert!(
            password_in_clear(&kafka(plain, false, &[("security.protocol", "SASL_SSL")])),
            "TLS only through the properties: as admission sees it, write tls: {{}}"
        );
    }
}

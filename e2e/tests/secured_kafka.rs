//! Apps on a secured Kafka under the operator, on a real control plane and a real broker with
//! SASL_PLAINTEXT, SSL (client certificates required) and SASL_SSL listeners
//! (`kafka.sh start --sasl --tls`): credentials come from Secrets, the operator's own admin
//! client and the worker pods use them, the apps run and count correctly, and no credential
//! shows in a ConfigMap, the app, its status, the StatefulSet, an event or the operator's log.
//! A missing Secret, a wrong password and a credential in `kafka.properties` each say what to
//! fix.

use anyhow::{Context, Result, ensure};
use eddy_e2e::k8s::{ControlPlane, Process};
use eddy_e2e::*;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);
const OPERATOR_NS: &str = "eddy-system";
const NS: &str = "secured";

fn app_yaml(name: &str, input: &str, output: &str, kafka: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 1
  commitIntervalMs: 200
  cleanupPolicy: Delete
  kafka:
{kafka}  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

fn degraded(cp: &ControlPlane, app: &str) -> (String, String) {
    let c = |f: &str| {
        cp.jsonpath(
            NS,
            &format!("ssapp/{app}"),
            &format!("{{.status.conditions[?(@.type==\"Degraded\")].{f}}}"),
        )
    };
    (c("reason"), c("message"))
}

fn logs(dir: &Path) -> String {
    ["operator.log", "runner.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            format!(
                "--- {f}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn apps_on_sasl_and_tls_listeners_run_with_credentials_only_in_secrets() -> Result<()> {
    let name = format!("sec-{}", std::process::id());
    let (_kafka, info) = own_secured_cluster(&name, &["--sasl", "--tls"])?;
    let get = |k: &str| -> Result<String> {
        info.get(k)
            .cloned()
            .with_context(|| format!("kafka.sh info has no {k}: {info:?}"))
    };
    let password = get("sasl_password")?;
    let ca = std::fs::read_to_string(get("ca_file")?)?;
    let client_cert = std::fs::read_to_string(get("client_cert_file")?)?;
    let client_key = std::fs::read_to_string(get("client_key_file")?)?;

    let cp = ControlPlane::start(&name)?;
    let dir = tempfile::tempdir()?;
    let op_kubeconfig = cp.install_operator_rbac(OPERATOR_NS, dir.path())?;
    let _operator = Process::spawn(
        "eddy-operator",
        &[
            "run",
            "--http-addr",
            &format!("127.0.0.1:{}", free_port()?),
            "--namespace",
            OPERATOR_NS,
            "--identity",
            "op",
            "--lease-name",
            ControlPlane::LEASE,
        ],
        &[("KUBECONFIG", &op_kubeconfig)],
        &dir.path().join("operator.log"),
    )?;
    let _runner = Process::spawn(
        "pod-runner",
        &[
            "--kubeconfig",
            &cp.kubeconfig.to_string_lossy(),
            "--node",
            "e2e-node",
            "--root",
            &dir.path().join("node").to_string_lossy(),
        ],
        &[],
        &dir.path().join("runner.log"),
    )?;
    cp.kubectl(&["create", "namespace", NS], None)?;

    // The credentials, as a user would keep them: in Secrets of the app's namespace.
    let files = dir.path().join("secrets");
    std::fs::create_dir_all(&files)?;
    for (f, text) in [
        ("password", password.as_str()),
        ("username", "eddy"),
        ("ca.crt", &ca),
        ("tls.crt", &client_cert),
        ("tls.key", &client_key),
    ] {
        std::fs::write(files.join(f), text)?;
    }
    let from = |f: &str| format!("--from-file={f}={}", files.join(f).display());
    cp.kubectl(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "kafka-sasl",
            &from("username"),
            &from("password"),
        ],
        None,
    )?;
    cp.kubectl(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "kafka-tls",
            &from("ca.crt"),
            &from("tls.crt"),
            &from("tls.key"),
        ],
        None,
    )?;
    // Whoever keeps the Secrets lets the namespace's apps use them as Kafka credentials.
    let label = |secret: &str| {
        cp.kubectl(
            &[
                "-n",
                NS,
                "label",
                "secret",
                secret,
                &format!("{}=true", eddy_crds::security::CREDENTIAL_LABEL),
            ],
            None,
        )
    };
    label("kafka-sasl")?;
    label("kafka-tls")?;

    // Three apps, one per listener: SCRAM with a literal username; mutual TLS; PLAIN over TLS
    // with the username from a Secret in today's `{name, key}` shape.
    let apps = [
        (
            unique("scram"),
            format!(
                "    bootstrapServers: {}\n    sasl:\n      mechanism: SCRAM-SHA-512\n      username: eddy\n      password: {{secretKeyRef: {{name: kafka-sasl, key: password}}}}\n",
                get("sasl_plaintext")?
            ),
        ),
        (
            unique("mtls"),
            format!(
                "    bootstrapServers: {}\n    tls:\n      ca: {{secretKeyRef: {{name: kafka-tls, key: ca.crt}}}}\n      cert: {{secretKeyRef: {{name: kafka-tls, key: tls.crt}}}}\n      key: {{secretKeyRef: {{name: kafka-tls, key: tls.key}}}}\n",
                get("ssl")?
            ),
        ),
        (
            unique("sasl-ssl"),
            format!(
                "    bootstrapServers: {}\n    tls: {{ca: {{name: kafka-tls, key: ca.crt}}}}\n    sasl: {{mechanism: PLAIN, username: {{name: kafka-sasl, key: username}}, password: {{name: kafka-sasl, key: password}}}}\n",
                get("sasl_ssl")?
            ),
        ),
    ];
    let records: Vec<Input> = (0..300)
        .map(|i| {
            (
                Some(format!("k{}", i % 30).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    for (app, kafka) in &apps {
        let (input, output) = (format!("{app}-in"), format!("{app}-out"));
        create_topic(&input, 2)?;
        create_topic(&output, 2)?;
        produce(&input, &records)?;
        cp.kubectl(
            &["-n", NS, "apply", "-f", "-"],
            Some(&app_yaml(app, &input, &output, kafka)),
        )?;
    }
    for (app, _) in &apps {
        wait_until(WAIT, || {
            let last = latest_by_key(&format!("{app}-out"))?;
            Ok(last.len() == 30 && last.values().all(|v| v.as_slice() == 10i64.to_be_bytes()))
        })
        .with_context(|| format!("{app}: {}\n{}", degraded(&cp, app).1, logs(dir.path())))?;
        wait_until(WAIT, || {
            Ok(cp.jsonpath(NS, &format!("ssapp/{app}"), "{.status.phase}") == "Running")
        })
        .with_context(|| {
            format!(
                "{app} status: {}\n{}",
                cp.jsonpath(NS, &format!("ssapp/{app}"), "{.status}"),
                logs(dir.path())
            )
        })?;
        // The operator created the internal topic through the secured listener (the default
        // application id is `<namespace>.<name>`).
        ensure!(
            partition_count(&format!("{NS}.{app}-counts-changelog"))? == 2,
            "{app}: no changelog"
        );
    }

    // No credential in any object the operator writes (nor in its log): the password, the
    // client key, in clear or base64 as a Secret holds it.
    // The base64 forms as the Secrets hold them.
    let b64 = |secret: &str, key: &str| {
        cp.jsonpath(NS, &format!("secret/{secret}"), &format!("{{.data.{key}}}"))
    };
    let key_line = client_key
        .lines()
        .find(|l| l.len() >= 60 && !l.starts_with("-----"))
        .context("a line of the client key")?
        .to_string();
    let needles = [
        password.clone(),
        b64("kafka-sasl", "password"),
        key_line,
        b64("kafka-tls", "tls\\.key"),
    ];
    ensure!(
        needles.iter().all(|n| n.len() >= 20),
        "needles: {needles:?}"
    );
    let leaks = |what: &str, text: &str| -> Result<()> {
        for n in &needles {
            ensure!(!text.contains(n.as_str()), "a credential shows in {what}");
        }
        Ok(())
    };
    for kind in [
        "configmaps",
        "statefulstreamapps",
        "statefulsets",
        "events",
        "pods",
    ] {
        leaks(
            kind,
            &cp.kubectl(&["-n", NS, "get", kind, "-o", "json"], None)?,
        )?;
    }
    leaks(
        "the operator's log",
        &std::fs::read_to_string(dir.path().join("operator.log"))?,
    )?;
    // Worker pods get the password by reference, the literal username as a value.
    let (scram, _) = &apps[0];
    let env = |var: &str, field: &str| {
        cp.jsonpath(
            NS,
            &format!("statefulset/{scram}"),
            &format!("{{.spec.template.spec.containers[0].env[?(@.name==\"{var}\")].{field}}}"),
        )
    };
    ensure!(env("EDDY_KAFKA_SASL_PASSWORD", "value").is_empty());
    ensure!(
        env("EDDY_KAFKA_SASL_PASSWORD", "valueFrom.secretKeyRef.name") == "kafka-sasl",
        "password env: {}",
        env("EDDY_KAFKA_SASL_PASSWORD", "valueFrom")
    );
    ensure!(env("EDDY_KAFKA_SASL_USERNAME", "value") == "eddy");

    // A rotated Secret rolls the pods of the app that uses it (its workers read credentials
    // when they start): the pod template's digest changes, the pod is replaced, the app goes
    // on. Text before a PEM block is ignored, so the CA file can change and stay valid.
    let (mtls, _) = &apps[1];
    let digest = || {
        cp.jsonpath(
            NS,
            &format!("statefulset/{mtls}"),
            "{.spec.template.metadata.annotations.eddy\\.dev/credentials-digest}",
        )
    };
    let before = digest();
    ensure!(before.len() == 32, "credentials digest: {before:?}");
    let pod = format!("{mtls}-0");
    let uid = cp.jsonpath(NS, &format!("pod/{pod}"), "{.metadata.uid}");
    let rotated = serde_json::json!({"stringData": {"ca.crt": format!("# rotated\n{ca}")}});
    cp.kubectl(
        &[
            "-n",
            NS,
            "patch",
            "secret",
            "kafka-tls",
            "--type=merge",
            "-p",
            &rotated.to_string(),
        ],
        None,
    )?;
    produce(&format!("{mtls}-in"), &records)?;
    wait_until(WAIT, || {
        let last = latest_by_key(&format!("{mtls}-out"))?;
        Ok(digest() != before
            && cp.jsonpath(NS, &format!("pod/{pod}"), "{.metadata.uid}") != uid
            && last.len() == 30
            && last.values().all(|v| v.as_slice() == 20i64.to_be_bytes()))
    })
    .with_context(|| {
        format!(
            "{mtls}: the rotated Secret did not roll the pod\n{}",
            logs(dir.path())
        )
    })?;

    // A missing Secret: Degraded, naming it; once created, the app runs.
    let late = unique("late");
    let (input, output) = (format!("{late}-in"), format!("{late}-out"));
    create_topic(&input, 1)?;
    create_topic(&output, 1)?;
    produce(&input, &records)?;
    let late_kafka = format!(
        "    bootstrapServers: {}\n    sasl: {{mechanism: SCRAM-SHA-256, username: eddy, password: {{secretKeyRef: {{name: late-creds, key: password}}}}}}\n",
        get("sasl_plaintext")?
    );
    cp.kubectl(
        &["-n", NS, "apply", "-f", "-"],
        Some(&app_yaml(&late, &input, &output, &late_kafka)),
    )?;
    wait_until(WAIT, || {
        let (reason, message) = degraded(&cp, &late);
        Ok(reason == "KafkaCredentialsMissing"
            && message.contains(&format!("secret {NS}/late-creds not found"))
            && message.contains("kafka.sasl.password"))
    })
    .with_context(|| format!("{:?}\n{}", degraded(&cp, &late), logs(dir.path())))?;
    ensure!(
        cp.jsonpath(NS, &format!("statefulset/{late}"), "{.metadata.name}")
            .is_empty(),
        "a StatefulSet naming the missing Secret was made"
    );
    cp.kubectl(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "late-creds",
            &from("password"),
        ],
        None,
    )?;
    // Not labelled as a Kafka credential: the app may not use it, and gets no pod (a pod
    // would carry the password to whatever brokers the app names); nor did it while the
    // Secret was missing.
    let no_pods = || {
        cp.jsonpath(NS, &format!("statefulset/{late}"), "{.metadata.name}")
            .is_empty()
    };
    wait_until(WAIT, || {
        let (reason, message) = degraded(&cp, &late);
        Ok(reason == "KafkaCredentialsNotAllowed"
            && message.contains(&format!(
                "secret {NS}/late-creds may not be used by this app"
            ))
            && message.contains(&format!(
                "kubectl -n {NS} label secret late-creds eddy.dev/kafka-credential=true"
            )))
    })
    .with_context(|| format!("{:?}\n{}", degraded(&cp, &late), logs(dir.path())))?;
    ensure!(
        no_pods(),
        "a StatefulSet naming the unlabelled Secret was made"
    );
    // Labelled, but for other brokers only.
    cp.kubectl(
        &[
            "-n",
            NS,
            "annotate",
            "secret",
            "late-creds",
            &format!("{}=elsewhere:9092", eddy_crds::security::BROKERS_ANNOTATION),
        ],
        None,
    )?;
    label("late-creds")?;
    let servers = get("sasl_plaintext")?;
    wait_until(WAIT, || {
        let (reason, message) = degraded(&cp, &late);
        Ok(reason == "KafkaCredentialsNotAllowed"
            && message.contains(&format!("(elsewhere:9092) does not list {servers}")))
    })
    .with_context(|| format!("{:?}\n{}", degraded(&cp, &late), logs(dir.path())))?;
    ensure!(
        no_pods(),
        "a StatefulSet naming a Secret meant for other brokers was made"
    );
    cp.kubectl(
        &[
            "-n",
            NS,
            "annotate",
            "--overwrite",
            "secret",
            "late-creds",
            &format!(
                "{}=elsewhere:9092,{servers}",
                eddy_crds::security::BROKERS_ANNOTATION
            ),
        ],
        None,
    )?;
    wait_until(WAIT, || {
        let last = latest_by_key(&output)?;
        Ok(last.len() == 30
            && cp.jsonpath(NS, &format!("ssapp/{late}"), "{.status.phase}") == "Running")
    })
    .with_context(|| format!("{:?}\n{}", degraded(&cp, &late), logs(dir.path())))?;

    // A wrong password: Degraded, and the message says authentication failed.
    std::fs::write(files.join("wrong"), "not-the-password")?;
    cp.kubectl(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "wrong-creds",
            &format!("--from-file=password={}", files.join("wrong").display()),
        ],
        None,
    )?;
    label("wrong-creds")?;
    let wrong = unique("wrong");
    let wrong_kafka = late_kafka.replace("late-creds", "wrong-creds");
    cp.kubectl(
        &["-n", NS, "apply", "-f", "-"],
        Some(&app_yaml(&wrong, &input, &output, &wrong_kafka)),
    )?;
    wait_until(WAIT, || {
        let (reason, message) = degraded(&cp, &wrong);
        Ok(reason == "KafkaUnreachable"
            && message.contains("SASL authentication error: Authentication failed"))
    })
    .with_context(|| format!("{:?}\n{}", degraded(&cp, &wrong), logs(dir.path())))?;
    ensure!(
        !degraded(&cp, &wrong).1.contains("not-the-password"),
        "the message repeats the password"
    );

    // A credential in kafka.properties never reaches the cluster.
    let bad = app_yaml(
        "bad-props",
        &input,
        &output,
        "    bootstrapServers: x:9092\n    properties: {sasl.password: hunter2}\n",
    );
    let err = cp
        .kubectl(&["-n", NS, "apply", "-f", "-"], Some(&bad))
        .expect_err("admission must refuse a credential in kafka.properties");
    ensure!(
        err.to_string()
            .contains("kafka.properties must not hold credentials"),
        "{err}"
    );

    // Nor does a PLAIN password in clear, unless the app says so.
    let plain = |extra: &str| {
        app_yaml(
            "plain",
            &input,
            &output,
            &format!(
                "    bootstrapServers: x:9092\n    sasl: {{mechanism: PLAIN, username: u, password: {{name: kafka-sasl, key: password}}{extra}}}\n"
            ),
        )
    };
    let err = cp
        .kubectl(
            &["-n", NS, "apply", "--dry-run=server", "-f", "-"],
            Some(&plain("")),
        )
        .expect_err("admission must refuse PLAIN without TLS");
    ensure!(
        err.to_string().contains("sendPasswordInClear: true"),
        "{err}"
    );
    cp.kubectl(
        &["-n", NS, "apply", "--dry-run=server", "-f", "-"],
        Some(&plain(", sendPasswordInClear: true")),
    )
    .context("PLAIN in clear, said so")?;

    // Deleting the apps deletes their internal topics through the secured listeners.
    for (app, _) in &apps {
        cp.kubectl(
            &[
                "-n",
                NS,
                "delete",
                "ssapp",
                app,
                "--wait=true",
                "--timeout=120s",
            ],
            None,
        )?;
        wait_until(WAIT, || {
            Ok(topics_with_prefix(&format!("{app}-counts"))?.is_empty())
        })
        .with_context(|| logs(dir.path()))?;
    }
    cp.kubectl(
        &["delete", "namespace", NS, "--wait=true", "--timeout=120s"],
        None,
    )?;
    Ok(())
}

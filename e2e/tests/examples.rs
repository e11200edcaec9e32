//! The manifests of examples/kubernetes/ on a real API server with the CRD of the chart
//! installed: every file passes `kubectl apply --dry-run=server` with strict field validation
//! (a field the CRD does not declare, a wrong type or a value its rules refuse fails the
//! test), the server returns exactly the objects the file holds, and every Secret an app names
//! from the same file is labelled as the operator requires and holds the key named. A control
//! plane only: no Kafka, no operator. Its own, stopped when the test ends (even by a failure).
//!
//! `eddy-worker check` is not run on them: it reads one document per file, and
//! secured-kafka.yaml holds its Secrets too.

use anyhow::{Context as _, Result, ensure};
use eddy_crds::security::CREDENTIAL_LABEL;
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::repo_root;
use serde_json::Value;
use std::path::{Path, PathBuf};

const DIR: &str = "examples/kubernetes";
const NS: &str = "examples";

/// The files the docs point to, with the kinds of their objects in order.
const EXPECTED: &[(&str, &[&str])] = &[
    ("small-app.yaml", &["StatefulStreamApp"]),
    (
        "secured-kafka.yaml",
        &["Secret", "Secret", "StatefulStreamApp"],
    ),
];

#[test]
fn every_kubernetes_example_passes_a_server_side_dry_run() -> Result<()> {
    let files = manifests()?;
    for (name, _) in EXPECTED {
        ensure!(
            files.iter().any(|f| file_name(f) == *name),
            "{DIR}/{name} is missing (found {files:?})"
        );
    }

    let cp = ControlPlane::start(&format!("examples-{}", std::process::id()))?;
    cp.install_crd(&repo_root().join("charts/eddy-operator/crds"))?;
    cp.kubectl(&["create", "namespace", NS], None)?;

    for file in &files {
        let name = file_name(file);
        let text = std::fs::read_to_string(file).with_context(|| format!("{DIR}/{name}"))?;
        let objects = dry_run(&cp, file).with_context(|| format!("{DIR}/{name}"))?;
        let returned: Vec<String> = objects.iter().map(kind_and_name).collect();
        let written: Vec<String> = eddy_e2e::chart::documents(&text)
            .with_context(|| format!("{DIR}/{name}"))?
            .iter()
            .map(kind_and_name)
            .collect();
        ensure!(
            returned == written,
            "{name}: the dry run returned {returned:?}, the file holds {written:?}"
        );
        if let Some((_, kinds)) = EXPECTED.iter().find(|(f, _)| *f == name) {
            let got: Vec<&str> = objects
                .iter()
                .map(|o| o["kind"].as_str().unwrap_or_default())
                .collect();
            ensure!(got == *kinds, "{name}: kinds {got:?}, expected {kinds:?}");
        }
        for o in &objects {
            ensure!(
                o["metadata"]["namespace"] == NS,
                "{name}: {} is not in the namespace applied to (a file must not name one)",
                kind_and_name(o)
            );
        }
        secrets_as_the_operator_wants(name, &objects)?;
        if name == "secured-kafka.yaml" {
            let app = objects
                .iter()
                .find(|o| o["kind"] == "StatefulStreamApp")
                .context("secured-kafka.yaml: no app")?;
            let kafka = &app["spec"]["kafka"];
            ensure!(
                kafka["sasl"]["mechanism"] == "SCRAM-SHA-512" && kafka["tls"].is_object(),
                "secured-kafka.yaml: not TLS with SCRAM-SHA-512: {kafka}"
            );
        }
    }

    // A dry run stores nothing.
    let stored = cp.kubectl(&["-n", NS, "get", "ssapp", "-o", "name"], None)?;
    ensure!(
        stored.trim().is_empty(),
        "apps stored by a dry run: {stored}"
    );
    // Dropping `cp` stops the control plane, on failure too.
    Ok(())
}

/// The YAML files of examples/kubernetes, sorted.
fn manifests() -> Result<Vec<PathBuf>> {
    let dir = repo_root().join(DIR);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn file_name(path: &Path) -> &str {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
}

/// `kubectl apply --dry-run=server` of a file into [`NS`]: the objects as the API server
/// would store them. Strict field validation: an unknown or duplicate field is an error, not
/// a warning.
fn dry_run(cp: &ControlPlane, file: &Path) -> Result<Vec<Value>> {
    let out = cp.kubectl(
        &[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-n",
            NS,
            "-o",
            "json",
            "-f",
            &file.to_string_lossy(),
        ],
        None,
    )?;
    let v: Value = serde_json::from_str(&out).context("kubectl's JSON output")?;
    Ok(match v["kind"].as_str() {
        Some("List") => v["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![v],
    })
}

fn kind_and_name(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap_or("?"),
        o["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Every Secret an app of the file names in `spec.kafka.tls` or `spec.kafka.sasl` that the
/// file also holds is labelled `eddy.dev/kafka-credential=true` (else the operator refuses it)
/// and has the key named; a file holding Secrets holds every one its apps name.
fn secrets_as_the_operator_wants(file: &str, objects: &[Value]) -> Result<()> {
    let holds_secrets = objects.iter().any(|o| o["kind"] == "Secret");
    for app in objects.iter().filter(|o| o["kind"] == "StatefulStreamApp") {
        for (field, secret, key) in secret_refs(&app["spec"]["kafka"]) {
            let found = objects
                .iter()
                .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret.as_str());
            let Some(found) = found else {
                ensure!(
                    !holds_secrets,
                    "{file}: {field} names Secret {secret}, which the file does not hold"
                );
                continue;
            };
            ensure!(
                found["metadata"]["labels"][CREDENTIAL_LABEL] == "true",
                "{file}: Secret {secret} ({field}) is not labelled {CREDENTIAL_LABEL}=true"
            );
            ensure!(
                found["data"][key.as_str()].is_string(),
                "{file}: Secret {secret} has no key {key} ({field})"
            );
        }
    }
    Ok(())
}

/// (field, Secret, key) of every Secret key `spec.kafka` names, in either shape
/// (`{secretKeyRef: {name, key}}` or `{name, key}`); a username written as a string is none.
fn secret_refs(kafka: &Value) -> Vec<(String, String, String)> {
    let mut refs = Vec::new();
    for (block, fields) in [
        ("tls", &["ca", "cert", "key", "keyPassword"][..]),
        ("sasl", &["username", "password"][..]),
    ] {
        for field in fields {
            let v = &kafka[block][*field];
            let r = if v["secretKeyRef"].is_object() {
                &v["secretKeyRef"]
            } else {
                v
            };
            if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) {
                refs.push((
                    format!("spec.kafka.{block}.{field}"),
                    name.to_string(),
                    key.to_string(),
                ));
            }
        }
    }
    refs
}

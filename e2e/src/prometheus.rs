//! A real Prometheus server for end-to-end tests: built from its Go module by
//! `e2e/prometheus/build.sh` (cached), run on 127.0.0.1 with a config and rule files of the
//! test's, read through its HTTP API. [`pod_monitor_job`] and [`service_monitor_job`] turn the
//! chart's rendered PodMonitor and ServiceMonitor into the scrape jobs the prometheus-operator
//! would generate from them, so a test scrapes the way the chart tells a cluster's Prometheus
//! to.

use crate::{free_port, http_get, repo_root, wait_until};
use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The directory holding `prometheus` and `promtool` (built on first use, a few minutes).
pub fn bin_dir() -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/prometheus/build.sh"))
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "e2e/prometheus/build.sh failed");
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    ))
}

/// A running Prometheus server, stopped (and its data removed) when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    dir: tempfile::TempDir,
}

/// One alert as `/api/v1/alerts` shows it.
#[derive(Clone, Debug)]
pub struct Alert {
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    pub labels: Value,
    pub annotations: Value,
    pub value: String,
}

impl Prometheus {
    /// Start with `config` (prometheus.yml, YAML or JSON; its `rule_files` may name the
    /// `rules` given here by file name) and wait until it is ready.
    pub fn start(config: &str, rules: &[(&str, &str)]) -> Result<Self> {
        let bin = bin_dir()?.join("prometheus");
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("prometheus.yml"), config)?;
        for (name, text) in rules {
            std::fs::write(dir.path().join(name), text)?;
        }
        let addr = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let child = Command::new(bin)
            .current_dir(dir.path())
            .args([
                "--config.file=prometheus.yml",
                "--storage.tsdb.path=data",
                &format!("--web.listen-address={addr}"),
                "--log.level=info",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let mut prom = Prometheus { child, addr, dir };
        let ready = wait_until(Duration::from_secs(60), || {
            if let Some(status) = prom.child.try_wait()? {
                bail!("prometheus exited ({status}):\n{}", prom.logs());
            }
            Ok(http_get(&prom.addr, "/-/ready").is_ok_and(|(code, _)| code == 200))
        });
        ready.with_context(|| format!("prometheus did not get ready:\n{}", prom.logs()))?;
        Ok(prom)
    }

    /// Its log (stderr).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The `data` of an API answer (`/api/v1/...`), failing on an error status.
    pub fn api(&self, path: &str) -> Result<Value> {
        let (code, body) = http_get(&self.addr, path)?;
        let v: Value =
            serde_json::from_str(&body).with_context(|| format!("GET {path}: {code} {body}"))?;
        ensure!(
            code == 200 && v["status"] == "success",
            "GET {path}: {code} {body}"
        );
        Ok(v["data"].clone())
    }

    /// Every pending or firing alert.
    pub fn alerts(&self) -> Result<Vec<Alert>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| Alert {
                name: a["labels"]["alertname"].as_str().unwrap_or_default().into(),
                state: a["state"].as_str().unwrap_or_default().into(),
                labels: a["labels"].clone(),
                annotations: a["annotations"].clone(),
                value: a["value"].as_str().unwrap_or_default().into(),
            })
            .collect())
    }

    /// The active scrape targets: their labels (after relabelling) and health.
    pub fn targets(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/targets?state=active")?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Kubernetes label name as Prometheus' service discovery spells it in meta labels.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A monitor's `relabelings` in a scrape config's spelling.
fn relabel_configs(relabelings: &Value) -> Vec<Value> {
    let key = |k: &str| match k {
        "sourceLabels" => "source_labels".to_string(),
        "targetLabel" => "target_label".to_string(),
        other => other.to_string(),
    };
    relabelings
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let mut out = serde_json::Map::new();
            for (k, v) in r.as_object().into_iter().flatten() {
                let v = match (k.as_str(), v) {
                    ("action", Value::String(a)) => Value::from(a.to_lowercase()),
                    _ => v.clone(),
                };
                out.insert(key(k), v);
            }
            Value::Object(out)
        })
        .collect()
}

/// A monitor's namespace (empty when not set) and name, as its job names use them.
fn monitor_id(monitor: &Value) -> Result<(&str, &str)> {
    let meta = &monitor["metadata"];
    let ns = meta["namespace"].as_str().unwrap_or_default();
    Ok((ns, meta["name"].as_str().context("no name")?))
}

/// The scrape job the prometheus-operator generates from a PodMonitor's first endpoint (the
/// parts the chart uses): pods found through the API server of `kubeconfig` in the monitor's
/// namespaces, kept by its selector's `matchLabels` and the endpoint's port name, labelled
/// `namespace`, `container`, `pod`, `job` and `endpoint`, then the endpoint's relabelings.
/// With `address_annotation`, a pod's address is read from that annotation: the pod runner's
/// pods do not listen where their IP and container port say.
pub fn pod_monitor_job(
    monitor: &Value,
    kubeconfig: &Path,
    interval: &str,
    address_annotation: Option<&str>,
) -> Result<Value> {
    let (ns, name) = monitor_id(monitor)?;
    let spec = &monitor["spec"];
    let endpoint = &spec["podMetricsEndpoints"][0];
    let port = endpoint["port"].as_str().context("no endpoint port")?;
    let mut relabel = Vec::new();
    for (label, value) in spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let l = sanitize(label);
        relabel.push(json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_pod_label_{l}"), format!("__meta_kubernetes_pod_labelpresent_{l}")],
            "regex": format!("({});true", value.as_str().unwrap_or_default()),
        }));
    }
    relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}));
    if let Some(a) = address_annotation {
        relabel.push(json!({
            "source_labels": [format!("__meta_kubernetes_pod_annotation_{}", sanitize(a))],
            "regex": "(.+)",
            "target_label": "__address__",
        }));
    }
    relabel.extend([
        json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
        json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
        json!({"target_label": "job", "replacement": format!("{ns}/{name}")}),
        json!({"target_label": "endpoint", "replacement": port}),
    ]);
    relabel.extend(relabel_configs(&endpoint["relabelings"]));
    let mut sd = json!({"role": "pod", "kubeconfig_file": kubeconfig});
    if let Some(names) = spec["namespaceSelector"]["matchNames"].as_array() {
        sd["namespaces"] = json!({"names": names});
    }
    Ok(json!({
        "job_name": format!("podMonitor/{ns}/{name}/0"),
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "kubernetes_sd_configs": [sd],
        "relabel_configs": relabel,
    }))
}

/// The scrape job of a ServiceMonitor's first endpoint, for targets that are no Service's
/// endpoints (operators running as local processes: an Endpoints object may not point at
/// loopback addresses): its path and `honorLabels`, and the labels the prometheus-operator
/// gives (`job` is the Service's name, `namespace` the Service's).
pub fn service_monitor_job(
    monitor: &Value,
    service: &str,
    targets: &[String],
    interval: &str,
) -> Result<Value> {
    let (ns, name) = monitor_id(monitor)?;
    let endpoint = &monitor["spec"]["endpoints"][0];
    let port = endpoint["port"].as_str().unwrap_or_default();
    Ok(json!({
        "job_name": format!("serviceMonitor/{ns}/{name}/0"),
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "static_configs": [{
            "targets": targets,
            "labels": {"job": service, "namespace": ns, "service": service, "endpoint": port},
        }],
        "relabel_configs": relabel_configs(&endpoint["relabelings"]),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_monitor_becomes_a_pod_job_keeping_its_selector_and_port() {
        let pm = json!({
            "metadata": {"name": "t-workers", "namespace": "eddy-system"},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "eddy-worker"}},
                "namespaceSelector": {"matchNames": ["a", "b"]},
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "relabelings": [
                    {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "targetLabel": "app"},
                    {"action": "Drop", "regex": "x", "sourceLabels": ["y"]}
                ]}]
            }
        });
        let job = pod_monitor_job(&pm, Path::new("/k"), "1s", Some("e2e.eddy.dev/http-addr"))
            .expect("job");
        assert_eq!(job["job_name"], "podMonitor/eddy-system/t-workers/0");
        assert_eq!(
            job["kubernetes_sd_configs"][0]["namespaces"]["names"],
            json!(["a", "b"])
        );
        let relabel = job["relabel_configs"].as_array().expect("relabel_configs");
        assert_eq!(
            relabel[0],
            json!({"action": "keep", "regex": "(eddy-worker);true", "source_labels": [
                "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"]})
        );
        assert_eq!(relabel[1]["regex"], "http");
        assert_eq!(
            relabel[2]["source_labels"][0],
            "__meta_kubernetes_pod_annotation_e2e_eddy_dev_http_addr"
        );
        let n = relabel.len();
        assert_eq!(
            relabel[n - 2],
            json!({"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "target_label": "app"})
        );
        assert_eq!(relabel[n - 1]["action"], "drop");
    }
}

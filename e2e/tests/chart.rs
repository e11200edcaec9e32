//! The Helm chart on a real control plane: every object it renders, with every toggle on, is
//! accepted by the API server (a server-side dry-run; the prometheus-operator CRDs are
//! stand-ins from e2e/k8s/monitoring-crds.yaml); an operator installed with
//! `watchNamespaces` runs the apps of those namespaces with Roles there and touches no other;
//! its PodMonitor finds the worker pods; and namespace users manage apps through the
//! built-in `edit` and `view` roles. One control plane for the binary; the operator watches
//! only [`WATCHED`].

use anyhow::{Context, Result, bail, ensure};
use eddy_e2e::chart::{self, CHART};
use eddy_e2e::k8s::ControlPlane;
use eddy_e2e::operated::{Namespace, OPERATOR_NS, Operated, Setup, WAIT};
use eddy_e2e::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::OnceLock;

/// The namespaces the operator watches: the first is one test's (deleted when it ends), the
/// second stays for the dry-runs.
const WATCHED: [&str; 2] = ["watched-a", "watched-b"];
const WATCH_VALUE: &str = "watchNamespaces={watched-a,watched-b}";
/// A namespace the operator does not watch, with an app created before the operator started.
const UNWATCHED: &str = "unwatched";

fn env() -> Result<&'static Operated> {
    eddy_e2e::operated::shared_with(
        &Setup {
            operators: 1,
            namespaces: &WATCHED,
            values: &[WATCH_VALUE],
            args: &["--watch-namespaces", &WATCHED.join(",")],
        },
        |cp, bs| {
            cp.kubectl(&["create", "namespace", UNWATCHED], None)?;
            cp.kubectl(
                &["-n", UNWATCHED, "apply", "-f", "-"],
                Some(&app_yaml("early", bs, "never-created", "never-written")),
            )?;
            Ok(())
        },
    )
}

fn app_yaml(name: &str, bs: &str, input: &str, output: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 1
  kafka: {{bootstrapServers: "{bs}"}}
  commitIntervalMs: 200
  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

/// The stand-in prometheus-operator CRDs, installed once.
fn monitoring_crds(env: &Operated) -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let install = || -> Result<()> {
            env.kubectl(
                &[
                    "apply",
                    "--server-side",
                    "-f",
                    "e2e/k8s/monitoring-crds.yaml",
                ],
                None,
            )?;
            for crd in ["servicemonitors", "podmonitors", "prometheusrules"] {
                env.kubectl(
                    &[
                        "wait",
                        "--for=condition=Established",
                        &format!("crd/{crd}.monitoring.coreos.com"),
                        "--timeout=60s",
                    ],
                    None,
                )?;
            }
            Ok(())
        };
        install().map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!("installing the monitoring CRDs: {e}"))
}

/// `kubectl apply --dry-run=server` of a YAML stream: the objects as the API server would
/// store them.
fn dry_run(env: &Operated, yaml: &str) -> Result<Vec<Value>> {
    let out = env.kubectl(
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(yaml),
    )?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(match v["kind"].as_str() {
        Some("List") => v["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![v],
    })
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// Every toggle on.
const ALL_ON: &[&str] = &[
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.podMonitor.enabled=true",
    "--set",
    "monitoring.dashboard.enabled=true",
    "--set",
    "rbac.aggregateToDefaultRoles=true",
];

#[test]
fn the_chart_with_every_toggle_on_passes_a_server_side_dry_run() -> Result<()> {
    let env = env()?;
    monitoring_crds(env)?;
    let dashboard = std::fs::read_to_string(repo_root().join(CHART).join("files/dashboard.json"))?;

    for watch in [false, true] {
        let mut args = ALL_ON.to_vec();
        if watch {
            args.extend(["--set", "watchNamespaces={watched-b}"]);
            args.extend([
                "--set",
                "workerImage.repository=registry.example.com/t/eddy-worker",
            ]);
        }
        let yaml = chart::template(&env.cp, OPERATOR_NS, &args)?;
        let objects = dry_run(env, &yaml).with_context(|| format!("the chart with {args:?}"))?;
        let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in [
            "ServiceAccount",
            "Deployment",
            "Service",
            "ServiceMonitor",
            "PodMonitor",
            "ConfigMap",
            "ClusterRole",
            "Role",
            "RoleBinding",
        ] {
            ensure!(kinds.contains(kind), "no {kind} with {args:?}: {kinds:?}");
        }
        // Who may query is each app's (the operator's NetworkPolicy), not the chart's.
        ensure!(
            !kinds.contains("NetworkPolicy"),
            "the chart renders a NetworkPolicy: {kinds:?}"
        );
        let old = chart::template(
            &env.cp,
            OPERATOR_NS,
            &["--set", "queries.networkPolicy.enabled=true"],
        );
        ensure!(
            old.as_ref()
                .is_err_and(|e| format!("{e:#}").contains("queries.networkPolicy is gone")),
            "the chart's old query policy: {old:?}"
        );
        for role in ["t-eddy-operator-edit", "t-eddy-operator-view"] {
            ensure!(find(&objects, "ClusterRole", role).is_some(), "no {role}");
        }
        let cm = find(&objects, "ConfigMap", "t-eddy-operator-dashboard").context("dashboard")?;
        ensure!(
            cm["metadata"]["labels"]["grafana_dashboard"] == "1",
            "the dashboard ConfigMap lacks the sidecar's label: {}",
            cm["metadata"]
        );
        ensure!(
            cm["data"]["eddy.json"].as_str() == Some(dashboard.as_str()),
            "the dashboard ConfigMap does not hold files/dashboard.json as it is"
        );
        let sm = find(&objects, "ServiceMonitor", "t-eddy-operator").context("ServiceMonitor")?;
        let svc = find(&objects, "Service", "t-eddy-operator-metrics").context("Service")?;
        let selected = sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| svc["metadata"]["labels"][k] == *v);
        ensure!(
            selected,
            "the ServiceMonitor does not select the metrics Service"
        );
        ensure!(
            svc["spec"]["ports"][0]["name"] == sm["spec"]["endpoints"][0]["port"],
            "the ServiceMonitor names another port than the Service's"
        );

        let deployment = find(&objects, "Deployment", "t-eddy-operator").context("Deployment")?;
        let operator = &deployment["spec"]["template"]["spec"]["containers"][0];
        let env_of = |name: &str| {
            operator["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        let env_var = env_of("EDDY_OPERATOR_WATCH_NAMESPACES");
        // Both images are tagged with the crate version, what images/build.sh builds.
        let version = env!("CARGO_PKG_VERSION");
        let registry = if watch {
            "registry.example.com/t"
        } else {
            "ghcr.io/eddy-dev"
        };
        ensure!(
            operator["image"] == format!("ghcr.io/eddy-dev/eddy-operator:{version}").as_str(),
            "the operator's image: {}",
            operator["image"]
        );
        let worker_image = env_of("EDDY_OPERATOR_WORKER_IMAGE");
        ensure!(
            worker_image == Some(Value::from(format!("{registry}/eddy-worker:{version}"))),
            "the operator's worker image: {worker_image:?}"
        );
        let cluster_role = find(&objects, "ClusterRole", "t-eddy-operator").is_some();
        let roles: BTreeSet<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "Role" && o["metadata"]["name"] == "t-eddy-operator")
            .filter_map(|o| o["metadata"]["namespace"].as_str())
            .collect();
        if watch {
            ensure!(
                env_var == Some(Value::from(WATCHED[1])),
                "the operator is not told its namespaces: {env_var:?}"
            );
            ensure!(
                !cluster_role && roles == BTreeSet::from([WATCHED[1]]),
                "watchNamespaces: Roles in {roles:?}, ClusterRole {cluster_role}"
            );
        } else {
            ensure!(env_var.is_none(), "{env_var:?}");
            ensure!(cluster_role && roles.is_empty(), "Roles in {roles:?}");
        }
    }

    // The stand-in CRDs do refuse what the real ones would: a misspelt field.
    let yaml = chart::template(
        &env.cp,
        OPERATOR_NS,
        &[
            "--show-only",
            "templates/monitoring.yaml",
            "--set",
            "monitoring.serviceMonitor.enabled=true",
        ],
    )?;
    let wrong = yaml.replace("honorLabels:", "honourLabels:");
    ensure!(wrong != yaml, "the ServiceMonitor has no honorLabels");
    match dry_run(env, &wrong) {
        Ok(_) => bail!("a ServiceMonitor with an unknown field passed the dry-run"),
        Err(e) => ensure!(format!("{e:#}").contains("honourLabels"), "{e:#}"),
    }
    Ok(())
}

/// `monitoring.*.enabled` left null: the monitors follow the cluster's API versions.
#[test]
fn monitors_are_on_when_the_cluster_serves_the_prometheus_operator_api() -> Result<()> {
    let env = env()?;
    let kinds = |args: &[&str]| -> Result<Vec<String>> {
        let yaml = chart::template(&env.cp, OPERATOR_NS, args)?;
        Ok(yaml
            .lines()
            .filter_map(|l| l.strip_prefix("kind: "))
            .filter(|k| k.ends_with("Monitor"))
            .map(str::to_string)
            .collect())
    };
    ensure!(
        kinds(&[])?.is_empty(),
        "monitors without the API: {:?}",
        kinds(&[])?
    );
    let api = ["--api-versions", "monitoring.coreos.com/v1"];
    ensure!(
        kinds(&api)? == ["PodMonitor", "ServiceMonitor"],
        "{:?}",
        kinds(&api)?
    );
    let off = [&api[..], &["--set", "monitoring.podMonitor.enabled=false"]].concat();
    ensure!(kinds(&off)? == ["ServiceMonitor"], "{:?}", kinds(&off)?);
    Ok(())
}

#[test]
fn install_notes_say_what_was_installed_and_where_to_start() -> Result<()> {
    let env = env()?;
    // Another release name than the objects installed for the operator (`t`), which Helm
    // would refuse to take over.
    let notes = env.cp.tool(
        "helm",
        &[
            "install",
            "notes",
            CHART,
            "--namespace",
            OPERATOR_NS,
            "--dry-run=client",
            "--set",
            WATCH_VALUE,
        ],
        None,
    )?;
    let notes = notes.split("NOTES:").nth(1).context("no NOTES")?;
    for expected in [
        "Role in each watched namespace: watched-a, watched-b",
        "kubectl apply -n watched-a -f examples/page-views.yaml",
        "Helm never upgrades CRDs",
        "docs/reference.md",
        "ConfigMap notes-eddy-operator-dashboard",
    ] {
        ensure!(
            notes.contains(expected),
            "NOTES lack {expected:?}:\n{notes}"
        );
    }
    Ok(())
}

/// The operator watching two namespaces with Roles there: an app in one runs, the app in a
/// namespace it does not watch is never touched (no finalizer, no status), and the chart's
/// PodMonitor selects the worker pod and its port, whose metrics are those the dashboard
/// shows.
#[test]
fn an_operator_watching_namespaces_runs_their_apps_and_leaves_others_alone() -> Result<()> {
    let env = env()?;
    let space = Namespace::adopt(env, WATCHED[0]);
    let ns = space.name.as_str();
    let (input, output) = (space.topic("ch-in", 2)?, space.topic("ch-out", 1)?);
    let records: Vec<Input> = (0..200)
        .map(|i| {
            (
                Some(format!("k{}", i % 10).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(&input, &records)?;

    // One more unwatched app, created after the operator started.
    env.apply(
        UNWATCHED,
        &app_yaml("late", &env.bs, &input, "never-written"),
    )?;
    env.apply(ns, &app_yaml("counts", &env.bs, &input, &output))?;
    wait_until(WAIT, || {
        let last = latest_by_key(&output)?;
        Ok(last.len() == 10 && last.values().all(|v| v.as_slice() == 20i64.to_be_bytes()))
    })
    .with_context(|| env.logs())?;
    wait_until(WAIT, || {
        Ok(env.get(ns, "ssapp/counts", "{.status.phase}/{.status.ready}") == "Running/1/1")
    })
    .with_context(|| env.logs())?;

    for app in ["early", "late"] {
        let touched = env.get(
            UNWATCHED,
            &format!("ssapp/{app}"),
            "{.metadata.finalizers}{.status}",
        );
        ensure!(
            touched.is_empty(),
            "the operator touched {UNWATCHED}/{app}, outside its namespaces: {touched}"
        );
        ensure!(
            env.get(UNWATCHED, &format!("statefulset/{app}"), "{.metadata.name}")
                .is_empty(),
            "{UNWATCHED}/{app} got a StatefulSet"
        );
    }
    let log = std::fs::read_to_string(env.dir.path().join("op-0.log"))?;
    ensure!(
        !log.contains("forbidden"),
        "the operator was refused something with its Roles:\n{}",
        env.logs()
    );
    ensure!(
        env.kubectl(&["get", "clusterrolebinding", "t-eddy-operator"], None)
            .is_err(),
        "watchNamespaces must not bind a ClusterRole"
    );

    // The chart's PodMonitor selects this worker pod, scrapes its port, and labels its series
    // with the app's name.
    monitoring_crds(env)?;
    let yaml = chart::template(
        &env.cp,
        OPERATOR_NS,
        &[
            "--show-only",
            "templates/monitoring.yaml",
            "--set",
            "monitoring.podMonitor.enabled=true",
            "--set",
            WATCH_VALUE,
        ],
    )?;
    let objects = dry_run(env, &yaml)?;
    let pm = find(&objects, "PodMonitor", "t-eddy-operator-workers").context("PodMonitor")?;
    let pod: Value = serde_json::from_str(
        &env.kubectl(&["-n", ns, "get", "pod", "counts-0", "-o", "json"], None)?,
    )?;
    let labels = &pod["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        ensure!(
            labels[k] == *v,
            "the PodMonitor selects {k}={v}; the pod has {labels}"
        );
    }
    let names = pm["spec"]["namespaceSelector"]["matchNames"].to_string();
    ensure!(names.contains(ns), "the PodMonitor looks in {names} only");
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    let ports = pod["spec"]["containers"][0]["ports"].to_string();
    ensure!(
        pod["spec"]["containers"][0]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == endpoint["port"]),
        "the PodMonitor scrapes port {}; the worker has {ports}",
        endpoint["port"]
    );
    let app_label = endpoint["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["targetLabel"] == "app")
        .and_then(|r| r["sourceLabels"][0].as_str())
        .context("no relabelling to `app`")?;
    let from = app_label
        .strip_prefix("__meta_kubernetes_pod_label_")
        .context("`app` is not taken from a pod label")?;
    let value = labels
        .as_object()
        .into_iter()
        .flatten()
        .find(|(k, _)| k.replace(['.', '/', '-'], "_") == from)
        .map(|(_, v)| v.clone());
    ensure!(
        value == Some(Value::from("counts")),
        "`app` would be {value:?}, not the app's name"
    );

    // The worker serves on that port and path the worker metrics the dashboard queries: all
    // but those of events this app has not had (a worker exports a series once it has one).
    // Consumer lag is measured every 5 s.
    ensure!(endpoint["path"] == "/metrics", "{endpoint}");
    let used: BTreeSet<String> = chart::queries(&chart::dashboard()?)
        .iter()
        .flat_map(|q| chart::metric_names(q))
        .filter(|m| m.starts_with("eddy_") && !m.starts_with("eddy_operator_"))
        .collect();
    ensure!(
        used.contains("eddy_task_state"),
        "its variables read eddy_task_state"
    );
    let not_yet = [
        "eddy_bad_records_total",
        "eddy_restored_records_total",
        "eddy_standby_lag_records",
    ];
    let mut missing = Vec::new();
    wait_until(WAIT, || {
        let served = chart::exported(&env.pod_metrics(ns, "counts-0")?);
        missing = used
            .difference(&served)
            .filter(|m| !not_yet.contains(&m.as_str()))
            .cloned()
            .collect();
        Ok(missing.is_empty())
    })
    .with_context(|| {
        format!("the dashboard queries worker metrics the worker does not serve: {missing:?}")
    })?;
    env.delete_apps(ns)?;
    Ok(())
}

/// The chart's aggregated ClusterRoles: a user bound to the built-in `edit` role in a
/// namespace creates, scales and deletes apps there but cannot write their status; a `view`
/// user reads them and changes nothing.
#[test]
fn namespace_users_manage_apps_through_the_built_in_roles() -> Result<()> {
    let env = env()?;
    let roles = chart::template(
        &env.cp,
        OPERATOR_NS,
        &["--show-only", "templates/user-roles.yaml"],
    )?;
    env.kubectl(&["apply", "-f", "-"], Some(&roles))?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    env.kubectl(
        &[
            "-n",
            ns,
            "create",
            "rolebinding",
            "alice",
            "--clusterrole=edit",
            "--user=alice",
        ],
        None,
    )?;
    env.kubectl(
        &[
            "-n",
            ns,
            "create",
            "rolebinding",
            "bob",
            "--clusterrole=view",
            "--user=bob",
        ],
        None,
    )?;
    let can = |user: &str, verb: &str, what: &str| {
        env.kubectl(&["-n", ns, "auth", "can-i", verb, what, "--as", user], None)
            .is_ok()
    };
    // The controller manager aggregates the roles shortly after they appear.
    wait_until(WAIT, || {
        Ok(can("alice", "create", "statefulstreamapps.eddy.dev")
            && can("bob", "list", "statefulstreamapps.eddy.dev"))
    })
    .context("the edit and view roles never gained StatefulStreamApps")?;

    let as_user = |user: &str, args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--as", user, "-n", ns];
        all.extend_from_slice(args);
        env.kubectl(&all, stdin)
    };
    as_user(
        "alice",
        &["apply", "-f", "-"],
        Some(&app_yaml("mine", &env.bs, "in", "out")),
    )?;
    as_user("alice", &["scale", "ssapp", "mine", "--replicas=2"], None)?;
    ensure!(env.get(ns, "ssapp/mine", "{.spec.replicas}") == "2");
    let status = as_user(
        "alice",
        &[
            "patch",
            "ssapp",
            "mine",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"backlog":7}}"#,
        ],
        None,
    );
    ensure!(status.is_err(), "an editor wrote an app's status");
    ensure!(as_user("bob", &["get", "ssapp", "mine"], None)?.contains("mine"));
    let deleted = as_user("bob", &["delete", "ssapp", "mine"], None);
    ensure!(
        deleted
            .as_ref()
            .is_err_and(|e| e.to_string().contains("forbidden")),
        "a viewer deleted an app: {deleted:?}"
    );
    as_user("alice", &["delete", "ssapp", "mine"], None)?;
    Ok(())
}

/// Two releases of the chart in one namespace, splitting the cluster by `watchNamespaces`
/// (docs/operator.md): each has its own objects and its own Lease, named after its release, so
/// both elect a leader at once, and each runs the apps of its own namespaces. The second
/// release's operator runs as a local process with its ServiceAccount's token and the
/// environment its Deployment gives it.
#[test]
fn two_releases_in_one_namespace_each_lead_their_own_namespaces() -> Result<()> {
    use eddy_e2e::k8s::Process;
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let watch = format!("watchNamespaces={{{ns}}}");
    let render = |only: &[&str]| -> Result<String> {
        let mut args = vec![
            "template",
            "second",
            CHART,
            "--namespace",
            OPERATOR_NS,
            "--set",
            &watch,
        ];
        for o in only {
            args.extend(["--show-only", o]);
        }
        env.cp.tool("helm", &args, None)
    };
    let rbac = render(&[
        "templates/serviceaccount.yaml",
        "templates/rbac.yaml",
        "templates/worker-status-policy.yaml",
    ])?;
    // Every object of the second release next to the first's: no name is taken.
    let first: BTreeSet<String> = serde_yaml_names(&chart::template(&env.cp, OPERATOR_NS, &[])?)?;
    let second = serde_yaml_names(&render(&[])?)?;
    let shared: Vec<&String> = first.intersection(&second).collect();
    ensure!(shared.is_empty(), "both releases name {shared:?}");

    env.kubectl(&["apply", "-f", "-"], Some(&rbac))?;
    let cleanup = scopeguard(|| {
        let _ = env.kubectl(&["delete", "--ignore-not-found", "-f", "-"], Some(&rbac));
    });
    let deployment = chart::documents(&render(&["templates/deployment.yaml"])?)?
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .context("no Deployment")?;
    let var = |name: &str| -> Result<String> {
        deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_string)
            .with_context(|| format!("the Deployment sets no {name}"))
    };
    let lease = var("EDDY_OPERATOR_LEASE_NAME")?;
    ensure!(lease == "second-eddy-operator-leader", "lease {lease}");
    let kubeconfig = env
        .cp
        .kubeconfig_for(OPERATOR_NS, "second-eddy-operator", env.dir.path())?;
    let port = free_port()?;
    let _operator = Process::spawn(
        "eddy-operator",
        &[
            "run",
            "--http-addr",
            &format!("127.0.0.1:{port}"),
            "--namespace",
            OPERATOR_NS,
            "--identity",
            "second-0",
            "--lease-name",
            &lease,
            "--watch-namespaces",
            &var("EDDY_OPERATOR_WATCH_NAMESPACES")?,
        ],
        &[("KUBECONFIG", &kubeconfig)],
        &env.dir.path().join("second-0.log"),
    )?;
    let leads = || {
        http_get(&format!("127.0.0.1:{port}"), "/metrics")
            .map(|(_, text)| sum_metric(&text, "eddy_operator_leader", &[]))
            .unwrap_or(0.0)
    };
    wait_until(WAIT, || Ok(leads() == 1.0 && env.leaders() == 1.0)).with_context(|| {
        std::fs::read_to_string(env.dir.path().join("second-0.log")).unwrap_or_default()
    })?;
    let holders = [ControlPlane::LEASE, lease.as_str()]
        .map(|l| env.get(OPERATOR_NS, &format!("lease/{l}"), "{.spec.holderIdentity}"));
    ensure!(holders == ["op-0", "second-0"], "lease holders {holders:?}");

    // The second release's operator runs an app of its namespace.
    let (input, output) = (space.topic("two-in", 1)?, space.topic("two-out", 1)?);
    env.apply(ns, &app_yaml("second", &env.bs, &input, &output))?;
    wait_until(WAIT, || {
        Ok(env.get(ns, "ssapp/second", "{.status.phase}/{.status.ready}") == "Running/1/1")
    })
    .with_context(|| {
        format!(
            "status {}\nworker log: {}\n{}",
            env.get(ns, "ssapp/second", "{.status}"),
            std::fs::read_to_string(env.pod_dir(ns, "second-0").join("log")).unwrap_or_default(),
            std::fs::read_to_string(env.dir.path().join("second-0.log")).unwrap_or_default()
        )
    })?;
    // Deleted while its operator runs, which removes its finalizer.
    env.kubectl(
        &["-n", ns, "delete", "ssapp", "second", "--timeout=60s"],
        None,
    )?;
    drop(cleanup);
    Ok(())
}

/// `Kind/name` of every object of a multi-document YAML.
fn serde_yaml_names(yaml: &str) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for doc in chart::documents(yaml)? {
        let v = doc;
        if let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str()) {
            names.insert(format!("{kind}/{name}"));
        }
    }
    Ok(names)
}

/// Runs `f` when dropped: the test's objects go also when it fails half-way.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

//! The operator end to end, on a real control plane (etcd, kube-apiserver,
//! kube-controller-manager from `e2e/k8s/cluster.sh`), a real Kafka broker, and worker pods
//! run as local `eddy-worker` processes by the pod runner. One control plane, one pair of
//! operators (one leader) and one pod runner serve every test of this binary: the first test
//! starts them, they stop when the binary exits. Each test works in namespaces of its own, so
//! the tests run concurrently. They check what a user would: objects, correct output, status,
//! scale, bad and malformed apps, objects the operator did not create, pod templates, the
//! `restricted` Pod Security Standard, application ids, deletion. A malformed app exists
//! before the operators start, so every test also shows it does not disturb other apps.

use anyhow::{Context, Result, bail, ensure};
use eddy_e2e::operated::{Namespace, Operated, WAIT};
use eddy_e2e::*;
use std::sync::OnceLock;

/// Namespace of the app `bad` that no typed client can read.
static MALFORMED: OnceLock<String> = OnceLock::new();

/// An app no typed client can read: `groupBy: 42` passes the CRD's schema (a groupBy is a
/// string or an object, which a structural schema must leave open) but is no expression,
/// like a resource stored before a schema change. It carries the operator's finalizer, as an
/// app the operator had taken on before it became unreadable.
fn malformed_app(bs: &str) -> String {
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: bad, finalizers: [eddy.dev/cleanup]}}
spec:
  kafka: {{bootstrapServers: "{bs}"}}
  cleanupPolicy: Delete
  topology:
    - from: {{topic: never-created}}
    - groupBy: 42
    - count: {{store: counts}}
"#
    )
}

/// An app whose pod template is nested 200 levels deep: the API server stores it (the field
/// is open), but JSON that deep is more than serde_json reads, and once made the operators'
/// list of all apps fail.
fn deep_app(bs: &str) -> String {
    let template = (0..200).fold("x".to_string(), |v, _| format!("{{a: {v}}}"));
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: deep}}
spec:
  kafka: {{bootstrapServers: "{bs}"}}
  podTemplate: {template}
  topology:
    - from: {{topic: never-created}}
"#
    )
}

/// The binary's control plane with two operator replicas (one leads). The malformed apps
/// are there before the operators start: they list them with all others.
fn env() -> Result<&'static Operated> {
    eddy_e2e::operated::shared(2, |cp, bs| {
        let ns = unique("malformed");
        cp.kubectl(&["create", "namespace", &ns], None)?;
        cp.kubectl(&["-n", &ns, "apply", "-f", "-"], Some(&malformed_app(bs)))?;
        cp.kubectl(&["-n", &ns, "apply", "-f", "-"], Some(&deep_app(bs)))?;
        let _ = MALFORMED.set(ns);
        Ok(())
    })
}

/// `output` holds the count `each` for each of `keys` keys.
fn counted(output: &str, keys: usize, each: i64) -> Result<bool> {
    let last = latest_by_key(output)?;
    Ok(last.len() == keys && last.values().all(|v| v.as_slice() == each.to_be_bytes()))
}

#[test]
fn runs_scales_restores_and_deletes_an_app() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let bs = &env.bs;

    let app = unique("op");
    let (input, output) = (space.topic("op-in", 4)?, space.topic("op-out", 2)?);
    produce_counts(&input, 4000, 40)?;

    // Exactly-once: the scale-out below moves tasks between workers, which under
    // exactly-once goes through the hand-off (the new owner waits for the old one to let go).
    // Its workers stop at once on SIGTERM (no hand-off before they go): the pod deleted below
    // is failed over, and its tasks restore in full where they go.
    let yaml = counting_app_yaml(
        &app,
        2,
        bs,
        &input,
        &output,
        "  cleanupPolicy: Delete\n  processingGuarantee: exactly_once\n  podTemplate:\n    spec:\n      containers:\n        - {name: worker, env: [{name: EDDY_HANDOFF_TIMEOUT_SECONDS, value: \"0\"}]}\n",
    );
    env.apply(ns, &yaml)?;

    // The objects appear, owned by the app.
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "2")
    })
    .with_context(|| env.logs())?;
    for what in [
        format!("service/{app}-workers"),
        format!("configmap/{app}-app"),
        format!("serviceaccount/{app}-worker"),
        format!("role/{app}-worker"),
        format!("rolebinding/{app}-worker"),
        format!("poddisruptionbudget/{app}"),
    ] {
        let owner = env.get(
            ns,
            &what,
            "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        );
        ensure!(
            owner == format!("StatefulStreamApp/{app}"),
            "{what} is owned by {owner:?}"
        );
    }

    // Workers run their assigned tasks and produce the right counts.
    wait_until(WAIT, || counted(&output, 40, 100)).with_context(|| env.logs())?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running")
    })
    .with_context(|| {
        format!(
            "status: {}\n{}",
            env.get(ns, &format!("ssapp/{app}"), "{.status}"),
            env.logs()
        )
    })?;
    let tasks = env.get(
        ns,
        &format!("ssapp/{app}"),
        "{.status.workers.*.tasks.*.state}",
    );
    ensure!(
        tasks.split_whitespace().filter(|s| *s == "RUNNING").count() == 4,
        "task states: {tasks}"
    );
    let table = env.kubectl(&["-n", ns, "get", "ssapp", &app], None)?;
    ensure!(
        table.contains("READY") && table.contains("PHASE") && table.contains("BACKLOG"),
        "{table}"
    );
    ensure!(
        table.contains("2/2") && table.contains("Running"),
        "{table}"
    );

    // The leading operator shows the app as its status says; each worker its version, its
    // process and the lag of the tasks it reads.
    let (in_ns, is_app) = (format!("namespace=\"{ns}\""), format!("app=\"{app}\""));
    let app_metric = |text: &str, name: &str, extra: &str| {
        sum_metric(text, name, &[in_ns.as_str(), is_app.as_str(), extra])
    };
    wait_until(WAIT, || {
        let m = env.leader_metrics()?;
        Ok(
            app_metric(&m, "eddy_operator_app_phase", "phase=\"Running\"") == 1.0
                && app_metric(&m, "eddy_operator_app_phase", "phase=\"Pending\"") == 0.0
                && app_metric(
                    &m,
                    "eddy_operator_app_condition",
                    "condition=\"Ready\",status=\"True\"",
                ) == 1.0
                && app_metric(&m, "eddy_operator_app_ready_replicas", "") == 2.0
                && app_metric(&m, "eddy_operator_app_desired_replicas", "") == 2.0
                && app_metric(&m, "eddy_operator_app_assignment_generation", "") >= 1.0,
        )
    })
    .with_context(|| {
        format!(
            "{}\n{}",
            env.leader_metrics().unwrap_or_default(),
            env.logs()
        )
    })?;
    let m = env.leader_metrics()?;
    let version = format!("{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    ensure!(
        m.contains(&format!("eddy_operator_build_info{version}")),
        "{m}"
    );
    ensure!(
        sum_metric(&m, "process_resident_memory_bytes", &[]) > 1e6,
        "{m}"
    );
    for pod in [format!("{app}-0"), format!("{app}-1")] {
        let w = env.pod_metrics(ns, &pod)?;
        ensure!(
            w.contains(&format!("eddy_build_info{version}")),
            "{pod}: {w}"
        );
        ensure!(
            sum_metric(&w, "process_cpu_seconds_total", &[]) > 0.0,
            "{pod}: {w}"
        );
        ensure!(
            sum_metric(&w, "process_resident_memory_bytes", &[]) > 1e6,
            "{pod}: {w}"
        );
        ensure!(sum_metric(&w, "process_open_fds", &[]) > 3.0, "{pod}: {w}");
        // Where the memory is: the allocator's heap, RocksDB's parts and the budget.
        ensure!(
            sum_metric(&w, "eddy_memory_bytes", &["part=\"heap_resident\""]) > 1e6
                && w.contains("eddy_memory_bytes{part=\"rocksdb_memtables\"}")
                && w.contains("eddy_memory_bytes{part=\"record_cache\"}")
                && sum_metric(&w, "eddy_memory_budget_bytes", &[]) >= 16.0 * 1048576.0,
            "{pod}: {w}"
        );
        ensure!(
            sum_metric(&w, "process_max_fds", &[]) >= 1024.0,
            "{pod}: {w}"
        );
        let started = sum_metric(&w, "process_start_time_seconds", &[]);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64();
        ensure!(
            started > now - 3600.0 && started <= now + 1.0,
            "{pod} started at {started}, now is {now}"
        );
    }
    // Each input partition's lag is shown once, by the worker reading it, naming its task.
    let lag_series = |pods: usize| -> Result<Vec<String>> {
        let mut series = Vec::new();
        for i in 0..pods {
            let w = env.pod_metrics(ns, &format!("{app}-{i}"))?;
            series.extend(
                w.lines()
                    .filter_map(|l| l.strip_prefix("eddy_consumer_lag_records{"))
                    .filter_map(|l| l.split_once('}').map(|(labels, _)| labels.to_string())),
            );
        }
        series.sort();
        Ok(series)
    };
    let one_per_partition = |pods: usize| -> Result<bool> {
        let expected: Vec<String> = (0..4)
            .map(|p| format!("topic=\"{input}\",partition=\"{p}\",task=\"0_{p}\""))
            .collect();
        Ok(lag_series(pods)? == expected)
    };
    wait_until(WAIT, || one_per_partition(2))
        .with_context(|| format!("lag series: {:?}", lag_series(2)))?;

    // kubectl scale goes through the scale subresource to the StatefulSet.
    env.kubectl(&["-n", ns, "scale", "ssapp", &app, "--replicas=3"], None)?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("statefulset/{app}"), "{.spec.replicas}") == "3")
    })?;
    wait_until(WAIT, || {
        Ok(env.get(ns, &format!("ssapp/{app}"), "{.status.readyReplicas}") == "3")
    })
    .with_context(|| env.logs())?;
    // Tasks moved to the new worker: the workers that let them go show no lag for them.
    wait_until(WAIT, || one_per_partition(3))
        .with_context(|| format!("lag series: {:?}", lag_series(3)))?;

    // A worker that lost its volume restores its tasks from the changelog: the status shows
    // the backlog while it does, and it falls back to 0. The changelog is named after the
    // default application id, `<namespace>.<name>`.
    let changelog = format!("{ns}.{app}-counts-changelog");
    let more: Vec<Input> = (0..200_000)
        .map(|i| (Some(format!("big-{i}").into_bytes()), Some(b"{}".to_vec())))
        .collect();
    produce(&input, &more)?;
    wait_until(WAIT, || Ok(read_all(&changelog)?.len() >= 200_040))?;
    // Across the move to three workers every new record is counted exactly once, in the
    // committed output.
    wait_until(WAIT, || {
        let mut last = std::collections::HashMap::new();
        for r in read_all(&output)? {
            if let (Some(k), Some(v)) = (r.key, r.value) {
                last.insert(k, v);
            }
        }
        Ok((0..200_000).all(|i| {
            last.get(format!("big-{i}").as_bytes())
                .is_some_and(|v| v.as_slice() == 1i64.to_be_bytes())
        }))
    })
    .with_context(|| env.logs())?;
    let pvc_dir = env
        .dir
        .path()
        .join("node/pvcs")
        .join(ns)
        .join(format!("state-{app}-0"));
    ensure!(pvc_dir.exists(), "no PVC dir at {}", pvc_dir.display());
    // Restores here take a few hundred milliseconds: the backlog is read from every status
    // write (what `kubectl get -w` shows), and the leader's metric in a loop of its own.
    let backlogs = env.watch(ns, &format!("ssapp/{app}"), "{.status.backlog}")?;
    env.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            &format!("{app}-0"),
            "--wait=true",
        ],
        None,
    )?;
    std::fs::remove_dir_all(&pvc_dir)?;
    let (mut max_backlog, mut max_backlog_metric) = (0i64, 0f64);
    let deadline = std::time::Instant::now() + WAIT;
    while !(max_backlog > 0 && max_backlog_metric > 0.0) {
        let seen = backlogs.seen();
        let b = seen.iter().filter_map(|b| b.parse::<i64>().ok()).max();
        max_backlog = max_backlog.max(b.unwrap_or(0));
        if let Ok(m) = env.leader_metrics() {
            max_backlog_metric = max_backlog_metric.max(app_metric(
                &m,
                "eddy_operator_app_restore_backlog_records",
                "",
            ));
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "status backlogs {seen:?}, metric at most {max_backlog_metric}\n{}",
                env.logs()
            );
        }
        // The metric is set at each reconcile: scraped often, not to miss a short restore.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(backlogs);
    wait_until(WAIT, || {
        Ok(
            env.get(ns, &format!("ssapp/{app}"), "{.status.backlog}") == "0"
                && env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running",
        )
    })
    .with_context(|| env.logs())?;
    ensure!(
        max_backlog > 1000,
        "the status showed a backlog of only {max_backlog} records"
    );

    // Nonsense is rejected at admission with what to fix; a missing topic is Degraded.
    let bad = counting_app_yaml(
        "bad-timeout",
        2,
        bs,
        &input,
        &output,
        "  transactionTimeoutMs: 10\n",
    );
    let err = env
        .kubectl(&["-n", ns, "apply", "-f", "-"], Some(&bad))
        .expect_err("admission must refuse");
    ensure!(
        err.to_string()
            .contains("transactionTimeoutMs must be between 1000 and 900000"),
        "{err}"
    );
    let missing = counting_app_yaml("missing-topic", 1, bs, "no-such-topic", &output, "");
    env.apply(ns, &missing)?;
    env.wait_degraded(ns, "missing-topic", "SourceTopicMissing")?;
    let missing_metric = |name: &str, extra: &str| -> Result<f64> {
        Ok(sum_metric(
            &env.leader_metrics()?,
            name,
            &[in_ns.as_str(), "app=\"missing-topic\"", extra],
        ))
    };
    wait_until(WAIT, || {
        Ok(
            missing_metric("eddy_operator_app_phase", "phase=\"Degraded\"")? == 1.0
                && missing_metric(
                    "eddy_operator_app_condition",
                    "condition=\"Degraded\",status=\"True\"",
                )? == 1.0,
        )
    })
    .with_context(|| env.leader_metrics().unwrap_or_default())?;
    env.kubectl(&["-n", ns, "delete", "ssapp", "missing-topic"], None)?;

    ensure!(env.leaders() == 1.0, "still exactly one leader");

    // Deleting the app removes its objects and, with cleanupPolicy Delete, its topics.
    env.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "ssapp",
            &app,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    wait_until(WAIT, || {
        Ok(env
            .get(ns, &format!("statefulset/{app}"), "{.metadata.name}")
            .is_empty())
    })?;
    wait_until(WAIT, || {
        Ok(topics_with_prefix(&format!("{ns}.{app}-counts"))?.is_empty())
    })?;
    // A deleted app leaves no series behind.
    wait_until(WAIT, || {
        let m = env.leader_metrics()?;
        Ok(!m.lines().any(|l| l.contains(&in_ns)))
    })
    .with_context(|| env.leader_metrics().unwrap_or_default())?;
    Ok(())
}

#[test]
fn a_malformed_app_marks_only_itself_and_stays_deletable() -> Result<()> {
    let env = env()?;
    let bad_ns = MALFORMED.get().map(String::as_str).unwrap_or_default();
    let good_space = Namespace::new(env, &[])?;
    let good_ns = good_space.name.as_str();
    let (input, output) = (
        good_space.topic("malformed-in", 1)?,
        good_space.topic("malformed-out", 1)?,
    );

    let message = env.wait_degraded(bad_ns, "bad", "InvalidSpec")?;
    ensure!(message.contains("spec.topology[1]"), "{message}");
    ensure!(
        env.get(bad_ns, "statefulset/bad", "{.metadata.name}")
            .is_empty(),
        "an unreadable app gets no workers"
    );
    let message = env.wait_degraded(bad_ns, "deep", "InvalidSpec")?;
    ensure!(
        message.contains("spec.podTemplate is nested more than 128 levels"),
        "{message}"
    );

    // Another app, created and scaled while the malformed one exists, is reconciled.
    env.apply(
        good_ns,
        &counting_app_yaml("good", 0, &env.bs, &input, &output, ""),
    )?;
    wait_until(WAIT, || {
        Ok(env.get(good_ns, "statefulset/good", "{.spec.replicas}") == "0")
    })
    .with_context(|| env.logs())?;
    env.kubectl(
        &["-n", good_ns, "scale", "ssapp", "good", "--replicas=1"],
        None,
    )?;
    wait_until(WAIT, || {
        Ok(env.get(good_ns, "statefulset/good", "{.spec.replicas}") == "1")
    })
    .with_context(|| env.logs())?;

    // The malformed apps can be deleted: the finalizer goes whatever the spec says.
    for app in ["bad", "deep"] {
        env.kubectl(
            &[
                "-n",
                bad_ns,
                "delete",
                "ssapp",
                app,
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        )
        .with_context(|| env.logs())?;
    }
    env.kubectl(&["delete", "namespace", bad_ns, "--wait=false"], None)?;
    env.delete_apps(good_ns)?;
    Ok(())
}

#[test]
fn objects_the_operator_did_not_create_are_left_alone() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let input = space.topic("clash-in", 1)?;
    // No workers (0 replicas): this is about objects.
    let app = |extra: &str| counting_app_yaml("clash", 0, &env.bs, &input, "clash-out", extra);

    env.kubectl(
        &[
            "-n",
            ns,
            "create",
            "configmap",
            "clash-app",
            "--from-literal=owner=someone-else",
        ],
        None,
    )?;
    env.apply(ns, &app(""))?;
    let message = env.wait_degraded(ns, "clash", "NameConflict")?;
    ensure!(
        message.contains("ConfigMap clash-app") && message.contains("delete"),
        "{message}"
    );
    // Its other objects are there, the ConfigMap is untouched, and no StatefulSet runs pods
    // with someone else's app file.
    wait_until(WAIT, || {
        Ok(!env
            .get(ns, "service/clash-workers", "{.metadata.name}")
            .is_empty())
    })?;
    ensure!(
        env.get(ns, "configmap/clash-app", "{.data}") == r#"{"owner":"someone-else"}"#,
        "data: {}",
        env.get(ns, "configmap/clash-app", "{.data}")
    );
    ensure!(
        env.get(ns, "configmap/clash-app", "{.metadata.ownerReferences}")
            .is_empty(),
        "the ConfigMap was adopted"
    );
    let managers = env.get(
        ns,
        "configmap/clash-app",
        "{.metadata.managedFields[*].manager}",
    );
    ensure!(!managers.contains("eddy-operator"), "managers: {managers}");
    ensure!(
        env.get(ns, "statefulset/clash", "{.metadata.name}")
            .is_empty(),
        "a StatefulSet was created"
    );

    // The fix the message names: delete the ConfigMap; the operator creates its own.
    env.kubectl(&["-n", ns, "delete", "configmap", "clash-app"], None)?;
    wait_until(WAIT, || {
        Ok(env.get(
            ns,
            "configmap/clash-app",
            "{.metadata.ownerReferences[0].name}",
        ) == "clash"
            && env.get(ns, "statefulset/clash", "{.spec.replicas}") == "0"
            && env.degraded(ns, "clash").0 == "False")
    })
    .with_context(|| env.logs())?;

    // A change the API server refuses (the volumes of a StatefulSet never change) is a
    // Degraded condition and a Warning event naming the object and what to do.
    env.apply(ns, &app("  storage: {size: 2Gi}\n"))?;
    let message = env.wait_degraded(ns, "clash", "ApplyFailed")?;
    ensure!(
        message.contains("StatefulSet clash:") && message.contains("--cascade=orphan"),
        "{message}"
    );
    wait_until(WAIT, || {
        Ok(env
            .get(
                ns,
                "events",
                "{.items[?(@.reason==\"ApplyFailed\")].message}",
            )
            .contains("StatefulSet clash:"))
    })?;
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn a_pod_template_adds_env_and_a_sidecar_to_the_worker() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let (input, output) = (space.topic("tmpl-in", 2)?, space.topic("tmpl-out", 1)?);
    produce_counts(&input, 200, 10)?;
    let extra = "  podTemplate:\n    spec:\n      containers:\n        - {name: worker, env: [{name: TEAM, value: blue}]}\n        - {name: proxy, image: envoyproxy/envoy, args: [--version]}\n";
    env.apply(
        ns,
        &counting_app_yaml("tmpl", 1, &env.bs, &input, &output, extra),
    )?;
    // The worker still runs (the pod runner runs the first container) and counts right.
    wait_until(WAIT, || counted(&output, 10, 20)).with_context(|| env.logs())?;
    let containers = env.get(ns, "pod/tmpl-0", "{.spec.containers[*].name}");
    ensure!(containers == "worker proxy", "containers: {containers}");
    let env_names = env.get(ns, "pod/tmpl-0", "{.spec.containers[0].env[*].name}");
    ensure!(
        env_names.contains("TEAM") && env_names.contains("EDDY_APP_FILE"),
        "worker env: {env_names}"
    );
    // Without spec.resources, the worker's memory follows the default 256Mi budget: not a
    // BestEffort pod.
    let resources = env.get(
        ns,
        "pod/tmpl-0",
        "{.spec.containers[0].resources.requests.memory}/{.spec.containers[0].resources.limits.memory}/{.status.qosClass}",
    );
    ensure!(
        resources.starts_with("512Mi/512Mi"),
        "worker resources: {resources}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

/// `memory.budget` is a Kubernetes quantity: admission takes `1.5Gi` and refuses `1.5GB`
/// with the field; the pods' memory follows the budget, and a limit set by hand that leaves
/// the budget too little room is a `MemoryLimitLow` condition, not a failure.
#[test]
fn memory_is_a_quantity_and_a_low_limit_is_a_warning() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let (input, output) = (space.topic("mem-in", 1)?, space.topic("mem-out", 1)?);
    let app = |name: &str, extra: &str| counting_app_yaml(name, 0, &env.bs, &input, &output, extra);
    let refused = env
        .kubectl(
            &["-n", ns, "create", "--dry-run=server", "-f", "-"],
            Some(&app("typo", "  memory: {budget: 1.5GB}\n")),
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    ensure!(
        refused.contains("spec.memory.budget") && refused.contains("1.5GB"),
        "a budget of 1.5GB was not refused by admission: {refused:?}"
    );
    env.apply(ns, &app("roomy", "  memory: {budget: 1.5Gi}\n"))?;
    env.apply(
        ns,
        &app(
            "tight",
            "  memory: {budget: 1Gi}\n  resources: {limits: {memory: 1Gi}}\n",
        ),
    )?;
    wait_until(WAIT, || {
        Ok(env.get(
            ns,
            "statefulset/roomy",
            "{.spec.template.spec.containers[0].resources.limits.memory}",
        ) == "3Gi")
    })
    .with_context(|| {
        format!(
            "roomy: {} / {}",
            env.get(
                ns,
                "statefulset/roomy",
                "{.spec.template.spec.containers[0].resources}"
            ),
            env.get(ns, "ssapp/roomy", "{.status.conditions}")
        )
    })?;
    let low = "{.status.conditions[?(@.type==\"MemoryLimitLow\")].status}/{.status.conditions[?(@.type==\"MemoryLimitLow\")].message}";
    wait_until(WAIT, || {
        Ok(env.get(ns, "ssapp/tight", low).starts_with("True/"))
    })
    .with_context(|| env.get(ns, "ssapp/tight", "{.status}"))?;
    let message = env.get(ns, "ssapp/tight", low);
    ensure!(message.contains("at least 1152Mi"), "{message}");
    ensure!(
        env.get(ns, "ssapp/roomy", low).starts_with("False/"),
        "{}",
        env.get(ns, "ssapp/roomy", "{.status}")
    );
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn a_restricted_namespace_admits_the_workers_and_the_operator() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(
        env,
        &[
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
    )?;
    let ns = space.name.as_str();

    // The API server's PodSecurity admission enforces here: a plain pod is refused.
    let plain = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}"#;
    let err = env
        .kubectl(
            &["-n", ns, "create", "--dry-run=server", "-f", "-"],
            Some(plain),
        )
        .expect_err("a plain pod must be refused");
    ensure!(err.to_string().contains("PodSecurity"), "{err}");

    // The chart's operator: the pod its Deployment's ReplicaSet would create is admitted.
    let chart = env.cp.tool(
        "helm",
        &[
            "template",
            "t",
            "charts/eddy-operator",
            "--namespace",
            ns,
            "--show-only",
            "templates/deployment.yaml",
        ],
        None,
    )?;
    // kubectl prints one JSON document per object (the Deployment, its Service).
    let json = env.kubectl(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(&chart),
    )?;
    let deployment = serde_json::Deserializer::from_str(&json)
        .into_iter::<serde_json::Value>()
        .collect::<std::result::Result<Vec<_>, _>>()?
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .context("no Deployment in the chart")?;
    let template = &deployment["spec"]["template"];
    let account = template["spec"]["serviceAccountName"]
        .as_str()
        .context("the operator runs under its own ServiceAccount")?;
    env.kubectl(&["-n", ns, "create", "serviceaccount", account], None)?;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "operator", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    });
    env.kubectl(
        &["-n", ns, "create", "--dry-run=server", "-f", "-"],
        Some(&pod.to_string()),
    )
    .context("the chart's operator pod is refused")?;

    // Worker pods are created by the StatefulSet controller, admitted, and run.
    let (input, output) = (
        space.topic("restricted-in", 2)?,
        space.topic("restricted-out", 1)?,
    );
    produce_counts(&input, 200, 10)?;
    env.apply(
        ns,
        &counting_app_yaml("locked", 1, &env.bs, &input, &output, ""),
    )?;
    wait_until(WAIT, || counted(&output, 10, 20)).with_context(|| {
        format!(
            "{}\n{}",
            env.get(ns, "events", "{.items[*].message}"),
            env.logs()
        )
    })?;
    env.delete_apps(ns)?;
    Ok(())
}

#[test]
fn apps_of_one_name_in_two_namespaces_run_on_their_own_topics() -> Result<()> {
    let env = env()?;
    let spaces = [Namespace::new(env, &[])?, Namespace::new(env, &[])?];
    let input = spaces[0].topic("twin-in", 2)?;
    produce_counts(&input, 200, 10)?;
    let outputs = [
        spaces[0].topic("twin-a-out", 1)?,
        spaces[1].topic("twin-b-out", 1)?,
    ];
    // Exactly-once: two apps sharing an id would also share transactional ids and fence
    // each other.
    for (space, output) in spaces.iter().zip(&outputs) {
        env.apply(
            &space.name,
            &counting_app_yaml(
                "twin",
                1,
                &env.bs,
                &input,
                output,
                "  processingGuarantee: exactly_once\n  cleanupPolicy: Delete\n",
            ),
        )?;
    }
    for output in &outputs {
        wait_until(WAIT, || counted(output, 10, 20)).with_context(|| env.logs())?;
    }
    for space in &spaces {
        let changelog = format!("{}.twin-counts-changelog", space.name);
        ensure!(
            topics_with_prefix(&changelog)? == [changelog.clone()],
            "no changelog {changelog}"
        );
    }
    ensure!(
        topics_with_prefix("twin-counts")?.is_empty(),
        "a topic named after the bare app name exists"
    );
    for space in &spaces {
        env.delete_apps(&space.name)?;
    }
    Ok(())
}

#[test]
fn an_application_id_used_twice_is_refused_for_the_newer_app() -> Result<()> {
    let env = env()?;
    let (first_space, second_space) = (Namespace::new(env, &[])?, Namespace::new(env, &[])?);
    let (first_ns, second_ns) = (first_space.name.as_str(), second_space.name.as_str());
    let id = unique("shared-id");
    first_space.owns_topics(&format!("{id}-"));
    let input = first_space.topic("shared-in", 2)?;
    let outputs = [
        first_space.topic("first-out", 1)?,
        second_space.topic("second-out", 1)?,
    ];
    produce_counts(&input, 100, 10)?;
    let extra = format!("  applicationId: {id}\n  cleanupPolicy: Delete\n");
    env.apply(
        first_ns,
        &counting_app_yaml("first", 1, &env.bs, &input, &outputs[0], &extra),
    )?;
    wait_until(WAIT, || counted(&outputs[0], 10, 10)).with_context(|| env.logs())?;

    env.apply(
        second_ns,
        &counting_app_yaml("second", 1, &env.bs, &input, &outputs[1], &extra),
    )?;
    let message = env.wait_degraded(second_ns, "second", "ApplicationIdConflict")?;
    ensure!(
        message.contains(&format!("{first_ns}/first")) && message.contains(&id),
        "{message}"
    );
    ensure!(
        env.get(second_ns, "statefulset/second", "{.metadata.name}")
            .is_empty(),
        "the refused app got workers"
    );

    // The first app keeps running, also after the refused one is deleted: with
    // cleanupPolicy Delete it must not take the first app's topics along.
    env.delete_apps(second_ns)?;
    produce_counts(&input, 100, 10)?;
    wait_until(WAIT, || counted(&outputs[0], 10, 20)).with_context(|| env.logs())?;
    ensure!(
        !topics_with_prefix(&format!("{id}-counts-changelog"))?.is_empty(),
        "the first app's changelog was deleted"
    );
    ensure!(
        env.degraded(first_ns, "first").0 == "False",
        "the first app: {:?}",
        env.degraded(first_ns, "first")
    );
    ensure!(
        latest_by_key(&outputs[1])?.is_empty(),
        "the refused app wrote output"
    );
    env.delete_apps(first_ns)?;
    wait_until(WAIT, || {
        Ok(topics_with_prefix(&format!("{id}-"))?.is_empty())
    })?;
    Ok(())
}

/// A leader stopped with SIGTERM releases its Lease: the follower leads at its next try
/// (every 2 s), not once the lease expired (15 s after the last renewal), and the old leader
/// exits 0. Two operators of this test's own, watching only its (empty) namespace and holding
/// their Lease there, so the binary's operators and the other tests' apps are not disturbed.
#[test]
fn a_leader_stopped_with_sigterm_hands_its_lease_over_at_once() -> Result<()> {
    use eddy_e2e::k8s::Process;
    use std::time::{Duration, Instant};
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let holder = || env.get(ns, "lease/eddy-operator-leader", "{.spec.holderIdentity}");
    let start = |id: &str| -> Result<(Process, String)> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let args = [
            "run",
            "--http-addr",
            &addr,
            "--namespace",
            ns,
            "--identity",
            id,
            "--watch-namespaces",
            ns,
        ];
        let log = env.dir.path().join(format!("{ns}-{id}.log"));
        let p = Process::spawn(
            "eddy-operator",
            &args,
            &[("KUBECONFIG", env.cp.kubeconfig.as_path())],
            &log,
        )?;
        Ok((p, addr))
    };
    let logs = |id: &str| {
        std::fs::read_to_string(env.dir.path().join(format!("{ns}-{id}.log"))).unwrap_or_default()
    };
    let leads = |addr: &str| {
        http_get(addr, "/metrics")
            .map(|(_, m)| sum_metric(&m, "eddy_operator_leader", &[]) == 1.0)
            .unwrap_or(false)
    };

    let (mut first, first_addr) = start("first")?;
    wait_until(WAIT, || Ok(holder() == "first" && leads(&first_addr)))
        .with_context(|| logs("first"))?;
    let (_second, second_addr) = start("second")?;
    // The follower serves /metrics right before it tries the lease, and keeps trying.
    wait_until(WAIT, || Ok(http_get(&second_addr, "/metrics").is_ok()))
        .with_context(|| logs("second"))?;
    ensure!(
        holder() == "first" && !leads(&second_addr),
        "the follower took a held lease: holder {:?}\n{}",
        holder(),
        logs("second")
    );

    first.term();
    let stopped = Instant::now();
    wait_until(Duration::from_secs(30), || {
        Ok(holder() == "second" && leads(&second_addr))
    })
    .with_context(|| format!("{}\n{}", logs("first"), logs("second")))?;
    let took = stopped.elapsed();
    // Without the release the follower waits out the lease: at least 10 s after the SIGTERM
    // (the leader renews every 5 s, the lease lasts 15 s).
    ensure!(
        took < Duration::from_secs(6),
        "the follower led {took:?} after the leader's SIGTERM\n{}",
        logs("first")
    );
    let status = first.wait_exit(Duration::from_secs(20))?;
    ensure!(
        status.is_some_and(|s| s.success()),
        "the old leader exited with {status:?}\n{}",
        logs("first")
    );
    ensure!(
        logs("first").contains("released the leader lease"),
        "{}",
        logs("first")
    );
    Ok(())
}

/// The lifecycle steps of an app are Normal events on it, each told once: its StatefulSet
/// `Created`, `Scaled` from one replica count to another, and a spec change `RolledOut` once
/// it reached every pod.
#[test]
fn creating_scaling_and_rolling_out_an_app_are_normal_events() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let app = unique("life");
    let (input, output) = (space.topic("life-in", 2)?, space.topic("life-out", 1)?);
    produce_counts(&input, 100, 10)?;
    env.apply(
        ns,
        &counting_app_yaml(&app, 1, &env.bs, &input, &output, ""),
    )?;
    let events = |reason: &str| -> Result<Vec<String>> {
        let list: serde_json::Value =
            serde_json::from_str(&env.kubectl(&["-n", ns, "get", "events", "-o", "json"], None)?)?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["involvedObject"]["kind"] == "StatefulStreamApp"
                    && e["involvedObject"]["name"] == app.as_str()
                    && e["type"] == "Normal"
                    && e["reason"] == reason
            })
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect())
    };
    let running = |ready: &str| {
        env.get(
            ns,
            &format!("ssapp/{app}"),
            "{.status.phase} {.status.ready}",
        ) == format!("Running {ready}")
    };

    wait_until(WAIT, || Ok(!events("Created")?.is_empty())).with_context(|| env.logs())?;
    let created = events("Created")?;
    ensure!(
        created.len() == 1
            && created[0].contains(&format!("StatefulSet {app} with 1 worker pod(s)")),
        "{created:?}"
    );
    wait_until(WAIT, || Ok(counted(&output, 10, 10)? && running("1/1")))
        .with_context(|| env.logs())?;

    env.kubectl(&["-n", ns, "scale", "ssapp", &app, "--replicas=2"], None)?;
    wait_until(WAIT, || Ok(!events("Scaled")?.is_empty())).with_context(|| env.logs())?;
    let scaled = events("Scaled")?;
    ensure!(
        scaled
            == [format!(
                "scaled StatefulSet {app} from 1 to 2 worker pod(s)"
            )],
        "{scaled:?}"
    );
    wait_until(WAIT, || Ok(running("2/2"))).with_context(|| env.logs())?;
    ensure!(
        events("RolledOut")?.is_empty(),
        "a scale is no rollout: {:?}",
        events("RolledOut")?
    );

    // A spec change rolls the pods one at a time; the event comes once every pod runs it.
    env.kubectl(
        &[
            "-n",
            ns,
            "patch",
            "ssapp",
            &app,
            "--type=merge",
            "-p",
            r#"{"spec":{"commitIntervalMs":300}}"#,
        ],
        None,
    )?;
    wait_until(WAIT, || Ok(!events("RolledOut")?.is_empty())).with_context(|| env.logs())?;
    let template_hash = env.get(
        ns,
        &format!("statefulset/{app}"),
        r#"{.spec.template.metadata.annotations.eddy\.dev/spec-hash}"#,
    );
    let pods: serde_json::Value = serde_json::from_str(&env.kubectl(
        &[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={app}"),
            "-o",
            "json",
        ],
        None,
    )?)?;
    let hashes: Vec<&str> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["annotations"]["eddy.dev/spec-hash"].as_str())
        .collect();
    ensure!(
        !template_hash.is_empty() && hashes == [template_hash.as_str(); 2],
        "RolledOut while the pods run {hashes:?}, the template {template_hash:?}"
    );
    let rolled = events("RolledOut")?;
    ensure!(
        rolled.len() == 1
            && rolled[0].contains(&format!(
                "every pod of StatefulSet {app} (2 pod(s) restarted one at a time, each with its copies caught up"
            )),
        "{rolled:?}"
    );
    ensure!(
        events("Created")?.len() == 1 && events("Scaled")?.len() == 1,
        "told twice: {:?} {:?}",
        events("Created")?,
        events("Scaled")?
    );
    env.delete_apps(ns)?;
    Ok(())
}

/// A join app under the operator: admitted with its tables, run by a worker pod that reads
/// the stream and the table's partitions together (orders meet the customer written before
/// them); one whose table has another partition count is Degraded with `NotCopartitioned`,
/// and a versioned global table (Kafka Streams has none either) is refused as `InvalidSpec`.
#[test]
fn a_join_app_runs_and_one_not_co_partitioned_is_degraded_with_what_to_do() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = &space.name;
    let customers = space.topic("customers", 2)?;
    let orders = space.topic("orders", 2)?;
    let wide = space.topic("orders-wide", 3)?;
    let output = space.topic("enriched", 1)?;
    // An hour ago: records older than the broker's retention would be deleted under the test.
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        - 3_600_000;
    let customer = |c: &str, name: &str, at: i64| {
        (
            c.as_bytes().to_vec(),
            format!(r#"{{"name":"{name}"}}"#).into_bytes(),
            t0 + at,
        )
    };
    produce_at(
        &customers,
        &[customer("c1", "Ada", 1_000), customer("c2", "Bea", 1_000)],
    )?;
    let order = |id: i64, c: &str| {
        (
            c.as_bytes().to_vec(),
            format!(r#"{{"id":{id}}}"#).into_bytes(),
            t0 + 2_000 + id,
        )
    };
    produce_at(&orders, &[order(1, "c1"), order(2, "c2"), order(3, "c3")])?;
    let app = |name: &str, input: &str, extra: &str| {
        format!(
            r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 1
  kafka: {{bootstrapServers: "{bs}"}}
  commitIntervalMs: 200
  tables:
    customers: {{topic: {customers}{extra}}}
  topology:
    - from: {{topic: {input}}}
    - join: {{table: customers, type: left, as: '{{id: .id, name: $right.name}}'}}
    - to: {{topic: {output}}}
"#,
            bs = env.bs
        )
    };
    env.apply(ns, &app("enrich", &orders, ""))?;
    let names = || -> Result<Vec<String>> {
        let mut v: Vec<String> = read_all(&output)?
            .into_iter()
            .filter_map(|r| r.value)
            .map(|v| String::from_utf8_lossy(&v).to_string())
            .collect();
        v.sort();
        Ok(v)
    };
    wait_until(WAIT, || Ok(names()?.len() >= 3)).with_context(|| env.logs())?;
    ensure!(
        names()?
            == [
                r#"{"id":1,"name":"Ada"}"#,
                r#"{"id":2,"name":"Bea"}"#,
                r#"{"id":3,"name":null}"#
            ],
        "{:?}",
        names()?
    );
    env.apply(ns, &app("enrich-wide", &wide, ""))?;
    env.wait_degraded(ns, "enrich-wide", "NotCopartitioned")?;
    let message = env.get(
        ns,
        "ssapp/enrich-wide",
        "{.status.conditions[?(@.type==\"Degraded\")].message}",
    );
    ensure!(
        message.contains(&format!("give \"{customers}\" 3 partitions")),
        "{message}"
    );
    env.apply(
        ns,
        &app(
            "enrich-versioned",
            &orders,
            ", global: true, versioned: {history: 1d}",
        ),
    )?;
    env.wait_degraded(ns, "enrich-versioned", "InvalidSpec")?;
    env.delete_apps(ns)?;
    Ok(())
}

/// What a worker pod (or anyone with the app's status rights) may write into the status is
/// input, never trusted: with the app's only pod frozen past the failover bound, the status
/// is forged (a pod of a huge ordinal, a pod that does not exist holding every task, reports
/// of pods that are not the app's, a peer's report rewritten). The StatefulSet never exceeds
/// `spec.replicas`, the operator stays up, rewrites the assignment, says so in a Warning
/// event, and goes on reconciling an app applied afterwards; the app counts on exactly. Then,
/// under the chart's admission policy, a worker pod's own credentials may write its own
/// report and nothing else: not a peer's, not the assignment; a token of the worker
/// ServiceAccount not bound to a pod may write nothing.
#[test]
fn a_forged_status_scales_nothing_and_a_worker_writes_only_its_own_report() -> Result<()> {
    use eddy_e2e::operated::all_threads_stopped;
    use std::time::Duration;
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let (input, output) = (space.topic("fs-in", 2)?, space.topic("fs-out", 2)?);
    produce_counts(&input, 200, 10)?;
    let app = "fs";
    let exactly_once = "  processingGuarantee: exactly_once\n";
    env.apply(
        ns,
        &counting_app_yaml(app, 1, &env.bs, &input, &output, exactly_once),
    )?;
    wait_until(WAIT, || counted(&output, 10, 20)).with_context(|| env.logs())?;
    let incarnation = |pod: &str| {
        env.app_json(ns, app)
            .ok()
            .and_then(|v| {
                v["status"]["assignment"]["pods"][pod]["incarnation"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    wait_until(WAIT, || Ok(!incarnation("fs-0").is_empty())).with_context(|| env.logs())?;
    let replicas = || env.get(ns, &format!("statefulset/{app}"), "{.spec.replicas}");
    // Every look at the StatefulSet, from here on: never more pods than spec.replicas.
    let at_most = |n: i32| -> Result<()> {
        let r = replicas();
        ensure!(
            r.parse::<i32>().is_ok_and(|r| r <= n),
            "the StatefulSet has {r} replicas, spec.replicas is {n}\n{}",
            env.logs()
        );
        Ok(())
    };

    // Freeze the only worker until the operator takes it for silent (its entry no longer
    // names its run).
    let pid = env.worker_pid(ns, "fs-0")?;
    // SAFETY: a signal to a process this test's pod runner started.
    ensure!(
        unsafe { libc::kill(pid, libc::SIGSTOP) } == 0,
        "SIGSTOP {pid}"
    );
    let forged = (|| -> Result<()> {
        wait_until(Duration::from_secs(10), || all_threads_stopped(pid))?;
        wait_until(WAIT, || Ok(incarnation("fs-0").is_empty())).with_context(|| env.logs())?;
        let tasks = r#"{"active": ["0_0", "0_1"]}"#;
        let patch = format!(
            r#"{{"status": {{
                "assignment": {{"pods": {{"fs-2147483646": {tasks}, "fs-7": {tasks}, "other-0": {tasks}}},
                    "down": ["fs-2147483646"]}},
                "workers": {{
                    "fs-2147483646": {{"globalBacklog": 9223372036854775807, "appliedGeneration": 9223372036854775807}},
                    "fs-0": {{"globalBacklog": 9223372036854775807,
                        "tasks": {{"0_0": {{"state": "RUNNING", "restoreBacklog": -5, "lag": -1}}}}}}
                }}}}}}"#
        );
        // As an admin may (the admission policy restricts ServiceAccounts only).
        env.kubectl(
            &[
                "-n",
                ns,
                "patch",
                "ssapp",
                app,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ],
            None,
        )?;
        wait_until(WAIT, || {
            at_most(1)?;
            let pods = env.get(ns, &format!("ssapp/{app}"), "{.status.assignment.pods}");
            Ok(!pods.contains("fs-2147483646") && !pods.contains("other-0"))
        })
        .with_context(|| env.logs())?;
        at_most(1)?;
        let told = || {
            env.get(
                ns,
                "events",
                "{.items[?(@.reason==\"ForgedStatusIgnored\")].message}",
            )
        };
        wait_until(WAIT, || Ok(told().contains("fs-2147483646")))
            .with_context(|| format!("events: {}", told()))?;
        let backlog = env.get(ns, &format!("ssapp/{app}"), "{.status.backlog}");
        ensure!(
            backlog.parse::<i64>().is_ok_and(|b| b >= 0),
            "the backlog reads {backlog}"
        );
        Ok(())
    })();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    forged?;

    // The operators are up, one leads, and an app applied now is reconciled.
    ensure!(
        env.leaders() == 1.0,
        "leaders: {}\n{}",
        env.leaders(),
        env.logs()
    );
    let (input2, output2) = (space.topic("fs2-in", 1)?, space.topic("fs2-out", 1)?);
    env.apply(
        ns,
        &counting_app_yaml("fs-later", 1, &env.bs, &input2, &output2, ""),
    )?;
    produce_counts(&input2, 30, 3)?;
    wait_until(WAIT, || counted(&output2, 3, 10)).with_context(|| env.logs())?;
    // The frozen worker is back and counts on, exactly.
    produce_counts(&input, 200, 10)?;
    wait_until(WAIT, || {
        at_most(1)?;
        counted(&output, 10, 40)
    })
    .with_context(|| env.logs())?;

    // Two pods, each with its own credentials.
    env.kubectl(&["-n", ns, "scale", "ssapp", app, "--replicas=2"], None)?;
    wait_until(WAIT, || {
        Ok(
            env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running"
                && !incarnation("fs-1").is_empty(),
        )
    })
    .with_context(|| env.logs())?;
    let patch_status = |pod: &str, body: &str| {
        env.kubectl_as_pod(
            ns,
            pod,
            &[
                "-n",
                ns,
                "patch",
                "ssapp",
                app,
                "--subresource=status",
                "--type=merge",
                "-p",
                body,
            ],
        )
    };
    let refused = |what: &str, r: Result<String>, says: &str| -> Result<()> {
        match r {
            Ok(out) => anyhow::bail!("{what} was allowed: {out}"),
            Err(e) => {
                let e = format!("{e:#}");
                ensure!(e.contains("denied") && e.contains(says), "{what}: {e}");
                Ok(())
            }
        }
    };
    refused(
        "fs-0 rewriting fs-1's report",
        patch_status(
            "fs-0",
            r#"{"status": {"workers": {"fs-1": {"queryAddress": "evil.example:9091"}}}}"#,
        ),
        "may write only its own report, status.workers.fs-0",
    )?;
    refused(
        "fs-0 writing the assignment",
        patch_status(
            "fs-0",
            r#"{"status": {"assignment": {"pods": {"fs-7": {"active": ["0_0"]}}}}}"#,
        ),
        "not status.assignment",
    )?;
    refused(
        "fs-0 writing the backlog",
        patch_status("fs-0", r#"{"status": {"backlog": 5}}"#),
        "not status.backlog",
    )?;
    // Its own report it may write (its worker does, every few seconds).
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    patch_status(
        "fs-0",
        &format!(r#"{{"status": {{"workers": {{"fs-0": {{"updated": "{now}"}}}}}}}}"#),
    )
    .with_context(|| env.logs())?;
    // A token of the worker ServiceAccount that is not bound to a pod writes nothing.
    let unbound = env.cp.kubeconfig_for(ns, "fs-worker", env.dir.path())?;
    let r = env.cp.kubectl(
        &[
            "--kubeconfig",
            unbound.to_str().unwrap_or_default(),
            "-n",
            ns,
            "patch",
            "ssapp",
            app,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"workers": {"fs-0": {"updated": "2026-01-01T00:00:00Z"}}}}"#,
        ],
        None,
    );
    refused("an unbound token", r, "bound to no pod")?;
    // The peer's report is its own still.
    let peer = env.app_json(ns, app)?["status"]["workers"]["fs-1"].clone();
    ensure!(
        peer.is_object() && peer["queryAddress"] != "evil.example:9091",
        "fs-1's report: {peer}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

/// A status write that changes the assignment is refused for a change of what it was decided
/// from, and for nothing else: on the real API server, with the operator's credentials, the
/// write of `eddy_operator::controller::patch_status`, made from an app read a moment
/// before. A report of another pod written in between (restoring workers report every
/// 250 ms) lets a failover through, and the write leaves that report as its worker wrote it;
/// a report of the pod failed over written in between, or another leader's assignment,
/// refuses it as a conflict (decided again); a status the schema refuses stays an error.
/// The app's spec cannot be read, so the operators leave its assignment and reports alone.
#[test]
fn an_assignment_write_is_refused_only_for_what_it_was_decided_from() -> Result<()> {
    use eddy_crds::resource::{Assignment, PodTasks};
    use eddy_operator::app::RawApp;
    use eddy_operator::controller::{Error, patch_status};
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let app = "race";
    env.apply(
        ns,
        &format!(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: {app}}}\n\
             spec:\n  kafka: {{bootstrapServers: \"{}\"}}\n  topology:\n    \
             - from: {{topic: never-created}}\n    - groupBy: 42\n",
            env.bs
        ),
    )?;
    env.wait_degraded(ns, app, "InvalidSpec")?;
    let admin_patch = |body: String| {
        env.kubectl(
            &[
                "-n",
                ns,
                "patch",
                "ssapp",
                app,
                "--subresource=status",
                "--type=merge",
                "-p",
                &body,
            ],
            None,
        )
    };
    // A worker's report, as its worker writes it.
    let report = |pod: &str, updated: &str| {
        admin_patch(format!(
            r#"{{"status": {{"workers": {{"{pod}": {{"appliedGeneration": 5, "updated": "{updated}"}}}}}}}}"#
        ))
    };
    admin_patch(
        r#"{"status": {"assignment": {"generation": 5, "pods": {
            "race-0": {"active": ["0_0"]}, "race-1": {"active": ["0_1"]}}}}}"#
            .into(),
    )?;
    for pod in ["race-0", "race-1", "race-9"] {
        report(pod, "2026-01-01T00:00:00Z")?;
    }

    let dir = tempfile::tempdir()?;
    let kubeconfig = env.cp.kubeconfig_for(
        eddy_e2e::operated::OPERATOR_NS,
        "t-eddy-operator",
        dir.path(),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        anyhow::Ok(kube::Client::try_from(config)?)
    })?;
    let api: kube::Api<RawApp> = kube::Api::namespaced(client.clone(), ns);
    let read = || rt.block_on(api.get(app));
    let tasks = |active: &[&str]| PodTasks {
        active: active.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    };
    // What the operator would write failing `down` over to race-0 under `generation`, and
    // dropping race-9's report (no such pod).
    let failover = |raw: &RawApp, generation: i64, down: &[&str]| {
        let mut status = raw.status_or_default();
        status.assignment = Some(Assignment {
            generation,
            partitions: vec![2],
            pods: [("race-0".to_string(), tasks(&["0_0", "0_1"]))].into(),
            down: down.iter().map(|p| p.to_string()).collect(),
        });
        status.workers.remove("race-9");
        status
    };
    let stored = || env.app_json(ns, app).map(|v| v["status"].clone());

    // race-1 is failed over while race-0, restoring, reports: written.
    let raw = read()?;
    report("race-0", "2026-01-01T00:00:01Z")?;
    rt.block_on(patch_status(&client, &raw, &failover(&raw, 6, &["race-1"])))
        .with_context(|| env.logs())?;
    let s = stored()?;
    ensure!(
        s["assignment"]["generation"] == 6
            && s["assignment"]["down"] == serde_json::json!(["race-1"])
            && s["workers"]["race-0"]["updated"] == "2026-01-01T00:00:01Z"
            && s["workers"]["race-1"].is_object()
            && s["workers"].get("race-9").is_none(),
        "the failover, race-0's newer report kept, race-9's dropped: {s}"
    );

    // race-0 is failed over, but it reported since the app was read: refused.
    let raw = read()?;
    report("race-0", "2026-01-01T00:00:02Z")?;
    let r = rt.block_on(patch_status(
        &client,
        &raw,
        &failover(&raw, 7, &["race-1", "race-0"]),
    ));
    ensure!(matches!(r, Err(Error::Conflict)), "{r:?}");

    // Another leader published generation 7 since the app was read: refused.
    let raw = read()?;
    admin_patch(r#"{"status": {"assignment": {"generation": 7}}}"#.into())?;
    let r = rt.block_on(patch_status(&client, &raw, &failover(&raw, 7, &[])));
    ensure!(matches!(r, Err(Error::Conflict)), "{r:?}");
    let s = stored()?;
    ensure!(
        s["assignment"]["generation"] == 7
            && s["assignment"]["down"] == serde_json::json!(["race-1"]),
        "nothing of the refused writes: {s}"
    );

    // A status the schema refuses (a pod name longer than any) is an error, not a conflict.
    let raw = read()?;
    let long = "x".repeat(300);
    let r = rt.block_on(patch_status(&client, &raw, &failover(&raw, 8, &[&long])));
    ensure!(
        matches!(&r, Err(Error::Kube(kube::Error::Api(s))) if s.code == 422),
        "{r:?}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

//! The real-node tier: the chart installed with `helm install` as README says, on a real node
//! (kubelet, containerd and runc, a CNI bridge, kube-proxy: `e2e/k8s/node.sh`), its operator
//! and the apps' workers running as pods of the images `images/build.sh` makes, against a
//! broker on the node's bridge address (`eddy_e2e::node`). What the pod runner of the other
//! operator tests cannot show: the images start as pods; the worker's `securityContext` is in
//! force (checked from the host, on the container's process); its state volume is a local
//! PersistentVolume bound through the scheduler and owned through `fsGroup`; a deleted pod
//! comes back on its volume, or its tasks resume on its standby while it cannot; workers
//! forward queries to each other by their names in the cluster DNS (CoreDNS on the node); a
//! frozen worker is restarted by its liveness probe, evictions are held to the
//! PodDisruptionBudget, a scale out and in keeps the state volumes, with the counts exact. One
//! node, broker and chart serve the binary's tests; each works in a namespace of its own. Root
//! only.
//!
//! Alone: `CARGO_TARGET_DIR=~/.cache/eddy/target cargo test --release -p eddy-e2e --test node`.

use anyhow::{Context as _, Result, ensure};
use eddy_e2e::node::{self, Namespace, OPERATOR_NS, RELEASE, RealNode, WAIT, WORKER_UID};
use eddy_e2e::*;
use std::os::unix::fs::MetadataExt as _;
use std::time::Instant;

const EXACTLY_ONCE: &str = "  cleanupPolicy: Delete\n  processingGuarantee: exactly_once\n";

/// Each of `keys` keys counted to `each` in the committed output, its counts rising from one
/// record to the next: a record counted twice or a count gone back would show.
fn counted_exactly(output: &str, keys: usize, each: i64) -> Result<bool> {
    let seen = i64_values_by_key(output)?;
    Ok(seen.len() == keys
        && seen
            .values()
            .all(|v| v.last() == Some(&each) && v.windows(2).all(|w| w[0] < w[1])))
}

/// The app's phase is Running with `replicas` Ready pods.
fn running(env: &RealNode, ns: &str, app: &str, replicas: usize) -> bool {
    env.get(ns, &format!("ssapp/{app}"), "{.status.phase}") == "Running"
        && env.get(ns, &format!("statefulset/{app}"), "{.status.readyReplicas}")
            == replicas.to_string()
}

/// Worker pod `<app>-<i>` as the node runs it: on the node, from the worker image, Ready; and
/// from the host, on the container's process: uid and gid 65532 with the fsGroup as
/// supplementary group, no capabilities, seccomp and no_new_privs, a read-only root; its
/// state dir is the local PersistentVolume's directory, group 65532 with setgid, and what the
/// worker wrote there is 65532's; its `/metrics` answer at its pod IP.
fn check_worker_pod(env: &RealNode, ns: &str, app: &str, i: usize) -> Result<()> {
    let pod = format!("{app}-{i}");
    let get = |path: &str| env.get(ns, &format!("pod/{pod}"), path);
    let placed = get(
        "{.spec.nodeName} {.status.containerStatuses[0].image} {.status.containerStatuses[0].ready}",
    );
    ensure!(
        placed == format!("{} {} true", env.node, env.worker_image),
        "{pod}: node, image, ready: {placed}"
    );
    let sc = get(
        "{.spec.securityContext.runAsUser} {.spec.securityContext.runAsGroup} {.spec.securityContext.fsGroup} {.spec.containers[0].securityContext.readOnlyRootFilesystem} {.spec.containers[0].securityContext.capabilities.drop[*]}",
    );
    ensure!(
        sc == format!("{WORKER_UID} {WORKER_UID} {WORKER_UID} true ALL"),
        "{pod}: securityContext {sc}"
    );
    let ip = get("{.status.podIP}");
    let subnet = env.node_ip.rsplit_once('.').map(|(n, _)| n).unwrap_or("");
    ensure!(
        ip.rsplit_once('.').map(|(n, _)| n) == Some(subnet),
        "{pod}: pod IP {ip:?} is not in the node's subnet ({})",
        env.node_ip
    );

    let pid = env.container_pid(ns, &pod)?;
    let status = node::proc_status(pid)?;
    let field = |k: &str| status.get(k).map(String::as_str).unwrap_or("");
    let ids = format!("{WORKER_UID} {WORKER_UID} {WORKER_UID} {WORKER_UID}");
    ensure!(
        field("Name") == "eddy-worker",
        "{pod}: pid {pid} is {}",
        field("Name")
    );
    ensure!(
        field("Uid") == ids && field("Gid") == ids,
        "{pod}: Uid {}, Gid {}",
        field("Uid"),
        field("Gid")
    );
    ensure!(
        field("Groups")
            .split(' ')
            .any(|g| g.parse() == Ok(WORKER_UID)),
        "{pod}: supplementary groups {:?} lack the fsGroup",
        field("Groups")
    );
    for cap in ["CapEff", "CapPrm", "CapBnd"] {
        ensure!(
            field(cap) == "0000000000000000",
            "{pod}: {cap} {}",
            field(cap)
        );
    }
    ensure!(
        field("NoNewPrivs") == "1" && field("Seccomp") == "2",
        "{pod}: NoNewPrivs {}, Seccomp {}",
        field("NoNewPrivs"),
        field("Seccomp")
    );
    let root = node::root_mount_options(pid)?;
    ensure!(
        root.split(',').next() == Some("ro"),
        "{pod}: root mounted {root}"
    );

    let state = std::fs::metadata(format!("/proc/{pid}/root/var/lib/eddy"))?;
    let pv = env.get(ns, &format!("pvc/state-{pod}"), "{.spec.volumeName}");
    ensure!(
        pv == format!("{ns}-state-{pod}"),
        "{pod}: its claim is bound to {pv:?}"
    );
    let dir = env.volume_dir(&pv);
    let host = std::fs::metadata(&dir)?;
    ensure!(
        (host.dev(), host.ino()) == (state.dev(), state.ino()),
        "{pod}: /var/lib/eddy is not the PersistentVolume's {}",
        dir.display()
    );
    ensure!(
        state.gid() == WORKER_UID && state.mode() & 0o2070 == 0o2070,
        "{pod}: the state volume is group {} mode {:o} (fsGroup: {WORKER_UID}, setgid, group rwx)",
        state.gid(),
        state.mode()
    );
    let mut written = 0;
    for entry in std::fs::read_dir(&dir)? {
        let m = entry?.metadata()?;
        ensure!(
            m.uid() == WORKER_UID && m.gid() == WORKER_UID,
            "{pod}: the worker wrote a file of {}:{} in its state volume",
            m.uid(),
            m.gid()
        );
        written += 1;
    }
    ensure!(written > 0, "{pod}: nothing in its state volume");

    let (code, metrics) = http_get(&format!("{ip}:9090"), "/metrics")?;
    let build = format!(
        "eddy_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    ensure!(
        code == 200 && metrics.contains(&build),
        "{pod}: {ip}:9090/metrics answered {code} without {build}"
    );
    Ok(())
}

/// An exactly-once counting app `<prefix>-…` of two workers with `volumes` local volumes
/// made for it (`extra`: more spec lines), in a namespace of its own, 2000 records over 20
/// keys counted exactly and both workers running.
struct Counting<'a> {
    space: Namespace<'a>,
    app: String,
    input: String,
    output: String,
}

fn counting<'a>(
    env: &'a RealNode,
    prefix: &str,
    volumes: usize,
    extra: &str,
) -> Result<Counting<'a>> {
    let space = Namespace::new(env)?;
    let ns = space.name.as_str();
    let app = unique(prefix);
    let (input, output) = (space.topic("node-in", 4)?, space.topic("node-out", 2)?);
    produce_counts(&input, 2000, 20)?;
    env.local_volumes(ns, &app, volumes)?;
    let extra = format!("{EXACTLY_ONCE}{extra}");
    env.apply(
        ns,
        &counting_app_yaml(&app, 2, &env.bs, &input, &output, &extra),
    )?;
    wait_until(WAIT, || counted_exactly(&output, 20, 100)).with_context(|| env.diagnostics(ns))?;
    wait_until(WAIT, || Ok(running(env, ns, &app, 2))).with_context(|| env.diagnostics(ns))?;
    Ok(Counting {
        space,
        app,
        input,
        output,
    })
}

#[test]
fn the_chart_runs_an_app_on_real_pods_hardened_with_its_state_on_local_volumes() -> Result<()> {
    let env = node::shared()?;
    let space = Namespace::new(env)?;
    let ns = space.name.as_str();
    let app = unique("count");
    let (input, output) = (space.topic("node-in", 4)?, space.topic("node-out", 2)?);
    produce_counts(&input, 4000, 40)?;
    env.local_volumes(ns, &app, 2)?;

    let t = Instant::now();
    env.apply(
        ns,
        &counting_app_yaml(&app, 2, &env.bs, &input, &output, EXACTLY_ONCE),
    )?;
    wait_until(WAIT, || counted_exactly(&output, 40, 100)).with_context(|| env.diagnostics(ns))?;
    node::note(&format!(
        "app applied to its output exact in {:.1} s",
        node::since(t)
    ));
    wait_until(WAIT, || Ok(running(env, ns, &app, 2))).with_context(|| env.diagnostics(ns))?;
    for i in 0..2 {
        check_worker_pod(env, ns, &app, i).with_context(|| env.diagnostics(ns))?;
    }

    // The chart's operator: its pods from the operator image, with its ServiceAccount, one
    // of them leading.
    let operators = env.get(
        OPERATOR_NS,
        "pods",
        "{range .items[*]}{.spec.serviceAccountName} {.status.containerStatuses[0].image} {.status.containerStatuses[0].ready}{\"\\n\"}{end}",
    );
    let expected = format!("{RELEASE} {} true", env.operator_image);
    ensure!(
        operators.lines().count() == 2 && operators.lines().all(|l| l == expected),
        "operator pods: {operators}"
    );
    ensure!(env.operator_leaders()? == 1.0, "not one operator leads");
    Ok(())
}

#[test]
fn a_deleted_worker_pod_comes_back_on_its_volume_and_the_counts_stay_exact() -> Result<()> {
    let env = node::shared()?;
    let Counting {
        space,
        app,
        input,
        output,
    } = counting(env, "back", 2, "  numStandbyReplicas: 1\n")?;
    let ns = space.name.as_str();

    let pod = format!("{app}-0");
    let uid = |env: &RealNode| env.get(ns, &format!("pod/{pod}"), "{.metadata.uid}");
    let (before, volume) = (
        uid(env),
        env.get(ns, &format!("pvc/state-{pod}"), "{.spec.volumeName}"),
    );
    let t = Instant::now();
    env.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            &pod,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    node::note(&format!("{pod} deleted in {:.1} s", node::since(t)));
    // Input while it is gone (or coming back): its tasks resume, on the other worker that
    // keeps their standby or on the new pod, and every record is counted once.
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 200)).with_context(|| env.diagnostics(ns))?;
    node::note(&format!(
        "counts exact again {:.1} s after the delete",
        node::since(t)
    ));
    // The StatefulSet makes the pod anew, on the same claim and volume.
    wait_until(WAIT, || {
        let now = uid(env);
        Ok(!now.is_empty() && now != before && running(env, ns, &app, 2))
    })
    .with_context(|| env.diagnostics(ns))?;
    node::note(&format!(
        "{pod} back and the app Running {:.1} s after the delete",
        node::since(t)
    ));
    let again = env.get(ns, &format!("pvc/state-{pod}"), "{.spec.volumeName}");
    ensure!(
        again == volume,
        "{pod}'s claim moved from {volume} to {again}"
    );
    check_worker_pod(env, ns, &app, 0).with_context(|| env.diagnostics(ns))?;

    // With both workers back, more input is still counted exactly once.
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 300)).with_context(|| env.diagnostics(ns))?;
    Ok(())
}

#[test]
fn a_frozen_worker_is_restarted_by_its_liveness_probe_and_the_counts_stay_exact() -> Result<()> {
    let env = node::shared()?;
    let Counting {
        space,
        app,
        input,
        output,
    } = counting(env, "frozen", 2, "")?;
    let ns = space.name.as_str();

    // SIGSTOP to the worker's process (the container's pid 1, seen from the host): it
    // answers nothing, not even its liveness probe.
    let pod = format!("{app}-1");
    let restarts = || {
        env.get(
            ns,
            &format!("pod/{pod}"),
            "{.status.containerStatuses[0].restartCount}",
        )
    };
    ensure!(restarts() == "0", "{pod} restarted before the test");
    let pid = env.container_pid(ns, &pod)?;
    let t = Instant::now();
    // SAFETY: kill(2) with a pid read from containerd; no memory is involved.
    ensure!(
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) } == 0,
        "SIGSTOP to {pid}: {}",
        std::io::Error::last_os_error()
    );
    wait_until(WAIT, || {
        eddy_e2e::operated::all_threads_stopped(pid as i32).or(Ok(true))
    })?;
    produce_counts(&input, 2000, 20)?;

    // The kubelet's liveness probe fails, the container is killed (SIGTERM waits for the
    // grace period: a stopped process does not act on it; then SIGKILL) and started again in
    // the same pod, on the same volume.
    wait_until(WAIT, || Ok(restarts().parse::<u32>().is_ok_and(|n| n >= 1)))
        .with_context(|| format!("{pod} was not restarted\n{}", env.diagnostics(ns)))?;
    node::note(&format!(
        "{pod} frozen, restarted by its liveness probe after {:.1} s",
        node::since(t)
    ));
    let events = env.kubectl(
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod},reason=Unhealthy"),
            "-o",
            "jsonpath={.items[*].message}",
        ],
        None,
    )?;
    ensure!(
        events.contains("Liveness probe failed"),
        "{pod}'s Unhealthy events: {events}"
    );
    ensure!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the frozen process {pid} still exists"
    );
    wait_until(WAIT, || counted_exactly(&output, 20, 200)).with_context(|| env.diagnostics(ns))?;
    wait_until(WAIT, || Ok(running(env, ns, &app, 2))).with_context(|| env.diagnostics(ns))?;
    node::note(&format!(
        "counts exact and the app Running {:.1} s after the SIGSTOP",
        node::since(t)
    ));
    check_worker_pod(env, ns, &app, 1).with_context(|| env.diagnostics(ns))?;
    ensure!(restarts() == "1", "{pod} restarted {} times", restarts());
    Ok(())
}

#[test]
fn evictions_respect_the_pod_disruption_budget_and_the_counts_stay_exact() -> Result<()> {
    let env = node::shared()?;
    let Counting {
        space,
        app,
        input,
        output,
    } = counting(env, "evict", 2, "")?;
    let ns = space.name.as_str();

    // The app's PodDisruptionBudget (maxUnavailable 1), as the disruption controller counts
    // it: one of the two pods may go.
    let allowed = || env.get(ns, &format!("pdb/{app}"), "{.status.disruptionsAllowed}");
    wait_until(WAIT, || Ok(allowed() == "1"))
        .with_context(|| format!("disruptionsAllowed {}", allowed()))?;
    // What `kubectl drain` does: the eviction API.
    let evict = |pod: &str| {
        env.kubectl(
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction"),
                "-f",
                "-",
            ],
            Some(&format!(
                r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}","namespace":"{ns}"}}}}"#
            )),
        )
    };
    let (first, second) = (format!("{app}-0"), format!("{app}-1"));
    let uid = |pod: &str| env.get(ns, &format!("pod/{pod}"), "{.metadata.uid}");
    let before = uid(&first);
    evict(&first).context("the first eviction was refused")?;
    // The other pod may not go while the first is away.
    let refused = evict(&second).err().map(|e| format!("{e:#}"));
    ensure!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("disruption budget")),
        "the second eviction, with {first} away: {refused:?}"
    );
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 200)).with_context(|| env.diagnostics(ns))?;
    wait_until(WAIT, || {
        let now = uid(&first);
        Ok(!now.is_empty() && now != before && running(env, ns, &app, 2))
    })
    .with_context(|| env.diagnostics(ns))?;

    // With both back, the budget lets the other one go.
    wait_until(WAIT, || Ok(allowed() == "1"))
        .with_context(|| format!("disruptionsAllowed {}", allowed()))?;
    let before = uid(&second);
    evict(&second).context("the eviction with both pods back was refused")?;
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 300)).with_context(|| env.diagnostics(ns))?;
    wait_until(WAIT, || {
        let now = uid(&second);
        Ok(!now.is_empty() && now != before && running(env, ns, &app, 2))
    })
    .with_context(|| env.diagnostics(ns))?;
    Ok(())
}

#[test]
fn scaling_out_and_in_keeps_the_state_volumes_and_the_counts_exact() -> Result<()> {
    let env = node::shared()?;
    let Counting {
        space,
        app,
        input,
        output,
    } = counting(env, "scale", 3, "")?;
    let ns = space.name.as_str();
    let scale = |n: usize| {
        env.kubectl(
            &["-n", ns, "scale", "ssapp", &app, &format!("--replicas={n}")],
            None,
        )
    };
    let third = format!("{app}-2");
    let claim = format!("pvc/state-{third}");

    // Out to 3: the new pod gets its local volume through the scheduler, and tasks.
    let t = Instant::now();
    scale(3)?;
    wait_until(WAIT, || Ok(running(env, ns, &app, 3))).with_context(|| env.diagnostics(ns))?;
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 200)).with_context(|| env.diagnostics(ns))?;
    node::note(&format!(
        "scaled out to 3, counts exact, in {:.1} s",
        node::since(t)
    ));
    check_worker_pod(env, ns, &app, 2).with_context(|| env.diagnostics(ns))?;
    let volume = env.get(ns, &claim, "{.spec.volumeName}");

    // In to 2: the pod goes, its claim and volume stay (whenScaled: Retain).
    scale(2)?;
    wait_until(WAIT, || {
        Ok(running(env, ns, &app, 2)
            && env
                .get(ns, &format!("pod/{third}"), "{.metadata.name}")
                .is_empty())
    })
    .with_context(|| env.diagnostics(ns))?;
    let kept = env.get(ns, &claim, "{.status.phase} {.spec.volumeName}");
    ensure!(
        kept == format!("Bound {volume}"),
        "{claim} after the scale-in: {kept}"
    );
    ensure!(
        std::fs::read_dir(env.volume_dir(&volume))?.next().is_some(),
        "{volume} is empty after the scale-in"
    );
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 300)).with_context(|| env.diagnostics(ns))?;

    // Out again: the pod comes back on the same claim and volume.
    scale(3)?;
    wait_until(WAIT, || Ok(running(env, ns, &app, 3))).with_context(|| env.diagnostics(ns))?;
    let again = env.get(ns, &claim, "{.spec.volumeName}");
    ensure!(again == volume, "{claim} moved from {volume} to {again}");
    check_worker_pod(env, ns, &app, 2).with_context(|| env.diagnostics(ns))?;
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 400)).with_context(|| env.diagnostics(ns))?;
    Ok(())
}

#[test]
fn a_deleted_pods_tasks_resume_on_its_standby_while_it_cannot_come_back() -> Result<()> {
    let env = node::shared()?;
    let Counting {
        space,
        app,
        input,
        output,
    } = counting(env, "standby", 2, "  numStandbyReplicas: 1\n")?;
    let ns = space.name.as_str();
    let (gone, other) = (format!("{app}-0"), format!("{app}-1"));
    // The active and standby tasks of each pod, from one read of the assignment.
    let tasks = |env: &RealNode| -> Result<[(Vec<String>, Vec<String>); 2]> {
        let pods = env
            .app_status(ns, &app)?
            .assignment
            .unwrap_or_default()
            .pods;
        Ok([&gone, &other].map(|pod| {
            pods.get(pod.as_str())
                .map(|t| (t.active.clone(), t.standby.clone()))
                .unwrap_or_default()
        }))
    };
    let mut moved = Vec::new();
    wait_until(WAIT, || {
        let [(active, _), (_, standby)] = tasks(env)?;
        moved = active;
        Ok(!moved.is_empty() && moved.iter().all(|t| standby.contains(t)))
    })
    .with_context(|| format!("{other} keeps no standby of {gone}'s tasks {moved:?}"))?;

    // A quota of one pod in the namespace: the StatefulSet cannot make the deleted pod again
    // (as when its node is gone or full), so only the standby can take its tasks.
    env.kubectl(
        &["-n", ns, "create", "quota", "one-pod", "--hard=pods=1"],
        None,
    )?;
    wait_until(WAIT, || {
        Ok(env.get(ns, "resourcequota/one-pod", "{.status.used.pods}") == "2")
    })?;
    let t = Instant::now();
    env.kubectl(
        &[
            "-n",
            ns,
            "delete",
            "pod",
            &gone,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    )?;
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 200)).with_context(|| env.diagnostics(ns))?;
    let [_, (mut active, _)] = tasks(env)?;
    moved.sort();
    active.sort();
    ensure!(
        moved.iter().all(|t| active.binary_search(t).is_ok()),
        "{other} is active for {active:?}, not for all of {gone}'s tasks {moved:?}"
    );
    ensure!(
        env.get(ns, &format!("pod/{gone}"), "{.metadata.name}")
            .is_empty(),
        "{gone} came back despite the quota: the standby was not what resumed its tasks"
    );
    node::note(&format!(
        "{gone}'s tasks resumed on {other}'s standbys, counts exact, {:.1} s after the delete",
        node::since(t)
    ));

    // The quota lifted, the pod comes back on its volume, and the app counts on exactly.
    env.kubectl(&["-n", ns, "delete", "quota", "one-pod"], None)?;
    // The StatefulSet controller retries the refused pod with a growing back-off; a change
    // of the StatefulSet makes it try at once.
    env.kubectl(
        &[
            "-n",
            ns,
            "annotate",
            "--overwrite",
            "statefulset",
            &app,
            "e2e.eddy.dev/quota-lifted=true",
        ],
        None,
    )?;
    wait_until(WAIT, || Ok(running(env, ns, &app, 2))).with_context(|| env.diagnostics(ns))?;
    produce_counts(&input, 2000, 20)?;
    wait_until(WAIT, || counted_exactly(&output, 20, 300)).with_context(|| env.diagnostics(ns))?;
    Ok(())
}

#[test]
fn queries_are_forwarded_between_pods_by_their_names_in_the_cluster_dns() -> Result<()> {
    let env = node::shared()?;
    let Counting { space, app, .. } = counting(env, "iq", 2, "")?;
    let ns = space.name.as_str();
    let pods = [format!("{app}-0"), format!("{app}-1")];

    // Each worker reports its name in the headless Service, which only the cluster's DNS
    // (CoreDNS on the node) resolves, for the pods' own resolver.
    let status = env.app_status(ns, &app)?;
    for pod in &pods {
        let reported = status
            .workers
            .get(pod)
            .and_then(|w| w.query_address.clone());
        let name = eddy_crds::query::pod_query_address(&app, pod, ns);
        ensure!(
            reported.as_deref() == Some(name.as_str()),
            "{pod} reports its query address as {reported:?}, not {name}"
        );
    }
    // A query client's token, bound to the chart's ClusterRole for query clients.
    let account = "reader";
    env.kubectl(&["-n", ns, "create", "serviceaccount", account], None)?;
    env.kubectl(
        &[
            "-n",
            ns,
            "create",
            "rolebinding",
            account,
            &format!("--clusterrole={}-query", node::RELEASE),
            &format!("--serviceaccount={ns}:{account}"),
        ],
        None,
    )?;
    let token = env.kubectl(&["-n", ns, "create", "token", account], None)?;
    let token = token.trim();
    // Every key asked of either pod, at its pod IP: the right count, read where the key's
    // partition is active, which is the other pod for some keys (forwarded with the workers'
    // own tokens).
    let mut forwarded = 0;
    for pod in &pods {
        let ip = env.get(ns, &format!("pod/{pod}"), "{.status.podIP}");
        let mut answered_by = std::collections::BTreeMap::<String, usize>::new();
        for k in 0..20 {
            let (code, _, body) = http_get_as(
                &format!("{ip}:9091"),
                &format!("/stores/counts/keys/k{k}"),
                Some(token),
            )?;
            ensure!(code == 200, "{pod} asked for k{k}: {code} {body}");
            let answer: eddy_crds::query::KeyAnswer =
                serde_json::from_str(&body).with_context(|| body.clone())?;
            ensure!(
                answer.found && answer.value == 100,
                "{pod} asked for k{k}: {body}"
            );
            *answered_by.entry(answer.answered_by.pod).or_default() += 1;
        }
        ensure!(
            answered_by.keys().eq(pods.iter()),
            "asked at {pod}, the keys were answered by {answered_by:?}: not by both pods"
        );
        forwarded += answered_by
            .iter()
            .filter(|(p, _)| *p != pod)
            .map(|(_, n)| n)
            .sum::<usize>();
    }
    node::note(&format!(
        "{forwarded} of 40 gets forwarded to the other pod by name"
    ));
    Ok(())
}

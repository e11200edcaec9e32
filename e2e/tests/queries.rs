//! Interactive queries end to end: apps under the operator on a real control plane and a real
//! broker, every worker pod serving the query API (each pod's address is the pod runner's
//! annotation; other workers forward to the address each worker reports in the status, as
//! the runner sets `EDDY_QUERY_PEERS=reported`).
//!
//! What a user would notice: every pod answers every key with the value the output topic
//! holds last, and the app's `<name>-query` Service exists; during a scale-out an answer is
//! either that value or a retry-after, never a wrong or empty one; with its active copy's
//! worker frozen, a key is still answered by the standby when the request accepts its lag;
//! in-memory stores answer as stores on disk do.

use anyhow::{Context, Result, ensure};
use eddy_crds::query::{KeyAnswer, RangeAnswer};
use eddy_crds::resource::TaskRole;
use eddy_e2e::operated::{Namespace, Operated, WAIT};
use eddy_e2e::*;
use std::collections::HashMap;
use std::time::Duration;

fn env() -> Result<&'static Operated> {
    eddy_e2e::operated::shared(1, |_, _| Ok(()))
}

const KEYS: usize = 200;

fn app_yaml(name: &str, replicas: i32, input: &str, output: &str) -> Result<String> {
    let bs = &env()?.bs;
    Ok(format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  numStandbyReplicas: 1
  kafka: {{bootstrapServers: "{bs}"}}
  cleanupPolicy: Delete
  processingGuarantee: exactly_once
  commitIntervalMs: 100
  queries: {{from: [{{podSelector: {{matchLabels: {{role: web}}}}}}]}}
  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    ))
}

/// Every key `k0..` once per round: each key's count is `rounds`.
fn produce_rounds(topic: &str, rounds: usize) -> Result<()> {
    let records: Vec<Input> = (0..rounds * KEYS)
        .map(|i| {
            (
                Some(format!("k{}", i % KEYS).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(topic, &records)
}

/// The query address of each worker pod of `app` that has one, by pod name.
fn query_addresses(env: &Operated, ns: &str, app: &str) -> HashMap<String, String> {
    let text = env.get(
        ns,
        "pods",
        &format!(
            "{{range .items[?(@.metadata.labels.app\\.kubernetes\\.io/instance==\"{app}\")]}}{{.metadata.name}}={{.metadata.annotations.e2e\\.eddy\\.dev/query-addr}}{{\"\\n\"}}{{end}}"
        ),
    );
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, a)| !a.is_empty())
        .map(|(p, a)| (p.to_string(), a.to_string()))
        .collect()
}

/// The latest count per key in the output topic, once every key reached `want`.
fn wait_output(env: &Operated, output: &str, want: i64) -> Result<()> {
    wait_until(WAIT, || {
        let last = i64_values_by_key(output)?;
        Ok(last.len() == KEYS && last.values().all(|v| v.last().copied() == Some(want)))
    })
    .with_context(|| format!("the counts never reached {want}\n{}", env.logs()))
}

/// GET `path` on `addr` with `token`: status, whether a Retry-After header came, body.
fn get(token: &str, addr: &str, path: &str) -> Result<(u16, bool, String)> {
    let (code, headers, body) = http_get_as(addr, path, Some(token))?;
    Ok((
        code,
        headers.to_ascii_lowercase().contains("retry-after: 1"),
        body,
    ))
}

/// The answer for `key` asked at `addr` (`extra`: more query parameters).
fn ask(
    token: &str,
    addr: &str,
    key: &str,
    extra: &str,
) -> Result<Result<KeyAnswer, (u16, bool, String)>> {
    let (code, retry, body) = get(token, addr, &format!("/stores/counts/keys/{key}{extra}"))?;
    if code != 200 {
        return Ok(Err((code, retry, body)));
    }
    Ok(Ok(
        serde_json::from_str(&body).with_context(|| body.clone())?
    ))
}

fn wait_running(env: &Operated, ns: &str, app: &str, replicas: usize) -> Result<()> {
    wait_until(WAIT, || {
        let v = env.app_json(ns, app)?;
        let s: eddy_crds::resource::AppStatus =
            serde_json::from_value(v["status"].clone()).unwrap_or_default();
        let Some(a) = &s.assignment else {
            return Ok(false);
        };
        let assigned = a.pods.len() == replicas
            && a.pods
                .values()
                .all(|p| !p.active.is_empty() && p.warmup.is_empty());
        let running = a.pods.iter().all(|(pod, tasks)| {
            s.workers.get(pod).is_some_and(|w| {
                w.applied_generation == a.generation
                    && w.query_address.is_some()
                    && tasks
                        .active
                        .iter()
                        .chain(&tasks.standby)
                        .all(|t| w.tasks.get(t).is_some_and(|t| t.state.name() == "RUNNING"))
            })
        });
        Ok(assigned && running && query_addresses(env, ns, app).len() == replicas)
    })
    .with_context(|| {
        format!(
            "{ns}/{app} did not settle at {replicas} pods\n{}",
            env.logs()
        )
    })
}

/// Three pods, each asked for every key with a client's token: the same value as the output
/// topic's latest record, found through whichever pod holds it (forwarded with the workers'
/// own tokens); a page through every key from one pod; 401 without a token or with a forged
/// one, 403 for a token without the right or with it in another namespace, and once the
/// right is revoked; the `query` command; the `<name>-query` Service and NetworkPolicy.
#[test]
fn every_pod_answers_every_key_with_the_output_topics_latest_value() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let token = space.query_token("reader", true)?;
    let (input, output) = (space.topic("iq-in", 6)?, space.topic("iq-out", 6)?);
    env.apply(ns, &app_yaml("iq", 3, &input, &output)?)?;
    wait_running(env, ns, "iq", 3)?;
    produce_rounds(&input, 3)?;
    wait_output(env, &output, 3)?;

    let service = env.get(ns, "service/iq-query", "{.spec.ports[0].port}");
    ensure!(
        service == "9091",
        "the iq-query Service's port: {service:?}"
    );
    // Who may query: the app's own pods and the peers the app names, on 9091 only.
    let policy: serde_json::Value = serde_json::from_str(&env.kubectl(
        &["-n", ns, "get", "networkpolicy", "iq-query", "-o", "json"],
        None,
    )?)?;
    let spec = &policy["spec"];
    let own = &spec["podSelector"]["matchLabels"];
    let rules = &spec["ingress"];
    ensure!(
        own["app.kubernetes.io/instance"] == "iq"
            && rules[0]["ports"][0]["port"] == 9091
            && rules[0]["from"][0]["podSelector"]["matchLabels"] == *own
            && rules[0]["from"][1]["podSelector"]["matchLabels"]["role"] == "web"
            && rules[1]["from"].is_null()
            && rules[1]["ports"][0]["endPort"] == 9090
            && rules[1]["ports"][1]["port"] == 9092,
        "the iq-query NetworkPolicy: {spec}"
    );
    let pods = query_addresses(env, ns, "iq");
    let mut answered_by: HashMap<String, usize> = HashMap::new();
    for (pod, addr) in &pods {
        for k in 0..KEYS {
            let key = format!("k{k}");
            // Committed state: a commit follows the output within the commit interval.
            let mut last = None;
            wait_until(Duration::from_secs(30), || {
                last = Some(ask(&token, addr, &key, "")?);
                Ok(matches!(&last, Some(Ok(a)) if a.value == 3))
            })
            .with_context(|| format!("{pod} asked for {key}: {last:?}"))?;
            if let Some(Ok(a)) = last {
                ensure!(a.found && a.key == key, "{pod}, {key}: {a:?}");
                ensure!(
                    a.answered_by.role == TaskRole::Active,
                    "{pod}, {key}: answered by {:?}",
                    a.answered_by
                );
                *answered_by.entry(a.answered_by.pod).or_default() += 1;
            }
        }
    }
    ensure!(
        answered_by.len() == 3,
        "every pod holds some keys' active copy: {answered_by:?}"
    );

    // Every key once, in pages of 50, from one pod: each partition read where it lives.
    let addr = pods.values().next().context("a pod")?;
    let mut seen = Vec::new();
    let mut after = String::new();
    for _ in 0..10 {
        let (code, _, body) = get(
            &token,
            addr,
            &format!("/stores/counts/keys?limit=50{after}"),
        )?;
        ensure!(code == 200, "a page: {code} {body}");
        let page: RangeAnswer = serde_json::from_str(&body)?;
        ensure!(page.answered_by.len() == 6, "six partitions read: {body}");
        seen.extend(
            page.entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone())),
        );
        match page.next {
            Some(n) => after = format!("&after={n}"),
            None => break,
        }
    }
    let mut keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    keys.sort();
    let got: Vec<String> = seen
        .iter()
        .map(|(k, _)| k.as_str().unwrap_or_default().to_string())
        .collect();
    ensure!(
        got == keys,
        "the pages hold every key once, in order: {got:?}"
    );
    ensure!(seen.iter().all(|(_, v)| v == 3), "every count is 3");

    // Who may query: a token the API server accepts, allowed `get` on statefulstreamapps/query
    // of this app (above, through the chart's ClusterRole); nobody else.
    let path = "/stores/counts/keys/k7";
    let (code, headers, body) = http_get_as(addr, path, None)?;
    ensure!(
        code == 401
            && headers
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer")
            && body.contains("needs a bearer token"),
        "without a token: {code} {headers} {body}"
    );
    let (code, _, body) = http_get_as(addr, path, Some("not-a-token"))?;
    ensure!(
        code == 401 && body.contains("not one the Kubernetes API server accepts"),
        "a forged token: {code} {body}"
    );
    let outsider = space.query_token("outsider", false)?;
    let (code, _, body) = http_get_as(addr, path, Some(&outsider))?;
    ensure!(
        code == 403 && body.contains("statefulstreamapps/query") && !body.contains("\"value\""),
        "a token without the right: {code} {body}"
    );
    // Allowed in its own namespace is not allowed here.
    let elsewhere = Namespace::new(env, &[])?;
    let stranger = elsewhere.query_token("reader", true)?;
    let (code, _, body) = http_get_as(addr, path, Some(&stranger))?;
    ensure!(
        code == 403,
        "a token allowed in another namespace: {code} {body}"
    );

    // The command-line client, as a user with a port-forward would run it: the token given,
    // and without one (no kubeconfig holding one) the 401's message.
    let out = std::process::Command::new(binary("eddy-worker")?)
        .args([
            "query",
            "--url",
            &format!("http://{addr}"),
            "--store",
            "counts",
        ])
        .args(["--key", "k7"])
        .env("KUBECONFIG", "/nonexistent")
        .env_remove("EDDY_QUERY_TOKEN")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("401") && err.contains("--token"),
        "query without a token: {err}"
    );
    let out = std::process::Command::new(binary("eddy-worker")?)
        .args([
            "query",
            "--url",
            &format!("http://{addr}"),
            "--store",
            "counts",
            "--key",
            "k7",
            "--token",
            &token,
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "query: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a: KeyAnswer = serde_json::from_slice(&out.stdout)?;
    ensure!(a.value == 3 && a.found, "query printed {a:?}");
    let out = std::process::Command::new(binary("eddy-worker")?)
        .args([
            "query",
            "--url",
            &format!("http://{addr}"),
            "--store",
            "count",
        ])
        .env("EDDY_QUERY_TOKEN", &token)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("no store \"count\"") && err.contains("counts"),
        "a wrong store name: {err}"
    );
    // A right taken away stops working within the workers' decision cache (10 s).
    env.kubectl(&["-n", ns, "delete", "rolebinding", "reader"], None)?;
    let mut last = (0, String::new(), String::new());
    wait_until(Duration::from_secs(30), || {
        last = http_get_as(addr, path, Some(&token))?;
        Ok(last.0 == 403)
    })
    .with_context(|| format!("the revoked token still reads: {last:?}"))?;
    env.delete_apps(ns)?;
    Ok(())
}

/// While an app scales from 2 to 4 pods (tasks moving as their new pods catch up), every
/// answer from every pod is the right count or a 503 with Retry-After; afterwards all answer.
#[test]
fn during_a_scale_out_answers_are_right_or_a_retry_after() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let token = space.query_token("reader", true)?;
    let (input, output) = (space.topic("iqs-in", 8)?, space.topic("iqs-out", 8)?);
    env.apply(ns, &app_yaml("iqs", 2, &input, &output)?)?;
    wait_running(env, ns, "iqs", 2)?;
    produce_rounds(&input, 2)?;
    wait_output(env, &output, 2)?;

    env.kubectl(&["-n", ns, "scale", "ssapp", "iqs", "--replicas=4"], None)?;
    let (mut right, mut retries) = (0usize, 0usize);
    let settled = || wait_running(env, ns, "iqs", 4).is_ok();
    let deadline = std::time::Instant::now() + WAIT;
    let mut done = false;
    while !done {
        ensure!(
            std::time::Instant::now() < deadline,
            "the scale-out never settled\n{}",
            env.logs()
        );
        // Settled after this round of questions: one more round, then stop.
        done = query_addresses(env, ns, "iqs").len() == 4
            && env.get(ns, "ssapp/iqs", "{.status.phase}") == "Running"
            && settled();
        for addr in query_addresses(env, ns, "iqs").values() {
            for k in (0..KEYS).step_by(7) {
                let key = format!("k{k}");
                // A pod that is starting may not listen yet: a client would retry.
                let Ok(answer) = ask(&token, addr, &key, "") else {
                    continue;
                };
                match answer {
                    Ok(a) => {
                        ensure!(
                            a.found && a.value == 2,
                            "a wrong answer during the scale-out: {a:?}"
                        );
                        right += 1;
                    }
                    Err((503, true, _)) => retries += 1,
                    Err(other) => anyhow::bail!("{key} at {addr}: {other:?}"),
                }
            }
        }
    }
    // Settled: every pod answers every key.
    for addr in query_addresses(env, ns, "iqs").values() {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let mut last = None;
            wait_until(Duration::from_secs(30), || {
                last = Some(ask(&token, addr, &key, "")?);
                Ok(matches!(&last, Some(Ok(a)) if a.value == 2))
            })
            .with_context(|| format!("{key} at {addr} after the scale-out: {last:?}"))?;
        }
    }
    eprintln!("during the scale-out: {right} right answers, {retries} retry-afters");
    ensure!(right > 0, "nothing was answered during the scale-out");
    env.delete_apps(ns)?;
    Ok(())
}

/// The worker holding a key's active copy frozen (SIGSTOP, as a hung node would be): the
/// pod holding its standby answers with the standby when the request accepts a lag (saying
/// so, with the position it reflects), and asks for a retry when it does not.
#[test]
fn a_standby_answers_within_a_lag_bound_when_the_active_is_gone() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let token = space.query_token("reader", true)?;
    let (input, output) = (space.topic("iqf-in", 2)?, space.topic("iqf-out", 2)?);
    env.apply(ns, &app_yaml("iqf", 2, &input, &output)?)?;
    wait_running(env, ns, "iqf", 2)?;
    produce_rounds(&input, 4)?;
    wait_output(env, &output, 4)?;
    let pods = query_addresses(env, ns, "iqf");
    let any = pods.values().next().context("a pod")?;
    let mut first = None;
    wait_until(Duration::from_secs(30), || {
        first = Some(ask(&token, any, "k1", "")?);
        Ok(matches!(&first, Some(Ok(a)) if a.value == 4))
    })?;
    let Some(Ok(first)) = first else {
        anyhow::bail!("k1 was never answered");
    };
    let active = first.answered_by.pod.clone();
    let (standby, standby_addr) = pods
        .iter()
        .find(|(p, _)| **p != active)
        .context("the other pod")?;
    // The standby has caught up once its reported lag is 0.
    wait_until(WAIT, || {
        let v = env.app_json(ns, "iqf")?;
        Ok(v["status"]["workers"][standby]["tasks"][&first.answered_by.task]["lag"] == 0)
    })?;

    let pid = env.worker_pid(ns, &active)?;
    // SAFETY: a signal to a process this test's pod runner started.
    ensure!(
        unsafe { libc::kill(pid, libc::SIGSTOP) } == 0,
        "SIGSTOP {pid}"
    );
    let result = (|| -> Result<()> {
        // kill() returns before the stop: one thread takes the signal and stops the others
        // when it is scheduled, and on a busy machine the rest answer a request meanwhile.
        wait_until(Duration::from_secs(10), || {
            eddy_e2e::operated::all_threads_stopped(pid)
        })
        .with_context(|| format!("{active} (pid {pid}) did not stop"))?;
        let a = ask(&token, standby_addr, "k1", "?maxLag=100")?
            .map_err(|e| anyhow::anyhow!("the standby did not answer: {e:?}"))?;
        ensure!(
            a.value == 4
                && a.answered_by.pod == *standby
                && a.answered_by.role == TaskRole::Standby
                && a.answered_by.lag == Some(0)
                && a.answered_by.position.as_ref().map(|p| p.offset)
                    >= first.answered_by.position.as_ref().map(|p| p.offset),
            "the standby's answer: {a:?} (the active's: {first:?})"
        );
        // Only the active may answer: it does not (frozen), so the caller is told to retry.
        match ask(&token, standby_addr, "k1", "")? {
            Err((503, true, body)) => ensure!(body.contains(&active), "{body}"),
            other => anyhow::bail!("without maxLag: {other:?}"),
        }
        Ok(())
    })();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    result?;
    env.delete_apps(ns)?;
    Ok(())
}

/// An in-memory store (`inMemory: true`) answers as one on disk: every key from either pod
/// by its active copy, and by the pod's own standby copy when the request accepts one.
#[test]
fn an_in_memory_store_answers_from_its_active_and_its_standby() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let token = space.query_token("reader", true)?;
    let (input, output) = (space.topic("iqm-in", 2)?, space.topic("iqm-out", 2)?);
    let yaml = app_yaml("iqm", 2, &input, &output)?.replace(
        "count: {store: counts}",
        "count: {store: counts, inMemory: true}",
    );
    ensure!(yaml.contains("inMemory: true"), "{yaml}");
    env.apply(ns, &yaml)?;
    wait_running(env, ns, "iqm", 2)?;
    produce_rounds(&input, 2)?;
    wait_output(env, &output, 2)?;
    let pods = query_addresses(env, ns, "iqm");
    ensure!(pods.len() == 2, "two pods answer: {pods:?}");
    let mut standby_answers: HashMap<&str, usize> = HashMap::new();
    for (pod, addr) in &pods {
        for k in (0..KEYS).step_by(5) {
            let key = format!("k{k}");
            for (extra, role) in [("", TaskRole::Active), ("?maxLag=any", TaskRole::Standby)] {
                let mut last = None;
                wait_until(Duration::from_secs(30), || {
                    last = Some(ask(&token, addr, &key, extra)?);
                    Ok(matches!(&last, Some(Ok(a)) if a.value == 2))
                })
                .with_context(|| format!("{pod} asked for {key}{extra}: {last:?}"))?;
                let Some(Ok(a)) = last else { continue };
                let by = &a.answered_by;
                ensure!(
                    a.found && by.position.is_some(),
                    "{pod}, {key}{extra}: {a:?}"
                );
                // With maxLag, the pod's own copy answers: its standby for the other's keys.
                if role == TaskRole::Standby && by.role == TaskRole::Standby {
                    ensure!(by.pod == *pod, "{pod}, {key}{extra}: {a:?}");
                    *standby_answers.entry(pod).or_default() += 1;
                } else {
                    ensure!(by.role == TaskRole::Active, "{pod}, {key}{extra}: {a:?}");
                }
            }
        }
    }
    ensure!(
        standby_answers.len() == 2,
        "each pod's standby copy answered some keys: {standby_answers:?}"
    );
    env.delete_apps(ns)?;
    Ok(())
}

/// `spec.queries.enabled: false` on a running app: its query Service goes, and its rolled
/// pods have no query port (nor report where to send a query).
#[test]
fn queries_switched_off_remove_the_service_and_the_api() -> Result<()> {
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let (input, output) = (space.topic("iqo-in", 2)?, space.topic("iqo-out", 2)?);
    let on = app_yaml("iqo", 1, &input, &output)?;
    env.apply(ns, &on)?;
    wait_running(env, ns, "iqo", 1)?;
    for what in ["service", "networkpolicy"] {
        ensure!(
            env.get(ns, &format!("{what}/iqo-query"), "{.metadata.name}") == "iqo-query",
            "no query {what} while queries are on"
        );
    }
    let off = on.replace(
        "  queries: {from: [{podSelector: {matchLabels: {role: web}}}]}",
        "  queries: {enabled: false}",
    );
    ensure!(off != on, "the app file has no queries line to switch off");
    env.apply(ns, &off)?;
    wait_until(WAIT, || {
        let v = env.app_json(ns, "iqo")?;
        let reports_address = v["status"]["workers"]["iqo-0"]["queryAddress"].is_string();
        let gone = ["service", "networkpolicy"].iter().all(|what| {
            env.get(ns, &format!("{what}/iqo-query"), "{.metadata.name}")
                .is_empty()
        });
        // The rolled pod has no query port (the runner gives one to EDDY_QUERY_ADDR only).
        let port = query_addresses(env, ns, "iqo");
        Ok(gone && !reports_address && port.is_empty())
    })
    .with_context(|| format!("queries did not go\n{}", env.logs()))?;
    env.delete_apps(ns)?;
    Ok(())
}

/// A flood of connections that send their request heads a byte at a time, more than a
/// worker's query server keeps open, for twice its header timeout: the worker's status
/// reports keep arriving (its heartbeat, every 5 s), it is not failed over, and once the
/// flood stops it answers again.
#[test]
fn a_flood_of_slow_connections_neither_silences_the_worker_nor_stops_its_answers() -> Result<()> {
    use std::io::Write as _;
    use std::net::TcpStream;
    let env = env()?;
    let space = Namespace::new(env, &[])?;
    let ns = space.name.as_str();
    let token = space.query_token("reader", true)?;
    let app = "iqflood";
    let (input, output) = (space.topic("iqf-in", 2)?, space.topic("iqf-out", 2)?);
    env.apply(ns, &app_yaml(app, 2, &input, &output)?)?;
    wait_running(env, ns, app, 2)?;
    produce_rounds(&input, 1)?;
    wait_output(env, &output, 1)?;
    let pods = query_addresses(env, ns, app);
    let (pod, addr) = pods.iter().next().context("a pod")?;
    let generation = env.app_json(ns, app)?["status"]["assignment"]["generation"].as_i64();

    const FLOOD: usize = 600;
    let head = b"GET /stores/counts/keys/k1 HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let connect = || -> Result<TcpStream> {
        let c = TcpStream::connect(addr)?;
        c.set_nonblocking(true)?;
        Ok(c)
    };
    let mut flood = (0..FLOOD).map(|_| connect()).collect::<Result<Vec<_>>>()?;
    let mut reports = std::collections::BTreeSet::new();
    let (started, mut byte, mut cut) = (std::time::Instant::now(), 0, 0);
    while started.elapsed() < Duration::from_secs(22) {
        // One more byte on each; a connection the server closed is opened again.
        for c in flood.iter_mut() {
            if c.write(&head[byte % head.len()..][..1]).is_err() {
                cut += 1;
                *c = connect()?;
            }
        }
        byte += 1;
        let v = env.app_json(ns, app)?;
        if let Some(u) = v["status"]["workers"][pod.as_str()]["updated"].as_str() {
            reports.insert(u.to_string());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        reports.len() >= 3,
        "{pod} reported {} times in 22 s of the flood: {reports:?}",
        reports.len()
    );
    ensure!(
        cut > 0,
        "the server cut off none of {FLOOD} slow connections"
    );
    let after = env.app_json(ns, app)?;
    ensure!(
        after["status"]["assignment"]["generation"].as_i64() == generation,
        "the assignment changed during the flood: {}",
        after["status"]["assignment"]
    );
    drop(flood);
    let mut last = None;
    wait_until(Duration::from_secs(30), || {
        last = Some(ask(&token, addr, "k1", "")?);
        Ok(matches!(&last, Some(Ok(a)) if a.value == 1))
    })
    .with_context(|| format!("{pod} after the flood: {last:?}"))?;
    Ok(())
}

//! `query-bench`: interactive queries under load, on a real local control plane (operator,
//! pod runner) and broker (`bench/queries.sh`, docs/benchmarks.md "Interactive queries").
//!
//! 1. Latency: an app of 2 worker pods counts `--keys` keys while `--input-rate` records a
//!    second flow in; single-key gets are sent at `--rate` a second (open loop: each is sent
//!    when due whatever the earlier ones do, so a stall delays every answer it holds up) for
//!    `--seconds`, first each to the pod holding the key's active copy (local), then each to
//!    the other pod (forwarded). p50, p99, max, the answers that were not 200, and the CPU
//!    each get cost the workers (their CPU over the phase, less what a phase as long without
//!    gets cost them) and the client.
//! 2. Processing throughput: identical apps each catch up a backlog of `--backlog` records,
//!    in `--pairs` pairs (without gets, then while gets arrive at `--rate` a second, so drift
//!    of the machine over the run hits both sides); the ratio of each pair's rates, and their
//!    median.

use anyhow::{Context, Result, ensure};
use clap::Parser;
use eddy_e2e::operated::{Namespace, Operated, WAIT};
use eddy_e2e::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "Interactive queries' latency and their cost to processing (see docs/benchmarks.md)"
)]
struct Args {
    /// Single-key gets a second.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// Seconds each latency phase lasts.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Distinct keys of the app's store.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Input records a second while latency is measured.
    #[arg(long, default_value_t = 2000)]
    input_rate: u64,
    /// Records each throughput app catches up.
    #[arg(long, default_value_t = 10_000_000)]
    backlog: usize,
    /// Catch-ups without and with gets, alternating.
    #[arg(long, default_value_t = 2)]
    pairs: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

const PARTITIONS: i32 = 4;

/// The benchmark's app; `anonymous`: its queries need no token.
fn app_yaml(bs: &str, name: &str, input: &str, output: &str, anonymous: bool) -> String {
    let queries = match anonymous {
        true => "\n  queries: {anonymous: true}",
        false => "",
    };
    format!(
        r#"apiVersion: eddy.dev/v1alpha1
kind: StatefulStreamApp
metadata: {{name: {name}}}
spec:
  replicas: 2
  kafka: {{bootstrapServers: "{bs}"}}
  cleanupPolicy: Delete
  commitIntervalMs: 1000{queries}
  topology:
    - from: {{topic: {input}}}
    - count: {{store: counts}}
    - to: {{topic: {output}, value: i64}}
"#
    )
}

/// The query address of each pod of `app`.
fn addresses(env: &Operated, ns: &str, app: &str) -> HashMap<String, String> {
    (0..2)
        .map(|i| format!("{app}-{i}"))
        .filter_map(|pod| {
            let a = env.get(
                ns,
                &format!("pod/{pod}"),
                "{.metadata.annotations.e2e\\.eddy\\.dev/query-addr}",
            );
            (!a.is_empty()).then_some((pod, a))
        })
        .collect()
}

/// Every pod reports its tasks RUNNING and a query address.
fn running(env: &Operated, ns: &str, app: &str) -> Result<bool> {
    let v = env.app_json(ns, app)?;
    let s: eddy_crds::resource::AppStatus =
        serde_json::from_value(v["status"].clone()).unwrap_or_default();
    let Some(a) = &s.assignment else {
        return Ok(false);
    };
    Ok(a.pods.len() == 2
        && a.pods.iter().all(|(pod, t)| {
            !t.active.is_empty()
                && s.workers.get(pod).is_some_and(|w| {
                    w.applied_generation == a.generation
                        && w.query_address.is_some()
                        && t.active
                            .iter()
                            .all(|id| w.tasks.get(id).is_some_and(|t| t.state.name() == "RUNNING"))
                })
        })
        && addresses(env, ns, app).len() == 2)
}

/// Latencies of one phase, in µs, and how many answers were not 200.
#[derive(Default)]
struct Phase {
    latencies: Vec<u64>,
    /// (ms since the phase started, µs taken) of each get, to find stalls.
    timeline: Vec<(u64, u64)>,
    /// Pauses of the machine itself: (ms since the phase started, ms) a thread asleep for
    /// 1 ms overslept by more than [`STALL_MS`].
    stalls: Vec<(u64, u64)>,
    /// CPU time the host ran something else while this VM's cores wanted it, in ms summed
    /// over the cores (`steal` in /proc/stat): a stall with steal is the host's, one without
    /// is this machine's own cores being busy.
    steal_ms: Option<u64>,
    failed: usize,
    first_failure: Option<String>,
    elapsed: f64,
}

impl Phase {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.latencies.clone();
        v.sort_unstable();
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i] as f64 / 1000.0
    }
    /// The machine's pauses: how many, and the longest (ms).
    fn stalled(&self) -> (usize, u64) {
        let longest = self.stalls.iter().map(|s| s.1).max().unwrap_or(0);
        (self.stalls.len(), longest)
    }

    fn json(&self) -> serde_json::Value {
        let (stalls, longest) = self.stalled();
        serde_json::json!({
            "machine_stalls": stalls, "longest_machine_stall_ms": longest,
            "host_steal_ms": self.steal_ms,
            "requests": self.latencies.len() + self.failed,
            "failed": self.failed,
            "per_second": (self.latencies.len() + self.failed) as f64 / self.elapsed,
            "p50_ms": self.pct(0.5), "p99_ms": self.pct(0.99), "max_ms": self.pct(1.0),
        })
    }
}

/// A pause longer than this of a thread that asked to sleep 1 ms counts as a stall of the
/// machine (the VM descheduled, the host busy): every process on it waits as long, and gets
/// sent before it are answered after it.
const STALL_MS: u64 = 10;

/// The host's steal time so far, in ms summed over the cores, if /proc/stat says.
fn steal_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // cpu user nice system idle iowait irq softirq steal ... (in USER_HZ, 100 a second)
    let steal: u64 = stat
        .lines()
        .next()?
        .split_whitespace()
        .nth(8)?
        .parse()
        .ok()?;
    Some(steal * 10)
}

/// Record the machine's stalls from `started` until `stop`.
fn watch_stalls(
    started: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let mut stalls = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            let over = t.elapsed().saturating_sub(Duration::from_millis(1));
            if over > Duration::from_millis(STALL_MS) {
                stalls.push(((t - started).as_millis() as u64, over.as_millis() as u64));
            }
        }
        stalls
    })
}

/// `rate` gets a second for `seconds`, each key to the address `target` picks for it.
fn query_load(
    rt: &tokio::runtime::Runtime,
    targets: Vec<(String, String)>,
    rate: u64,
    seconds: u64,
    token: Option<&str>,
) -> Phase {
    let client = eddy_worker::query::client::client();
    let auth: Option<Arc<str>> = token.map(|t| format!("Bearer {t}").into());
    let out = Arc::new(Mutex::new(Phase::default()));
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let watch = watch_stalls(started, stop.clone());
    let steal_before = steal_ms();
    rt.block_on(async {
        let mut tasks = Vec::new();
        let total = rate * seconds;
        for i in 0..total {
            // Open loop: request i is due at i / rate, whatever the earlier ones do.
            let due = started + Duration::from_micros(i * 1_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
            let (addr, key) = &targets[(i as usize * 7919) % targets.len()];
            let url = format!("http://{addr}/stores/counts/keys/{key}");
            let (client, out, auth) = (client.clone(), out.clone(), auth.clone());
            // Timed from the send, not from `due`: the timer wakes up to 1 ms late, and the
            // sender never waits for answers, so a slow server still meets every due request.
            let sent = Instant::now();
            tasks.push(tokio::spawn(async move {
                let headers: Vec<(&str, &str)> = auth
                    .as_deref()
                    .map(|a| ("authorization", a))
                    .into_iter()
                    .collect();
                let r = eddy_worker::query::client::fetch(&client, &url, &headers).await;
                let took = sent.elapsed().as_micros() as u64;
                let mut o = out
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                o.timeline.push(((sent - started).as_millis() as u64, took));
                match r {
                    Ok((code, _, _)) if code.is_success() => o.latencies.push(took),
                    Ok((code, _, body)) => {
                        o.failed += 1;
                        o.first_failure.get_or_insert_with(|| {
                            format!("{code}: {}", String::from_utf8_lossy(&body))
                        });
                    }
                    Err(e) => {
                        o.failed += 1;
                        o.first_failure.get_or_insert(e.to_string());
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let mut phase = std::mem::take(
        &mut *out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    phase.elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    phase.stalls = watch
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    phase.steal_ms = steal_ms()
        .zip(steal_before)
        .map(|(after, before)| after.saturating_sub(before));
    phase
}

/// Sum of a metric over both pods of `app`.
fn pods_sum(env: &Operated, ns: &str, app: &str, metric: &str, filters: &[&str]) -> f64 {
    (0..2)
        .filter_map(|i| env.pod_metrics(ns, &format!("{app}-{i}")).ok())
        .map(|t| sum_metric(&t, metric, filters))
        .sum()
}

/// Records processed by both pods of `app`.
fn processed(env: &Operated, ns: &str, app: &str) -> f64 {
    pods_sum(env, ns, app, "eddy_records_processed_total", &[])
}

/// CPU-seconds both pods' workers have used, and this process.
fn cpu(env: &Operated, ns: &str, app: &str) -> Result<(f64, f64)> {
    let (_, me) = proc_stats(std::process::id())?;
    Ok((pods_sum(env, ns, app, "process_cpu_seconds_total", &[]), me))
}

/// CPU µs per get of a phase, the workers' and the client's, beyond `idle` (their CPU-s a
/// second without gets: the input, and in this process its producer).
fn per_get(p: &Phase, before: (f64, f64), after: (f64, f64), idle: (f64, f64)) -> (f64, f64) {
    let n = (p.latencies.len() + p.failed).max(1) as f64;
    let workers = (after.0 - before.0 - idle.0 * p.elapsed).max(0.0);
    let client = (after.1 - before.1 - idle.1 * p.elapsed).max(0.0);
    (workers / n * 1e6, client / n * 1e6)
}

/// Start `app` on a topic holding `backlog` records and return its processing rate (records a
/// second from its first processed record to its last), with `rate` gets a second to its pods
/// meanwhile if `queries` (from when both pods serve queries, before processing starts).
fn catch_up(
    env: &Operated,
    space: &Namespace,
    app: &str,
    (backlog, keys): (usize, usize),
    rate: u64,
    queries: bool,
    token: &str,
) -> Result<(f64, Option<Phase>)> {
    let ns = space.name.as_str();
    let input = space.topic(&format!("{app}-in"), PARTITIONS)?;
    let output = space.topic(&format!("{app}-out"), PARTITIONS)?;
    let records: Vec<Input> = (0..backlog)
        .map(|i| {
            (
                Some(format!("k{}", i % keys).into_bytes()),
                Some(b"{}".to_vec()),
            )
        })
        .collect();
    produce(&input, &records)?;
    env.apply(ns, &app_yaml(&env.bs, app, &input, &output, false))?;
    let total = backlog as f64;
    let mut load = None;
    let mut first: Option<(Instant, f64)> = None;
    let deadline = Instant::now() + WAIT;
    let done = loop {
        ensure!(
            Instant::now() < deadline,
            "{app} did not catch up\n{}",
            env.logs()
        );
        if queries && load.is_none() {
            let addrs = addresses(env, ns, app);
            // Both workers listening: gets refused before that would cost the pods nothing.
            let listening = addrs
                .values()
                .all(|a| std::net::TcpStream::connect(a).is_ok());
            if addrs.len() == 2 && listening {
                let targets: Vec<(String, String)> = addrs
                    .into_values()
                    .flat_map(|a| {
                        (0..keys)
                            .step_by(13)
                            .map(move |k| (a.clone(), format!("k{k}")))
                    })
                    .collect();
                // Long enough to cover the whole catch-up.
                let token = token.to_string();
                load = Some(std::thread::spawn(move || {
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .enable_all()
                        .build()
                        .map(|rt| query_load(&rt, targets, rate, 40, Some(&token)))
                }));
            }
        }
        let n = processed(env, ns, app);
        let now = Instant::now();
        if n > 0.0 && first.is_none() {
            first = Some((now, n));
        }
        if n >= total {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (t0, n0) = first.context("nothing processed")?;
    let rate = (total - n0) / (done - t0).as_secs_f64();
    // This process (the load generator, the broker's client) shares the machine's cores.
    let (_, cpu) = proc_stats(std::process::id())?;
    eprintln!(
        "query-bench: {app}: {:.1} s from the first processed record to the last; query-bench had used {cpu:.1} CPU-s so far",
        (done - t0).as_secs_f64()
    );
    let phase = match load {
        Some(h) => Some(
            h.join()
                .map_err(|_| anyhow::anyhow!("the query load panicked"))??,
        ),
        None => None,
    };
    env.delete_apps(ns)?;
    Ok((rate, phase))
}

/// The latency phases of one app, and what each get cost.
struct Latency {
    local: Phase,
    forwarded: Phase,
    local_cpu: (f64, f64),
    forwarded_cpu: (f64, f64),
    /// The workers' and this process's CPU-s a second without gets.
    idle: (f64, f64),
    /// Records processed while the latency was measured.
    steady: f64,
}

/// The latency phases while app `app` processes a steady input: gets with `token`, or
/// anonymous (the app then says `queries: {anonymous: true}`).
fn latency(
    env: &Operated,
    space: &Namespace,
    rt: &tokio::runtime::Runtime,
    args: &Args,
    app: &str,
    token: Option<&str>,
) -> Result<Latency> {
    let ns = space.name.as_str();
    let (input, output) = (
        space.topic(&format!("{app}-in"), PARTITIONS)?,
        space.topic(&format!("{app}-out"), PARTITIONS)?,
    );
    env.apply(
        ns,
        &app_yaml(&env.bs, app, &input, &output, token.is_none()),
    )?;
    wait_until(WAIT, || running(env, ns, app)).with_context(|| env.logs())?;
    let records: Vec<Input> = (0..args.keys)
        .map(|i| (Some(format!("k{i}").into_bytes()), Some(b"{}".to_vec())))
        .collect();
    produce(&input, &records)?;
    let addrs = addresses(env, ns, app);
    let any = addrs.values().next().context("a pod")?.clone();
    // Who holds each key's active copy: ask once (committed within the commit interval).
    let client = eddy_worker::query::client::client();
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("authorization", a))
        .into_iter()
        .collect();
    let mut owner: HashMap<String, String> = HashMap::new();
    wait_until(WAIT, || {
        for k in (0..args.keys).step_by(10) {
            let key = format!("k{k}");
            if owner.contains_key(&key) {
                continue;
            }
            let url = format!("http://{any}/stores/counts/keys/{key}");
            let (code, _, body) = rt
                .block_on(eddy_worker::query::client::fetch(&client, &url, &headers))
                .map_err(|e| anyhow::anyhow!(e))?;
            if code.is_success() {
                let a: eddy_crds::query::KeyAnswer = serde_json::from_slice(&body)?;
                if a.found {
                    owner.insert(key, a.answered_by.pod);
                }
            }
        }
        Ok(owner.len() == args.keys.div_ceil(10))
    })?;
    let load = Load::start(&input, args.keys, args.input_rate)?;
    let before = processed(env, ns, app);
    // What the workers spend on the input alone, to take from the phases with gets.
    let (c0, t0) = (cpu(env, ns, app)?, Instant::now());
    std::thread::sleep(Duration::from_secs(args.seconds));
    let c = cpu(env, ns, app)?;
    let secs = t0.elapsed().as_secs_f64();
    let idle = ((c.0 - c0.0) / secs, (c.1 - c0.1) / secs);
    let (mut local, mut forwarded) = (Vec::new(), Vec::new());
    for (key, pod) in &owner {
        for (p, addr) in &addrs {
            let t = (addr.clone(), key.clone());
            if p == pod {
                local.push(t)
            } else {
                forwarded.push(t)
            }
        }
    }
    let how = match token {
        Some(_) => "with a token",
        None => "anonymous",
    };
    eprintln!(
        "query-bench: {app}: {} gets/s for {} s to the pod holding each key, {how}",
        args.rate, args.seconds
    );
    let c1 = cpu(env, ns, app)?;
    let local = query_load(rt, local, args.rate, args.seconds, token);
    let c2 = cpu(env, ns, app)?;
    eprintln!(
        "query-bench: {app}: {} gets/s for {} s to the other pod (forwarded), {how}",
        args.rate, args.seconds
    );
    let forwarded = query_load(rt, forwarded, args.rate, args.seconds, token);
    if std::env::var_os("QB_TIMELINE").is_some() {
        for (name, p) in [("local", &local), ("forwarded", &forwarded)] {
            let mut slow: Vec<_> = p.timeline.iter().filter(|(_, us)| *us > 5_000).collect();
            slow.sort();
            eprintln!("query-bench: {name}: gets over 5 ms, (ms into the phase, µs): {slow:?}");
            eprintln!(
                "query-bench: {name}: machine stalls (ms into the phase, ms): {:?}",
                p.stalls
            );
        }
    }
    let c3 = cpu(env, ns, app)?;
    let local_cpu = per_get(&local, c1, c2, idle);
    let forwarded_cpu = per_get(&forwarded, c2, c3, idle);
    let steady = processed(env, ns, app) - before;
    if token.is_some() {
        // The workers' reviews of tokens over the app's life (both pods): how many, how long.
        let sum = |metric: &str, filters: &[&str]| pods_sum(env, ns, app, metric, filters);
        let h = "eddy_query_token_review_duration_seconds";
        let count = sum(&format!("{h}_count"), &[]);
        eprintln!(
            "query-bench: {app}: {count:.0} token reviews ({:.0} allowed), {:.1} ms on average, {:.0} over 16 ms, {:.0} over 64 ms; {:.0} queries refused",
            sum("eddy_query_token_reviews_total", &["allowed"]),
            sum(&format!("{h}_sum"), &[]) / count.max(1.0) * 1e3,
            count - sum(&format!("{h}_bucket"), &["le=\"0.016\""]),
            count - sum(&format!("{h}_bucket"), &["le=\"0.064\""]),
            // + 0.0: an empty sum is -0.0.
            sum("eddy_queries_refused_total", &[]) + 0.0,
        );
    }
    load.stop()?;
    env.kubectl(&["-n", ns, "delete", "ssapp", app, "--wait=true"], None)?;
    Ok(Latency {
        local,
        forwarded,
        local_cpu,
        forwarded_cpu,
        idle,
        steady,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let env = eddy_e2e::operated::shared(1, |_, _| Ok(()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let space = Namespace::new(env, &[])?;

    // 1. Latency, anonymous and with a token (each get's token checked against the cached
    // decision; the first of each token asks the API server).
    let token = space.query_token("bench", true)?;
    let open = latency(env, &space, &rt, &args, "qa", None)?;
    let auth = latency(env, &space, &rt, &args, "qb", Some(&token))?;
    let Latency {
        local,
        forwarded,
        local_cpu,
        forwarded_cpu,
        idle,
        steady,
    } = &auth;

    // 2. Processing throughput with and without the query load.
    eprintln!(
        "query-bench: catching up {} records without queries, then with",
        args.backlog
    );
    let mut pairs: Vec<(f64, f64)> = Vec::new();
    let mut during = None;
    for i in 0..args.pairs.max(1) {
        let size = (args.backlog, args.keys);
        let (quiet, _) = catch_up(
            env,
            &space,
            &format!("tpa{i}"),
            size,
            args.rate,
            false,
            &token,
        )?;
        let (busy, d) = catch_up(
            env,
            &space,
            &format!("tpb{i}"),
            size,
            args.rate,
            true,
            &token,
        )?;
        eprintln!(
            "query-bench: pair {i}: {quiet:.0} records/s without gets, {busy:.0} with: ratio {:.2}",
            busy / quiet
        );
        pairs.push((quiet, busy));
        during = d;
    }
    let mut ratios: Vec<f64> = pairs.iter().map(|(q, b)| b / q).collect();
    ratios.sort_by(f64::total_cmp);
    let median = match ratios.len() {
        n if n % 2 == 1 => ratios[n / 2],
        n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
    };

    let row = |name: &str, p: &Phase, target: f64, cpu: Option<(f64, f64)>| {
        let cpu = cpu.map_or("| | ".into(), |(w, c)| format!("| {w:.0} | {c:.0} "));
        let (stalls, longest) = p.stalled();
        let steal = p.steal_ms.map_or("?".into(), |s| s.to_string());
        format!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.2} | < {target} | {} {cpu}| {stalls} ({longest} ms) | {steal} |",
            (p.latencies.len() + p.failed) as f64 / p.elapsed,
            p.pct(0.5),
            p.pct(0.99),
            p.pct(1.0),
            p.failed
        )
    };
    println!(
        "| gets | requests/s | p50 ms | p99 ms | max ms | p99 target | not 200 | workers' CPU µs/get | client's CPU µs/get | machine stalls > {STALL_MS} ms (longest) | host's steal ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let rows = [
        (
            "local (the pod holding the key), anonymous",
            &open.local,
            2.0,
            open.local_cpu,
        ),
        ("local, with a token", local, 2.0, *local_cpu),
        (
            "forwarded (the other pod), anonymous",
            &open.forwarded,
            10.0,
            open.forwarded_cpu,
        ),
        ("forwarded, with a token", forwarded, 10.0, *forwarded_cpu),
    ];
    for (name, p, target, cpu) in rows {
        println!("{}", row(name, p, target, Some(cpu)));
    }
    if let Some(d) = &during {
        println!(
            "{}",
            row("during the last catch-up (both pods)", d, 10.0, None)
        );
        if let Some(f) = &d.first_failure {
            eprintln!("query-bench: first failed get during the catch-up: {f}");
        }
    }
    for p in [&open.local, &open.forwarded, local, forwarded] {
        if let Some(f) = &p.first_failure {
            eprintln!("query-bench: first failed get: {f}");
        }
    }
    eprintln!(
        "query-bench: {steady:.0} records processed while the latency was measured ({} a second came in)",
        args.input_rate
    );
    println!(
        "| catch-up of {} records | without gets, records/s | with {} gets/s | ratio |",
        args.backlog, args.rate
    );
    println!("|---|---:|---:|---:|");
    for (i, (q, b)) in pairs.iter().enumerate() {
        println!("| pair {} | {q:.0} | {b:.0} | {:.2} |", i + 1, b / q);
    }
    println!("| median | | | **{median:.2}** (target >= 0.90) |");
    if let Some(path) = &args.json {
        let j = serde_json::json!({
            "rate": args.rate, "seconds": args.seconds, "keys": args.keys,
            "input_rate": args.input_rate, "backlog": args.backlog,
            "local": local.json(), "forwarded": forwarded.json(),
            "anonymous": {"local": open.local.json(), "forwarded": open.forwarded.json(),
                "cpu_us_per_get": {"local": {"workers": open.local_cpu.0, "client": open.local_cpu.1},
                    "forwarded": {"workers": open.forwarded_cpu.0, "client": open.forwarded_cpu.1}}},
            "cpu_us_per_get": {"local": {"workers": local_cpu.0, "client": local_cpu.1},
                "forwarded": {"workers": forwarded_cpu.0, "client": forwarded_cpu.1},
                "without_gets_cpu_per_second": {"workers": idle.0, "client": idle.1}},
            "during_catch_up": during.as_ref().map(Phase::json),
            "catch_up_records_per_second": pairs.iter()
                .map(|(q, b)| serde_json::json!({"without_queries": q, "with_queries": b, "ratio": b / q}))
                .collect::<Vec<_>>(),
            "catch_up_ratio_median": median,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    ensure!(!local.latencies.is_empty(), "no get was answered");
    Ok(())
}

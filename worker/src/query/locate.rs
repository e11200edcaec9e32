//! Where a query for one task goes: a pure function of the task, the freshness the caller
//! accepts, this worker's copy and the operator's view of the app, so that every case is
//! tested without a cluster.
//!
//! The active copy answers by default. A caller that accepts a lagging copy (`maxLag`) may be
//! answered by a standby or warm-up whose reported lag is within the bound; this worker's own
//! copy is preferred (no hop), then the active's pod, then the replica with the least lag.
//! A request already forwarded once is answered where it lands or not at all, so two workers
//! with different views of the assignment never bounce it between them.
//!
//! Where another worker is asked is derived from its pod name ([`PeerAddressing::Service`]),
//! not taken from what it reports: anyone who can write the app's status (the workers can)
//! could otherwise send this worker's forwarded queries to a host and path of their choice.

use super::Cluster;
use super::Holder;
use eddy_crds::TaskId;
use eddy_crds::resource::{TaskRole, TaskState, TaskStatus, WorkerStatus};
use std::net::{Ipv4Addr, Ipv6Addr};

/// How a worker finds where another worker of its app answers queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAddressing {
    /// At its pod's name in the app's headless Service, `<pod>.<app>-workers.<namespace>.svc`,
    /// port 9091 ([`eddy_crds::query::pod_query_address`]), for a pod the operator's
    /// assignment names: the default under the operator. A worker's report only says whether
    /// it serves queries at all.
    Service { app: String, namespace: String },
    /// At the address each worker reports, if it is a bare `host:port`: for workers that are
    /// not pods of the app's StatefulSet (the e2e pod runner's local processes). Whoever may
    /// write the app's status then chooses where forwarded queries go.
    Reported,
}

impl PeerAddressing {
    /// Where `pod`, whose report is `w`, answers queries; or why it cannot be asked.
    pub fn address(&self, pod: &str, w: &WorkerStatus) -> Result<String, String> {
        let Some(reported) = &w.query_address else {
            return Err(format!("{pod} reports no query address"));
        };
        match self {
            PeerAddressing::Service { app, namespace } => {
                if !eddy_crds::resource::is_dns_label(pod) {
                    return Err(format!("{pod:?} is not a pod name (a DNS label)"));
                }
                Ok(eddy_crds::query::pod_query_address(app, pod, namespace))
            }
            PeerAddressing::Reported => match check_host_port(reported) {
                Ok(()) => Ok(reported.clone()),
                Err(why) => Err(format!(
                    "{pod} reports the query address {reported:?}, which is not a bare host:port ({why})"
                )),
            },
        }
    }
}

/// `host:port` and nothing else (no user, path, query or fragment): a DNS name, an IPv4
/// address or a bracketed IPv6 address, and a port from 1 to 65535.
fn check_host_port(s: &str) -> Result<(), String> {
    let (host, port) = s.rsplit_once(':').ok_or("no port")?;
    if port.is_empty() || !port.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!("port {port:?}"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("port {port}")),
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("host {host:?}"));
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let labels_ok = name.split('.').all(|l| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    });
    if name.is_empty() || name.len() > 253 || !labels_ok {
        return Err(format!("host {host:?}"));
    }
    Ok(())
}

/// How stale an answer the caller accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// The active copy only (the default).
    Active,
    /// Also a standby or warm-up lacking at most this many changelog records.
    MaxLag(i64),
    /// Any copy, however far behind.
    Any,
}

impl Freshness {
    /// A copy in `role`, lacking `lag` records (None: not known), may answer.
    pub fn accepts(self, role: TaskRole, lag: Option<i64>) -> bool {
        match (self, role) {
            (_, TaskRole::Active) => true,
            (Freshness::Active, _) => false,
            (Freshness::Any, _) => true,
            (Freshness::MaxLag(max), _) => lag.is_some_and(|l| l <= max),
        }
    }
}

/// This worker's copy of the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub role: TaskRole,
    pub lag: Option<i64>,
}

impl LocalCopy {
    /// From the catalog's holder and, for a replica, the state updater's report of it.
    pub fn of(holder: Holder, replica: Option<&TaskStatus>) -> Self {
        match (holder, replica) {
            (Holder::Active, _) => LocalCopy {
                role: TaskRole::Active,
                lag: Some(0),
            },
            (Holder::Replica, Some(r)) => LocalCopy {
                role: r.role,
                lag: r.lag,
            },
            (Holder::Replica, None) => LocalCopy {
                role: TaskRole::Standby,
                lag: None,
            },
        }
    }
}

/// Where to ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This worker's copy answers.
    Local,
    /// Forward to `pod` at `address` (see [`PeerAddressing`]).
    Forward { pod: String, address: String },
    /// No copy can answer now (a restore, a move, a pod down): ask again shortly. Says why.
    Unavailable(String),
}

/// Where the query for `task` goes (`me`: this worker; `cluster`: None when standalone).
pub fn route(
    task: TaskId,
    freshness: Freshness,
    local: Option<LocalCopy>,
    cluster: Option<&Cluster>,
    me: &str,
    forwarded: bool,
) -> Route {
    if let Some(l) = local
        && freshness.accepts(l.role, l.lag)
    {
        return Route::Local;
    }
    let held_here = match local {
        Some(l) => format!(
            "this worker ({me}) holds a {} copy of task {task} lacking {} records, beyond what the request accepts",
            l.role.name().to_ascii_lowercase(),
            l.lag
                .map_or("an unknown number of".to_string(), |n| n.to_string())
        ),
        None => format!("this worker ({me}) holds no running copy of task {task}"),
    };
    if forwarded {
        return Route::Unavailable(format!(
            "{held_here} (the request was forwarded here, and is not forwarded twice)"
        ));
    }
    let Some(cluster) = cluster else {
        return Route::Unavailable(format!("{held_here}: it is restoring or starting"));
    };
    let id = task.to_string();
    let down = &cluster.assignment.down;
    // Where to ask `pod` for its running copy of the task in `role` (or why it cannot be).
    let running = |pod: &str, role: TaskRole| -> Option<Result<String, String>> {
        let w = cluster.workers.get(pod)?;
        let t = w.tasks.get(&id)?;
        (t.role == role && t.state == TaskState::Running).then(|| cluster.peers.address(pod, w))
    };
    let mut why = vec![held_here];
    let active = cluster
        .assignment
        .pods
        .iter()
        .find(|(_, p)| p.active.contains(&id))
        .map(|(pod, _)| pod.clone());
    match &active {
        Some(pod) if pod == me => why.push(format!("task {task} is assigned here, and restoring")),
        Some(pod) if down.contains(pod) => {
            why.push(format!("the pod of its active copy, {pod}, is down"))
        }
        Some(pod) => match running(pod, TaskRole::Active) {
            Some(Ok(address)) => {
                return Route::Forward {
                    pod: pod.clone(),
                    address,
                };
            }
            Some(Err(no_address)) => why.push(format!(
                "its active copy on {pod} cannot be asked: {no_address}"
            )),
            None => why.push(format!(
                "its active copy on {pod} is not running yet (restoring, or being handed over)"
            )),
        },
        None => why.push(format!("no pod is assigned task {task} yet")),
    }
    if freshness == Freshness::Active {
        why.push("a standby copy may answer if the request accepts one (maxLag)".into());
        return Route::Unavailable(why.join("; "));
    }
    let mut replicas: Vec<(i64, String, String)> = cluster
        .assignment
        .pods
        .iter()
        .filter(|(pod, _)| *pod != me && !down.contains(pod))
        .filter_map(|(pod, p)| {
            let role = if p.standby.contains(&id) {
                TaskRole::Standby
            } else if p.warmup.contains(&id) {
                TaskRole::Warmup
            } else {
                return None;
            };
            let w = cluster.workers.get(pod)?;
            let t = w.tasks.get(&id).filter(|t| t.role == role)?;
            let address = cluster.peers.address(pod, w).ok()?;
            freshness
                .accepts(role, t.lag)
                .then(|| (t.lag.unwrap_or(i64::MAX), pod.clone(), address))
        })
        .collect();
    replicas.sort();
    match replicas.into_iter().next() {
        Some((_, pod, address)) => Route::Forward { pod, address },
        None => {
            why.push("no standby within the lag accepted reports a copy".into());
            Route::Unavailable(why.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::{Assignment, PodTasks, WorkerStatus};

    const ME: &str = "app-0";

    fn task() -> TaskId {
        TaskId::new(0, 1)
    }

    fn addr(pod: &str) -> String {
        format!("{pod}.app-workers.ns.svc:9091")
    }

    /// What a pod holds of task 0_1 in the assignment.
    #[derive(Clone, Copy)]
    enum Held {
        Active,
        Standby,
        Warmup,
    }

    /// A pod of the cluster: its place in the assignment, and its report of task 0_1 (role,
    /// state, lag), with or without a query address.
    struct Pod {
        name: &'static str,
        held: Held,
        report: Option<(TaskRole, TaskState, Option<i64>)>,
        address: bool,
    }

    fn running_active(name: &'static str) -> Pod {
        Pod {
            name,
            held: Held::Active,
            report: Some((TaskRole::Active, TaskState::Running, Some(0))),
            address: true,
        }
    }

    fn standby(name: &'static str, lag: Option<i64>) -> Pod {
        Pod {
            name,
            held: Held::Standby,
            report: Some((TaskRole::Standby, TaskState::Running, lag)),
            address: true,
        }
    }

    fn warmup(name: &'static str, lag: Option<i64>) -> Pod {
        Pod {
            name,
            held: Held::Warmup,
            report: Some((TaskRole::Warmup, TaskState::Restoring, lag)),
            address: true,
        }
    }

    fn cluster(pods: &[Pod], down: &[&str]) -> Cluster {
        let id = task().to_string();
        let mut c = Cluster {
            assignment: Assignment {
                generation: 3,
                partitions: vec![4],
                down: down.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            },
            workers: Default::default(),
            peers: PeerAddressing::Service {
                app: "app".into(),
                namespace: "ns".into(),
            },
        };
        // Every pod also holds another task, which must not confuse the routing.
        for p in pods {
            let mut tasks = PodTasks {
                active: vec!["0_3".into()],
                ..Default::default()
            };
            match p.held {
                Held::Active => tasks.active.push(id.clone()),
                Held::Standby => tasks.standby.push(id.clone()),
                Held::Warmup => tasks.warmup.push(id.clone()),
            }
            c.assignment.pods.insert(p.name.into(), tasks);
            let mut w = WorkerStatus {
                applied_generation: 3,
                query_address: p.address.then(|| addr(p.name)),
                ..Default::default()
            };
            if let Some((role, state, lag)) = p.report {
                w.tasks.insert(
                    id.clone(),
                    TaskStatus {
                        role,
                        state,
                        restore_backlog: 0,
                        lag,
                    },
                );
            }
            c.workers.insert(p.name.into(), w);
        }
        c
    }

    fn local(role: TaskRole, lag: Option<i64>) -> Option<LocalCopy> {
        Some(LocalCopy { role, lag })
    }

    fn forward(pod: &str) -> Route {
        Route::Forward {
            pod: pod.into(),
            address: addr(pod),
        }
    }

    /// The message of an Unavailable route; panics on any other.
    fn unavailable(r: Route) -> String {
        match r {
            Route::Unavailable(why) => why,
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    fn assert_says(why: &str, parts: &[&str]) {
        for p in parts {
            assert!(why.contains(p), "{why:?} should say {p:?}");
        }
    }

    const ALL: [Freshness; 4] = [
        Freshness::Active,
        Freshness::MaxLag(0),
        Freshness::MaxLag(1_000),
        Freshness::Any,
    ];

    #[test]
    fn freshness_accepts_an_active_always_and_a_replica_within_its_bound() {
        for f in ALL {
            assert!(f.accepts(TaskRole::Active, Some(0)));
            assert!(f.accepts(TaskRole::Active, None));
        }
        for role in [TaskRole::Standby, TaskRole::Warmup] {
            assert!(!Freshness::Active.accepts(role, Some(0)));
            assert!(Freshness::MaxLag(5).accepts(role, Some(5)));
            assert!(!Freshness::MaxLag(5).accepts(role, Some(6)));
            assert!(
                !Freshness::MaxLag(i64::MAX).accepts(role, None),
                "an unknown lag is within no bound"
            );
            assert!(Freshness::Any.accepts(role, None));
            assert!(Freshness::Any.accepts(role, Some(i64::MAX)));
        }
    }

    #[test]
    fn a_local_copy_is_an_active_or_what_the_updater_reports() {
        let report = TaskStatus {
            role: TaskRole::Warmup,
            state: TaskState::Restoring,
            restore_backlog: 0,
            lag: Some(12),
        };
        assert_eq!(
            LocalCopy::of(Holder::Active, Some(&report)),
            LocalCopy {
                role: TaskRole::Active,
                lag: Some(0)
            }
        );
        assert_eq!(
            LocalCopy::of(Holder::Replica, Some(&report)),
            LocalCopy {
                role: TaskRole::Warmup,
                lag: Some(12)
            }
        );
        assert_eq!(
            LocalCopy::of(Holder::Replica, None),
            LocalCopy {
                role: TaskRole::Standby,
                lag: None
            },
            "a replica not reported yet: a standby of unknown lag"
        );
    }

    #[test]
    fn the_local_active_copy_answers_whatever_the_request_and_the_cluster() {
        let others = cluster(&[running_active("app-1")], &[]);
        for f in ALL {
            for forwarded in [false, true] {
                for c in [None, Some(&others)] {
                    assert_eq!(
                        route(
                            task(),
                            f,
                            local(TaskRole::Active, Some(0)),
                            c,
                            ME,
                            forwarded
                        ),
                        Route::Local,
                        "{f:?}, forwarded {forwarded}, cluster {}",
                        c.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn a_local_standby_does_not_answer_by_default_the_active_pod_does() {
        let c = cluster(&[running_active("app-1"), standby(ME, Some(0))], &[]);
        let here = local(TaskRole::Standby, Some(0));
        assert_eq!(
            route(task(), Freshness::Active, here, Some(&c), ME, false),
            forward("app-1"),
            "even a standby lacking nothing is not the active"
        );
    }

    #[test]
    fn a_local_replica_answers_within_max_lag_and_forwards_beyond_it() {
        let c = cluster(&[running_active("app-1"), standby(ME, Some(7))], &[]);
        for role in [TaskRole::Standby, TaskRole::Warmup] {
            let here = local(role, Some(7));
            for ok in [Freshness::MaxLag(7), Freshness::MaxLag(100), Freshness::Any] {
                assert_eq!(
                    route(task(), ok, here, Some(&c), ME, false),
                    Route::Local,
                    "{role:?} {ok:?}"
                );
            }
            assert_eq!(
                route(task(), Freshness::MaxLag(6), here, Some(&c), ME, false),
                forward("app-1"),
                "{role:?} one record too far behind"
            );
        }
        // A replica whose lag is not known yet answers only a request accepting any copy.
        let unknown = local(TaskRole::Standby, None);
        assert_eq!(
            route(
                task(),
                Freshness::MaxLag(i64::MAX),
                unknown,
                Some(&c),
                ME,
                false
            ),
            forward("app-1")
        );
        assert_eq!(
            route(task(), Freshness::Any, unknown, Some(&c), ME, false),
            Route::Local
        );
    }

    #[test]
    fn a_forwarded_request_is_never_forwarded_again() {
        let c = cluster(&[running_active("app-1"), standby("app-2", Some(0))], &[]);
        for f in ALL {
            let why = unavailable(route(task(), f, None, Some(&c), ME, true));
            assert_says(
                &why,
                &[
                    "this worker (app-0) holds no running copy of task 0_1",
                    "not forwarded twice",
                ],
            );
        }
        let why = unavailable(route(
            task(),
            Freshness::MaxLag(3),
            local(TaskRole::Standby, Some(40)),
            Some(&c),
            ME,
            true,
        ));
        assert_says(
            &why,
            &[
                "standby copy of task 0_1 lacking 40 records",
                "not forwarded twice",
            ],
        );
        let why = unavailable(route(
            task(),
            Freshness::Active,
            local(TaskRole::Warmup, None),
            Some(&c),
            ME,
            true,
        ));
        assert_says(&why, &["warmup copy", "an unknown number of records"]);
    }

    #[test]
    fn standalone_without_a_local_copy_asks_to_retry() {
        for f in ALL {
            let why = unavailable(route(task(), f, None, None, ME, false));
            assert_says(
                &why,
                &["holds no running copy of task 0_1", "restoring or starting"],
            );
        }
        let why = unavailable(route(
            task(),
            Freshness::MaxLag(1),
            local(TaskRole::Standby, Some(2)),
            None,
            ME,
            false,
        ));
        assert_says(
            &why,
            &["lacking 2 records", "beyond what the request accepts"],
        );
    }

    #[test]
    fn the_active_pod_down_sends_a_request_accepting_lag_to_the_least_lagging_replica() {
        let pods = || {
            vec![
                running_active("app-1"),
                standby("app-2", Some(30)),
                warmup("app-3", Some(4)),
                standby("app-4", Some(9)),
            ]
        };
        let c = cluster(&pods(), &["app-1"]);
        let why = unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
        assert_says(
            &why,
            &["the pod of its active copy, app-1, is down", "maxLag"],
        );
        assert_eq!(
            route(task(), Freshness::MaxLag(10), None, Some(&c), ME, false),
            forward("app-3"),
            "a warm-up is a replica too: the least lag wins"
        );
        assert_eq!(
            route(task(), Freshness::Any, None, Some(&c), ME, false),
            forward("app-3")
        );
        let why = unavailable(route(
            task(),
            Freshness::MaxLag(3),
            None,
            Some(&c),
            ME,
            false,
        ));
        assert_says(
            &why,
            &["app-1, is down", "no standby within the lag accepted"],
        );
        // A replica on a pod that is down too is not asked.
        let c = cluster(&pods(), &["app-1", "app-3"]);
        assert_eq!(
            route(task(), Freshness::MaxLag(10), None, Some(&c), ME, false),
            forward("app-4")
        );
        // Equal lags: the first pod by name, so that every worker picks the same.
        let c = cluster(
            &[
                running_active("app-1"),
                standby("app-5", Some(2)),
                standby("app-2", Some(2)),
            ],
            &["app-1"],
        );
        assert_eq!(
            route(task(), Freshness::MaxLag(2), None, Some(&c), ME, false),
            forward("app-2")
        );
    }

    #[test]
    fn a_replica_of_unknown_lag_is_asked_only_by_a_request_accepting_any_copy() {
        let c = cluster(
            &[running_active("app-1"), standby("app-2", None)],
            &["app-1"],
        );
        let why = unavailable(route(
            task(),
            Freshness::MaxLag(i64::MAX),
            None,
            Some(&c),
            ME,
            false,
        ));
        assert_says(&why, &["no standby within the lag accepted"]);
        assert_eq!(
            route(task(), Freshness::Any, None, Some(&c), ME, false),
            forward("app-2")
        );
        // With a known lag beside it, the known one is preferred even under `any`.
        let c = cluster(
            &[
                running_active("app-1"),
                standby("app-2", None),
                standby("app-3", Some(1_000_000)),
            ],
            &["app-1"],
        );
        assert_eq!(
            route(task(), Freshness::Any, None, Some(&c), ME, false),
            forward("app-3")
        );
    }

    #[test]
    fn a_replica_is_asked_only_where_its_report_matches_the_assignment_and_it_answers_queries() {
        let mut no_address = standby("app-2", Some(0));
        no_address.address = false;
        let mut not_reported = standby("app-3", Some(0));
        not_reported.report = None;
        let mut other_role = standby("app-4", Some(0));
        other_role.report = Some((TaskRole::Warmup, TaskState::Running, Some(0)));
        let c = cluster(
            &[
                running_active("app-1"),
                no_address,
                not_reported,
                other_role,
            ],
            &["app-1"],
        );
        let why = unavailable(route(task(), Freshness::Any, None, Some(&c), ME, false));
        assert_says(&why, &["app-1, is down", "no standby"]);
        // This worker's own replica is not forwarded to: it would be local if it answered.
        let c = cluster(&[running_active("app-1"), standby(ME, Some(0))], &["app-1"]);
        unavailable(route(task(), Freshness::Any, None, Some(&c), ME, false));
    }

    #[test]
    fn an_active_that_is_not_running_or_not_reachable_is_not_asked() {
        let restoring = Pod {
            report: Some((TaskRole::Active, TaskState::Restoring, Some(500))),
            ..running_active("app-1")
        };
        let no_address = Pod {
            address: false,
            ..running_active("app-1")
        };
        let not_reported = Pod {
            report: None,
            ..running_active("app-1")
        };
        // The operator moved the task here, the pod still reports its old standby.
        let stale = Pod {
            report: Some((TaskRole::Standby, TaskState::Running, Some(0))),
            ..running_active("app-1")
        };
        for (active, says) in [
            (restoring, "its active copy on app-1 is not running yet"),
            (
                no_address,
                "its active copy on app-1 cannot be asked: app-1 reports no query address",
            ),
            (not_reported, "its active copy on app-1 is not running yet"),
            (stale, "its active copy on app-1 is not running yet"),
        ] {
            let c = cluster(&[active, standby("app-2", Some(3))], &[]);
            let why = unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
            assert_says(
                &why,
                &[
                    says,
                    "a standby copy may answer if the request accepts one (maxLag)",
                ],
            );
            assert_eq!(
                route(task(), Freshness::MaxLag(3), None, Some(&c), ME, false),
                forward("app-2"),
                "a standby within the lag answers instead"
            );
            let why = unavailable(route(
                task(),
                Freshness::MaxLag(2),
                None,
                Some(&c),
                ME,
                false,
            ));
            assert_says(&why, &[says, "no standby within the lag accepted"]);
        }
        // The worker with no report at all is not asked either.
        let mut c = cluster(&[running_active("app-1")], &[]);
        c.workers.clear();
        unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
    }

    #[test]
    fn the_active_assigned_here_without_a_copy_is_restoring() {
        let c = cluster(&[running_active(ME), standby("app-1", Some(0))], &[]);
        let why = unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
        assert_says(
            &why,
            &[
                "holds no running copy of task 0_1",
                "task 0_1 is assigned here, and restoring",
            ],
        );
        assert_eq!(
            route(task(), Freshness::MaxLag(0), None, Some(&c), ME, false),
            forward("app-1"),
            "a request accepting lag is answered by a standby meanwhile"
        );
    }

    #[test]
    fn a_task_no_pod_is_assigned_is_unavailable() {
        let c = cluster(&[], &[]);
        for f in ALL {
            let why = unavailable(route(task(), f, None, Some(&c), ME, false));
            assert_says(&why, &["no pod is assigned task 0_1 yet"]);
        }
        // Only a replica assigned: a request accepting lag goes there.
        let c = cluster(&[standby("app-2", Some(1))], &[]);
        unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
        assert_eq!(
            route(task(), Freshness::MaxLag(1), None, Some(&c), ME, false),
            forward("app-2")
        );
    }

    /// Reports that would send a forwarded query elsewhere: another host, a path, a user, a
    /// fragment that cuts the request's path off, an unbracketed IPv6 address, no port.
    const FORGED: [&str; 8] = [
        "10.0.0.5:8080/admin#",
        "user@app-1.app-workers.ns.svc:9091",
        "app-1.app-workers.ns.svc:9091/x?",
        "app-1.app-workers.ns.svc",
        "::1:9091",
        "app-1.app-workers.ns.svc:0",
        "app-1.app-workers.ns.svc:65536",
        "app_1.app-workers.ns.svc:9091",
    ];

    #[test]
    fn under_the_service_a_peer_is_asked_at_its_pod_name_whatever_it_reports() {
        for forged in FORGED.into_iter().chain(["evil.example:9091"]) {
            let mut c = cluster(&[running_active("app-1"), standby("app-2", Some(0))], &[]);
            for w in c.workers.values_mut() {
                w.query_address = Some(forged.into());
            }
            assert_eq!(
                route(task(), Freshness::Active, None, Some(&c), ME, false),
                forward("app-1"),
                "{forged}"
            );
            if let Some(p) = c.assignment.pods.get_mut("app-1") {
                p.active.clear();
            }
            assert_eq!(
                route(task(), Freshness::Any, None, Some(&c), ME, false),
                forward("app-2"),
                "{forged}"
            );
        }
        // A pod name that is no DNS label (a forged assignment) is never asked.
        let c = cluster(&[running_active("app-1.evil.example:80/#")], &[]);
        assert_says(
            &unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false)),
            &["cannot be asked", "is not a pod name"],
        );
    }

    fn set_address(c: &mut Cluster, address: Option<&str>) {
        if let Some(w) = c.workers.get_mut("app-1") {
            w.query_address = address.map(String::from);
        }
    }

    #[test]
    fn reported_addresses_are_used_only_when_they_are_a_bare_host_and_port() {
        let mut c = cluster(&[running_active("app-1")], &[]);
        c.peers = PeerAddressing::Reported;
        for good in [
            "app-1.app-workers.ns.svc:9091",
            "127.0.0.1:40123",
            "[::1]:9091",
            "localhost.:1",
        ] {
            set_address(&mut c, Some(good));
            assert_eq!(
                route(task(), Freshness::Active, None, Some(&c), ME, false),
                Route::Forward {
                    pod: "app-1".into(),
                    address: good.into()
                },
                "{good}"
            );
        }
        for forged in FORGED {
            set_address(&mut c, Some(forged));
            let why = unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
            assert_says(&why, &["app-1 cannot be asked", "not a bare host:port"]);
        }
        set_address(&mut c, None);
        let why = unavailable(route(task(), Freshness::Active, None, Some(&c), ME, false));
        assert_says(&why, &["app-1 reports no query address"]);
    }
}

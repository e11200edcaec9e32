//! The worker's HTTP endpoints: `/metrics` (OpenMetrics text), `/healthz` (the processing
//! thread is making progress) and `/readyz` (every active task is RUNNING).
//!
//! The server runs on its own thread, so answering proves nothing about the processing
//! thread: `/healthz` checks the heartbeat that thread leaves on every turn of its loops
//! ([`Status::beat`]) and fails once it is older than the liveness timeout, so that
//! Kubernetes restarts a worker that is stuck (an expression outside the budget's reach, a
//! call that never returns) instead of leaving its partitions unprocessed, unnoticed.

use crate::expr::budget;
use crate::metrics::Metrics;
use crate::status::Status;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn router(metrics: Arc<Metrics>, status: Arc<Status>, liveness_timeout: Duration) -> Router {
    let health = status.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let s = health.clone();
                async move {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                    let (code, body) = liveness(&s, liveness_timeout, now);
                    if code != StatusCode::OK {
                        tracing::error!("/healthz: {body}");
                    }
                    (code, body)
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let s = status.clone();
                async move {
                    if s.ready.load(Ordering::Relaxed) {
                        return (StatusCode::OK, "ready".to_string()).into_response();
                    }
                    let why = match s.problem.lock().ok().and_then(|p| p.clone()) {
                        Some(p) => format!("{:?}: {}", p.reason, p.message),
                        None => "tasks are not all running".to_string(),
                    };
                    (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
                }
            }),
        )
}

/// The answer of `/healthz` at `now_ms` (ms since the UNIX epoch): 200 while the processing
/// thread's last heartbeat is at most `timeout` old (or it has not started), else 503 saying
/// for how long it made no progress and what it was doing, as far as known.
pub fn liveness(status: &Status, timeout: Duration, now_ms: u64) -> (StatusCode, String) {
    let beat = status.heartbeat.load(Ordering::Relaxed);
    let idle = Duration::from_millis(now_ms.saturating_sub(beat));
    if beat == 0 || idle <= timeout {
        return (StatusCode::OK, "ok".into());
    }
    let doing = match budget::current::evaluating() {
        Some((expr, running)) => format!(
            "evaluating the jq expression `{}` for {} s",
            crate::format::shorten(&expr, 200),
            running.as_secs()
        ),
        None => "not inside a jq expression (in Kafka, RocksDB or a commit)".into(),
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the processing thread made no progress for {} s (livenessTimeoutMs is {}); it is {doing}",
            idle.as_secs(),
            timeout.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fails_when_the_heartbeat_stops() {
        let status = Status::default();
        let timeout = Duration::from_secs(300);
        let now = 1_700_000_000_000;
        // Not started yet: a worker waiting for its first assignment or for Kafka is alive.
        assert_eq!(liveness(&status, timeout, now).0, StatusCode::OK);
        status.heartbeat.store(now - 299_000, Ordering::Relaxed);
        assert_eq!(
            liveness(&status, timeout, now),
            (StatusCode::OK, "ok".into())
        );
        status.heartbeat.store(now - 301_000, Ordering::Relaxed);
        let (code, body) = liveness(&status, timeout, now);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with(
                "the processing thread made no progress for 301 s (livenessTimeoutMs is 300000)"
            ),
            "{body}"
        );
        assert!(body.contains("not inside a jq expression"), "{body}");
        // A beat makes it healthy again.
        status.beat();
        let now = status.heartbeat.load(Ordering::Relaxed);
        assert_eq!(liveness(&status, timeout, now).0, StatusCode::OK);
    }

    #[test]
    fn healthz_names_the_expression_that_does_not_return() {
        let status = Status::default();
        let now = 1_700_000_000_000;
        status.heartbeat.store(now - 600_000, Ordering::Relaxed);
        let id = budget::register("last(range(1e12))");
        let (started, stop) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let evaluating = std::thread::spawn(move || {
            budget::report_this_thread();
            let _eval = budget::Evaluation::start(Duration::from_secs(3600), id);
            started.0.send(()).expect("send");
            stop.1.recv().expect("recv");
        });
        started.1.recv().expect("started");
        let (code, body) = liveness(&status, Duration::from_secs(300), now);
        stop.0.send(()).expect("send");
        evaluating.join().expect("join");
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("it is evaluating the jq expression `last(range(1e12))` for 0 s"),
            "{body}"
        );
    }
}

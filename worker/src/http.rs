//! The worker's HTTP endpoints: `/metrics` (OpenMetrics text), `/healthz` (the process is
//! alive) and `/readyz` (every active task is RUNNING).

use crate::metrics::Metrics;
use crate::runtime::Status;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub fn router(metrics: Arc<Metrics>, status: Arc<Status>) -> Router {
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
        .route("/healthz", get(|| async { "ok" }))
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

//! The operator's own metrics on `/metrics`: reconciles, failures and their duration.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ResultLabels, Counter>,
    pub duration: Histogram,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("eddy_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciles of StatefulStreamApps, by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile one app",
            duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica is the leader",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            duration,
            leader,
        }
    }
}

impl Metrics {
    pub fn observe(&self, took: Duration, ok: bool) {
        self.duration.observe(took.as_secs_f64());
        let result = if ok { "ok" } else { "error" }.to_string();
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

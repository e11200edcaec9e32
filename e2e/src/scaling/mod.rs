//! The scaling benchmark (`scaling-bench`, run through `bench/scaling.sh`): how long tasks
//! pause when a stateful app scales out, loses a pod or has its pods rolled, for eddy under its
//! operator (local control plane, operator and pod runner) and for Kafka Streams
//! (`bench/kstreams`' reference app as local processes), on the same input. docs/benchmarks.md ("Scaling and failover")
//! says what each figure means.
//!
//! Every case starts an app counting per key (exactly-once, output keyed like the input, so
//! output partition p is task 0_p's), fills its state with `keys` keys, keeps `rate` records a
//! second flowing, and watches each task's committed output ([`measure::OutputWatch`]).
//! - [`measure`]: the load and the output watch, gaps and percentiles;
//! - [`stage`]: one case's topics, load and baseline;
//! - [`eddy`]: eddy's cases (scale-out with and without warm-ups, failover, rolling update);
//! - [`kstreams`]: Kafka Streams' cases (scale-out, failover by SIGKILL and SIGTERM, rolling
//!   bounce);
//! - [`report`]: the results as Markdown, and the Kafka Streams / eddy ratios.

pub mod eddy;
pub mod kstreams;
pub mod measure;
pub mod report;
pub mod stage;

pub use measure::*;

/// What every case is run with.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Keys in the app's state (one record each before the measurement starts).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Input (and output) partitions: the tasks.
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    /// Input records per second, the whole time, keys spread over the key space.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Seconds of steady output measured before each event (the normal gap between commits).
    #[arg(long, default_value_t = 5.0)]
    pub baseline_s: f64,
    /// Seconds measured after the last task moved or resumed.
    #[arg(long, default_value_t = 5.0)]
    pub settle_s: f64,
    /// Longest wait for eddy to balance after a scale-out or come back after a failover.
    #[arg(long, default_value_t = 300)]
    pub balance_wait_s: u64,
    /// Longest wait for Kafka Streams to balance after a scale-out: its warm-ups move at a
    /// probing rebalance, run here every minute (`probing.rebalance.interval.ms`, its
    /// smallest value; Kafka Streams' default is 10 minutes).
    #[arg(long, default_value_t = 300)]
    pub ks_balance_wait_s: u64,
    /// Longest wait for a failed pod's or instance's tasks to process again.
    #[arg(long, default_value_t = 180)]
    pub failover_wait_s: u64,
    /// Longest wait for a rolling update of 3 pods or instances to finish.
    #[arg(long, default_value_t = 600)]
    pub rollout_wait_s: u64,
}

/// The operator's default `warmup.acceptableRecoveryLag`, which Kafka Streams shares.
pub const ACCEPTABLE_LAG: i64 = 10_000;

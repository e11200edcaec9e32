//! Metrics both binaries export besides their own: `<prefix>_build_info{version}` and the
//! standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, ...) under the names every Prometheus client library uses, so the
//! usual dashboards and alerts work. prometheus-client has no process collector, and no crate
//! in the tree reads `/proc`: [`ProcessCollector`] reads it at scrape time (Linux only; other
//! systems export none of these). [`logging`] sets up both binaries' log output, [`report`] how
//! they print an error.

pub mod logging;
pub mod report;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

/// Register `build_info{version}` with value 1 (the registry's prefix goes in front).
pub fn register_build_info(registry: &mut Registry, version: &str) {
    let info = Family::<VersionLabels, Gauge>::default();
    info.get_or_create(&VersionLabels {
        version: version.to_string(),
    })
    .set(1);
    registry.register(
        "build_info",
        "1, labelled with the version of the binary",
        info,
    );
}

/// Register the process metrics on a registry without a prefix (their names are standard).
pub fn register_process_metrics(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector::default()));
}

/// The kernel's clock ticks per second as `/proc` reports them (USER_HZ): 100 on every
/// architecture Kubernetes runs on; Prometheus' Go client assumes the same.
const USER_HZ: f64 = 100.0;

/// Reads the process' CPU time, memory, file descriptors and start time from `/proc` on
/// each scrape.
#[derive(Debug)]
pub struct ProcessCollector {
    /// `/proc` (a test points it elsewhere).
    proc: PathBuf,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self {
            proc: PathBuf::from("/proc"),
        }
    }
}

/// One reading; a value that could not be read is None and is left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<i64>,
    pub virtual_memory_bytes: Option<i64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessCollector {
    /// A collector reading `<proc>/self/...` and `<proc>/stat` instead of `/proc`.
    pub fn with_proc_root(proc: impl Into<PathBuf>) -> Self {
        Self { proc: proc.into() }
    }

    pub fn read(&self) -> ProcessStats {
        let me = self.proc.join("self");
        let text = |p: &Path| std::fs::read_to_string(p).ok();
        let stat = text(&me.join("stat")).and_then(|s| parse_stat(&s));
        let status = text(&me.join("status"));
        let boot = text(&self.proc.join("stat")).and_then(|s| parse_boot_time(&s));
        ProcessStats {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
            resident_memory_bytes: status.as_deref().and_then(|s| status_kib(s, "VmRSS")),
            virtual_memory_bytes: status.as_deref().and_then(|s| status_kib(s, "VmSize")),
            open_fds: std::fs::read_dir(me.join("fd"))
                .ok()
                .map(|d| i64::try_from(d.count()).unwrap_or(i64::MAX)),
            max_fds: text(&me.join("limits")).and_then(|s| parse_max_fds(&s)),
            start_time_seconds: stat
                .zip(boot)
                .map(|(s, boot)| boot as f64 + s.starttime as f64 / USER_HZ),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        if let Some(v) = s.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The fields of `/proc/<pid>/stat` used here, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    pub utime: u64,
    pub stime: u64,
    /// Since boot.
    pub starttime: u64,
}

/// Parse `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so
/// the fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // `rest` starts at field 3 (state): field n is at index n - 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        starttime: field(22)?,
    })
}

/// `btime` (boot time, seconds since the epoch) from `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `kB` line of `/proc/<pid>/status` (e.g. `VmRSS:    1234 kB`), in bytes.
pub fn status_kib(text: &str, key: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// The soft limit of open files from `/proc/<pid>/limits` (None when unlimited).
pub fn parse_max_fds(text: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        // A command name with spaces and a parenthesis.
        let stat = "4242 (eddy (w) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 125 0 0 20 0 \
                    7 0 98765 123456789 2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                utime: 250,
                stime: 125,
                starttime: 98765
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
        let status = "Name:\teddy\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(10_485_760));
        assert_eq!(status_kib(status, "VmSize"), Some(209_715_200));
        assert_eq!(status_kib(status, "VmSwap"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
    }

    #[test]
    fn exports_the_standard_process_metrics_of_this_process() {
        let mut registry = Registry::default();
        register_process_metrics(&mut registry);
        register_build_info(registry.sub_registry_with_prefix("eddy"), "1.2.3");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("eddy_build_info{version=\"1.2.3\"} 1\n"),
            "{text}"
        );
        if !cfg!(target_os = "linux") {
            return;
        }
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(value("process_resident_memory_bytes") > 1e5);
        assert!(value("process_virtual_memory_bytes") > 1e5);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let started = value("process_start_time_seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "started {started}, now {now}"
        );
    }

    #[test]
    fn a_missing_proc_exports_nothing() {
        let c = ProcessCollector::with_proc_root("/nonexistent-proc");
        assert_eq!(c.read(), ProcessStats::default());
    }
}

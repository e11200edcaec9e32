//! What the scaling benchmark (`scaling-bench`, `bench/scaling.sh`) measures from outside an
//! app: when each task's committed output moves, under a steady input.
//!
//! The app counts per key and writes each new count to an output topic with as many partitions
//! as its input, keyed like it, so output partition `p` carries exactly task `0_p`'s results.
//! [`OutputWatch`] reads that topic `read_committed` and stamps every record with the time it
//! became visible: a task's pause is the longest interval between two such arrivals
//! ([`longest_gap`]). That is what a consumer of the app notices, and it counts only work that
//! was processed *and committed*, so both engines are measured alike whatever they do inside.

use crate::{bootstrap, partition_count, send};
use anyhow::{Context as _, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Seconds since `epoch`: every timestamp of one benchmark run is taken against one epoch.
pub fn since(epoch: Instant) -> f64 {
    epoch.elapsed().as_secs_f64()
}

/// The key of record `i` of a load over `keys` keys: `k<n>` with `n` running over the whole key
/// space in a scrambled order (a stride coprime to `keys`), so every partition receives input
/// all the time.
pub fn key(i: u64, keys: u64) -> String {
    let keys = keys.max(1);
    let mut stride = 2_654_435_761 % keys;
    while gcd(stride, keys) != 1 {
        stride += 1;
    }
    format!("k{}", (i % keys) * stride % keys)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn producer(extra: &[(&str, &str)]) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap()?);
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

/// One record (`{}`) for each of `keys` keys, so the app's state holds every key before the
/// measurement starts.
pub fn prepopulate(topic: &str, keys: u64) -> Result<()> {
    let n = partition_count(topic)?;
    let p = producer(&[
        ("linger.ms", "50"),
        ("batch.size", "1000000"),
        ("compression.type", "lz4"),
    ])?;
    for i in 0..keys {
        let k = format!("k{i}");
        let part = eddy_worker::partitioner::partition_for(k.as_bytes(), n);
        send(
            &p,
            BaseRecord::to(topic)
                .key(k.as_bytes())
                .payload(&b"{}"[..])
                .partition(part),
        )?;
    }
    p.flush(Duration::from_secs(300))?;
    Ok(())
}

/// A producer thread writing `rate` records a second (`{}` values, keys from [`key`]) until
/// stopped: the steady input under which pauses are measured.
pub struct Steady {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Steady {
    pub fn start(topic: &str, keys: u64, rate: u64) -> Result<Steady> {
        let n = partition_count(topic)?;
        let p = producer(&[("linger.ms", "5"), ("acks", "all")])?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (flag, count, to) = (stop.clone(), sent.clone(), topic.to_string());
        let thread = std::thread::spawn(move || -> Result<()> {
            let started = Instant::now();
            let mut i: u64 = 0;
            while !flag.load(Ordering::Relaxed) {
                // Never ahead of the rate, and never a burst to catch up after a stall of this
                // thread (the machine is shared): at most 50 ms worth at once.
                let due = started.elapsed().as_millis() as u64 * rate / 1000;
                if i >= due {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                i = i.max(due.saturating_sub(rate / 20));
                let k = key(i, keys);
                let part = eddy_worker::partitioner::partition_for(k.as_bytes(), n);
                send(
                    &p,
                    BaseRecord::to(&to)
                        .key(k.as_bytes())
                        .payload(&b"{}"[..])
                        .partition(part),
                )?;
                i += 1;
                count.fetch_add(1, Ordering::Relaxed);
            }
            p.flush(Duration::from_secs(60))?;
            Ok(())
        });
        Ok(Steady {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Records sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stop and wait until every record is acknowledged.
    pub fn stop(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => bail!("the steady producer thread panicked"),
            None => {}
        }
        Ok(self.sent())
    }
}

impl Drop for Steady {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Records of `topic` the consumer group `group` has not committed yet, summed over the
/// partitions; None while some partition has no committed offset.
pub fn group_lag(group: &str, topic: &str) -> Result<Option<i64>> {
    let n = partition_count(topic)?;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap()?)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition(topic, p);
    }
    // Reading committed offsets does not join the group.
    let committed = c.committed_offsets(tpl, Duration::from_secs(10))?;
    let mut lag = 0;
    for p in 0..n {
        let Some(Offset::Offset(at)) = committed.find_partition(topic, p).map(|e| e.offset())
        else {
            return Ok(None);
        };
        let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        lag += (high - at).max(0);
    }
    Ok(Some(lag))
}

/// Every record's arrival in a topic's committed output, per partition, as seconds since the
/// epoch: a thread reads the topic `read_committed` from its end until stopped.
pub struct OutputWatch {
    arrivals: Arc<Mutex<Vec<Vec<f64>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl OutputWatch {
    pub fn start(topic: &str, epoch: Instant) -> Result<OutputWatch> {
        let n = partition_count(topic)?;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap()?)
            .set("group.id", "eddy-scalebench-watch")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            // Records become visible when their transaction commits; ask often so an
            // arrival is stamped within a few ms of that (the broker answers at once when it
            // has data).
            .set("fetch.wait.max.ms", "20")
            .set("fetch.queue.backoff.ms", "1")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..n {
            tpl.add_partition_offset(topic, p, Offset::End)?;
        }
        c.assign(&tpl)?;
        let arrivals = Arc::new(Mutex::new(vec![Vec::new(); n as usize]));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, flag, name) = (arrivals.clone(), stop.clone(), topic.to_string());
        let thread = std::thread::spawn(move || -> Result<()> {
            while !flag.load(Ordering::Relaxed) {
                match c.poll(Duration::from_millis(50)) {
                    None => {}
                    Some(Ok(m)) => {
                        let t = since(epoch);
                        if let Some(v) = seen
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_mut(m.partition() as usize)
                        {
                            v.push(t);
                        }
                    }
                    Some(Err(e)) if !eddy_worker::fault::is_fatal(&e) => {}
                    Some(Err(e)) => bail!("reading {name}: {e}"),
                }
            }
            Ok(())
        });
        Ok(OutputWatch {
            arrivals,
            stop,
            thread: Some(thread),
        })
    }

    /// Arrival times of partition `p` so far.
    pub fn arrivals(&self, p: i32) -> Vec<f64> {
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(p as usize)
            .cloned()
            .unwrap_or_default()
    }

    /// The first arrival in partition `p` after `t`.
    pub fn first_after(&self, p: i32, t: f64) -> Option<f64> {
        self.arrivals(p).into_iter().find(|a| *a > t)
    }

    pub fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.context("the output watch failed"),
            Some(Err(_)) => bail!("the output watch thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for OutputWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A pause of one task's output: from its last arrival before to its first after.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gap {
    pub start: f64,
    pub end: f64,
    /// False when no record arrived after `start` within the window: `end` is the window's end
    /// and the pause lasts at least this long.
    pub resumed: bool,
}

impl Gap {
    pub fn seconds(&self) -> f64 {
        self.end - self.start
    }
}

/// Every interval between consecutive arrivals (sorted) that overlaps `[from, to]`, in time
/// order. An interval that began before `from` counts from its real start (the arrival before
/// `from`); the last one ends at `to`, not resumed (with no arrival at all it is the whole
/// window).
pub fn gaps(arrivals: &[f64], from: f64, to: f64) -> Vec<Gap> {
    let mut prev = arrivals
        .iter()
        .copied()
        .take_while(|a| *a <= from)
        .last()
        .unwrap_or(from);
    let mut out = Vec::new();
    for &a in arrivals.iter().filter(|a| **a > from && **a <= to) {
        out.push(Gap {
            start: prev,
            end: a,
            resumed: true,
        });
        prev = a;
    }
    out.push(Gap {
        start: prev,
        end: to,
        resumed: false,
    });
    out
}

/// The longest of [`gaps`]: a task's pause within `[from, to]`.
pub fn longest_gap(arrivals: &[f64], from: f64, to: f64) -> Gap {
    longest(gaps(arrivals, from, to)).unwrap_or(Gap {
        start: from,
        end: to,
        resumed: false,
    })
}

/// The longest gap of `gaps` (the first of equals).
pub fn longest(gaps: impl IntoIterator<Item = Gap>) -> Option<Gap> {
    gaps.into_iter()
        .fold(None, |best: Option<Gap>, g| match best {
            Some(b) if b.seconds() >= g.seconds() => Some(b),
            _ => Some(g),
        })
}

/// Nearest-rank percentile (`q` in 0..=1) of `values`; None when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    v.get(rank.min(v.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_overlapping_the_window() {
        let a = [1.0, 1.1, 1.2, 2.0, 2.1, 5.0, 5.1];
        // The pause from 2.1 to 5.0 is the longest within [1.5, 6].
        assert_eq!(
            longest_gap(&a, 1.5, 6.0),
            Gap {
                start: 2.1,
                end: 5.0,
                resumed: true
            }
        );
        // A pause that began before the window counts from its real start.
        assert_eq!(longest_gap(&a, 3.0, 6.0).start, 2.1);
        // Nothing after 5.1 up to 9: still paused at the window's end.
        let open = longest_gap(&a, 3.0, 9.0);
        assert_eq!((open.start, open.end, open.resumed), (5.1, 9.0, false));
        // No arrival at all.
        assert_eq!(longest_gap(&[], 1.0, 2.0).seconds(), 1.0);
        // The pauses that began before 4.0: the longest is 2.1 to 5.0.
        let before = gaps(&a, 1.5, 9.0).into_iter().filter(|g| g.start < 4.0);
        assert_eq!(longest(before).map(|g| g.end), Some(5.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v = [0.3, 0.1, 0.4, 0.2];
        assert_eq!(percentile(&v, 0.99), Some(0.4));
        assert_eq!(percentile(&v, 0.5), Some(0.2));
        assert_eq!(percentile(&[], 0.99), None);
    }

    #[test]
    fn keys_cover_the_key_space() {
        let keys: std::collections::HashSet<String> = (0..1000).map(|i| key(i, 1000)).collect();
        assert_eq!(keys.len(), 1000);
        assert_eq!(key(1000, 1000), key(0, 1000));
    }
}

//! Sliding-window aggregations: `window: {sliding: SIZE, ...}` then `count`, `aggregate` or
//! `reduce` (Kafka Streams' `KStreamSlidingWindowAggregate`). Windows `[start, start + size]`
//! (both ends included) exist only where their set of records changes: each record has a left
//! window ending at it, and a right window starting just after it while later records fall
//! within `size` of it. A record updates every window that holds it and creates the windows
//! its arrival calls for, from what the store holds between `ts - 2 × size` and `ts + 1`.
//!
//! The store's values are the largest record timestamp in the window (8 bytes, big-endian)
//! then the aggregate, as in Kafka Streams' timestamped window stores: where the previous
//! record of the key lies decides which windows a record creates. The prefix stays in the
//! store and changelog; downstream sees the aggregate alone.

use super::{Fold, window_object, windowed_key};
use crate::processor::{Context, KeyValueStore, ProcessError, Processor};
use crate::record::Record;
use crate::window::{self, KeySchema, Window};
use eddy_crds::Format;

pub struct SlidingAggregation {
    pub store: String,
    pub key_format: Format,
    pub size: i64,
    pub grace: i64,
    pub fold: Fold,
    /// Stream time (see [`super::window::WindowedAggregation`]).
    observed: i64,
}

/// A window's aggregate and the largest record timestamp in it.
#[derive(Clone)]
struct Agg {
    max_ts: i64,
    value: Vec<u8>,
}

/// A stored value: the timestamp prefix, then the aggregate.
fn decode(store: &str, v: &[u8]) -> Result<Agg, ProcessError> {
    let (max_ts, value) = window::split_timestamp(v).ok_or_else(|| {
        ProcessError::Fatal(format!(
            "store {store:?} holds a sliding window value without its timestamp"
        ))
    })?;
    Ok(Agg {
        max_ts,
        value: value.to_vec(),
    })
}

impl SlidingAggregation {
    pub fn new(store: String, key_format: Format, size: i64, grace: i64, fold: Fold) -> Self {
        Self {
            store,
            key_format,
            size,
            grace,
            fold,
            observed: i64::MIN,
        }
    }

    fn window(&self, start: i64) -> Window {
        Window {
            start,
            end: start.saturating_add(self.size),
        }
    }

    /// Add the record to the window `start` (whose aggregate so far is `base`, none for a new
    /// window) unless the window has closed.
    fn update(
        &self,
        store: &mut KeyValueStore<'_>,
        key: &[u8],
        start: i64,
        base: Option<Agg>,
        r: &Record,
        close: i64,
    ) -> Result<(), ProcessError> {
        let w = self.window(start);
        if w.end < close {
            return Ok(());
        }
        let max_ts = base
            .as_ref()
            .map_or(r.timestamp, |b| b.max_ts.max(r.timestamp));
        let value = self
            .fold
            .apply(&self.store, base.map(|b| b.value), r, window_object(w))?;
        self.put(store, key, start, &Agg { max_ts, value });
        Ok(())
    }

    fn put(&self, store: &mut KeyValueStore<'_>, key: &[u8], start: i64, agg: &Agg) {
        store.put(
            &window::key(key, start),
            &window::with_timestamp(agg.max_ts, &agg.value),
            agg.max_ts,
        );
        store.observe_window(start);
    }

    /// The windows of `key` starting in `[from, to]`: start and aggregate, by start.
    fn windows(
        &self,
        store: &mut KeyValueStore<'_>,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, Agg)>, ProcessError> {
        let schema = KeySchema::Window { size: self.size };
        store
            .fetch(key, from, to)?
            .into_iter()
            .filter_map(|(k, v)| schema.split(&k).map(|(_, w)| (w.start, v)))
            .map(|(start, v)| Ok((start, decode(&self.store, &v)?)))
            .collect()
    }

    /// A record at `ts >= size`.
    fn process_in_order(
        &self,
        store: &mut KeyValueStore<'_>,
        key: &[u8],
        r: &Record,
        close: i64,
    ) -> Result<(), ProcessError> {
        let ts = r.timestamp;
        let found = self.windows(store, key, (ts - 2 * self.size).max(0), ts + 1)?;
        let mut starts = std::collections::HashSet::new();
        let (mut left_agg, mut right_agg): (Option<Agg>, Option<Agg>) = (None, None);
        let (mut left_exists, mut right_exists) = (false, false);
        let mut previous: Option<i64> = None;
        for (start, agg) in found {
            starts.insert(start);
            let end = start + self.size;
            if end < ts {
                // The window before the record's own: what its left window starts from.
                previous = Some(agg.max_ts);
                left_agg = Some(agg);
            } else if end == ts {
                left_exists = true;
                if agg.max_ts < ts {
                    previous = Some(agg.max_ts);
                }
                self.update(store, key, start, Some(agg), r, close)?;
            } else if start <= ts {
                right_agg = Some(agg.clone());
                self.update(store, key, start, Some(agg), r, close)?;
            } else if start == ts + 1 {
                right_exists = true;
            } else {
                return Err(unexpected(start, ts));
            }
        }
        // The previous record's right window, if this record is the first to fall in it.
        if let Some(p) = previous
            && !starts.contains(&(p + 1))
            && p + 1 + self.size >= ts
        {
            self.update(store, key, p + 1, None, r, close)?;
        }
        if !left_exists {
            // The left window holds the records the window before it does, if the previous
            // record is within reach.
            let base = match (previous, left_agg) {
                (Some(p), Some(agg)) if ts - self.size <= p => Some(Agg {
                    max_ts: ts,
                    value: agg.value,
                }),
                _ => None,
            };
            self.update(store, key, ts - self.size, base, r, close)?;
        }
        if !right_exists && let Some(agg) = right_agg.filter(|a| a.max_ts > ts) {
            // Later records are within reach: the record's right window holds them.
            self.put(store, key, ts + 1, &agg);
        }
        Ok(())
    }

    /// A record at `0 <= ts < size`, whose left window would start before 0: it goes into
    /// the window `[0, size]`, which holds every such record.
    fn process_early(
        &self,
        store: &mut KeyValueStore<'_>,
        key: &[u8],
        r: &Record,
        close: i64,
    ) -> Result<(), ProcessError> {
        let ts = r.timestamp;
        let found = self.windows(store, key, 0, ts + 1)?;
        let mut starts = std::collections::HashSet::new();
        let mut combined: Option<Agg> = None;
        let mut right_agg: Option<Agg> = None;
        let mut right_exists = false;
        let mut previous: Option<i64> = None;
        for (start, agg) in found {
            starts.insert(start);
            if start == 0 {
                if agg.max_ts < ts {
                    previous = Some(agg.max_ts);
                }
                combined = Some(agg);
            } else if start <= ts {
                right_agg = Some(agg.clone());
                self.update(store, key, start, Some(agg), r, close)?;
            } else if start == ts + 1 {
                right_exists = true;
            } else {
                return Err(unexpected(start, ts));
            }
        }
        // With no right window found, the combined window holds only later records (if any
        // is later than this one), which are what this record's right window holds.
        if right_agg.is_none() {
            right_agg = combined.clone().filter(|c| c.max_ts > ts);
        }
        if !right_exists && let Some(agg) = right_agg.filter(|a| a.max_ts > ts) {
            self.put(store, key, ts + 1, &agg);
        }
        if let Some(p) = previous
            && !starts.contains(&(p + 1))
        {
            self.update(store, key, p + 1, None, r, close)?;
        }
        self.update(store, key, 0, combined, r, close)
    }
}

fn unexpected(start: i64, ts: i64) -> ProcessError {
    ProcessError::Fatal(format!(
        "sliding window store holds a window starting at {start}, which a record at {ts} cannot meet: the store was written with other windows"
    ))
}

impl Processor for SlidingAggregation {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = windowed_key(&r, self.key_format, "windows")? else {
            return Ok(());
        };
        let ts = r.timestamp;
        self.observed = self.observed.max(ts);
        let close = self.observed.saturating_sub(self.grace);
        if ts.saturating_add(1).saturating_add(self.size) <= close {
            return Err(ProcessError::Skip(format!(
                "late record: event time {ts} is behind stream time {} by more than the grace period ({} ms), its windows are closed",
                self.observed, self.grace
            )));
        }
        let mut store = ctx.store(&self.store)?;
        if ts < self.size {
            self.process_early(&mut store, &key, &r, close)
        } else {
            self.process_in_order(&mut store, &key, &r, close)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::{Driver, Lcg, count};
    use std::collections::{BTreeMap, BTreeSet};

    /// Kafka Streams' sliding windows of a key's timestamps: a left window `[t - size, t]`
    /// for each record (`[0, size]` for records before `size`), and a right window
    /// `[t + 1, t + 1 + size]` for each record with a later one within `size + 1`; each
    /// counts the records it holds.
    fn model(times: &[i64], size: i64) -> BTreeMap<i64, i64> {
        let mut starts = BTreeSet::new();
        for &t in times {
            starts.insert((t - size).max(0));
            if times.iter().any(|&u| t < u && u <= t + 1 + size) {
                starts.insert(t + 1);
            }
        }
        starts
            .into_iter()
            .map(|s| {
                let n = times.iter().filter(|&&t| s <= t && t <= s + size).count();
                (s, n as i64)
            })
            .collect()
    }

    #[test]
    fn sliding_windows_are_the_same_whatever_the_order_records_arrive_in() {
        let size = 10_000;
        for seed in 1..=6 {
            let mut rng = Lcg(seed);
            let mut input: Vec<(String, i64)> = Vec::new();
            let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for _ in 0..200 {
                let k = format!("u{}", rng.next(3));
                // Some before `size`, which go to the early window [0, size].
                let t = rng.next(120) as i64 * 500;
                input.push((k.clone(), t));
                times.entry(k).or_default().push(t);
            }
            if seed % 2 == 0 {
                rng.shuffle(&mut input);
            } else {
                input.sort_by_key(|(_, t)| *t);
            }
            let mut d = Driver::new(
                "topology:\n- from: {topic: in, key: string, value: json, timestamp: '.t'}\n- window: {sliding: 10s, grace: 1h}\n- count: {store: s}\n- to: {topic: out, value: i64}\n",
                0,
            );
            for (i, (k, t)) in input.iter().enumerate() {
                d.process(k, &format!(r#"{{"t": {t}}}"#), *t);
                if i % 5 == 0 {
                    d.commit();
                }
            }
            d.commit();
            let mut want = BTreeMap::new();
            for (k, ts) in &times {
                for (start, n) in model(ts, size) {
                    want.insert([k.as_bytes(), &start.to_be_bytes()].concat(), n);
                }
            }
            let got: BTreeMap<Vec<u8>, i64> =
                d.table().into_iter().map(|(k, v)| (k, count(&v))).collect();
            let show = |m: &BTreeMap<Vec<u8>, i64>| {
                m.iter()
                    .map(|(k, n)| {
                        let (i, s) = crate::window::split(k).expect("window key");
                        format!("{}@{s}={n}", String::from_utf8_lossy(i))
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(show(&got), show(&want), "seed {seed}");
        }
    }

    #[test]
    fn a_record_later_than_grace_is_dropped() {
        let mut d = Driver::new(
            "topology:\n- from: {topic: in, key: string, value: json, timestamp: '.t'}\n- window: {sliding: 10s, grace: 0s}\n- count: {store: s}\n- to: {topic: out, value: i64}\n",
            0,
        );
        d.process("a", r#"{"t": 100000}"#, 100_000);
        // Its right window [80 001, 90 001] would end before stream time.
        d.process("a", r#"{"t": 80000}"#, 80_000);
        assert_eq!(d.dropped.len(), 1, "{:?}", d.dropped);
        d.commit();
        assert_eq!(d.table().len(), 1);
    }
}

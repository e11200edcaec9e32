//! Session aggregations: `window: {session: GAP, ...}` then `count`, `aggregate` or `reduce`
//! (Kafka Streams' `KStreamSessionWindowAggregate`). A key's records no more than the gap
//! apart make one session; a record that falls between two sessions merges them into one,
//! and each session it replaces is deleted, which goes downstream as a tombstone.

use super::{Fold, window_object, windowed_key};
use crate::processor::{Context, ProcessError, Processor};
use crate::record::Record;
use crate::window::{KeySchema, Window};
use eddy_crds::Format;

pub struct SessionAggregation {
    pub store: String,
    pub key_format: Format,
    pub gap: i64,
    pub grace: i64,
    pub fold: Fold,
    /// The largest timestamp this processor has seen: its stream time (see
    /// [`super::window::WindowedAggregation`]).
    observed: i64,
}

impl SessionAggregation {
    pub fn new(store: String, key_format: Format, gap: i64, grace: i64, fold: Fold) -> Self {
        Self {
            store,
            key_format,
            gap,
            grace,
            fold,
            observed: i64::MIN,
        }
    }
}

impl Processor for SessionAggregation {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = windowed_key(&r, self.key_format, "sessions")? else {
            return Ok(());
        };
        let ts = r.timestamp;
        self.observed = self.observed.max(ts);
        // A session ending before this can no longer change: a record would have to be later
        // than the grace period to reach it.
        let close = self
            .observed
            .saturating_sub(self.grace)
            .saturating_sub(self.gap);
        let mut store = ctx.store(&self.store)?;
        // Sessions ending at ts - gap or later and starting by ts + gap: the record joins them.
        let near: Vec<(Window, Vec<u8>, Vec<u8>)> = store
            .fetch(&key, ts.saturating_sub(self.gap), i64::MAX)?
            .into_iter()
            .filter_map(|(k, v)| {
                let (_, w) = KeySchema::Session.split(&k)?;
                (w.start <= ts.saturating_add(self.gap)).then_some((w, k, v))
            })
            .collect();
        let mut merged = Window { start: ts, end: ts };
        for (w, ..) in &near {
            merged.start = merged.start.min(w.start);
            merged.end = merged.end.max(w.end);
        }
        if merged.end < close {
            return Err(ProcessError::Skip(format!(
                "late record: event time {ts} is behind stream time {} by more than the gap and grace period ({} ms), its session is closed",
                self.observed,
                self.gap + self.grace
            )));
        }
        let window = window_object(merged);
        let mut agg = None;
        for (_, _, v) in &near {
            agg = Some(self.fold.merge(&self.store, agg, v, &r, window.clone())?);
        }
        let agg = self.fold.apply(&self.store, agg, &r, window)?;
        let new_key = KeySchema::Session.key(&key, merged);
        for (w, k, _) in &near {
            if *k != new_key {
                store.delete(k, w.end);
            }
        }
        store.put(&new_key, &agg, merged.end);
        store.observe_window(merged.end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::{Driver, Lcg, count};
    use std::collections::BTreeMap;

    fn app(window: &str, agg: &str, to: &str) -> String {
        format!(
            "topology:\n- from: {{topic: in, key: string, value: json, timestamp: '.t'}}\n- window: {window}\n- {agg}\n- to: {to}\n"
        )
    }

    /// Session windowed key: inner ‖ end ‖ start.
    fn skey(k: &str, start: i64, end: i64) -> Vec<u8> {
        [k.as_bytes(), &end.to_be_bytes(), &start.to_be_bytes()].concat()
    }

    /// Sessions of a key's timestamps: records no more than `gap` apart, with their counts.
    fn model(times: &mut [i64], gap: i64) -> Vec<(i64, i64, i64)> {
        times.sort();
        let mut out: Vec<(i64, i64, i64)> = Vec::new();
        for &t in times.iter() {
            match out.last_mut() {
                Some((_, end, n)) if t - *end <= gap => {
                    *end = t;
                    *n += 1;
                }
                _ => out.push((t, t, 1)),
            }
        }
        out
    }

    #[test]
    fn sessions_are_the_same_whatever_the_order_records_arrive_in() {
        let gap = 10_000;
        for seed in 1..=5 {
            let mut rng = Lcg(seed);
            let mut input: Vec<(String, i64)> = Vec::new();
            let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for _ in 0..300 {
                let k = format!("u{}", rng.next(4));
                let t = rng.next(400) as i64 * 1_000;
                input.push((k.clone(), t));
                times.entry(k).or_default().push(t);
            }
            rng.shuffle(&mut input);
            // Grace covers the whole input: no record is late.
            let mut d = Driver::new(
                &app(
                    "{session: 10s, grace: 1h}",
                    "count: {store: s}",
                    "{topic: out, value: i64}",
                ),
                0,
            );
            for (i, (k, t)) in input.iter().enumerate() {
                d.process(k, &format!(r#"{{"t": {t}}}"#), *t);
                match i % 7 {
                    0 => d.commit(),
                    3 => d.flush(),
                    _ => {}
                }
            }
            d.commit();
            let mut want = BTreeMap::new();
            for (k, ts) in &mut times {
                for (start, end, n) in model(ts, gap) {
                    want.insert(skey(k, start, end), n);
                }
            }
            let got: BTreeMap<Vec<u8>, i64> =
                d.table().into_iter().map(|(k, v)| (k, count(&v))).collect();
            assert_eq!(got, want, "seed {seed}");
            assert!(d.dropped.is_empty(), "{:?}", d.dropped);
        }
    }

    #[test]
    fn a_record_between_two_sessions_merges_them_and_their_keys_get_tombstones() {
        let mut d = Driver::new(
            &app(
                "{session: 10s, grace: 0s}",
                "aggregate: {store: s, initial: '0', add: '$agg + .n', merge: '$agg + $other'}",
                "{topic: out}",
            ),
            0,
        );
        d.process("a", r#"{"t": 0, "n": 1}"#, 0);
        d.process("a", r#"{"t": 20000, "n": 2}"#, 20_000);
        d.commit();
        assert_eq!(d.sent.0.len(), 2, "two sessions");
        d.process("a", r#"{"t": 10000, "n": 4}"#, 10_000);
        d.commit();
        let after: Vec<(Vec<u8>, Option<Vec<u8>>)> = d.sent.0[2..]
            .iter()
            .map(|(_, k, v, _)| (k.clone().expect("key"), v.clone()))
            .collect();
        assert_eq!(after.len(), 3, "{after:?}");
        assert!(after.contains(&(skey("a", 0, 0), None)));
        assert!(after.contains(&(skey("a", 20_000, 20_000), None)));
        assert!(after.contains(&(skey("a", 0, 20_000), Some(b"7".to_vec()))));
        assert_eq!(d.table().len(), 1, "one session left");
        // Stream time 31 s, gap 10 s, no grace: sessions ending before 21 s are closed, so a
        // record that would extend [0 s, 20 s] is late.
        d.process("b", r#"{"t": 31000, "n": 1}"#, 31_000);
        d.process("a", r#"{"t": 5000, "n": 1}"#, 5_000);
        assert!(
            d.dropped.iter().any(|m| m.contains("late record")),
            "{:?}",
            d.dropped
        );
    }

    #[test]
    fn session_keys_are_written_as_kafka_streams_session_serdes_and_json() {
        let mut d = Driver::new(
            &app(
                "{session: 5s, grace: 0s}",
                "count: {store: s}",
                "{topic: out, key: json, value: i64}",
            ),
            0,
        );
        d.process("a", r#"{"t": 1000}"#, 1_000);
        d.process("a", r#"{"t": 3000}"#, 3_000);
        d.commit();
        let (_, k, v, _) = d.sent.0.last().expect("sent");
        assert_eq!(
            k.as_deref(),
            Some(&br#"{"key":"a","start":1000,"end":3000}"#[..])
        );
        assert_eq!(count(v.as_deref().expect("value")), 2);
    }
}

//! `suppress: untilWindowCloses` (Kafka Streams' `Suppressed.untilWindowCloses`): a windowed
//! aggregation's updates wait in a buffer store until the window closes, when stream time
//! passes its end plus the grace (and, for sessions, the gap); only the last value then goes
//! on, once per window. The buffer is a store like any other: cached, changelogged, restored,
//! and always on disk (even after an in-memory aggregation), so the record cache's share of
//! the memory budget bounds what it holds in memory and the rest spills to RocksDB.

use crate::processor::{Context, ProcessError, Processor};
use crate::record::{Data, Record};
use crate::window::{self, KeySchema};

/// Bytes of the window end in front of a buffer key.
const END_LEN: usize = 8;
use eddy_crds::Format;

pub struct Suppress {
    /// The buffer store: key = window end ‖ window store key, value = timestamp ‖ value, so
    /// it is read in the order windows close.
    pub buffer: String,
    pub schema: KeySchema,
    /// Stream time must pass a window's end by this before it is emitted.
    pub close_after_end: i64,
    pub key_format: Format,
    pub value_format: Format,
    /// The largest timestamp seen: stream time.
    observed: i64,
    /// Every buffered window ends at or after this.
    floor: i64,
}

impl Suppress {
    pub fn new(
        buffer: String,
        schema: KeySchema,
        close_after_end: i64,
        key_format: Format,
        value_format: Format,
    ) -> Self {
        Self {
            buffer,
            schema,
            close_after_end,
            key_format,
            value_format,
            observed: i64::MIN,
            floor: 0,
        }
    }
}

impl Processor for Suppress {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let (Some(key), Some(w)) = (&r.key, r.window) else {
            return Err(ProcessError::Fatal(
                "suppress received a record that is not a windowed result".into(),
            ));
        };
        self.observed = self.observed.max(r.timestamp);
        let inner = key.to_bytes(self.key_format).map_err(ProcessError::bad)?;
        let mut bkey = w.end.max(0).to_be_bytes().to_vec();
        bkey.extend_from_slice(&self.schema.key(&inner, w));
        let mut buffer = ctx.store(&self.buffer)?;
        match &r.value {
            // A session merged into another: it never closes, nothing to emit.
            None => buffer.delete(&bkey, r.timestamp),
            Some(v) => {
                let v = v.to_bytes(self.value_format).map_err(ProcessError::bad)?;
                buffer.put(&bkey, &window::with_timestamp(r.timestamp, &v), r.timestamp);
            }
        }
        self.floor = self.floor.min(w.end.max(0));
        // Windows ending at or before `limit` are closed.
        let limit = self.observed.saturating_sub(self.close_after_end);
        if limit < self.floor {
            return Ok(());
        }
        let (from, to) = (
            self.floor.to_be_bytes(),
            limit.saturating_add(1).to_be_bytes(),
        );
        let due = buffer.range(&from, &to)?;
        self.floor = limit.saturating_add(1);
        let mut out = Vec::with_capacity(due.len());
        for (k, v) in due {
            let corrupt = || {
                ProcessError::Fatal(format!(
                    "suppression buffer {:?} holds an entry that is not a buffered window",
                    self.buffer
                ))
            };
            let (inner, w) = self
                .schema
                .split(k.get(END_LEN..).ok_or_else(corrupt)?)
                .ok_or_else(corrupt)?;
            let (ts, value) = window::split_timestamp(&v).ok_or_else(corrupt)?;
            buffer.delete(&k, ts);
            out.push(Record {
                window: Some(w),
                ..Record::new(
                    Some(Data::raw(inner, self.key_format)),
                    Some(Data::raw(value, self.value_format)),
                    ts,
                )
            });
        }
        // Every window in the range was just deleted: RocksDB gets one range tombstone instead
        // of one per window, and a memtable flush then writes none of them to disk.
        buffer.cleared_range(&from, &to);
        for r in out {
            ctx.forward(r);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::{Driver, Lcg, count};
    use std::collections::BTreeMap;

    fn app(window: &str) -> String {
        format!(
            "topology:\n- from: {{topic: in, key: string, value: json, timestamp: '.t'}}\n- window: {window}\n- count: {{store: c}}\n- suppress: untilWindowCloses\n- to: {{topic: out, value: i64}}\n"
        )
    }

    #[test]
    fn each_closed_window_is_emitted_once_with_its_final_count_and_open_ones_not_at_all() {
        for seed in 1..=4 {
            let mut rng = Lcg(seed);
            let mut d = Driver::new(&app("{tumbling: 10s, grace: 5s}"), 0);
            let mut counts: BTreeMap<(String, i64), i64> = BTreeMap::new();
            let mut stream_time = 0;
            for i in 0..400 {
                // Mostly forward, up to 4 s out of order: within the grace.
                let t = (i * 300 + rng.next(4_000) as i64 - 2_000).max(0);
                let k = format!("u{}", rng.next(3));
                d.process(&k, &format!(r#"{{"t": {t}}}"#), t);
                stream_time = stream_time.max(t);
                *counts.entry((k, t / 10_000 * 10_000)).or_default() += 1;
                if i % 9 == 0 {
                    d.commit();
                }
                // Nothing is emitted before its window closes.
                for (_, key, _, _) in &d.sent.0 {
                    let (_, start) =
                        crate::window::split(key.as_deref().expect("key")).expect("windowed");
                    assert!(
                        start + 10_000 + 5_000 <= stream_time,
                        "seed {seed}: window {start} emitted at {stream_time}"
                    );
                }
            }
            d.commit();
            assert!(d.dropped.is_empty(), "{:?}", d.dropped);
            let want: Vec<(Vec<u8>, i64)> = counts
                .into_iter()
                .filter(|((_, start), _)| start + 15_000 <= stream_time)
                .map(|((k, start), n)| ([k.as_bytes(), &start.to_be_bytes()].concat(), n))
                .collect();
            let mut got: Vec<(Vec<u8>, i64)> = d
                .sent
                .0
                .iter()
                .map(|(_, k, v, _)| (k.clone().expect("key"), count(v.as_deref().expect("value"))))
                .collect();
            got.sort();
            assert!(!want.is_empty());
            assert_eq!(
                got, want,
                "seed {seed}: once per closed window, final counts"
            );
        }
    }

    #[test]
    fn a_session_merged_away_is_never_emitted() {
        let mut d = Driver::new(&app("{session: 10s, grace: 5s}"), 0);
        d.process("a", r#"{"t": 0}"#, 0);
        d.process("a", r#"{"t": 14000}"#, 14_000);
        d.commit();
        d.process("a", r#"{"t": 8000}"#, 8_000);
        d.commit();
        assert!(d.sent.0.is_empty(), "nothing closed yet");
        // Stream time 30 s: [0 s, 14 s] closes at 14 s + gap 10 s + grace 5 s.
        d.process("b", r#"{"t": 30000}"#, 30_000);
        d.commit();
        let sent: Vec<_> = d
            .sent
            .0
            .iter()
            .map(|(_, k, v, _)| (k.clone().expect("key"), v.clone().map(|v| count(&v))))
            .collect();
        let key = [&b"a"[..], &14_000i64.to_be_bytes(), &0i64.to_be_bytes()].concat();
        assert_eq!(sent, vec![(key, Some(3))]);
    }
}

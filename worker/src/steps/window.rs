//! Windowed aggregations: `window` followed by `count`, `aggregate` or `reduce` (Kafka Streams'
//! `KStreamWindowAggregate`). Each record updates every window it falls in that is still open;
//! a window closes once stream time passes its end plus the grace period, and a record for a
//! closed window is dropped and counted.
//!
//! Values are stored after the largest record timestamp in the window (8 bytes, big-endian),
//! as in Kafka Streams' timestamped window stores: a window's updates go downstream with that
//! time however the record cache flushed them. Store and changelog keep the prefix;
//! downstream sees the aggregate alone.

use super::{Fold, window_object, windowed_key};
use crate::processor::{Context, ProcessError, Processor};
use crate::record::Record;
use crate::window::{self, TimeWindows};
use eddy_crds::Format;

pub struct WindowedAggregation {
    pub store: String,
    pub key_format: Format,
    pub windows: TimeWindows,
    pub fold: Fold,
    /// The largest timestamp this processor has seen: its stream time. Like Kafka Streams'
    /// processor it starts over when the task starts.
    observed: i64,
}

impl WindowedAggregation {
    pub fn new(store: String, key_format: Format, windows: TimeWindows, fold: Fold) -> Self {
        Self {
            store,
            key_format,
            windows,
            fold,
            observed: i64::MIN,
        }
    }
}

impl Processor for WindowedAggregation {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = windowed_key(&r, self.key_format, "windows")? else {
            return Ok(());
        };
        self.observed = self.observed.max(r.timestamp);
        let close = self.observed.saturating_sub(self.windows.grace);
        let mut store = ctx.store(&self.store)?;
        let mut updated = false;
        for w in self.windows.windows_for(r.timestamp) {
            if w.end <= close {
                continue;
            }
            let k = window::key(&key, w.start);
            let (old_ts, old) = match store.get(&k)? {
                Some(v) => {
                    let (ts, v) = window::split_timestamp(&v).ok_or_else(|| {
                        ProcessError::Fatal(format!(
                            "store {:?} holds a window value without its timestamp",
                            self.store
                        ))
                    })?;
                    (ts, Some(v.to_vec()))
                }
                None => (i64::MIN, None),
            };
            let new = self.fold.apply(&self.store, old, &r, window_object(w))?;
            let ts = old_ts.max(r.timestamp);
            store.put(&k, &window::with_timestamp(ts, &new), ts);
            store.observe_window(w.start);
            updated = true;
        }
        if updated {
            Ok(())
        } else {
            Err(ProcessError::Skip(format!(
                "late record: event time {} is behind stream time {} by more than the grace period ({} ms), its windows are closed",
                r.timestamp, self.observed, self.windows.grace
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::{Driver, count};

    /// Kafka Streams writes a window's update with the largest record time in the window. A
    /// late record updates the window after the cache was flushed and emptied: its output
    /// still carries the earlier, larger time, read back from the store.
    #[test]
    fn a_window_goes_downstream_with_its_largest_record_time_across_commits() {
        let mut d = Driver::new(
            "topology:\n- from: {topic: in, key: string, value: json, timestamp: '.t'}\n- window: {tumbling: 10s, grace: 10s}\n- count: {store: c}\n- to: {topic: out, value: i64}\n",
            0,
        );
        for (t, then) in [
            (5_000, 5_000),
            (3_000, 5_000),
            (8_000, 8_000),
            (1_000, 8_000),
        ] {
            d.process("u", &format!(r#"{{"t": {t}}}"#), t);
            d.commit();
            let (_, _, v, ts) = d.sent.0.last().expect("an update");
            assert_eq!(*ts, then, "after the record at {t}");
            assert!(count(v.as_deref().expect("a count")) > 0);
        }
        assert_eq!(count(d.sent.0[3].2.as_deref().expect("count")), 4);
    }
}

//! Windowed aggregations: `window` followed by `count`, `aggregate` or `reduce` (Kafka Streams'
//! `KStreamWindowAggregate`). Each record updates every window it falls in that is still open;
//! a window closes once stream time passes its end plus the grace period, and a record for a
//! closed window is dropped and counted.

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
            let old = store.get(&k)?;
            let new = self.fold.apply(&self.store, old, &r, window_object(w))?;
            store.put(&k, &new, r.timestamp);
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

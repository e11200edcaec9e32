//! Whether a store's checkpoint can still be trusted against its changelog: the one rule that
//! restore, the state updater (standby and warm-up tasks) and global tables apply when they
//! open a store, before reading its changelog from the checkpoint on.
//!
//! A checkpoint is the changelog offset the store's data reflects, and the time (ms since the
//! epoch) the store was last known to be at its changelog's end. Two things make it
//! untrustworthy:
//!
//! - The changelog no longer covers it: the topic was deleted and created again, or truncated
//!   past it (DeleteRecords, retention on `compact,delete`), or it ends before it.
//! - Its tombstones may be gone. Compaction removes a tombstone once it has been in the
//!   cleaned part of the log for `delete.retention.ms` (24 h by default). Every record after
//!   the checkpoint was written after the store was last caught up (before that, the store
//!   had read everything the changelog held), so none of their tombstones can have been
//!   removed before that time plus `delete.retention.ms`. Past it (a volume kept while scaled
//!   in, a pod down for a day, a copied state directory) the log may hold a key's value from
//!   before the checkpoint in the store but no longer the tombstone after it: replaying from
//!   the checkpoint would bring back deleted rows, merged-away sessions, emitted suppress
//!   entries. The rule keeps a margin below `delete.retention.ms` (the smaller of an hour and
//!   half of it) for clocks that differ between worker and broker, transactions still open at
//!   the end read, and the time between reading a changelog's end and writing the checkpoint.
//!
//! Either way the store is emptied, with its checkpoint, and rebuilt from the changelog's
//! beginning. Reading a compacted log from the beginning gives a consistent state if the read
//! ends within `delete.retention.ms` of its start (Kafka's own promise): a store rebuilt from
//! scratch counts as caught up when its rebuild started.

use crate::metrics::{Metrics, RebuiltLabels};
use crate::store::Checkpoint;

/// Why a store's local state cannot be trusted; its `reason` labels
/// `eddy_stores_rebuilt_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distrust {
    /// The changelog holds `[low, high)` and the checkpoint is outside it.
    NotCovered {
        checkpoint: i64,
        low: i64,
        high: i64,
    },
    /// The store was last at its changelog's end `age_ms` ago, longer than the changelog keeps
    /// tombstones (`retention_ms`, less the margin).
    TombstonesExpired { age_ms: i64, retention_ms: i64 },
}

impl Distrust {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Distrust::NotCovered { .. } => "changelog_truncated",
            Distrust::TombstonesExpired { .. } => "tombstones_expired",
        }
    }
}

impl std::fmt::Display for Distrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Distrust::NotCovered {
                checkpoint,
                low,
                high,
            } => write!(
                f,
                "the changelog no longer covers the checkpoint (offset {checkpoint}; the changelog holds offsets {low} to {high})"
            ),
            Distrust::TombstonesExpired {
                age_ms,
                retention_ms,
            } => write!(
                f,
                "the store was last caught up with its changelog {} ago, longer than the changelog keeps tombstones (delete.retention.ms {}, less a margin of {}): deletes since then may be gone from it",
                human(*age_ms),
                human(*retention_ms),
                human(margin(*retention_ms))
            ),
        }
    }
}

/// Log and count a store about to be emptied and rebuilt: the same line and metric from every
/// reader (`task`: a task id, or `global`; `kept`: what is left alone, for the log).
pub fn rebuilding(
    metrics: &Metrics,
    why: &Distrust,
    task: &str,
    store: &str,
    changelog: &str,
    partition: i32,
    kept: &str,
) {
    tracing::warn!(
        task,
        store,
        changelog,
        partition,
        reason = why.reason(),
        "{why}: wiping this store's local state and rebuilding it from the changelog's beginning ({kept})"
    );
    metrics
        .stores_rebuilt
        .get_or_create(&RebuiltLabels {
            task: task.to_string(),
            store: store.to_string(),
            reason: why.reason().to_string(),
        })
        .inc();
}

/// How much younger than `delete.retention.ms` a checkpoint must be (see the module docs).
pub fn margin(retention_ms: i64) -> i64 {
    (retention_ms / 2).min(3_600_000)
}

/// Whether `checkpoint` can be trusted against a changelog holding offsets `[low, high)` at
/// `now_ms`. `tombstone_retention_ms`: the changelog's `delete.retention.ms` if its
/// `cleanup.policy` includes `compact` (None: nothing removes tombstones, only whole segments).
pub fn check(
    checkpoint: Checkpoint,
    low: i64,
    high: i64,
    tombstone_retention_ms: Option<i64>,
    now_ms: i64,
) -> Option<Distrust> {
    let offset = checkpoint.offset;
    if offset > high || offset < low {
        return Some(Distrust::NotCovered {
            checkpoint: offset,
            low,
            high,
        });
    }
    let retention_ms = tombstone_retention_ms?;
    // Nothing was written after the checkpoint: nothing can be missing.
    if offset >= high {
        return None;
    }
    // No time: only a checkpoint nothing could date (see `TaskDb::open`).
    let age_ms = checkpoint
        .caught_up_at
        .map_or(i64::MAX, |at| now_ms.saturating_sub(at));
    (age_ms > retention_ms - margin(retention_ms)).then_some(Distrust::TombstonesExpired {
        age_ms,
        retention_ms,
    })
}

/// `86400000` as `24h`, `90061000` as `25h1m1s`, under 10 s in ms: for log lines.
fn human(ms: i64) -> String {
    if ms == i64::MAX {
        return "an unknown time".into();
    }
    if ms < 10_000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let parts = [(s / 3600, "h"), (s / 60 % 60, "m"), (s % 60, "s")];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;
    const HOUR: i64 = 3_600_000;
    const NOW: i64 = 1_800_000_000_000;

    fn at(offset: i64, caught_up_at: Option<i64>) -> Checkpoint {
        Checkpoint {
            offset,
            caught_up_at,
        }
    }

    #[test]
    fn a_checkpoint_older_than_the_tombstone_retention_less_the_margin_is_not_trusted() {
        let retention = Some(DAY);
        // 23 h is the most: a day less the hour of margin.
        assert_eq!(
            check(at(10, Some(NOW - 23 * HOUR)), 0, 20, retention, NOW),
            None
        );
        assert_eq!(
            check(at(10, Some(NOW - 23 * HOUR - 1)), 0, 20, retention, NOW),
            Some(Distrust::TombstonesExpired {
                age_ms: 23 * HOUR + 1,
                retention_ms: DAY
            })
        );
        // A short retention keeps half of it as the margin.
        assert_eq!(
            check(at(10, Some(NOW - 2_000)), 0, 20, Some(4_000), NOW),
            None
        );
        assert!(check(at(10, Some(NOW - 2_001)), 0, 20, Some(4_000), NOW).is_some());
        // Undated: too old.
        assert_eq!(
            check(at(10, None), 0, 20, retention, NOW),
            Some(Distrust::TombstonesExpired {
                age_ms: i64::MAX,
                retention_ms: DAY
            })
        );
        // A time ahead of this clock (another machine's) is not an age.
        assert_eq!(check(at(10, Some(NOW + HOUR)), 0, 20, retention, NOW), None);
    }

    #[test]
    fn age_does_not_matter_where_nothing_can_be_missing() {
        let old = Some(NOW - 30 * DAY);
        // Not compacted: tombstones are never removed on their own.
        assert_eq!(check(at(10, old), 0, 20, None, NOW), None);
        // Nothing written after the checkpoint.
        assert_eq!(check(at(20, old), 0, 20, Some(DAY), NOW), None);
    }

    #[test]
    fn a_checkpoint_outside_the_changelog_is_not_covered_whatever_its_age() {
        let fresh = Some(NOW);
        for (c, low, high) in [(25, 0, 20), (3, 5, 20)] {
            let want = Some(Distrust::NotCovered {
                checkpoint: c,
                low,
                high,
            });
            assert_eq!(check(at(c, fresh), low, high, Some(DAY), NOW), want);
            assert_eq!(check(at(c, fresh), low, high, None, NOW), want);
        }
        assert_eq!(
            check(at(5, fresh), 5, 20, None, NOW),
            None,
            "at the first offset"
        );
    }

    #[test]
    fn the_reasons_read_as_they_are_logged() {
        let d = Distrust::TombstonesExpired {
            age_ms: 25 * HOUR + 61_000,
            retention_ms: DAY,
        };
        assert_eq!(d.reason(), "tombstones_expired");
        let text = d.to_string();
        assert!(
            text.contains("25h1m1s ago")
                && text.contains("delete.retention.ms 24h, less a margin of 1h"),
            "{text}"
        );
        assert_eq!(human(1_500), "1500ms");
        assert_eq!(human(60_000), "1m");
        let d = Distrust::NotCovered {
            checkpoint: 3,
            low: 5,
            high: 9,
        };
        assert_eq!(d.reason(), "changelog_truncated");
        assert!(d.to_string().contains("no longer covers"), "{d}");
    }
}

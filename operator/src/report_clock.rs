//! When the operator first saw each worker's current report, on its own monotonic clock:
//! what [`crate::placement::health::assess`] measures a worker's silence by, as client-go's
//! leader election keeps the `observedTime` of a lease record instead of trusting the time
//! written in it. Kept in memory only: after an operator start (or a change of leader) every
//! report counts as seen then, which delays a failover, never hastens it.

use eddy_crds::resource::WorkerStatus;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Per pod: the `updated` of its latest report and when the operator first saw it.
type Seen = HashMap<String, (String, Instant)>;

/// [`Seen`] per app uid.
#[derive(Default)]
pub struct ReportClock {
    seen: Mutex<HashMap<String, Seen>>,
}

impl ReportClock {
    /// Record the reports of app `uid` as seen at `now` where their `updated` is new, and
    /// return, per pod that has a report, the whole seconds since its report was first seen.
    /// Pods without a report any more are forgotten.
    pub fn ages(
        &self,
        uid: &str,
        reports: &BTreeMap<String, WorkerStatus>,
        now: Instant,
    ) -> BTreeMap<String, u64> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let app = seen.entry(uid.to_string()).or_default();
        app.retain(|pod, _| reports.get(pod).is_some_and(|w| w.updated.is_some()));
        reports
            .iter()
            .filter_map(|(pod, w)| {
                let updated = w.updated.as_ref()?;
                let first = match app.get(pod) {
                    Some((u, at)) if u == updated => *at,
                    _ => {
                        app.insert(pod.clone(), (updated.clone(), now));
                        now
                    }
                };
                Some((pod.clone(), now.saturating_duration_since(first).as_secs()))
            })
            .collect()
    }

    /// The app is gone.
    pub fn forget(&self, uid: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reports(list: &[(&str, Option<&str>)]) -> BTreeMap<String, WorkerStatus> {
        list.iter()
            .map(|(pod, updated)| {
                (
                    pod.to_string(),
                    WorkerStatus {
                        updated: updated.map(str::to_string),
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_report_ages_from_when_it_was_first_seen_until_a_new_one_comes() {
        let clock = ReportClock::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Whatever time the report carries, the first sight starts its age.
        let first = reports(&[("a-0", Some("1999-01-01T00:00:00Z")), ("a-1", None)]);
        assert_eq!(
            clock.ages("uid", &first, at(0)),
            BTreeMap::from([("a-0".into(), 0)])
        );
        assert_eq!(clock.ages("uid", &first, at(31))["a-0"], 31);
        // A new report (any other `updated`, even an earlier one) starts again.
        let second = reports(&[("a-0", Some("1998-01-01T00:00:00Z"))]);
        assert_eq!(clock.ages("uid", &second, at(40))["a-0"], 0);
        assert_eq!(clock.ages("uid", &second, at(45))["a-0"], 5);
        // Apps are apart; a forgotten app starts over.
        assert_eq!(clock.ages("other", &second, at(45))["a-0"], 0);
        clock.forget("uid");
        assert_eq!(clock.ages("uid", &second, at(50))["a-0"], 0);
        // A pod whose report went is forgotten: its next report is new.
        assert!(clock.ages("uid", &reports(&[]), at(51)).is_empty());
        assert_eq!(clock.ages("uid", &second, at(60))["a-0"], 0);
        // A clock read earlier than the first sight (another thread's `now`) is age 0.
        assert_eq!(clock.ages("uid", &second, at(59))["a-0"], 0);
    }
}

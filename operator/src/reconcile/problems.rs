//! What keeps an app from running as asked. Each problem has a reason (the `Degraded`
//! condition's `reason`, and its Warning event's) and a message saying what is wrong and what
//! to do. To add a kind of problem: a [`Reason`] here, where it is found (reconcile or the
//! controller), a row in docs/operator.md (conditions) and docs/operations.md (failure modes).

use eddy_crds::resource::{AppStatus, WorkerStatus};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The spec cannot be read or is invalid; the app gets no objects.
    InvalidSpec,
    /// Another, older app holds the application id; this one gets no workers.
    ApplicationIdConflict,
    /// An object this app needs exists and is not this app's; it is left alone.
    NameConflict,
    /// The API server refused an object of the app.
    ApplyFailed,
    /// The operator cannot reach Kafka to plan tasks and topics.
    KafkaUnreachable,
    /// A Secret (or key) named by `spec.kafka.tls` / `spec.kafka.sasl` is missing or unreadable.
    KafkaCredentialsMissing,
    /// A Secret named by `spec.kafka.tls` / `spec.kafka.sasl` is not allowed as this app's
    /// Kafka credential (not labelled for it, or its brokers annotation leaves the app's out).
    KafkaCredentialsNotAllowed,
    /// A worker cannot reach Kafka, or its transactions fail; it retries from its last commit.
    WorkerKafkaUnavailable,
    /// A worker cannot write its state directory (disk full, I/O errors); it retries.
    StateStoreUnavailable,
    /// An at-least-once worker's reports stopped reaching the API server long enough that it
    /// stopped writing (its lease lapsed); it resumes once one gets through.
    WorkerApiServerUnreachable,
    /// A source topic does not exist.
    SourceTopicMissing,
    /// An internal topic has the wrong partition count.
    InternalTopicMismatch,
    /// A table and the stream joining it have different partition counts.
    NotCopartitioned,
    /// A pod restarted by a rolling update is down on the new pod template: the rollout
    /// stopped there ([`crate::rollout`]).
    RolloutHalted,
    /// A spec change would strand records in flight or drop state: held until accepted
    /// ([`super::gate`]).
    ChangeLosesData,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidSpec => "InvalidSpec",
            Reason::ApplicationIdConflict => "ApplicationIdConflict",
            Reason::NameConflict => "NameConflict",
            Reason::ApplyFailed => "ApplyFailed",
            Reason::KafkaUnreachable => "KafkaUnreachable",
            Reason::KafkaCredentialsMissing => "KafkaCredentialsMissing",
            Reason::KafkaCredentialsNotAllowed => "KafkaCredentialsNotAllowed",
            Reason::WorkerKafkaUnavailable => "WorkerKafkaUnavailable",
            Reason::StateStoreUnavailable => "StateStoreUnavailable",
            Reason::WorkerApiServerUnreachable => "WorkerApiServerUnreachable",
            Reason::SourceTopicMissing => "SourceTopicMissing",
            Reason::InternalTopicMismatch => "InternalTopicMismatch",
            Reason::NotCopartitioned => "NotCopartitioned",
            Reason::RolloutHalted => "RolloutHalted",
            Reason::ChangeLosesData => "ChangeLosesData",
        }
    }

    /// Whether the app's owner fixes it (its spec, topics or Secrets), rather than whoever
    /// runs Kafka, the volumes or the API server: the chart's alerts warn for these and page
    /// for the others (`EddyAppMisconfigured` and `EddyAppDegraded` list them; a test
    /// checks the two agree).
    pub fn owner_fixes(self) -> bool {
        !matches!(
            self,
            Reason::KafkaUnreachable
                | Reason::WorkerKafkaUnavailable
                | Reason::StateStoreUnavailable
                | Reason::WorkerApiServerUnreachable
        )
    }

    pub const ALL: [Reason; 15] = [
        Reason::InvalidSpec,
        Reason::ApplicationIdConflict,
        Reason::NameConflict,
        Reason::ApplyFailed,
        Reason::KafkaUnreachable,
        Reason::KafkaCredentialsMissing,
        Reason::KafkaCredentialsNotAllowed,
        Reason::WorkerKafkaUnavailable,
        Reason::StateStoreUnavailable,
        Reason::WorkerApiServerUnreachable,
        Reason::SourceTopicMissing,
        Reason::InternalTopicMismatch,
        Reason::NotCopartitioned,
        Reason::RolloutHalted,
        Reason::ChangeLosesData,
    ];
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub reason: Reason,
    pub message: String,
}

impl Problem {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// What the workers say keeps them from processing (each retries by itself): one problem per
/// worker, naming its pod, in pod order. `reports`: the app's workers' reports, sanitized.
pub fn from_workers(reports: &BTreeMap<String, WorkerStatus>) -> Vec<Problem> {
    use eddy_crds::resource::WorkerProblemReason as W;
    let mut pods: Vec<_> = reports
        .iter()
        .filter_map(|(pod, w)| w.problem.as_ref().map(|p| (pod, p)))
        .collect();
    pods.sort_by(|a, b| a.0.cmp(b.0));
    pods.into_iter()
        .map(|(pod, p)| {
            let reason = match p.reason {
                W::KafkaUnavailable => Reason::WorkerKafkaUnavailable,
                W::StateStoreUnavailable => Reason::StateStoreUnavailable,
                W::ApiServerUnreachable => Reason::WorkerApiServerUnreachable,
            };
            let since = p
                .since
                .as_deref()
                .map(|s| format!(" (since {s}; it retries)"))
                .unwrap_or_else(|| " (it retries)".into());
            Problem::new(reason, format!("worker {pod}: {}{since}", p.message))
        })
        .collect()
}

/// The `Degraded` condition for these problems: the reason of the first one the owner does
/// not fix (so a full volume still pages beside a bad spec edit), else of the first, and
/// every message (each names what it concerns); None when there is none.
pub fn degraded(problems: &[Problem]) -> Option<(&'static str, String)> {
    let first = problems
        .iter()
        .find(|p| !p.reason.owner_fixes())
        .or_else(|| problems.first())?;
    let message = problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Some((first.reason.as_str(), message))
}

/// The problems not already shown by `prev`'s `Degraded` condition: only these become
/// events, so a stuck app does not flood the event stream.
pub fn new_since<'a>(problems: &'a [Problem], prev: &AppStatus) -> Vec<&'a Problem> {
    let shown = prev
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True");
    problems
        .iter()
        .filter(|p| shown.is_none_or(|c| !c.message.contains(&p.message)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::resource::Condition;

    #[test]
    fn the_first_reason_leads_and_every_message_shows() {
        let p = [
            Problem::new(Reason::NameConflict, "ConfigMap pv-app exists"),
            Problem::new(Reason::ApplyFailed, "Service pv-workers: invalid"),
        ];
        assert_eq!(
            degraded(&p),
            Some((
                "NameConflict",
                "ConfigMap pv-app exists; Service pv-workers: invalid".to_string()
            ))
        );
        assert_eq!(degraded(&[]), None);
        let prev = AppStatus {
            conditions: vec![Condition {
                type_: "Degraded".into(),
                status: "True".into(),
                reason: "NameConflict".into(),
                message: "ConfigMap pv-app exists".into(),
                last_transition_time: None,
                observed_generation: None,
            }],
            ..Default::default()
        };
        let new: Vec<Reason> = new_since(&p, &prev).iter().map(|p| p.reason).collect();
        assert_eq!(new, [Reason::ApplyFailed]);
    }
}

#[cfg(test)]
mod alert_tests {
    use super::*;

    /// The chart's alerts split Degraded apps by reason: `EddyAppMisconfigured` lists the
    /// reasons the owner fixes, `EddyAppDegraded` pages for every other one.
    #[test]
    fn the_alerts_list_the_reasons_the_owner_fixes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/eddy-operator/files/alerts.yaml"
        );
        let rules = std::fs::read_to_string(path).expect("alerts.yaml");
        let listed = |alert: &str, op: &str| -> Vec<String> {
            let at = rules.find(&format!("alert: {alert}\n")).expect(alert);
            let key = format!("reason{op}\"");
            let from = at + rules[at..].find(&key).expect("reason matcher") + key.len();
            let to = from + rules[from..].find('"').expect("end");
            let mut v: Vec<String> = rules[from..to].split('|').map(str::to_string).collect();
            v.sort();
            v
        };
        let mut owner: Vec<String> = Reason::ALL
            .iter()
            .filter(|r| r.owner_fixes())
            .map(|r| r.as_str().to_string())
            .collect();
        owner.sort();
        assert_eq!(listed("EddyAppMisconfigured", "=~"), owner);
        assert_eq!(listed("EddyAppDegraded", "!~"), owner);
    }

    #[test]
    fn a_problem_the_owner_does_not_fix_names_the_condition() {
        let problems = [
            Problem::new(Reason::InvalidSpec, "spec.x: bad"),
            Problem::new(Reason::StateStoreUnavailable, "worker a-0: disk full"),
        ];
        let (reason, message) = degraded(&problems).expect("degraded");
        assert_eq!(reason, "StateStoreUnavailable");
        assert_eq!(message, "spec.x: bad; worker a-0: disk full");
        assert_eq!(degraded(&problems[..1]).map(|d| d.0), Some("InvalidSpec"));
    }
}

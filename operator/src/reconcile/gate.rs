//! Spec changes that lose data wait for a person to accept them. The workers run the spec in
//! the app's ConfigMap; a new spec that would strand records in flight in a repartition topic,
//! drop a store's state or change its layout ([`eddy_crds::upgrade`], what `eddy-worker check
//! --previous` says with exit status 3) is held: the operator keeps building the app from the
//! running spec (with the new `replicas`), and the app is `Degraded` with reason
//! `ChangeLosesData` saying what would be lost and how to accept it: the annotation
//! [`ACCEPT`] naming the spec's generation. A change that loses nothing rolls at once.

use eddy_crds::AppSpec;
use eddy_crds::resource::StatefulStreamApp;
use eddy_crds::upgrade::{self, Change, Version};

/// The annotation that accepts the losses of one generation of the spec.
pub const ACCEPT: &str = "eddy.dev/accept-data-loss";

#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Nothing to hold: no running spec known, the same one, or a change that loses nothing.
    Open,
    /// The change loses data and was accepted for this generation.
    Accepted(Vec<Change>),
    /// The change loses data: the app stays at `running`.
    Held {
        changes: Vec<Change>,
        running: Box<AppSpec>,
    },
}

/// What to do with the app's spec, given the spec its workers run.
pub fn check(app: &StatefulStreamApp, running: Option<&AppSpec>) -> Gate {
    let Some(running) = running else {
        return Gate::Open;
    };
    let new = &app.spec;
    let without_replicas = |s: &AppSpec| AppSpec {
        replicas: None,
        ..s.clone()
    };
    if without_replicas(running) == without_replicas(new) {
        return Gate::Open;
    }
    let ns = app.metadata.namespace.as_deref();
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let old_id = eddy_crds::manifest::application_id(ns, name, running.application_id.as_deref());
    let new_id = eddy_crds::manifest::application_id(ns, name, new.application_id.as_deref());
    let changes: Vec<Change> = upgrade::compare(
        Version {
            application_id: &old_id,
            spec: running,
        },
        Version {
            application_id: &new_id,
            spec: new,
        },
    )
    .into_iter()
    .filter(Change::loses_data)
    .collect();
    if changes.is_empty() {
        return Gate::Open;
    }
    let accepted = app
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ACCEPT))
        .zip(app.metadata.generation)
        .is_some_and(|(a, g)| a.trim() == g.to_string());
    if accepted {
        return Gate::Accepted(changes);
    }
    Gate::Held {
        changes,
        running: Box::new(running.clone()),
    }
}

/// The app to build from: as asked, or, while a change is held, [`held_app`].
pub fn effective(app: &StatefulStreamApp, running: Option<&AppSpec>) -> StatefulStreamApp {
    let valid = eddy_crds::manifest::validate(&app.spec, "spec.").is_ok();
    match check(app, running) {
        Gate::Held { running, .. } if valid => held_app(app, &running),
        _ => app.clone(),
    }
}

/// The app as it keeps running while a change is held: the running spec, the new replicas.
pub fn held_app(app: &StatefulStreamApp, running: &AppSpec) -> StatefulStreamApp {
    let mut held = app.clone();
    held.spec = AppSpec {
        replicas: app.spec.replicas,
        ..running.clone()
    };
    held
}

/// The `ChangeLosesData` message: each loss, and how to accept them or avoid them.
pub fn message(app: &StatefulStreamApp, changes: &[Change]) -> String {
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let generation = app.metadata.generation.unwrap_or(0);
    format!(
        "the change to generation {generation} would lose data, so the workers keep running the spec before it: {}. To apply it anyway: kubectl annotate ssapp {name} {ACCEPT}={generation} --overwrite; or change the spec as suggested, or back",
        losses(changes)
    )
}

/// The losses on one line, for a condition or an event: the suggestions `check --previous`
/// indents go inline.
fn losses(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| {
            c.to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `ChangeAccepted` message: a held change applied, and what it loses.
pub fn accepted(app: &StatefulStreamApp, changes: &[Change]) -> String {
    let generation = app.metadata.generation.unwrap_or(0);
    format!(
        "applying generation {generation}, accepted with {ACCEPT}={generation} although it loses data: {}",
        losses(changes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(topology: &str, generation: i64, accept: Option<&str>) -> StatefulStreamApp {
        let yaml = format!(
            "apiVersion: eddy.dev/v1alpha1\nkind: StatefulStreamApp\nmetadata: {{name: pv, namespace: ns}}\nspec:\n  replicas: 2\n  topology:\n{topology}"
        );
        let mut a: StatefulStreamApp = serde_yaml::from_str(&yaml).expect("app");
        a.metadata.generation = Some(generation);
        if let Some(g) = accept {
            a.metadata.annotations = Some([(ACCEPT.to_string(), g.to_string())].into());
        }
        a
    }

    const COUNT: &str =
        "    - from: {topic: views}\n    - count: {store: c}\n    - to: {topic: out}\n";
    const RENAMED: &str =
        "    - from: {topic: views}\n    - count: {store: d}\n    - to: {topic: out}\n";

    #[test]
    fn a_dropped_store_is_held_until_its_generation_is_accepted() {
        let running = app(COUNT, 1, None).spec;
        let renamed = app(RENAMED, 2, None);
        let Gate::Held { changes, .. } = check(&renamed, Some(&running)) else {
            panic!("not held");
        };
        assert!(
            matches!(changes[..], [Change::StoreDropped { .. }]),
            "{changes:?}"
        );
        let m = message(&renamed, &changes);
        assert!(
            m.contains("kubectl annotate ssapp pv eddy.dev/accept-data-loss=2 --overwrite"),
            "{m}"
        );
        assert!(m.contains("store c"), "{m}");
        // Accepting another generation accepts nothing.
        assert!(matches!(
            check(&app(RENAMED, 2, Some("1")), Some(&running)),
            Gate::Held { .. }
        ));
        assert!(matches!(
            check(&app(RENAMED, 2, Some("2")), Some(&running)),
            Gate::Accepted(_)
        ));
        // Held, the app keeps the running spec with the new replicas.
        let mut scaled = renamed.clone();
        scaled.spec.replicas = Some(5);
        let kept = held_app(&scaled, &running);
        assert_eq!(kept.spec.replicas, Some(5));
        assert_eq!(kept.spec.topology, running.topology);
    }

    #[test]
    fn safe_changes_and_unknown_running_specs_pass() {
        let running = app(COUNT, 1, None).spec;
        assert_eq!(check(&app(COUNT, 2, None), Some(&running)), Gate::Open);
        let mut more = app(COUNT, 2, None);
        more.spec.commit_interval_ms = Some(500);
        more.spec.replicas = Some(4);
        assert_eq!(check(&more, Some(&running)), Gate::Open);
        assert_eq!(check(&app(RENAMED, 2, None), None), Gate::Open);
    }
}

//! Kubernetes events about apps (`kubectl describe ssapp`). Not kube's `Recorder`: it folds
//! every event of one reason and action on an object into the first one's note (a series
//! count) for six minutes, so the second batch of moves, or a second refused object, would
//! show the first one's words. The operator already emits an event once per change, so each
//! one here is its own object.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};

/// The longest note the API server accepts is 1 kB.
const NOTE_CHARS: usize = 1000;

pub struct Events {
    client: Client,
    controller: String,
    instance: String,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            controller: controller.into(),
            instance: instance.into(),
        }
    }

    /// One event about `regarding` (in its namespace).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let ns = regarding.namespace.clone().unwrap_or_default();
        let now = Timestamp::now();
        let name = regarding.name.as_deref().unwrap_or(&self.controller);
        let event = Event {
            metadata: ObjectMeta {
                namespace: Some(ns.clone()),
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            reason: Some(reason.into()),
            action: Some(action.into()),
            note: Some(note.chars().take(NOTE_CHARS).collect()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

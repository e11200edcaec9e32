//! `eddy-operator`: reconciles `StatefulStreamApp` resources into worker StatefulSets and
//! acts as the task assignor. [`reconcile`] is a pure function from (spec, observed objects,
//! Kafka facts) to desired objects and status, built from [`resources`], [`placement`] and
//! [`rollout`];
//! a thin layer ([`controller`]) applies it. Apps are read leniently ([`app`]), so one that
//! does not parse marks only itself.

pub mod app;
pub mod controller;
pub mod events;
pub mod kafka;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod placement;
pub mod reconcile;
pub mod report_clock;
pub mod resources;
pub mod rollout;

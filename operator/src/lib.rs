//! `eddy-operator`: reconciles `StatefulStreamApp` resources into worker StatefulSets and
//! acts as the task assignor. [`reconcile`] is a pure function from (spec, observed objects,
//! Kafka facts) to desired objects and status, built from [`resources`] and [`assignment`];
//! a thin layer applies it.

pub mod app;
pub mod assignment;
pub mod controller;
pub mod kafka;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod resources;

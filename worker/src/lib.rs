//! `eddy-worker`: the engine that runs a stateful stream application on Kafka the way Kafka
//! Streams does. An app is a [`topology::Topology`] of sub-topologies; each runs as one
//! [`task::Task`] per input partition, with its own shard of each store ([`store`]) behind a
//! record cache ([`cache`]), every change mirrored to a compacted changelog ([`changelog`]),
//! [`restore`]d from it before processing, and committed at-least-once or exactly-once by the
//! loop in [`runtime`]. Declarative steps ([`steps`]) are built on the [`processor`] API that
//! embedding applications can use for their own logic.
//!
//! An application embedding [`run`] should give its thread a large stack, as `eddy-worker`
//! does (256 MiB of address space; pages are only backed when used): jq expressions get a share
//! of the thread's stack, and dropping a deeply nested value an expression built recurses per
//! level. Calling [`expr::budget::report_this_thread`] there lets `/healthz` name an expression
//! that does not return.

pub mod assignment;
pub mod cache;
pub mod changelog;
pub mod checkpoint;
pub mod collector;
pub mod config;
pub mod ends;
pub mod expr;
pub mod fault;
pub mod format;
pub mod global;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod partitioner;
pub mod plan;
pub mod processor;
pub mod query;
pub mod record;
pub mod restore;
pub mod runtime;
pub mod server;
pub mod status;
pub mod steps;
pub mod store;
pub mod task;
pub mod topology;
pub mod updater;
pub mod versioned;
pub mod window;

pub use config::{Overrides, WorkerConfig};
pub use processor::{
    Context, KeyValueStore, ProcessError, Processor, Punctuation, SessionStore, WindowStore,
};
pub use record::{Data, Record};
pub use runtime::{Status, run};

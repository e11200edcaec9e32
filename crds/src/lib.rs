//! The eddy API contract. The `StatefulStreamApp` spec is the application spec that
//! `eddy-worker` runs, so both the worker and the operator read these types; task ids and
//! internal topic names live here too, so both sides agree on them. No I/O.

pub mod duration;
pub mod manifest;
pub mod quantity;
pub mod query;
pub mod reference;
pub mod resource;
pub mod security;
pub mod spec;
pub mod step;
pub mod table;
pub mod task;
pub mod topics;
pub mod upgrade;

pub use duration::Duration;
pub use manifest::{AppManifest, ManifestError, parse_app};
pub use quantity::Quantity;
pub use spec::*;
pub use step::*;
pub use table::{TableSpec, Versioned};
pub use task::TaskId;

/// API group and version of the custom resource.
pub const API_VERSION: &str = "eddy.dev/v1alpha1";
pub const KIND: &str = "StatefulStreamApp";
/// The resource's API group and plural, as RBAC rules name it.
pub const GROUP: &str = "eddy.dev";
pub const PLURAL: &str = "statefulstreamapps";

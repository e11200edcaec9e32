//! Interactive queries (Kafka Streams' interactive queries and IQv2): any store of a running
//! app read over HTTP, from any worker.
//!
//! - [`Catalog`] is what the processing thread and the state updater share with the query
//!   API: the stores of the app and, per task this worker holds, the database and in-memory
//!   stores of its copy (active, standby or warm-up), published when the copy can answer and
//!   withdrawn before it closes.
//! - [`read`] reads one copy: a snapshot (an in-memory store: under its lock), so data and
//!   the changelog position it reflects are read together. Answers show committed state only: what a commit wrote to the store,
//!   never what a crash would roll back.
//! - [`locate`] decides where a request goes: this worker's copy, the worker holding the
//!   active (or an acceptable standby), or nowhere yet (a retry-after), from the operator's
//!   assignment and the workers' reports (pure, tested exhaustively).
//! - [`api`] serves it and forwards requests ([`params`]: what a request may say and the
//!   error answers; [`client`]: the HTTP client forwarding uses; [`auth`]: who may query,
//!   by Kubernetes RBAC).

pub mod api;
pub mod auth;
pub mod client;
pub mod locate;
pub mod params;
pub mod read;
#[cfg(test)]
mod tests;

use crate::global::GlobalStores;
use crate::store::{MemoryStore, TaskDb};
use crate::topology::StoreDef;
use eddy_crds::TaskId;
use eddy_crds::query::StoreDescription;
use eddy_crds::resource::{Assignment, WorkerStatus};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, Weak};

/// How a store's keys, values and windows are laid out, as queries read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    KeyValue,
    /// Each key's versions ([`crate::versioned`]), kept `history` ms.
    Versioned {
        history: i64,
    },
    Window(crate::window::KeySchema),
    /// A global table: every worker holds all of it.
    Global,
}

impl Kind {
    /// A window or session store's key layout.
    pub fn window_schema(self) -> Option<crate::window::KeySchema> {
        match self {
            Kind::Window(s) => Some(s),
            _ => None,
        }
    }
}

/// A store of the app, as the query API sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreInfo {
    pub name: String,
    pub kind: Kind,
    pub key_format: eddy_crds::Format,
    pub value_format: eddy_crds::Format,
    /// Values start with their record's timestamp.
    pub stamped: bool,
    /// The sub-topology whose tasks hold a shard each (none for a global table).
    pub subtopology: Option<u32>,
    /// The topic whose partitions split the store: the sub-topology's source, or the global
    /// table's topic.
    pub partitioned_by: String,
    /// The changelog (a global table's topic).
    pub changelog: String,
    /// Why it cannot be queried, if so.
    pub not_queryable: Option<&'static str>,
}

impl StoreInfo {
    fn of(application_id: &str, sub: &crate::topology::SubTopology, d: &StoreDef) -> Self {
        let kind = match (d.window, d.versioned) {
            (Some(w), _) => Kind::Window(w.windows.schema()),
            (None, Some(h)) => Kind::Versioned {
                history: i64::try_from(h.as_millis()).unwrap_or(i64::MAX),
            },
            (None, None) => Kind::KeyValue,
        };
        let not_queryable = d.internal.then_some(
            "it is the engine's own buffer (a stream join's or a suppression's), not a step's state",
        );
        StoreInfo {
            name: d.name.clone(),
            kind,
            key_format: d.key_format,
            value_format: d.value_format,
            stamped: d.stamped,
            subtopology: Some(sub.id),
            partitioned_by: sub.source().topic.clone(),
            changelog: eddy_crds::topics::changelog(application_id, &d.name),
            not_queryable,
        }
    }

    fn describe(&self, partitions: i32) -> StoreDescription {
        let kind = match self.kind {
            Kind::KeyValue => "key-value",
            Kind::Versioned { .. } => "versioned",
            Kind::Window(crate::window::KeySchema::Session) => "session",
            Kind::Window(_) => "window",
            Kind::Global => "global",
        };
        StoreDescription {
            name: self.name.clone(),
            kind: kind.into(),
            key_format: format_name(self.key_format).into(),
            value_format: format_name(self.value_format).into(),
            changelog: self.changelog.clone(),
            partitions,
            not_queryable: self.not_queryable.map(str::to_string),
        }
    }
}

pub(crate) fn format_name(f: eddy_crds::Format) -> &'static str {
    match f {
        eddy_crds::Format::String => "string",
        eddy_crds::Format::Json => "json",
        eddy_crds::Format::Bytes => "bytes",
        eddy_crds::Format::I64 => "i64",
        eddy_crds::Format::Windowed => "windowed",
    }
}

/// Who published a copy: the processing thread (an active task) or the state updater (a
/// standby or warm-up; its role and lag are in [`crate::status::Status::replicas`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    Active,
    Replica,
}

struct Held {
    holder: Holder,
    /// The task's database, if it keeps a store on disk.
    db: Option<Weak<TaskDb>>,
    /// Its in-memory stores, by name.
    memory: Vec<(String, MemoryStore)>,
    /// Held for reading while a query reads this copy; [`Catalog::withdraw`] takes it for
    /// writing, so it waits for the reads of this copy only.
    gate: RwLock<()>,
}

/// One task's copy of its stores, as a query reads it.
pub struct TaskCopy<'a> {
    pub db: Option<&'a TaskDb>,
    memory: &'a [(String, MemoryStore)],
}

impl TaskCopy<'_> {
    /// The in-memory store `name`, if it is one.
    pub fn memory(&self, name: &str) -> Option<&MemoryStore> {
        self.memory.iter().find(|(n, _)| n == name).map(|(_, m)| m)
    }
}

/// The app's stores and the copies of them this worker can answer from.
#[derive(Default)]
pub struct Catalog {
    // Behind `Arc`s: every request reads them, a start or a watch event replaces them.
    layout: RwLock<Arc<Layout>>,
    copies: RwLock<HashMap<TaskId, Arc<Held>>>,
    global: RwLock<Option<Weak<GlobalStores>>>,
    cluster: RwLock<Option<Arc<Cluster>>>,
}

/// What the app file and Kafka say, set when the worker starts and learns its topics.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// This worker's name (the pod name).
    pub pod: String,
    pub enabled: bool,
    pub stores: Vec<StoreInfo>,
    /// Partitions per topic the stores are split by.
    pub partitions: HashMap<String, i32>,
}

/// The operator's view of the app (under the operator only): who holds which task, and
/// what each worker reports; and how this worker reaches the others.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub assignment: Assignment,
    pub workers: BTreeMap<String, WorkerStatus>,
    pub peers: locate::PeerAddressing,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

impl Catalog {
    /// The stores of the app `cfg` runs, queryable when `spec.queries.enabled`.
    pub fn set_app(&self, cfg: &crate::config::WorkerConfig) {
        let mut stores: Vec<StoreInfo> = cfg
            .topology
            .subtopologies
            .iter()
            .flat_map(|s| {
                s.stores
                    .iter()
                    .map(|d| StoreInfo::of(&cfg.application_id, s, d))
            })
            .collect();
        stores.extend(cfg.topology.globals.iter().map(|g| StoreInfo {
            name: g.store.clone(),
            kind: Kind::Global,
            key_format: g.key_format,
            value_format: g.value_format,
            stamped: false,
            subtopology: None,
            partitioned_by: g.topic.clone(),
            changelog: g.topic.clone(),
            not_queryable: None,
        }));
        let mut l = self.layout.write().unwrap_or_else(PoisonError::into_inner);
        let l = Arc::make_mut(&mut l);
        l.pod = cfg.instance_id.clone();
        l.enabled = cfg.spec.queries_enabled();
        l.stores = stores;
    }

    /// Partition counts of the app's topics, as the worker learned them.
    pub fn set_partitions(&self, counts: &HashMap<String, i32>) {
        let mut l = self.layout.write().unwrap_or_else(PoisonError::into_inner);
        let l = Arc::make_mut(&mut l);
        for s in l.stores.clone() {
            if let Some(n) = counts.get(&s.partitioned_by) {
                l.partitions.insert(s.partitioned_by, *n);
            }
        }
    }

    pub fn layout(&self) -> Arc<Layout> {
        read(&self.layout).clone()
    }

    /// The stores, as `GET /stores` lists them.
    pub fn describe(&self) -> Vec<StoreDescription> {
        let l = read(&self.layout);
        l.stores
            .iter()
            .map(|s| s.describe(l.partitions.get(&s.partitioned_by).copied().unwrap_or(0)))
            .collect()
    }

    /// Make a task's copy answer queries: its database (if it keeps a store on disk) and its
    /// in-memory stores.
    pub fn publish(
        &self,
        task: TaskId,
        holder: Holder,
        db: Option<&Arc<TaskDb>>,
        memory: Vec<(String, MemoryStore)>,
    ) {
        let held = Arc::new(Held {
            holder,
            db: db.map(Arc::downgrade),
            memory,
            gate: RwLock::new(()),
        });
        self.copies
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(task, held);
    }

    /// Stop answering from a task's copy; returns once no query reads it any more, so the
    /// caller may close its database (and this worker open it again, as another role).
    pub fn withdraw(&self, task: TaskId, holder: Holder) {
        let held = {
            let mut copies = self.copies.write().unwrap_or_else(PoisonError::into_inner);
            match copies.get(&task) {
                Some(h) if h.holder == holder => copies.remove(&task),
                _ => None,
            }
        };
        if let Some(h) = held {
            drop(h.gate.write().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// Make the global tables answer queries (once they caught up).
    pub fn set_global(&self, stores: &Arc<GlobalStores>) {
        *self.global.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::downgrade(stores));
    }

    /// Stop answering from the global tables; returns once no query reads them, so they may
    /// close (and open again).
    pub fn withdraw_global(&self) {
        *self.global.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    pub fn set_cluster(&self, cluster: Cluster) {
        *self.cluster.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(cluster));
    }

    pub fn cluster(&self) -> Option<Arc<Cluster>> {
        read(&self.cluster).clone()
    }

    /// Who holds this worker's copy of `task`, if it has one that answers.
    pub fn holder(&self, task: TaskId) -> Option<Holder> {
        read(&self.copies)
            .get(&task)
            .filter(|h| h.db.as_ref().is_none_or(|db| db.strong_count() > 0))
            .map(|h| h.holder)
    }

    /// Run `f` on this worker's copy of `task`, if it has one; the copy is not closed while
    /// `f` runs ([`Self::withdraw`] waits for it).
    pub fn with_copy<T>(
        &self,
        task: TaskId,
        f: impl FnOnce(Holder, &TaskCopy<'_>) -> T,
    ) -> Option<T> {
        let copies = read(&self.copies);
        let held = copies.get(&task)?.clone();
        // The gate is taken while the copy is still listed: a withdraw that removed it in
        // between would not wait for this read (and a copy without a database has no other
        // sign that it is gone).
        let _reading = read(&held.gate);
        drop(copies);
        let db = match &held.db {
            Some(db) => Some(db.upgrade()?),
            None => None,
        };
        let copy = TaskCopy {
            db: db.as_deref(),
            memory: &held.memory,
        };
        Some(f(held.holder, &copy))
    }

    /// Run `f` on the global tables' stores, if they are open.
    pub fn with_global<T>(&self, f: impl FnOnce(&GlobalStores) -> T) -> Option<T> {
        let g = read(&self.global);
        let stores = g.as_ref()?.upgrade()?;
        Some(f(&stores))
    }
}

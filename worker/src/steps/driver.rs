//! A test driver for one sub-topology: its processors and in-memory stores, with the record
//! cache flushed and committed when the test says, as a task does, and what `to` sends
//! recorded. No Kafka.

use crate::cache::{Backend, StoreState};
use crate::processor::{Context, ProcessError, Processor, Sink};
use crate::record::{Data, Record};
use crate::store::MemoryStore;
use crate::topology::Topology;
use eddy_crds::Format;

/// A record `to` sent: topic, key, value, timestamp.
pub type Sent = (String, Option<Vec<u8>>, Option<Vec<u8>>, i64);

#[derive(Default)]
pub struct Recorder(pub Vec<Sent>);

impl Sink for Recorder {
    fn send(
        &mut self,
        topic: &str,
        _: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        ts: i64,
    ) -> Result<(), ProcessError> {
        self.0.push((
            topic.to_string(),
            key.map(<[u8]>::to_vec),
            value.map(<[u8]>::to_vec),
            ts,
        ));
        Ok(())
    }
}

pub struct Driver {
    pub processors: Vec<Box<dyn Processor>>,
    next: Vec<Option<usize>>,
    /// Each input's entry processor, formats and topic.
    inputs: Vec<(Option<usize>, Format, Format, String)>,
    pub stores: Vec<StoreState>,
    pub sent: Recorder,
    /// Reasons of records dropped (`ProcessError::Skip`).
    pub dropped: Vec<String>,
}

impl Driver {
    /// Sub-topology `sub` of an app file's topology.
    pub fn new(app: &str, sub: usize) -> Self {
        let app = eddy_crds::parse_app(app).expect("valid app");
        let t = Topology::from_spec("test", &app.spec).expect("compiles");
        let sub = &t.subtopologies[sub];
        Self {
            processors: sub.processors.iter().map(|n| (n.supplier)()).collect(),
            next: sub.processors.iter().map(|n| n.next).collect(),
            inputs: sub
                .inputs
                .iter()
                .map(|i| {
                    let s = &i.source;
                    (i.entry, s.key_format, s.value_format, s.topic.clone())
                })
                .collect(),
            stores: sub
                .stores
                .iter()
                .map(|d| {
                    StoreState::for_def(
                        d,
                        format!("test-{}-changelog", d.name),
                        Backend::Memory(MemoryStore::default()),
                    )
                })
                .collect(),
            sent: Recorder::default(),
            dropped: Vec::new(),
        }
    }

    /// Process one record of the source.
    pub fn process(&mut self, key: &str, value: &str, ts: i64) {
        self.process_input(0, Some(key), Some(value), ts);
    }

    /// Process one record of input `input` (0 the source, then the tables and streams joined);
    /// `None` is a null key or a tombstone.
    pub fn process_input(&mut self, input: usize, key: Option<&str>, value: Option<&str>, ts: i64) {
        let (entry, kf, vf, topic) = self.inputs[input].clone();
        let r = Record::new(
            key.map(|k| Data::raw(k.as_bytes(), kf)),
            value.map(|v| Data::raw(v.as_bytes(), vf)),
            ts,
        );
        self.run(entry, r, Some(&topic));
    }

    fn run(&mut self, start: Option<usize>, r: Record, topic: Option<&str>) {
        let mut cur = vec![r];
        let mut at = start;
        while let Some(i) = at {
            let p = &mut self.processors[i];
            at = self.next[i];
            let mut next = Vec::new();
            for r in cur.drain(..) {
                let mut ctx = Context {
                    stores: &mut self.stores,
                    db: None,
                    global: None,
                    sink: &mut self.sent,
                    out: &mut next,
                    topic,
                };
                match p.process(r, &mut ctx) {
                    Ok(()) => {}
                    Err(ProcessError::Skip(m)) => self.dropped.push(m),
                    Err(e) => panic!("{e}"),
                }
            }
            cur = next;
        }
    }

    /// Send the stores' dirty entries downstream, as a task's flush does.
    pub fn flush(&mut self) {
        while self.stores.iter().any(StoreState::has_dirty) {
            for i in 0..self.stores.len() {
                for d in self.stores[i].take_dirty() {
                    if let Some(f) = self.stores[i].forward_to {
                        let r = self.stores[i].downstream(&d);
                        self.run(Some(f), r, None);
                    }
                }
            }
        }
    }

    /// Flush, then write what was flushed to the (in-memory) stores and empty the caches.
    pub fn commit(&mut self) {
        self.flush();
        for s in &mut self.stores {
            let changes = s.take_committed(0);
            s.apply_in_memory(&changes, crate::store::Mark::default());
        }
    }

    /// The last value `to` sent per key (a tombstone removes the key), in key order.
    pub fn table(&self) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
        let mut t = std::collections::BTreeMap::new();
        for (_, k, v, _) in &self.sent.0 {
            let k = k.clone().unwrap_or_default();
            match v {
                Some(v) => t.insert(k, v.clone()),
                None => t.remove(&k),
            };
        }
        t
    }
}

/// A small deterministic generator for test inputs.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    /// Shuffle `v` in place.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.next(i as u64 + 1) as usize);
        }
    }
}

/// An 8-byte big-endian count.
pub fn count(v: &[u8]) -> i64 {
    i64::from_be_bytes(v.try_into().expect("8 bytes"))
}

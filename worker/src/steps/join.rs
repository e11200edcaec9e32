//! Tables and the stream-table join: a table's topic kept in a key-value store (Kafka
//! Streams' `KTableSource`), and each stream record joined with its key's value there
//! (`KStreamKTableJoinProcessor`), as of its time when the table is versioned.

use super::{joined_value, one, vars};
use crate::expr::{Expr, Val};
use crate::format;
use crate::processor::{Context, ProcessError, Processor};
use crate::record::{Data, Record};
use crate::versioned::{Put, VersionedStore};
use crate::window::{split_timestamp, with_timestamp};
use eddy_crds::{Format, JoinType};

/// A table's records into its store: a value sets the key's, a tombstone deletes the key.
/// For a stream-table join table updates go no further (the stream side triggers the join);
/// a table-table join gets them (`forward`), with timestamps kept beside the values.
#[derive(Clone)]
pub struct TableSource {
    pub store: String,
    pub key_format: Format,
    /// Pass each update on, and keep each value's timestamp in front of it
    /// ([`crate::window::with_timestamp`]) for the joined result's.
    pub forward: bool,
    /// A versioned table's history retention, ms: the store keeps versions
    /// ([`crate::versioned`]).
    pub history: Option<i64>,
}

impl TableSource {
    /// The source of table `name` of `spec.tables`.
    pub fn new(name: &str, t: &eddy_crds::TableSpec, forward: bool) -> Self {
        Self {
            store: t.store_name(name).to_string(),
            key_format: t.key,
            forward,
            history: t.history_ms(),
        }
    }
}

impl Processor for TableSource {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = &r.key else {
            return Err(ProcessError::Skip(
                "null key: a table ignores records without a key".into(),
            ));
        };
        let key = key.to_bytes(self.key_format).map_err(ProcessError::bad)?;
        // Kept in the table's own format: a lookup decodes only what it joins.
        let bytes = match &r.value {
            Some(Data::Raw { bytes, .. }) => Some(std::borrow::Cow::Borrowed(&bytes[..])),
            Some(Data::Val(v)) => Some(std::borrow::Cow::Owned(
                format::encode(Format::Json, v).map_err(ProcessError::bad)?,
            )),
            None => None,
        };
        let mut store = ctx.store(&self.store)?;
        if let Some(history) = self.history {
            // Validation refuses versioned tables where updates go on (`from: {table}`).
            debug_assert!(
                !self.forward,
                "a versioned table's updates are not forwarded"
            );
            let put =
                VersionedStore::new(store, history).put(&key, bytes.as_deref(), r.timestamp)?;
            if put == Put::Expired {
                return Err(ProcessError::Skip(format!(
                    "a table update older than the versioned table's history ({history} ms) behind its stream time"
                )));
            }
            return Ok(());
        }
        match bytes {
            Some(b) if self.forward => {
                store.put(&key, &with_timestamp(r.timestamp, &b), r.timestamp)
            }
            Some(b) => store.put(&key, &b, r.timestamp),
            None => store.delete(&key, r.timestamp),
        }
        if self.forward {
            ctx.forward(r);
        }
        Ok(())
    }
}

/// `join: {table, key, as, type}`: each record looks up its key (a global table's: `key`'s
/// output) in the table's store; `as` gives the joined value (`$right` the table's value, null
/// when a left join finds nothing). The key and timestamp stay the record's.
#[derive(Clone)]
pub struct StreamTableJoin {
    pub store: String,
    /// The store is a global table's ([`crate::global`]), not one of the task's.
    pub global: bool,
    /// Global tables: the lookup key from the record (default its key).
    pub key: Option<Expr>,
    /// The table's key format: the lookup key is looked up in it.
    pub key_format: Format,
    /// The table's value format, for `$right`.
    pub value_format: Format,
    pub joiner: Expr,
    pub left: bool,
    /// A versioned table's history retention, ms: the lookup is as of the record's time.
    pub history: Option<i64>,
}

impl Processor for StreamTableJoin {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        // As Kafka Streams: a tombstone joins nothing; a record without a key finds nothing,
        // which a left join still emits (KIP-962).
        if r.value.is_none() {
            return Err(ProcessError::Skip(
                "null value: a join ignores tombstones".into(),
            ));
        }
        let vars = vars(&r)?;
        let lookup = match (&self.key, &r.key) {
            (Some(e), _) => match one(e, &r.value, &vars)? {
                Val::Null => None,
                k => Some(format::encode(self.key_format, &k).map_err(ProcessError::bad)?),
            },
            (None, Some(k)) => Some(
                k.to_bytes(self.key_format)
                    .map_err(ProcessError::bad)?
                    .into_owned(),
            ),
            (None, None) => None,
        };
        let found = match lookup {
            Some(key) if self.global => ctx.global(&self.store, &key)?,
            Some(key) => match self.history {
                Some(h) => {
                    VersionedStore::new(ctx.store(&self.store)?, h).get_as_of(&key, r.timestamp)?
                }
                None => ctx.store(&self.store)?.get(&key)?,
            },
            None if self.left => None,
            None => {
                return Err(ProcessError::Skip(
                    "null lookup key: an inner join needs a key to look up".into(),
                ));
            }
        };
        let right = match found {
            Some(bytes) => format::decode(self.value_format, &bytes).map_err(|e| {
                ProcessError::BadRecord(format!("the value of table store {}: {e}", self.store))
            })?,
            None if self.left => Val::Null,
            None => return Ok(()),
        };
        let value = joined_value(&self.joiner, &r.key, &r.value, right, r.timestamp)?;
        ctx.forward(Record {
            key: r.key,
            value,
            timestamp: r.timestamp,
            window: None,
        });
        Ok(())
    }
}

/// `from: {table: a}` then `join: {table: b}`: a table-table join (Kafka Streams'
/// `KTableKTableJoin`, `LeftJoin`, `OuterJoin`). An update of either table joins the other's
/// current value for its key and emits the joined table's new value for the key (a
/// tombstone when the key leaves it), timestamped the later of both sides'.
#[derive(Clone)]
pub struct TableTableJoin {
    /// The right table's topic: its updates enter the task there.
    pub right_topic: String,
    /// The left and right tables' stores (values behind their timestamps).
    pub stores: [String; 2],
    pub value_formats: [Format; 2],
    pub key_format: Format,
    pub joiner: Expr,
    pub kind: JoinType,
    /// Also keep the joined table here.
    pub materialize: Option<String>,
}

impl TableTableJoin {
    /// The other side's current value for `key`, with its timestamp.
    fn current(
        &self,
        side: usize,
        key: &[u8],
        ctx: &mut Context<'_>,
    ) -> Result<Option<(i64, Data)>, ProcessError> {
        let Some(v) = ctx.store(&self.stores[side])?.get(key)? else {
            return Ok(None);
        };
        let (ts, bytes) = split_timestamp(&v).ok_or_else(|| {
            ProcessError::Fatal(format!(
                "table store {} holds a value without its timestamp: its changelog was written by a stream-table join's table; reset the app's state",
                self.stores[side]
            ))
        })?;
        Ok(Some((ts, Data::raw(bytes, self.value_formats[side]))))
    }
}

impl Processor for TableTableJoin {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let this = usize::from(ctx.topic() == Some(self.right_topic.as_str()));
        let Some(key) = &r.key else {
            return Err(ProcessError::Skip(
                "null key: a table ignores records without a key".into(),
            ));
        };
        let key_bytes = key
            .to_bytes(self.key_format)
            .map_err(ProcessError::bad)?
            .into_owned();
        let other = self.current(1 - this, &key_bytes, ctx)?;
        let (mine, theirs) = (r.value.clone(), other.as_ref().map(|(_, d)| d.clone()));
        let (left, right) = match this {
            0 => (mine, theirs),
            _ => (theirs, mine),
        };
        // Kafka Streams' rules: an inner join needs both sides; a left join needs the left
        // one (an update of the right side of a key the left lacks emits nothing); an outer
        // join either. A side that is needed and gone makes a tombstone (in an outer join,
        // both sides gone: the update may have removed the key's last side).
        let emit = match self.kind {
            JoinType::Inner => other.is_some(),
            JoinType::Left => this == 0 || other.is_some(),
            JoinType::Outer => true,
        };
        if !emit {
            return Ok(());
        }
        let joins = match self.kind {
            JoinType::Inner => left.is_some() && right.is_some(),
            JoinType::Left => left.is_some(),
            JoinType::Outer => left.is_some() || right.is_some(),
        };
        let timestamp = other
            .as_ref()
            .map_or(r.timestamp, |(ts, _)| (*ts).max(r.timestamp));
        let value = match joins {
            true => {
                let right = match &right {
                    Some(d) => d.to_val().map_err(ProcessError::bad)?,
                    None => Val::Null,
                };
                joined_value(&self.joiner, &r.key, &left, right, timestamp)?
            }
            false => None,
        };
        if let Some(m) = &self.materialize {
            let mut store = ctx.store(m)?;
            match &value {
                Some(v) => {
                    let bytes = v.to_bytes(Format::Json).map_err(ProcessError::bad)?;
                    store.put(&key_bytes, &bytes, timestamp);
                }
                None => store.delete(&key_bytes, timestamp),
            }
        }
        ctx.forward(Record {
            key: r.key,
            value,
            timestamp,
            window: None,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::Driver;

    const APP: &str = "tables:\n  customers: {topic: customers}\ntopology:\n- from: {topic: orders}\n- join: {table: customers, type: TYPE, as: '{order: .id, name: $right.name}'}\n- to: {topic: out}\n";

    fn driver(kind: &str) -> Driver {
        Driver::new(&APP.replace("TYPE", kind), 0)
    }

    /// What `to` sent: (key, value) as text.
    fn sent(d: &Driver) -> Vec<(Option<String>, Option<String>)> {
        let text = |b: &Option<Vec<u8>>| b.as_ref().map(|b| String::from_utf8_lossy(b).to_string());
        d.sent
            .0
            .iter()
            .map(|(_, k, v, _)| (text(k), text(v)))
            .collect()
    }

    #[test]
    fn a_record_meets_the_tables_latest_value_for_its_key_and_keeps_its_key_and_time() {
        for kind in ["inner", "left"] {
            let mut d = driver(kind);
            d.process_input(1, Some("c1"), Some(r#"{"name":"Ada"}"#), 1);
            d.process("c1", r#"{"id":1}"#, 2);
            d.process_input(1, Some("c1"), Some(r#"{"name":"Bea"}"#), 3);
            d.process("c1", r#"{"id":2}"#, 4);
            // A tombstone deletes the key: an inner join finds nothing, a left one null.
            d.process_input(1, Some("c1"), None, 5);
            d.process("c1", r#"{"id":3}"#, 6);
            d.process("c2", r#"{"id":4}"#, 7);
            let mut want = vec![
                (
                    Some("c1".into()),
                    Some(r#"{"order":1,"name":"Ada"}"#.into()),
                ),
                (
                    Some("c1".into()),
                    Some(r#"{"order":2,"name":"Bea"}"#.into()),
                ),
            ];
            if kind == "left" {
                want.push((Some("c1".into()), Some(r#"{"order":3,"name":null}"#.into())));
                want.push((Some("c2".into()), Some(r#"{"order":4,"name":null}"#.into())));
            }
            assert_eq!(sent(&d), want, "{kind}");
            let times: Vec<i64> = d.sent.0.iter().map(|s| s.3).collect();
            assert_eq!(&times[..2], [2, 4], "the stream record's time");
            // Table updates emit nothing; the table source only fills the store.
            assert!(d.dropped.is_empty(), "{:?}", d.dropped);
        }
    }

    #[test]
    fn a_versioned_table_answers_as_of_the_records_time() {
        let app = APP.replace("TYPE", "left").replace(
            "{topic: customers}",
            "{topic: customers, versioned: {history: 1m}}",
        );
        let mut d = Driver::new(&app, 0);
        d.process_input(1, Some("c1"), Some(r#"{"name":"Ada"}"#), 1_000);
        d.process_input(1, Some("c1"), Some(r#"{"name":"Bea"}"#), 5_000);
        d.commit();
        d.process_input(1, Some("c1"), None, 9_000);
        // Out of order: Cy from 3 s to Bea's 5 s.
        d.process_input(1, Some("c1"), Some(r#"{"name":"Cy"}"#), 3_000);
        for (id, ts) in [(1, 500), (2, 2_000), (3, 4_000), (4, 6_000), (5, 9_500)] {
            d.process("c1", &format!(r#"{{"id":{id}}}"#), ts);
        }
        // Stream time 70 s: 4 s is beyond the 1 min history, the newest version (a
        // tombstone) does not answer it; an update that old is dropped.
        d.process_input(1, Some("c2"), Some(r#"{"name":"Di"}"#), 70_000);
        d.process_input(1, Some("c1"), Some(r#"{"name":"Ed"}"#), 8_000);
        d.commit();
        d.process("c1", r#"{"id":6}"#, 4_000);
        d.process("c2", r#"{"id":7}"#, 1_000);
        d.process("c2", r#"{"id":8}"#, 80_000);
        let names: Vec<String> = sent(&d).into_iter().filter_map(|(_, v)| v).collect();
        assert_eq!(
            names,
            [
                r#"{"order":1,"name":null}"#,
                r#"{"order":2,"name":"Ada"}"#,
                r#"{"order":3,"name":"Cy"}"#,
                r#"{"order":4,"name":"Bea"}"#,
                r#"{"order":5,"name":null}"#,
                r#"{"order":6,"name":null}"#,
                r#"{"order":7,"name":null}"#,
                r#"{"order":8,"name":"Di"}"#,
            ]
        );
        assert_eq!(
            d.dropped.len(),
            1,
            "the update older than the history: {:?}",
            d.dropped
        );
    }

    const TABLES: &str = "tables:\n  customers: {topic: customers}\n  accounts: {topic: accounts}\ntopology:\n- from: {table: customers}\n- join: {table: accounts, type: TYPE, as: '{name: .name, balance: $right.balance}', materialize: {store: joined}}\n- to: {topic: out}\n";

    /// What `to` sent, with timestamps.
    fn sent_at(d: &Driver) -> Vec<(Option<String>, Option<String>, i64)> {
        sent(d)
            .into_iter()
            .zip(d.sent.0.iter().map(|s| s.3))
            .map(|((k, v), ts)| (k, v, ts))
            .collect()
    }

    #[test]
    fn a_table_table_join_emits_the_joined_tables_updates_and_tombstones() {
        let c = |n: &str| Some(format!(r#"{{"name":"{n}"}}"#));
        let a = |b: i64| Some(format!(r#"{{"balance":{b}}}"#));
        let row = |k: &str, v: Option<&str>, ts| (Some(k.to_string()), v.map(str::to_string), ts);
        let run = |kind: &str| {
            let mut d = Driver::new(&TABLES.replace("TYPE", kind), 0);
            d.process_input(0, Some("k"), c("Ada").as_deref(), 1); // customer, no account
            d.process_input(1, Some("k"), a(5).as_deref(), 2); // account arrives
            d.process_input(1, Some("j"), a(7).as_deref(), 3); // account without customer
            d.process_input(0, Some("k"), c("Bea").as_deref(), 4); // customer update
            d.process_input(1, Some("k"), None, 5); // account deleted
            d.process_input(0, Some("k"), None, 6); // customer deleted
            d
        };
        let d = run("inner");
        assert_eq!(
            sent_at(&d),
            [
                row("k", Some(r#"{"name":"Ada","balance":5}"#), 2),
                row("k", Some(r#"{"name":"Bea","balance":5}"#), 4),
                row("k", None, 5),
            ]
        );
        let d = run("left");
        assert_eq!(
            sent_at(&d),
            [
                row("k", Some(r#"{"name":"Ada","balance":null}"#), 1),
                row("k", Some(r#"{"name":"Ada","balance":5}"#), 2),
                row("k", Some(r#"{"name":"Bea","balance":5}"#), 4),
                row("k", Some(r#"{"name":"Bea","balance":null}"#), 5),
                row("k", None, 6),
            ]
        );
        let mut d = run("outer");
        assert_eq!(
            sent_at(&d),
            [
                row("k", Some(r#"{"name":"Ada","balance":null}"#), 1),
                row("k", Some(r#"{"name":"Ada","balance":5}"#), 2),
                row("j", Some(r#"{"name":null,"balance":7}"#), 3),
                row("k", Some(r#"{"name":"Bea","balance":5}"#), 4),
                row("k", Some(r#"{"name":"Bea","balance":null}"#), 5),
                row("k", None, 6),
            ]
        );
        // The joined table is kept in the materialized store: k is gone, j stays.
        d.commit();
        let store = d
            .stores
            .iter_mut()
            .find(|s| s.name == "joined")
            .expect("store");
        let table = store.range(None, &[], &[0xff; 4]).expect("readable");
        assert_eq!(
            table,
            [(b"j".to_vec(), br#"{"name":null,"balance":7}"#.to_vec())]
        );
    }

    #[test]
    fn tombstones_and_keyless_records_as_kafka_streams_drops_them() {
        let mut d = driver("inner");
        // A table record without a key is dropped; a stream tombstone joins nothing.
        d.process_input(1, None, Some(r#"{"name":"Ada"}"#), 1);
        d.process_input(0, Some("c1"), None, 2);
        d.process_input(0, None, Some(r#"{"id":1}"#), 3);
        assert!(sent(&d).is_empty());
        assert_eq!(d.dropped.len(), 3, "{:?}", d.dropped);
        // A left join keeps a record without a key, with nothing to join (KIP-962).
        let mut d = driver("left");
        d.process_input(0, None, Some(r#"{"id":1}"#), 3);
        assert_eq!(
            sent(&d),
            [(None, Some(r#"{"order":1,"name":null}"#.into()))]
        );
    }
}

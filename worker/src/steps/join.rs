//! Tables and the stream-table join: a table's topic kept in a key-value store (Kafka
//! Streams' `KTableSource`), and each stream record joined with its key's value there
//! (`KStreamKTableJoinProcessor`).

use super::{one, vars};
use crate::expr::{Expr, Val};
use crate::format;
use crate::processor::{Context, ProcessError, Processor};
use crate::record::{Data, Record};
use eddy_crds::Format;

/// A table's records into its store: a value sets the key's, a tombstone deletes the key.
/// Table updates go no further: a stream-table join is triggered by the stream side only.
#[derive(Clone)]
pub struct TableSource {
    pub store: String,
    pub key_format: Format,
}

impl Processor for TableSource {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = &r.key else {
            return Err(ProcessError::Skip(
                "null key: a table ignores records without a key".into(),
            ));
        };
        let key = key.to_bytes(self.key_format).map_err(ProcessError::bad)?;
        let mut store = ctx.store(&self.store)?;
        match &r.value {
            // Kept in the table's own format: a lookup decodes only what it joins.
            Some(v) => {
                let bytes = match v {
                    Data::Raw { bytes, .. } => std::borrow::Cow::Borrowed(&bytes[..]),
                    Data::Val(v) => std::borrow::Cow::Owned(
                        format::encode(Format::Json, v).map_err(ProcessError::bad)?,
                    ),
                };
                store.put(&key, &bytes, r.timestamp);
            }
            None => store.delete(&key, r.timestamp),
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
            Some(key) => ctx.store(&self.store)?.get(&key)?,
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
        let [k, ts, w] = vars;
        let joined = one(&self.joiner, &r.value, &[k, ts, w, right])?;
        ctx.forward(Record {
            key: r.key,
            // A joiner giving null makes a tombstone, as a Java joiner returning null does.
            value: (joined != Val::Null).then_some(Data::Val(joined)),
            timestamp: r.timestamp,
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

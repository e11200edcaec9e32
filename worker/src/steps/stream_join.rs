//! The windowed stream-stream join (Kafka Streams' `KStreamKStreamJoin` with `JoinWindows`):
//! each side's records are kept in a window store of their own; a record joins the other
//! side's records of its key at most `within` apart, whichever came first. Left and outer
//! joins hold a record nothing joined yet in an "outer" store until its window and grace have
//! passed in stream time, then emit it with null for the missing side.
//!
//! Written to give the same records as Kafka Streams 4.4 (e2e/src/joins.rs models it):
//! one stream time shared by both sides; no record is dropped as late (grace decides only
//! when unjoined records come out and how long records are kept); the scan for unjoined
//! records runs for a record at stream time, skipped while the oldest time it may find could
//! still join, with that time taken from the last entry the previous scan visited.

use super::joined_value;
use crate::expr::{Expr, Val};
use crate::processor::{Context, ProcessError, Processor};
use crate::record::{Data, Record};
use eddy_crds::Format;

/// One side of the join: where its records are kept and how their values are written.
#[derive(Clone)]
pub struct Side {
    /// Window store of this side's records: per key and timestamp, the values in arrival
    /// order (Kafka Streams' window store with `retainDuplicates`).
    pub store: String,
    pub value_format: Format,
    /// A record of this side nothing joins is emitted with null for the other side.
    pub outer: bool,
}

#[derive(Clone)]
pub struct StreamStreamJoin {
    /// The other stream's topic: its records enter the task there and are the right side.
    pub right_topic: String,
    /// Left (the joining stream), right (the other stream).
    pub sides: [Side; 2],
    /// Left and outer joins: records waiting for a partner, by (timestamp, side, key).
    pub outer_store: Option<String>,
    pub key_format: Format,
    /// How far apart two records may be (both ways), and the grace after a window's end.
    pub within: i64,
    pub grace: i64,
    /// How long each side's records are kept (and seen): 2 × within + grace.
    pub retention: i64,
    pub joiner: Expr,
    /// The largest timestamp either side has processed (Kafka Streams' shared time tracker);
    /// in memory, as there: a restarted task starts again from none.
    stream_time: i64,
    /// Each store's largest timestamp put: a lookup sees only what its retention keeps.
    observed: [i64; 2],
    /// Where the outer store's scan starts mattering (see the module doc).
    min_time: i64,
    /// The stream time of the last scan of the outer store, if any since the task started.
    scanned_at: Option<i64>,
}

impl StreamStreamJoin {
    pub fn new(
        right_topic: String,
        sides: [Side; 2],
        outer_store: Option<String>,
        key_format: Format,
        within: i64,
        grace: i64,
        joiner: Expr,
    ) -> Self {
        Self {
            right_topic,
            sides,
            outer_store,
            key_format,
            within,
            grace,
            retention: within.saturating_mul(2).saturating_add(grace),
            joiner,
            stream_time: -1,
            observed: [-1, -1],
            min_time: i64::MAX,
            scanned_at: None,
        }
    }

    /// The joined record: `.` the left value, `$right` the right one (either may be null).
    fn joined(
        &self,
        key: Option<Data>,
        left: Option<Data>,
        right: Option<Data>,
        timestamp: i64,
    ) -> Result<Record, ProcessError> {
        let right = match &right {
            Some(d) => d.to_val().map_err(|e| {
                ProcessError::BadRecord(format!("a value of store {}: {e}", self.sides[1].store))
            })?,
            None => Val::Null,
        };
        let value = joined_value(&self.joiner, &key, &left, right, timestamp)?;
        Ok(Record {
            key,
            value,
            timestamp,
            window: None,
        })
    }

    /// A value of side `side` as the joiner sees it.
    fn value(&self, side: usize, bytes: Vec<u8>) -> Data {
        Data::raw(&bytes, self.sides[side].value_format)
    }

    /// Emit, before the record at stream time that triggers it, every held record whose
    /// window and grace have passed (Kafka Streams' `emitNonJoinedOuterRecords`).
    fn emit_closed(&mut self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(name) = &self.outer_store else {
            return Ok(());
        };
        // Java's long arithmetic: MAX + x wraps negative, so "none held" never skips.
        if self.min_time.wrapping_add(self.within + self.grace) >= self.stream_time {
            return Ok(());
        }
        self.min_time = i64::MAX;
        // What the last scan left is not yet closed at its stream time, and what was held
        // since is at most `within` older than that: start there, past the deleted entries.
        let from = match self.scanned_at {
            Some(t) => held_key(t.saturating_sub(self.within + self.grace), 1, &[]),
            None => Vec::new(),
        };
        let held = ctx.store(name)?.range(&from, &[0xff; 10])?;
        let mut closed = Vec::new();
        let mut open = [false; 2];
        for (k, v) in held {
            let (ts, side, _) = split_held(&k).ok_or_else(|| corrupt(name))?;
            // Kafka Streams 4.x takes the time of the entry the scan stops at, too.
            self.min_time = ts;
            if open[0] && open[1] {
                break;
            }
            if ts.saturating_add(self.within + self.grace) >= self.stream_time {
                open[side] = true;
                continue;
            }
            closed.push((k, v));
        }
        // Emitted first, deleted once all are: a joiner failing on one keeps them all held
        // (what was forwarded is dropped with the failed record), none lost.
        for (k, v) in &closed {
            let (ts, side, key) = split_held(k).ok_or_else(|| corrupt(name))?;
            for value in values(v) {
                let key = Some(Data::raw(key, self.key_format));
                let value = Some(self.value(side, value.to_vec()));
                let r = match side {
                    0 => self.joined(key, value, None, ts)?,
                    _ => self.joined(key, None, value, ts)?,
                };
                ctx.forward(r);
            }
        }
        let mut store = ctx.store(name)?;
        for (k, _) in closed {
            let ts = split_held(&k).map_or(self.stream_time, |(ts, _, _)| ts);
            store.delete(&k, ts);
        }
        // Only now: a joiner that failed above leaves its records to the next scan.
        self.scanned_at = Some(self.stream_time);
        Ok(())
    }
}

/// The outer store holds a key this join did not write.
fn corrupt(store: &str) -> ProcessError {
    ProcessError::Fatal(format!(
        "store {store} holds a key that is not (timestamp, side, key): its changelog was written by something else; reset the app's state"
    ))
}

impl Processor for StreamStreamJoin {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let this = usize::from(ctx.topic() == Some(self.right_topic.as_str()));
        let other = 1 - this;
        let ts = r.timestamp;
        let (from, to) = (
            ts.saturating_sub(self.within).max(0),
            ts.saturating_add(self.within).max(0),
        );
        self.stream_time = self.stream_time.max(ts);
        let Some(value) = &r.value else {
            return Err(ProcessError::Skip(
                "null value: a join ignores tombstones".into(),
            ));
        };
        let value = value
            .to_bytes(self.sides[this].value_format)
            .map_err(ProcessError::bad)?
            .into_owned();
        let Some(key) = &r.key else {
            // KIP-962: an outer side emits a record without a key at once, unjoined.
            if !self.sides[this].outer {
                return Err(ProcessError::Skip(
                    "null key: a stream join matches records by key".into(),
                ));
            }
            let v = Some(self.value(this, value));
            let out = match this {
                0 => self.joined(None, v, None, ts)?,
                _ => self.joined(None, None, v, ts)?,
            };
            ctx.forward(out);
            return Ok(());
        };
        let key = key
            .to_bytes(self.key_format)
            .map_err(ProcessError::bad)?
            .into_owned();
        if ts == self.stream_time {
            self.emit_closed(ctx)?;
        }
        // The other store only shows what its retention keeps, counted from its own latest.
        let lo = from.max(self.observed[other].saturating_sub(self.retention) + 1);
        let found = ctx
            .window_store(&self.sides[other].store)?
            .fetch(&key, lo, to)?;
        let mut joined = false;
        for (w, list) in found {
            if let Some(outer) = &self.outer_store {
                // The partner waits no more for one: it only appears joined.
                let held = held_key(w.start, other, &key);
                let mut store = ctx.store(outer)?;
                if store.get(&held)?.is_some() {
                    store.delete(&held, ts);
                }
            }
            for v in values(&list) {
                joined = true;
                let (mine, theirs) = (
                    self.value(this, value.clone()),
                    self.value(other, v.to_vec()),
                );
                let (l, rv) = match this {
                    0 => (mine, theirs),
                    _ => (theirs, mine),
                };
                let k = Some(Data::raw(&key, self.key_format));
                let out = self.joined(k, Some(l), Some(rv), ts.max(w.start))?;
                ctx.forward(out);
            }
        }
        // This side's records of the key at this time so far (usually none).
        let own = ctx.window_store(&self.sides[this].store)?.get(&key, ts)?;
        if !joined && self.sides[this].outer {
            match &self.outer_store {
                Some(outer) if to >= self.stream_time => {
                    self.min_time = self.min_time.min(ts);
                    let held = held_key(ts, this, &key);
                    let mut store = ctx.store(outer)?;
                    // A held record is in its side's window store too (kept longer), so
                    // without one there the outer store has none: no lookup that would miss.
                    let before = match own {
                        Some(_) => store.get(&held)?,
                        None => None,
                    };
                    store.put(&held, &appended(before, &value), ts);
                }
                // Its window has already passed: nothing can join it any more.
                _ => {
                    let k = Some(Data::raw(&key, self.key_format));
                    let v = Some(self.value(this, value.clone()));
                    let out = match this {
                        0 => self.joined(k, v, None, ts)?,
                        _ => self.joined(k, None, v, ts)?,
                    };
                    ctx.forward(out);
                }
            }
        }
        let list = appended(own, &value);
        ctx.window_store(&self.sides[this].store)?
            .put(&key, ts, &list, ts);
        self.observed[this] = self.observed[this].max(ts);
        Ok(())
    }
}

/// A held record's key in the outer store: timestamp (ordered), side (right before left, as
/// Kafka Streams' `TimestampedKeyAndJoinSide`), key bytes.
fn held_key(ts: i64, side: usize, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&((ts as u64) ^ (1 << 63)).to_be_bytes());
    k.push(u8::from(side == 0));
    k.extend_from_slice(key);
    k
}

fn split_held(k: &[u8]) -> Option<(i64, usize, &[u8])> {
    let ts = u64::from_be_bytes(k.get(..8)?.try_into().ok()?) ^ (1 << 63);
    let side = match k.get(8)? {
        1 => 0,
        _ => 1,
    };
    Some((ts as i64, side, &k[9..]))
}

/// A list of values with `value` appended: each as a 4-byte big-endian length, then its bytes.
fn appended(list: Option<Vec<u8>>, value: &[u8]) -> Vec<u8> {
    let mut list = list.unwrap_or_default();
    list.extend_from_slice(&(value.len() as u32).to_be_bytes());
    list.extend_from_slice(value);
    list
}

/// The values of a list, in the order they were appended (a malformed tail is ignored).
fn values(list: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = list;
    while let Some(len) = rest.get(..4) {
        let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(v) = rest.get(4..4 + n) else { break };
        out.push(v);
        rest = &rest[4 + n..];
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::steps::driver::Driver;

    const APP: &str = "topology:\n- from: {topic: orders}\n- join: {stream: {topic: shipments}, within: 5ms, grace: 1ms, type: TYPE, as: '{o: .o, s: $right.s}'}\n- to: {topic: out}\n";
    const ORDERS: usize = 0;
    const SHIPMENTS: usize = 1;

    fn driver(kind: &str) -> Driver {
        Driver::new(&APP.replace("TYPE", kind), 0)
    }

    fn order(d: &mut Driver, key: &str, n: i64, ts: i64) {
        d.process_input(ORDERS, Some(key), Some(&format!(r#"{{"o":{n}}}"#)), ts);
    }

    fn shipment(d: &mut Driver, key: &str, n: i64, ts: i64) {
        d.process_input(SHIPMENTS, Some(key), Some(&format!(r#"{{"s":{n}}}"#)), ts);
    }

    /// What `to` sent: key, value, timestamp.
    fn sent(d: &Driver) -> Vec<(String, String, i64)> {
        let text = |b: &Option<Vec<u8>>| {
            b.as_ref()
                .map_or("null".into(), |b| String::from_utf8_lossy(b).to_string())
        };
        d.sent
            .0
            .iter()
            .map(|(_, k, v, ts)| (text(k), text(v), *ts))
            .collect()
    }

    fn rec(k: &str, v: &str, ts: i64) -> (String, String, i64) {
        (k.into(), v.into(), ts)
    }

    #[test]
    fn records_of_both_sides_within_the_window_meet_whichever_comes_first() {
        let mut d = driver("inner");
        order(&mut d, "a", 1, 10);
        shipment(&mut d, "a", 1, 12); // joins order 1, at 12
        shipment(&mut d, "b", 2, 13); // another key: nothing
        order(&mut d, "a", 2, 14); // joins shipment 1, at 14
        shipment(&mut d, "a", 3, 16); // 6 after order 1: only order 2
        order(&mut d, "a", 3, 16); // same time as shipment 3, and shipment 1 at 12
        assert_eq!(
            sent(&d),
            [
                rec("a", r#"{"o":1,"s":1}"#, 12),
                rec("a", r#"{"o":2,"s":1}"#, 14),
                rec("a", r#"{"o":2,"s":3}"#, 16),
                rec("a", r#"{"o":3,"s":1}"#, 16),
                rec("a", r#"{"o":3,"s":3}"#, 16),
            ]
        );
        // A late record still joins (grace only decides when unjoined ones come out), in
        // timestamp order of its partners.
        order(&mut d, "a", 4, 11);
        assert_eq!(
            sent(&d)[5..],
            [
                rec("a", r#"{"o":4,"s":1}"#, 12),
                rec("a", r#"{"o":4,"s":3}"#, 16)
            ]
        );
        assert_eq!(d.dropped.len(), 0);
    }

    #[test]
    fn records_of_a_key_at_the_same_time_are_all_kept_in_arrival_order() {
        let mut d = driver("inner");
        order(&mut d, "a", 1, 10);
        order(&mut d, "a", 2, 10);
        d.commit();
        order(&mut d, "a", 3, 10);
        shipment(&mut d, "a", 1, 11);
        let values: Vec<String> = sent(&d).into_iter().map(|r| r.1).collect();
        assert_eq!(
            values,
            [r#"{"o":1,"s":1}"#, r#"{"o":2,"s":1}"#, r#"{"o":3,"s":1}"#]
        );
    }

    #[test]
    fn a_left_join_holds_an_unjoined_record_until_its_window_and_grace_have_passed() {
        let mut d = driver("left");
        order(&mut d, "a", 1, 10);
        order(&mut d, "b", 2, 11);
        shipment(&mut d, "b", 1, 15); // joins order 2: it is never emitted unjoined
        shipment(&mut d, "c", 2, 16); // stream time 16 = 10 + 5 + 1: still open
        assert_eq!(sent(&d), [rec("b", r#"{"o":2,"s":1}"#, 15)]);
        // Stream time 17 closes order 1's window: it comes out before this record's results.
        order(&mut d, "c", 3, 17);
        assert_eq!(
            sent(&d)[1..],
            [
                rec("a", r#"{"o":1,"s":null}"#, 10),
                rec("c", r#"{"o":3,"s":2}"#, 17)
            ]
        );
        // An order whose window has passed already is emitted at once; an inner join drops it.
        order(&mut d, "d", 4, 5);
        assert_eq!(sent(&d)[3..], [rec("d", r#"{"o":4,"s":null}"#, 5)]);
        // A shipment nothing joins is not emitted by a left join.
        shipment(&mut d, "e", 5, 30);
        order(&mut d, "f", 5, 40);
        assert_eq!(sent(&d).len(), 4, "{:?}", sent(&d));
    }

    /// The scan for closed records remembers the time of the entry it stopped at (both sides
    /// still open), as Kafka Streams 4.x does: the next scan waits for it, so a late partner
    /// can still join a held record instead of finding it emitted unjoined.
    #[test]
    fn the_scan_remembers_where_it_stopped_so_a_late_partner_still_joins() {
        let mut d = driver("outer");
        order(&mut d, "a", 1, 10);
        shipment(&mut d, "x", 1, 15);
        order(&mut d, "y", 2, 15);
        order(&mut d, "z", 3, 16);
        shipment(&mut d, "a", 2, 11); // late: joins a, which waits no more
        order(&mut d, "w", 4, 17); // scans: x and y still open, stops at z (16)
        order(&mut d, "v", 5, 22); // 16 + 6 is not before 22: no scan
        order(&mut d, "x", 6, 14); // late: joins the held shipment x
        assert_eq!(
            sent(&d),
            [
                rec("a", r#"{"o":1,"s":2}"#, 11),
                rec("x", r#"{"o":6,"s":1}"#, 15)
            ]
        );
        order(&mut d, "q", 7, 23); // scans: y and z closed; x was joined
        assert_eq!(
            sent(&d)[2..],
            [
                rec("y", r#"{"o":2,"s":null}"#, 15),
                rec("z", r#"{"o":3,"s":null}"#, 16)
            ]
        );
    }

    #[test]
    fn an_outer_join_emits_both_sides_unjoined_once_closed() {
        let mut d = driver("outer");
        shipment(&mut d, "a", 1, 10);
        order(&mut d, "b", 1, 11);
        order(&mut d, "z", 9, 30);
        assert_eq!(
            sent(&d),
            [
                rec("a", r#"{"o":null,"s":1}"#, 10),
                rec("b", r#"{"o":1,"s":null}"#, 11)
            ]
        );
        // A record without a key is emitted unjoined at once by an outer side.
        d.process_input(SHIPMENTS, None, Some(r#"{"s":7}"#), 31);
        assert_eq!(sent(&d)[2..], [rec("null", r#"{"o":null,"s":7}"#, 31)]);
        // An inner join drops it.
        let mut d = driver("inner");
        d.process_input(SHIPMENTS, None, Some(r#"{"s":7}"#), 31);
        d.process_input(ORDERS, Some("a"), None, 31);
        assert!(sent(&d).is_empty());
        assert_eq!(d.dropped.len(), 2, "{:?}", d.dropped);
    }
}

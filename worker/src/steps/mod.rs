//! The declarative steps of an app file, as processors. Expressions are jq: `.` is the value,
//! `$key` the key, `$ts` the timestamp, `$window` the record's window (`{start, end}`, null
//! outside a window) and, in `aggregate.add` and `reduce.with`, `$agg` the current aggregate.

#[cfg(test)]
pub(crate) mod driver;
pub mod join;
pub mod session;
pub mod sliding;
pub mod stream_join;
pub mod suppress;
pub mod window;

use crate::expr::{Expr, Input, Val, as_i64, from_i64, truthy};
use crate::format;
use crate::processor::{Context, ProcessError, Processor};
use crate::record::{Data, Record};
use eddy_crds::Format;

fn val_of(d: &Option<Data>) -> Result<Val, ProcessError> {
    match d {
        Some(d) => d.to_val().map_err(ProcessError::bad),
        None => Ok(Val::Null),
    }
}

/// The variables every expression of a step sees, in [`VARS`] order.
fn vars(r: &Record) -> Result<[Val; 3], ProcessError> {
    Ok([val_of(&r.key)?, from_i64(r.timestamp), window_val(r)])
}

/// A join's `as` for one result: `.` the left value, `$right` the right one (null where a
/// side is missing), `$key` and `$ts` the result's. A joiner giving null makes a tombstone, as a
/// Java joiner returning null does.
fn joined_value(
    joiner: &Expr,
    key: &Option<Data>,
    left: &Option<Data>,
    right: Val,
    timestamp: i64,
) -> Result<Option<Data>, ProcessError> {
    let vars = [val_of(key)?, from_i64(timestamp), Val::Null, right];
    let joined = one(joiner, left, &vars)?;
    Ok((joined != Val::Null).then_some(Data::Val(joined)))
}

/// Names of the variables of [`vars`]; aggregations add `agg`.
pub const VARS: [&str; 3] = ["key", "ts", "window"];
/// [`VARS`] and the current aggregate.
pub const AGG_VARS: [&str; 4] = ["key", "ts", "window", "agg"];
/// [`VARS`] and the table's value (`join.as`).
pub const JOIN_VARS: [&str; 4] = ["key", "ts", "window", "right"];
/// [`AGG_VARS`] and the other session's aggregate (`aggregate.merge`).
pub const MERGE_VARS: [&str; 5] = ["key", "ts", "window", "agg", "other"];

/// `$window`: `{start, end}` of a windowed result, null otherwise.
fn window_val(r: &Record) -> Val {
    r.window.map_or(Val::Null, window_object)
}

/// A window as jq sees it: `{start, end}`.
pub(crate) fn window_object(w: crate::window::Window) -> Val {
    Val::obj(
        [("start", w.start), ("end", w.end)]
            .into_iter()
            .map(|(k, v)| (Val::from(k.to_string()), from_i64(v)))
            .collect(),
    )
}

/// What the direct evaluator reads: JSON bytes not decoded yet, or the decoded value. `None`
/// for values of other formats not decoded yet (jaq's path decodes them and reports errors).
fn input_of(d: &Option<Data>) -> Option<Input<'_>> {
    match d {
        Some(Data::Raw {
            bytes,
            format,
            decoded,
        }) => match (decoded.get(), format) {
            (Some(v), _) => Some(Input::Val(v)),
            (None, Format::Json) => Some(Input::Json(bytes)),
            (None, _) => None,
        },
        Some(Data::Val(v)) => Some(Input::Val(v)),
        None => Some(Input::Null),
    }
}

/// The expression's output on the record's value: directly when it can, else through jaq.
fn fast(e: &Expr, value: &Option<Data>, vars: &[Val]) -> Option<Val> {
    e.fast(input_of(value)?, vars)
}

/// The expression's single output on the record's value.
fn one(e: &Expr, value: &Option<Data>, vars: &[Val]) -> Result<Val, ProcessError> {
    if let Some(v) = fast(e, value, vars) {
        return Ok(v);
    }
    e.one(val_of(value)?, vars).map_err(ProcessError::bad)
}

pub struct Filter(pub Expr);

/// A windowed result without a value says a session is gone (merged into another): it
/// passes `filter` and `map` as it is, as Kafka Streams' table operations pass tombstones.
fn removed_window(r: &Record) -> bool {
    r.window.is_some() && r.value.is_none()
}

impl Processor for Filter {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if removed_window(&r) {
            ctx.forward(r);
            return Ok(());
        }
        let vars = vars(&r)?;
        let keep = match fast(&self.0, &r.value, &vars) {
            Some(v) => truthy(&v),
            None => self
                .0
                .run(val_of(&r.value)?, &vars)
                .map_err(ProcessError::bad)?
                .first()
                .is_some_and(truthy),
        };
        if keep {
            ctx.forward(r);
        }
        Ok(())
    }
}

pub struct Map(pub Expr);

impl Processor for Map {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if removed_window(&r) {
            ctx.forward(r);
            return Ok(());
        }
        for v in self
            .0
            .run(val_of(&r.value)?, &vars(&r)?)
            .map_err(ProcessError::bad)?
        {
            ctx.forward(Record {
                key: r.key.clone(),
                value: Some(Data::Val(v)),
                timestamp: r.timestamp,
                window: r.window,
            });
        }
        Ok(())
    }
}

/// Re-key and write to the repartition topic, partitioned by the new key's bytes, so every
/// record of a key reaches the same downstream task.
pub struct GroupBy {
    pub expr: Expr,
    pub key_format: Format,
    pub value_format: Format,
    pub topic: String,
}

impl Processor for GroupBy {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let key = one(&self.expr, &r.value, &vars(&r)?)?;
        let key = format::encode(self.key_format, &key).map_err(ProcessError::bad)?;
        let value = match &r.value {
            Some(v) => Some(v.to_bytes(self.value_format).map_err(ProcessError::bad)?),
            None => None,
        };
        ctx.send(&self.topic, Some(&key), value.as_deref(), r.timestamp)
    }
}

/// Stream aggregations ignore records without a key or value, as Kafka Streams does.
pub(crate) fn key_bytes(r: &Record, format: Format) -> Result<Option<Vec<u8>>, ProcessError> {
    match (&r.key, &r.value) {
        (Some(k), Some(_)) => Ok(Some(
            k.to_bytes(format).map_err(ProcessError::bad)?.into_owned(),
        )),
        (None, _) => Err(ProcessError::Skip(
            "null key: aggregations need a key".into(),
        )),
        (_, None) => Err(ProcessError::Skip(
            "null value: aggregations ignore tombstones".into(),
        )),
    }
}

/// A windowed aggregation's key bytes ([`key_bytes`]); a record at a negative event time is
/// dropped, as windows (`what`: windows or sessions) start at 0.
pub(crate) fn windowed_key(
    r: &Record,
    format: Format,
    what: &str,
) -> Result<Option<Vec<u8>>, ProcessError> {
    let key = key_bytes(r, format)?;
    if r.timestamp < 0 {
        return Err(ProcessError::Skip(format!(
            "timestamp {} is negative: {what} start at 0",
            r.timestamp
        )));
    }
    Ok(key)
}

/// How an aggregation combines a record with what its store holds for the key (or the key
/// and window).
#[derive(Clone)]
pub enum Fold {
    /// The number of records, as an 8-byte big-endian long.
    Count,
    /// `initial` for the first record, then `add` with `$agg` the current aggregate (JSON);
    /// sessions combine with `merge` (`$agg` and `$other`).
    Aggregate {
        initial: Expr,
        add: Expr,
        merge: Option<Expr>,
    },
    /// The first value as it is, then `with` of `$agg` and the new value, in `format`.
    Reduce { with: Expr, format: Format },
}

/// What an aggregation's store holds is corrupt: the worker stops rather than guess.
fn corrupt(store: &str, what: &str) -> ProcessError {
    ProcessError::Fatal(format!("store {store:?} holds {what}"))
}

/// A stored count.
fn stored_count(store: &str, b: &[u8]) -> Result<i64, ProcessError> {
    <[u8; 8]>::try_from(b)
        .map(i64::from_be_bytes)
        .map_err(|_| corrupt(store, "a count that is not 8 bytes"))
}

/// A stored aggregate or reduced value, as jq sees it.
fn stored_val(store: &str, format: Format, b: &[u8]) -> Result<Val, ProcessError> {
    format::decode(format, b).map_err(|e| match format {
        Format::Json => corrupt(store, &format!("bad JSON: {e}")),
        _ => corrupt(store, &format!("a value that is not {format:?}: {e}")),
    })
}

impl Fold {
    /// The new stored bytes after `r`, given the old ones. `window` is the record's window
    /// in a windowed aggregation (`$window` in the expressions).
    pub(crate) fn apply(
        &self,
        store: &str,
        old: Option<Vec<u8>>,
        r: &Record,
        window: Val,
    ) -> Result<Vec<u8>, ProcessError> {
        match self {
            Fold::Count => {
                let n = old.map_or(Ok(0), |b| stored_count(store, &b))?;
                Ok((n + 1).to_be_bytes().to_vec())
            }
            Fold::Aggregate { initial, add, .. } => {
                let (k, ts) = (val_of(&r.key)?, from_i64(r.timestamp));
                let agg = match old {
                    Some(b) => stored_val(store, Format::Json, &b)?,
                    None => one(initial, &r.value, &[k.clone(), ts.clone(), window.clone()])?,
                };
                let new = one(add, &r.value, &[k, ts, window, agg])?;
                format::encode(Format::Json, &new).map_err(ProcessError::bad)
            }
            Fold::Reduce { with, format } => {
                let value = r.value.as_ref().ok_or_else(|| {
                    ProcessError::Skip("null value: aggregations ignore tombstones".into())
                })?;
                let Some(b) = old else {
                    return Ok(value
                        .to_bytes(*format)
                        .map_err(ProcessError::bad)?
                        .into_owned());
                };
                let agg = stored_val(store, *format, &b)?;
                let new = one(
                    with,
                    &r.value,
                    &[val_of(&r.key)?, from_i64(r.timestamp), window, agg],
                )?;
                format::encode(*format, &new).map_err(ProcessError::bad)
            }
        }
    }

    /// Combine what a session store holds for a session a record bridges (`other`) into
    /// the aggregate so far (`None`: nothing yet). As Kafka Streams' session aggregation, an
    /// `aggregate` starts from `initial` of the record, then merges each session in turn;
    /// counts add; a reduce combines the two values with `with`.
    pub(crate) fn merge(
        &self,
        store: &str,
        agg: Option<Vec<u8>>,
        other: &[u8],
        r: &Record,
        window: Val,
    ) -> Result<Vec<u8>, ProcessError> {
        match self {
            Fold::Count => {
                let a = agg.map_or(Ok(0), |b| stored_count(store, &b))?;
                Ok((a + stored_count(store, other)?).to_be_bytes().to_vec())
            }
            Fold::Aggregate { initial, merge, .. } => {
                let merge = merge.as_ref().ok_or_else(|| {
                    ProcessError::Fatal(format!(
                        "store {store:?}: a session aggregate without merge"
                    ))
                })?;
                let (k, ts) = (val_of(&r.key)?, from_i64(r.timestamp));
                let a = match agg {
                    Some(b) => stored_val(store, Format::Json, &b)?,
                    None => one(initial, &r.value, &[k.clone(), ts.clone(), window.clone()])?,
                };
                let o = stored_val(store, Format::Json, other)?;
                let new = one(merge, &r.value, &[k, ts, window, a, o])?;
                format::encode(Format::Json, &new).map_err(ProcessError::bad)
            }
            Fold::Reduce { with, format } => {
                let Some(a) = agg else {
                    return Ok(other.to_vec());
                };
                let a = stored_val(store, *format, &a)?;
                let o = Some(Data::raw(other, *format));
                let new = one(
                    with,
                    &o,
                    &[val_of(&r.key)?, from_i64(r.timestamp), window, a],
                )?;
                format::encode(*format, &new).map_err(ProcessError::bad)
            }
        }
    }
}

/// `count`, `aggregate` or `reduce` per key into a key-value store; the store's updates go
/// downstream when the cache flushes.
pub struct Aggregation {
    pub store: String,
    pub key_format: Format,
    pub fold: Fold,
}

impl Processor for Aggregation {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = key_bytes(&r, self.key_format)? else {
            return Ok(());
        };
        let mut store = ctx.store(&self.store)?;
        let old = store.get(&key)?;
        let new = self.fold.apply(&self.store, old, &r, Val::Null)?;
        store.put(&key, &new, r.timestamp);
        Ok(())
    }
}

/// `from.timestamp`: the record's event time from its value.
pub struct Timestamp(pub Expr);

impl Processor for Timestamp {
    fn process(&mut self, mut r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let v = one(&self.0, &r.value, &vars(&r)?)?;
        let bad = |why: String| {
            ProcessError::BadRecord(format!(
                "timestamp expression {:?} gave {why}",
                self.0.source()
            ))
        };
        let t = as_i64(&v).ok_or_else(|| {
            bad(format!(
                "{v}: expected milliseconds since the epoch (an integer)"
            ))
        })?;
        // Kafka has no time before the epoch (a producer would stamp the send time instead),
        // and one a written topic refuses would stop the task after its stores changed.
        if t < 0 {
            return Err(bad(format!(
                "{t}: a time before 1970 (negative milliseconds)"
            )));
        }
        ctx.check_timestamp(t)
            .map_err(|e| bad(format!("{t}, which is refused: {e}")))?;
        r.timestamp = t;
        ctx.forward(r);
        Ok(())
    }
}

pub struct To {
    pub topic: String,
    pub key_format: Format,
    /// A windowed key's inner key format (the key's format before the window).
    pub inner_key_format: Format,
    /// Windowed keys are sessions (written `windowed` with their end, as Kafka Streams'
    /// `SessionWindowedSerializer`).
    pub session: bool,
    pub value_format: Format,
}

impl Processor for To {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let value = match &r.value {
            Some(v) => Some(v.to_bytes(self.value_format).map_err(ProcessError::bad)?),
            None => None,
        };
        let key = match (&r.key, r.window) {
            (Some(k), Some(w)) => {
                let key = crate::window::encode_key(
                    self.key_format,
                    k,
                    self.inner_key_format,
                    w,
                    self.session,
                )
                .map_err(ProcessError::bad)?;
                if self.key_format == Format::Windowed {
                    // Kafka Streams partitions a windowed key by its inner key, so that every
                    // window of a key lands in that key's partition.
                    let inner = k
                        .to_bytes(self.inner_key_format)
                        .map_err(ProcessError::bad)?;
                    return ctx.send_partitioned_by(
                        &self.topic,
                        &inner,
                        Some(&key),
                        value.as_deref(),
                        r.timestamp,
                    );
                }
                Some(std::borrow::Cow::Owned(key))
            }
            (Some(k), None) => Some(k.to_bytes(self.key_format).map_err(ProcessError::bad)?),
            (None, _) => None,
        };
        ctx.send(&self.topic, key.as_deref(), value.as_deref(), r.timestamp)
    }
}

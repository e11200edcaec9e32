//! The declarative steps of an app file, as processors. Expressions are jq: `.` is the value,
//! `$key` the key, `$ts` the timestamp and, in `aggregate.add`, `$agg` the current aggregate.

use crate::expr::{Expr, Input, Val, from_i64, truthy};
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

fn vars(r: &Record) -> Result<[Val; 2], ProcessError> {
    Ok([val_of(&r.key)?, from_i64(r.timestamp)])
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

impl Processor for Filter {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
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
        for v in self
            .0
            .run(val_of(&r.value)?, &vars(&r)?)
            .map_err(ProcessError::bad)?
        {
            ctx.forward(Record {
                key: r.key.clone(),
                value: Some(Data::Val(v)),
                timestamp: r.timestamp,
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
fn key_bytes(r: &Record, format: Format) -> Result<Option<Vec<u8>>, ProcessError> {
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

pub struct Count {
    pub store: String,
    pub key_format: Format,
}

impl Processor for Count {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = key_bytes(&r, self.key_format)? else {
            return Ok(());
        };
        let mut store = ctx.store(&self.store)?;
        let n = match store.get(&key)? {
            Some(b) => i64::from_be_bytes(b.as_slice().try_into().map_err(|_| {
                ProcessError::Fatal(format!(
                    "store {:?} holds a count that is not 8 bytes",
                    self.store
                ))
            })?),
            None => 0,
        };
        store.put(&key, &(n + 1).to_be_bytes(), r.timestamp);
        Ok(())
    }
}

pub struct Aggregate {
    pub store: String,
    pub key_format: Format,
    pub initial: Expr,
    pub add: Expr,
}

impl Processor for Aggregate {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(key) = key_bytes(&r, self.key_format)? else {
            return Ok(());
        };
        let [k, ts] = vars(&r)?;
        let old = ctx.store(&self.store)?.get(&key)?;
        let agg = match old {
            Some(b) => format::decode(Format::Json, &b).map_err(|e| {
                ProcessError::Fatal(format!("store {:?} holds bad JSON: {e}", self.store))
            })?,
            None => one(&self.initial, &r.value, &[k.clone(), ts.clone()])?,
        };
        let new = one(&self.add, &r.value, &[k, ts, agg])?;
        let bytes = format::encode(Format::Json, &new).map_err(ProcessError::bad)?;
        ctx.store(&self.store)?.put(&key, &bytes, r.timestamp);
        Ok(())
    }
}

pub struct To {
    pub topic: String,
    pub key_format: Format,
    pub value_format: Format,
}

impl Processor for To {
    fn process(&mut self, r: Record, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let key = match &r.key {
            Some(k) => Some(k.to_bytes(self.key_format).map_err(ProcessError::bad)?),
            None => None,
        };
        let value = match &r.value {
            Some(v) => Some(v.to_bytes(self.value_format).map_err(ProcessError::bad)?),
            None => None,
        };
        ctx.send(&self.topic, key.as_deref(), value.as_deref(), r.timestamp)
    }
}

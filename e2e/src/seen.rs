//! An aggregate that shows lost updates, not only lost records. A plain count cannot: under
//! at-least-once a record may be processed twice, and one duplicate hides one lost update
//! from a check of the final count. Records carry a sequence number `i` that grows per key
//! (as [`crate::Load`] writes them: `{"i": N}`, any integers); per key the aggregate keeps `n`, the records
//! whose `i` is above the last one it counted, `last`, that `i`, and `c`, every record it
//! processed. A duplicate (replayed after a recovery) leaves `n` and `last` alone; a lost
//! update (a key's state going back to an older value, a later record building on it) leaves
//! `n` short of the distinct `i`s for good, however many duplicates come.

use anyhow::{Result, ensure};
use std::collections::{BTreeSet, HashMap};

/// The steps after `from`, indented for a `topology:` list at two spaces: the aggregate in
/// `store`, its JSON value written to `output`.
pub fn steps(store: &str, output: &str) -> String {
    format!(
        "    - aggregate: {{store: {store}, initial: '{{n: 0, last: null, c: 0}}', add: 'if .i > $agg.last then {{n: ($agg.n + 1), last: .i, c: ($agg.c + 1)}} else $agg + {{c: ($agg.c + 1)}} end'}}\n    - to: {{topic: {output}, value: json}}\n"
    )
}

/// One output of [`steps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub n: i64,
    pub last: i64,
    pub c: i64,
}

/// What the input holds of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Distinct sequence numbers.
    pub distinct: i64,
    /// The highest.
    pub last: i64,
    /// Records, duplicates included (a producer retry may write one twice).
    pub records: i64,
}

/// Per key, every committed output of [`steps`] in offset order.
pub fn outputs(topic: &str) -> Result<HashMap<String, Vec<Seen>>> {
    let mut by_key: HashMap<String, Vec<Seen>> = HashMap::new();
    for r in crate::read_all(topic)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            by_key
                .entry(String::from_utf8_lossy(&k).to_string())
                .or_default()
                .push(parse(&v)?);
        }
    }
    Ok(by_key)
}

fn field(v: &serde_json::Value, name: &str) -> Result<i64> {
    v[name]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("{v} has no integer {name}"))
}

fn parse(bytes: &[u8]) -> Result<Seen> {
    let v: serde_json::Value = serde_json::from_slice(bytes)?;
    Ok(Seen {
        n: field(&v, "n")?,
        // null (jq orders it below every number) until a record was counted.
        last: v["last"].as_i64().unwrap_or(i64::MIN),
        c: field(&v, "c")?,
    })
}

/// Per key, what `topic` holds (values `{"i": N}`).
pub fn sent(topic: &str) -> Result<HashMap<String, Sent>> {
    let mut seqs: HashMap<String, (BTreeSet<i64>, i64)> = HashMap::new();
    for r in crate::read_all(topic)? {
        if let (Some(k), Some(v)) = (r.key, r.value) {
            let i = field(&serde_json::from_slice(&v)?, "i")?;
            let e = seqs
                .entry(String::from_utf8_lossy(&k).to_string())
                .or_default();
            e.0.insert(i);
            e.1 += 1;
        }
    }
    Ok(seqs
        .into_iter()
        .map(|(k, (set, records))| {
            let sent = Sent {
                distinct: i64::try_from(set.len()).unwrap_or(i64::MAX),
                last: set.last().copied().unwrap_or(-1),
                records,
            };
            (k, sent)
        })
        .collect())
}

/// Whether `output` accounts for every record of `input`. Exactly-once: each key's outputs
/// count every record once: `c` strictly increasing from one output to the next (an error
/// otherwise: a record counted twice stays counted) up to all of them. At-least-once: each key's last output counts every
/// distinct sequence number up to the highest: nothing lost.
pub fn complete(input: &HashMap<String, Sent>, output: &str, exactly_once: bool) -> Result<bool> {
    let out = outputs(output)?;
    if exactly_once {
        for (k, v) in &out {
            ensure!(
                v.windows(2).all(|w| w[0].c < w[1].c),
                "exactly-once: {k}'s outputs count a record twice (c does not strictly increase): {v:?}"
            );
        }
    }
    Ok(input.iter().all(|(k, s)| {
        out.get(k).and_then(|v| v.last()).is_some_and(|o| {
            o.n == s.distinct && o.last == s.last && (!exactly_once || o.c == s.records)
        })
    }))
}

/// Keys whose last output shows an update lost (`n` short while `last` is the highest), for a
/// failure message.
pub fn lost(input: &HashMap<String, Sent>, output: &str) -> Result<Vec<(String, Sent, Seen)>> {
    let out = outputs(output)?;
    let mut lost: Vec<(String, Sent, Seen)> = input
        .iter()
        .filter_map(|(k, s)| {
            let o = *out.get(k)?.last()?;
            (o.last == s.last && o.n < s.distinct).then(|| (k.clone(), *s, o))
        })
        .collect();
    lost.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(lost)
}

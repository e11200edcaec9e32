//! Windows (Kafka Streams' `TimeWindows`, `SlidingWindows`, `SessionWindows`): which windows a
//! record falls in, and how window and session stores lay out their keys.
//!
//! A window store keeps one value per key and window. Its changelog (and record cache) key is
//! the inner key followed by the window start as an 8-byte big-endian long; a session store's
//! is the inner key, the session's end, then its start (Kafka Streams' `SessionKeySchema`). In
//! RocksDB the same key is prefixed with the segment of its time (a window's start, a session's
//! end), so that expiry drops whole segments with one range deletion instead of deleting key by
//! key, and the files of expired segments go away in compaction without being read.

use crate::format;
use crate::record::Data;
use eddy_crds::Format;
use eddy_crds::step::WindowKind;

/// A window: `[start, end)` in milliseconds of event time (a session's and a sliding window's
/// end is inclusive, as in Kafka Streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

/// The windows of one `window` step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeWindows {
    pub size: i64,
    pub advance: i64,
    pub grace: i64,
}

impl TimeWindows {
    pub fn new(
        size: eddy_crds::Duration,
        advance: eddy_crds::Duration,
        grace: eddy_crds::Duration,
    ) -> Self {
        Self {
            size: size.millis_i64().max(1),
            advance: advance.millis_i64().max(1),
            grace: grace.millis_i64(),
        }
    }

    /// Every window that holds `ts`, earliest first. As in Kafka Streams, windows start at 0 or
    /// later: a record at a negative time has none.
    pub fn windows_for(&self, ts: i64) -> impl Iterator<Item = Window> + use<> {
        let (size, advance) = (self.size, self.advance);
        let first = if ts < 0 {
            i64::MAX
        } else {
            (ts.saturating_sub(size).saturating_add(advance)).max(0) / advance * advance
        };
        let starts = (0..)
            .map(move |i: i64| first.saturating_add(i.saturating_mul(advance)))
            .take_while(move |s| *s <= ts && ts >= 0);
        starts.map(move |start| Window {
            start,
            end: start.saturating_add(size),
        })
    }

    /// The window that starts at `start`.
    pub fn at(&self, start: i64) -> Window {
        Window {
            start,
            end: start.saturating_add(self.size),
        }
    }
}

/// The windows of one `window` step, of any kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    Time(TimeWindows),
    /// Windows `[t - size, t]` ending at records, and those starting just after them.
    Sliding {
        size: i64,
        grace: i64,
    },
    /// Sessions of a key's records no more than `gap` apart.
    Session {
        gap: i64,
        grace: i64,
    },
}

impl Windows {
    pub fn new(kind: WindowKind, grace: eddy_crds::Duration) -> Self {
        let g = grace.millis_i64();
        match kind {
            WindowKind::Tumbling { size } => Windows::Time(TimeWindows::new(size, size, grace)),
            WindowKind::Hopping { size, advance } => {
                Windows::Time(TimeWindows::new(size, advance, grace))
            }
            WindowKind::Sliding { size } => Windows::Sliding {
                size: size.millis_i64().max(1),
                grace: g,
            },
            WindowKind::Session { gap } => Windows::Session {
                gap: gap.millis_i64().max(1),
                grace: g,
            },
        }
    }

    /// How the store of these windows lays out its keys.
    pub fn schema(&self) -> KeySchema {
        match self {
            Windows::Time(t) => KeySchema::Window { size: t.size },
            Windows::Sliding { size, .. } => KeySchema::Window { size: *size },
            Windows::Session { .. } => KeySchema::Session,
        }
    }

    /// How long after a window's end a record may still change it: a window's final result
    /// is known once stream time passes its end by this (Kafka Streams' suppression waits as
    /// long: the grace, plus the gap for sessions, which a record that late can still extend).
    pub fn close_after_end(&self) -> i64 {
        match self {
            Windows::Time(t) => t.grace,
            Windows::Sliding { grace, .. } => *grace,
            Windows::Session { gap, grace } => gap.saturating_add(*grace),
        }
    }
}

impl std::fmt::Display for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = |ms: i64| eddy_crds::Duration::from_millis(ms.max(0) as u64);
        match self {
            Windows::Time(t) => t.fmt(f),
            Windows::Sliding { size, grace } => {
                write!(f, "sliding {}, grace {}", d(*size), d(*grace))
            }
            Windows::Session { gap, grace } => {
                write!(f, "session gap {}, grace {}", d(*gap), d(*grace))
            }
        }
    }
}

/// How a windowed store's keys carry their window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySchema {
    /// Inner key ‖ start: windows of one size.
    Window { size: i64 },
    /// Inner key ‖ end ‖ start: sessions, whose length varies.
    Session,
}

impl KeySchema {
    fn suffix(&self) -> usize {
        match self {
            KeySchema::Window { .. } => START_LEN,
            KeySchema::Session => 2 * START_LEN,
        }
    }

    /// The store key of an inner key's window.
    pub fn key(&self, inner: &[u8], w: Window) -> Vec<u8> {
        match self {
            KeySchema::Window { .. } => key(inner, w.start),
            KeySchema::Session => {
                let mut k = Vec::with_capacity(inner.len() + 2 * START_LEN);
                k.extend_from_slice(inner);
                k.extend_from_slice(&w.end.to_be_bytes());
                k.extend_from_slice(&w.start.to_be_bytes());
                k
            }
        }
    }

    /// The inner key and window of a store key; `None` for a key too short to be one.
    pub fn split<'a>(&self, k: &'a [u8]) -> Option<(&'a [u8], Window)> {
        match self {
            KeySchema::Window { size } => split(k).map(|(inner, start)| {
                (
                    inner,
                    Window {
                        start,
                        end: start.saturating_add(*size),
                    },
                )
            }),
            KeySchema::Session => {
                let (rest, start) = split(k)?;
                let (inner, end) = split(rest)?;
                Some((inner, Window { start, end }))
            }
        }
    }

    /// The time a key is segmented and expired by: a window's start, a session's end (as
    /// Kafka Streams' key schemas).
    pub fn time(&self, k: &[u8]) -> Option<i64> {
        let at = k.len().checked_sub(self.suffix())?;
        Some(i64::from_be_bytes(
            k.get(at..at + START_LEN)?.try_into().ok()?,
        ))
    }

    /// Store keys of `inner`'s windows whose time is in `[from, to]` lie in `[lo, hi]`, among
    /// keys of other inner keys that start with the same bytes (callers skip those).
    pub fn bounds(&self, inner: &[u8], from: i64, to: i64) -> (Vec<u8>, Vec<u8>) {
        let (mut lo, mut hi) = (inner.to_vec(), inner.to_vec());
        lo.extend_from_slice(&from.max(0).to_be_bytes());
        hi.extend_from_slice(&to.max(0).to_be_bytes());
        if *self == KeySchema::Session {
            lo.extend_from_slice(&[0; START_LEN]);
            hi.extend_from_slice(&[0xff; START_LEN]);
        }
        (lo, hi)
    }

    /// `k` is a key of `inner` with its time in `[from, to]`.
    pub fn matches(&self, k: &[u8], inner: &[u8], from: i64, to: i64) -> bool {
        k.len() == inner.len() + self.suffix()
            && k.starts_with(inner)
            && self.time(k).is_some_and(|t| from <= t && t <= to)
    }
}

/// As users write them: `tumbling 5m, grace 30s` or `hopping 1h advancing 5m, grace 0ms`.
impl std::fmt::Display for TimeWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = |ms: i64| eddy_crds::Duration::from_millis(ms.max(0) as u64);
        if self.size == self.advance {
            write!(f, "tumbling {}", d(self.size))?;
        } else {
            write!(f, "hopping {} advancing {}", d(self.size), d(self.advance))?;
        }
        write!(f, ", grace {}", d(self.grace))
    }
}

const START_LEN: usize = 8;

/// Bytes of the timestamp some stored values start with (sliding windows' largest record time,
/// a suppression buffer's record time).
pub const TIMESTAMP_LEN: usize = 8;

/// A value stored with its timestamp in front: `ts` then `value`.
pub fn with_timestamp(ts: i64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(TIMESTAMP_LEN + value.len());
    v.extend_from_slice(&ts.to_be_bytes());
    v.extend_from_slice(value);
    v
}

/// The timestamp and value of [`with_timestamp`]'s bytes; `None` if too short.
pub fn split_timestamp(v: &[u8]) -> Option<(i64, &[u8])> {
    let (ts, value) = v.split_at_checked(TIMESTAMP_LEN)?;
    Some((i64::from_be_bytes(ts.try_into().ok()?), value))
}
const SEGMENT_LEN: usize = 8;

/// Changelog and cache key of a window: the inner key, then the start (big-endian, so a
/// key's windows sort by time).
pub fn key(inner: &[u8], start: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(inner.len() + START_LEN);
    k.extend_from_slice(inner);
    k.extend_from_slice(&start.to_be_bytes());
    k
}

/// The inner key and window start of a changelog key; `None` for a key too short to be one.
pub fn split(key: &[u8]) -> Option<(&[u8], i64)> {
    let at = key.len().checked_sub(START_LEN)?;
    let (inner, start) = key.split_at(at);
    Some((inner, i64::from_be_bytes(start.try_into().ok()?)))
}

/// How a window store is cut into segments on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segments {
    /// Milliseconds of window times (starts, or sessions' ends) per segment.
    pub interval: i64,
    pub retention: i64,
    pub schema: KeySchema,
}

impl Segments {
    /// Kafka Streams' choice: half the retention, at least a minute, so at most about one
    /// segment's worth of expired windows stays on disk.
    pub fn for_retention(retention: eddy_crds::Duration, schema: KeySchema) -> Self {
        let retention = retention.millis_i64();
        Self {
            interval: (retention / 2).max(60_000),
            retention,
            schema,
        }
    }

    pub fn segment(&self, time: i64) -> i64 {
        time.max(0) / self.interval
    }

    /// The first bytes of every RocksDB key of a segment.
    pub fn prefix(segment: i64) -> [u8; SEGMENT_LEN] {
        ((segment as u64) | (1 << 63)).to_be_bytes()
    }

    /// The segment a RocksDB key is in, if it is a window key.
    pub fn segment_of(db_key: &[u8]) -> Option<i64> {
        let p: [u8; SEGMENT_LEN] = db_key.get(..SEGMENT_LEN)?.try_into().ok()?;
        let v = u64::from_be_bytes(p);
        (v & (1 << 63) != 0).then_some((v & !(1 << 63)) as i64)
    }

    /// The RocksDB key of a changelog key: its segment first. Keys that are not window keys
    /// (shorter than a start) keep their bytes: they sort before every segment and never expire.
    pub fn db_key(&self, key: &[u8]) -> Vec<u8> {
        match self.schema.time(key) {
            Some(time) => {
                let mut k = Vec::with_capacity(SEGMENT_LEN + key.len());
                // Sign bit set: segment keys sort after the short keys above, whatever they hold.
                k.extend_from_slice(&Self::prefix(self.segment(time)));
                k.extend_from_slice(key);
                k
            }
            None => key.to_vec(),
        }
    }

    /// The changelog key of a RocksDB key.
    pub fn changelog_key<'a>(&self, db_key: &'a [u8]) -> &'a [u8] {
        if db_key.len() >= SEGMENT_LEN + self.schema.suffix() && db_key[0] & 0x80 != 0 {
            &db_key[SEGMENT_LEN..]
        } else {
            db_key
        }
    }

    /// Windows whose time is before this have expired, given the largest time seen.
    pub fn expired_before(&self, observed: i64) -> i64 {
        observed.saturating_sub(self.retention).saturating_add(1)
    }

    /// The RocksDB key range `[from, to)` holding every segment that lies wholly before
    /// `before` (a window's time): deleting it drops expired windows a segment at a time.
    pub fn expired_range(&self, before: i64) -> Option<(Vec<u8>, Vec<u8>)> {
        let last_live = self.segment(before);
        (last_live > 0).then(|| (Self::prefix(0).to_vec(), Self::prefix(last_live).to_vec()))
    }
}

/// A windowed key on its way out, as `to.key` says: `windowed` is the inner key in its own
/// format then the start as an 8-byte big-endian long (Kafka Streams' `TimeWindowedSerializer`),
/// or for a session the end then the start (`SessionWindowedSerializer`); `json` is
/// `{"key", "start", "end"}`, `string` is `[key@start/end]` (`Windowed#toString`).
pub fn encode_key(
    format: Format,
    inner: &Data,
    inner_format: Format,
    w: Window,
    session: bool,
) -> Result<Vec<u8>, format::FormatError> {
    match format {
        Format::Json => {
            let key = String::from_utf8(format::encode(Format::Json, &inner.to_val()?)?)
                .map_err(|e| format::FormatError::Utf8(e.utf8_error().valid_up_to()))?;
            Ok(format!(r#"{{"key":{key},"start":{},"end":{}}}"#, w.start, w.end).into_bytes())
        }
        Format::String => {
            let key = format::encode(Format::String, &inner.to_val()?)?;
            let mut out = Vec::with_capacity(key.len() + 44);
            out.push(b'[');
            out.extend_from_slice(&key);
            out.extend_from_slice(format!("@{}/{}]", w.start, w.end).as_bytes());
            Ok(out)
        }
        _ => {
            let mut out = inner.to_bytes(inner_format)?.into_owned();
            if session {
                out.extend_from_slice(&w.end.to_be_bytes());
            }
            out.extend_from_slice(&w.start.to_be_bytes());
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_crds::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_record_falls_in_one_tumbling_window_and_in_size_over_advance_hopping_ones() {
        let t = TimeWindows::new(ms(10), ms(10), ms(0));
        assert_eq!(t.windows_for(25).collect::<Vec<_>>(), [t.at(20)]);
        assert_eq!(
            t.windows_for(30).collect::<Vec<_>>(),
            [t.at(30)],
            "end is exclusive"
        );
        assert_eq!(t.windows_for(0).collect::<Vec<_>>(), [t.at(0)]);
        assert_eq!(t.windows_for(-1).count(), 0);
        let h = TimeWindows::new(ms(10), ms(4), ms(0));
        let starts: Vec<i64> = h.windows_for(21).map(|w| w.start).collect();
        assert_eq!(starts, [12, 16, 20]);
        for w in h.windows_for(21) {
            assert!(w.start <= 21 && 21 < w.end);
        }
        let starts: Vec<i64> = h.windows_for(3).map(|w| w.start).collect();
        assert_eq!(starts, [0], "no window starts before 0");
    }

    #[test]
    fn window_keys_round_trip_and_sort_by_segment_then_key_then_start() {
        let k = key(b"user-1", 1_000);
        assert_eq!(split(&k), Some((&b"user-1"[..], 1_000)));
        assert_eq!(split(b"short"), None);
        let s = Segments::for_retention(ms(600_000), KeySchema::Window { size: 10 });
        assert_eq!(s.interval, 300_000);
        let a = s.db_key(&key(b"b", 10));
        let b = s.db_key(&key(b"a", 400_000));
        assert!(a < b, "an earlier segment sorts first whatever the key");
        assert_eq!(s.changelog_key(&a), key(b"b", 10).as_slice());
        assert!(
            s.db_key(b"meta") < a,
            "short keys sort before every segment"
        );
        assert_eq!(s.changelog_key(b"meta"), b"meta");
    }

    #[test]
    fn expiry_drops_whole_segments_older_than_the_retention() {
        let s = Segments::for_retention(ms(120_000), KeySchema::Window { size: 10 });
        assert_eq!(s.interval, 60_000);
        // Largest start seen 300_000: windows starting at 180_000 or earlier are past retention.
        let before = s.expired_before(300_000);
        assert_eq!(before, 180_001);
        let (from, to) = s.expired_range(before).expect("something expired");
        let old = s.db_key(&key(b"k", 179_999));
        let live = s.db_key(&key(b"k", 180_000));
        assert!(from.as_slice() <= old.as_slice() && old.as_slice() < to.as_slice());
        assert!(
            live.as_slice() >= to.as_slice(),
            "the segment holding a live window stays whole"
        );
        assert_eq!(s.expired_range(s.expired_before(100_000)), None);
    }
}

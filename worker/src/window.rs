//! Time windows (Kafka Streams' `TimeWindows`): which windows a record falls in, and how a
//! window store lays out its keys.
//!
//! A window store keeps one value per key and window. Its changelog (and record cache) key is
//! the inner key followed by the window start as an 8-byte big-endian long; in RocksDB the same
//! key is prefixed with the start's segment, so that expiry drops whole segments with one range
//! deletion instead of deleting key by key, and the files of expired segments go away in
//! compaction without being read.

use crate::format;
use crate::record::Data;
use eddy_crds::Format;
use eddy_crds::step::WindowKind;

/// A window: `[start, end)` in milliseconds of event time.
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
    pub fn new(kind: WindowKind, grace: eddy_crds::Duration) -> Self {
        let (size, advance) = match kind {
            WindowKind::Tumbling { size } => (size, size),
            WindowKind::Hopping { size, advance } => (size, advance),
        };
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
    /// Milliseconds of window starts per segment.
    pub interval: i64,
    pub retention: i64,
}

impl Segments {
    /// Kafka Streams' choice: half the retention, at least a minute, so at most about one
    /// segment's worth of expired windows stays on disk.
    pub fn for_retention(retention: eddy_crds::Duration) -> Self {
        let retention = retention.millis_i64();
        Self {
            interval: (retention / 2).max(60_000),
            retention,
        }
    }

    fn segment(&self, start: i64) -> i64 {
        start.max(0) / self.interval
    }

    /// The RocksDB key of a changelog key: its segment first. Keys that are not window keys
    /// (shorter than a start) keep their bytes: they sort before every segment and never expire.
    pub fn db_key(&self, key: &[u8]) -> Vec<u8> {
        match split(key) {
            Some((_, start)) => {
                let mut k = Vec::with_capacity(SEGMENT_LEN + key.len());
                // Sign bit set: segment keys sort after the short keys above, whatever they hold.
                k.extend_from_slice(&((self.segment(start) as u64) | (1 << 63)).to_be_bytes());
                k.extend_from_slice(key);
                k
            }
            None => key.to_vec(),
        }
    }

    /// The changelog key of a RocksDB key.
    pub fn changelog_key<'a>(&self, db_key: &'a [u8]) -> &'a [u8] {
        if db_key.len() >= SEGMENT_LEN + START_LEN && db_key[0] & 0x80 != 0 {
            &db_key[SEGMENT_LEN..]
        } else {
            db_key
        }
    }

    /// Windows starting before this have expired, given the largest window start seen.
    pub fn expired_before(&self, observed: i64) -> i64 {
        observed.saturating_sub(self.retention).saturating_add(1)
    }

    /// The RocksDB key range `[from, to)` holding every segment that lies wholly before
    /// `before` (a window start): deleting it drops expired windows a segment at a time.
    pub fn expired_range(&self, before: i64) -> Option<(Vec<u8>, Vec<u8>)> {
        let last_live = self.segment(before);
        (last_live > 0).then(|| {
            (
                (1u64 << 63).to_be_bytes().to_vec(),
                ((last_live as u64) | (1 << 63)).to_be_bytes().to_vec(),
            )
        })
    }
}

/// A windowed key on its way out, as `to.key` says: `windowed` is the inner key in its own
/// format then the start as an 8-byte big-endian long (Kafka Streams' `TimeWindowedSerializer`),
/// `json` is `{"key", "start", "end"}`, `string` is `[key@start/end]` (`Windowed#toString`).
pub fn encode_key(
    format: Format,
    inner: &Data,
    inner_format: Format,
    w: Window,
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
        let t = TimeWindows::new(WindowKind::Tumbling { size: ms(10) }, ms(0));
        assert_eq!(t.windows_for(25).collect::<Vec<_>>(), [t.at(20)]);
        assert_eq!(
            t.windows_for(30).collect::<Vec<_>>(),
            [t.at(30)],
            "end is exclusive"
        );
        assert_eq!(t.windows_for(0).collect::<Vec<_>>(), [t.at(0)]);
        assert_eq!(t.windows_for(-1).count(), 0);
        let h = TimeWindows::new(
            WindowKind::Hopping {
                size: ms(10),
                advance: ms(4),
            },
            ms(0),
        );
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
        let s = Segments::for_retention(ms(600_000));
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
        let s = Segments::for_retention(ms(120_000));
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

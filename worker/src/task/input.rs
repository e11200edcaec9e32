//! A task's inputs: the partition of its source and of each table it joins (Kafka Streams'
//! `PartitionGroup`). With several, records are buffered and the one with the smallest
//! timestamp goes next, so a stream record meets the table as of its time, whatever order
//! the fetches came back in.

use crate::topology::Input;
use eddy_crds::Format;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a task with several inputs holds records back for an empty input whose partition
/// has offsets past what was fetched that may hold no record: one offset (perhaps a
/// transaction's commit marker, never fetched as a record), or offsets librdkafka's fetcher
/// already read past (markers, aborted records). Past it the others go on.
pub const MAX_IDLE: Duration = Duration::from_secs(2);

/// How long a task holds records back for an empty input that has records on the broker (Kafka
/// Streams waits for inputs with lag, so that the order of the records it joins does not
/// depend on how fast each partition is fetched; a loaded machine fetches one partition
/// seconds behind another). Bounded: an aborted transaction leaves offsets that are never
/// fetched either.
pub const MAX_BEHIND: Duration = Duration::from_secs(30);

/// Records of one input a task buffers before the input's partition is paused (Kafka Streams'
/// `buffered.records.per.partition`, 1,000 there); resumed at half. Higher than Kafka Streams':
/// a fetch brings up to 1 MiB of a partition at once, and a pause drops what librdkafka has
/// queued of it, to be fetched again (at 1,000 the 100k stream-table join ran 30 % slower).
pub const PAUSE_AT: usize = 10_000;

/// How long a task holds records back for an empty input whose end is not known yet (before
/// its first fetch came back), as Kafka Streams waits for an unknown lag.
pub const MAX_UNKNOWN: Duration = Duration::from_secs(10);

/// Where an empty input stands, as far as librdkafka knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Everything its partition has was fetched: nothing to wait for.
    AtEnd,
    /// The broker has more than one offset past what was fetched.
    Behind,
    /// The broker has more offsets, which may hold no record (see [`MAX_IDLE`]).
    MaybeNoRecord,
    /// Not known yet.
    Unknown,
}

/// A record fetched and not processed yet.
#[derive(Debug)]
pub struct Buffered {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
}

/// One topic partition a task reads.
#[derive(Debug)]
pub struct TaskInput {
    pub topic: String,
    pub key_format: Format,
    pub value_format: Format,
    pub(crate) entry: Option<usize>,
    pub(crate) extracts_time: bool,
    /// Next offset to commit, once something was processed since the last commit.
    pub next_offset: Option<i64>,
    /// Offset after the last record fetched (buffered or processed), if any was.
    pub fetched: Option<i64>,
    buffer: VecDeque<Buffered>,
    /// Since when the buffer has been empty.
    empty_since: Instant,
}

impl TaskInput {
    pub fn new(input: &Input) -> Self {
        Self {
            topic: input.source.topic.clone(),
            key_format: input.source.key_format,
            value_format: input.source.value_format,
            entry: input.entry,
            extracts_time: input.extracts_time,
            next_offset: None,
            fetched: None,
            buffer: VecDeque::new(),
            empty_since: Instant::now(),
        }
    }

    /// The task starts running: an empty input is waited for from `now`.
    pub fn started(&mut self, now: Instant) {
        if self.buffer.is_empty() {
            self.empty_since = now;
        }
    }

    pub fn push(&mut self, record: Buffered) {
        self.fetched = Some(record.offset + 1);
        self.buffer.push_back(record);
    }

    pub fn pop(&mut self, now: Instant) -> Option<Buffered> {
        let r = self.buffer.pop_front();
        if self.buffer.is_empty() {
            self.empty_since = now;
        }
        r
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    fn head_timestamp(&self) -> Option<i64> {
        self.buffer.front().map(|r| r.timestamp)
    }
}

/// The input whose head record goes next: the smallest head timestamp (the earliest input on
/// a tie), once no empty input needs waiting for. An empty input is waited for unless
/// `position` says it is at its end, or it has been empty for [`MAX_BEHIND`] ([`MAX_IDLE`]
/// when what is left may hold no record, [`MAX_UNKNOWN`] while its position is unknown).
pub fn next_input(
    inputs: &[TaskInput],
    now: Instant,
    position: impl Fn(&TaskInput) -> Position,
) -> Option<usize> {
    let mut best: Option<(usize, i64)> = None;
    for (i, input) in inputs.iter().enumerate() {
        match input.head_timestamp() {
            Some(ts) => {
                if best.is_none_or(|(_, b)| ts < b) {
                    best = Some((i, ts));
                }
            }
            None => {
                let limit = match position(input) {
                    Position::AtEnd => continue,
                    Position::Behind => MAX_BEHIND,
                    Position::MaybeNoRecord => MAX_IDLE,
                    Position::Unknown => MAX_UNKNOWN,
                };
                if now.duration_since(input.empty_since) < limit {
                    return None;
                }
            }
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Source;

    fn inputs(n: usize) -> Vec<TaskInput> {
        (0..n)
            .map(|i| {
                TaskInput::new(&Input {
                    source: Source {
                        topic: format!("t{i}"),
                        key_format: Format::String,
                        value_format: Format::Json,
                        internal: false,
                    },
                    entry: None,
                    extracts_time: false,
                    table: None,
                })
            })
            .collect()
    }

    fn record(offset: i64, timestamp: i64) -> Buffered {
        Buffered {
            offset,
            key: None,
            value: None,
            timestamp,
        }
    }

    /// The order records go in, until `next_input` says wait.
    fn drain(inputs: &mut [TaskInput], now: Instant) -> Vec<(usize, i64)> {
        let mut out = Vec::new();
        while let Some(i) = next_input(inputs, now, |_| Position::AtEnd) {
            let r = inputs[i].pop(now).expect("a head record");
            out.push((i, r.timestamp));
        }
        out
    }

    #[test]
    fn the_smallest_head_timestamp_goes_first_and_each_input_keeps_its_order() {
        let now = Instant::now();
        let mut ins = inputs(2);
        for (o, ts) in [(0, 10), (1, 30), (2, 20)] {
            ins[0].push(record(o, ts));
        }
        for (o, ts) in [(0, 15), (1, 25)] {
            ins[1].push(record(o, ts));
        }
        // Input 0's 20 comes after its 30: a partition is read in offset order.
        assert_eq!(
            drain(&mut ins, now),
            [(0, 10), (1, 15), (1, 25), (0, 30), (0, 20)]
        );
        assert_eq!(ins[0].fetched, Some(3));
    }

    #[test]
    fn an_empty_input_is_waited_for_until_at_its_end_or_idle_too_long() {
        let mut ins = inputs(2);
        let start = Instant::now();
        ins[0].push(record(0, 10));
        // Input 1 just became empty and has more on the broker: wait.
        assert_eq!(next_input(&ins, start, |_| Position::Behind), None);
        // At its end: go on.
        assert_eq!(
            next_input(&ins, start, |i| match i.topic.as_str() {
                "t1" => Position::AtEnd,
                _ => Position::Behind,
            }),
            Some(0)
        );
        // Or empty for longer than the idle limit: short when all it may have left is a
        // transaction marker, longer when nothing is known of it yet, longest when the broker
        // has records for it.
        assert_eq!(
            next_input(&ins, start + MAX_IDLE, |_| Position::MaybeNoRecord),
            Some(0)
        );
        assert_eq!(
            next_input(&ins, start + MAX_UNKNOWN, |_| Position::Behind),
            None
        );
        assert_eq!(
            next_input(&ins, start + MAX_BEHIND, |_| Position::Behind),
            Some(0)
        );
        assert_eq!(
            next_input(&ins, start + MAX_IDLE, |_| Position::Unknown),
            None
        );
        assert_eq!(
            next_input(&ins, start + MAX_UNKNOWN, |_| Position::Unknown),
            Some(0)
        );
        // Nothing buffered anywhere: nothing to do.
        let empty = inputs(2);
        assert_eq!(
            next_input(&empty, start + MAX_UNKNOWN, |_| Position::AtEnd),
            None
        );
    }

    #[test]
    fn ties_go_to_the_earlier_input() {
        let now = Instant::now();
        let mut ins = inputs(2);
        ins[1].push(record(0, 5));
        ins[0].push(record(0, 5));
        assert_eq!(next_input(&ins, now, |_| Position::AtEnd), Some(0));
    }
}

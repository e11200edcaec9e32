//! The ends of the changelogs the state updater follows, from librdkafka's statistics, and when
//! a fetch response last confirmed each: what lets a standby's lag be "unknown" rather than a
//! number that stopped moving.
//!
//! librdkafka takes a partition's end (its last stable offset) from each fetch response and
//! its statistics repeat the last one every interval, answered or not: with the leader
//! unreachable the statistics still say the old end, and a lag computed from it reads 0 while
//! the changelog grows. An end counts as confirmed when the broker the partition is fetched
//! from sent two more fetch requests since the last confirmation, the partition being fetched
//! (`fetch_state` active) and the broker up throughout: librdkafka sends a broker's next fetch
//! only once the previous one returned, so a response came back in between, and it carried
//! the end of every partition fetched from that broker. An idle fetch returns after
//! `fetch.wait.max.ms` (500 ms), so a healthy consumer confirms every end about once a second.
//! What this cannot see: a partition the broker keeps answering with an error while it serves
//! the others (librdkafka backs it off and logs; the updater logs the consumer's errors).

use rdkafka::statistics::Statistics;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an end is trusted without a confirmation: five statistics intervals.
pub const FRESH_FOR: Duration = Duration::from_secs(10);

/// A partition's end as last known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    pub offset: i64,
    /// When a fetch response last confirmed it (None: not yet).
    pub confirmed: Option<Instant>,
}

/// One statistics report's view of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStat {
    pub topic: String,
    pub partition: i32,
    /// The broker it is fetched from (-1: none).
    pub broker: i32,
    /// Its fetch state is `active`.
    pub fetching: bool,
    /// Its last stable offset (negative: not known).
    pub end: i64,
}

/// One statistics report's view of a broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrokerStat {
    pub id: i32,
    pub up: bool,
    /// Fetch requests sent to it so far.
    pub fetches: i64,
}

/// The ends of the partitions in the statistics, by (topic, partition).
#[derive(Default)]
pub struct Ends {
    ends: HashMap<(String, i32), End>,
    /// Per partition, the broker it was fetched from and that broker's fetch count when it
    /// was last confirmed (or started being fetched there).
    since: HashMap<(String, i32), (i32, i64)>,
}

impl Ends {
    /// Take in one statistics report.
    pub fn observe_stats(&mut self, stats: &Statistics, now: Instant) {
        let brokers: Vec<BrokerStat> = stats
            .brokers
            .values()
            .map(|b| BrokerStat {
                id: b.nodeid,
                up: b.state == "UP",
                fetches: b.req.get("Fetch").copied().unwrap_or(0),
            })
            .collect();
        let partitions: Vec<PartitionStat> = stats
            .topics
            .iter()
            .flat_map(|(topic, t)| {
                t.partitions.values().map(move |p| PartitionStat {
                    topic: topic.clone(),
                    partition: p.partition,
                    broker: p.broker,
                    fetching: p.fetch_state == "active",
                    end: p.ls_offset,
                })
            })
            .collect();
        self.observe(&brokers, &partitions, now);
    }

    /// Take in one report's brokers and partitions, seen at `now`.
    pub fn observe(&mut self, brokers: &[BrokerStat], partitions: &[PartitionStat], now: Instant) {
        for p in partitions.iter().filter(|p| p.partition >= 0 && p.end >= 0) {
            let key = (p.topic.clone(), p.partition);
            let end = self.ends.entry(key.clone()).or_insert(End {
                offset: p.end,
                confirmed: None,
            });
            // The latest end known, confirmed or not: it only grows.
            end.offset = end.offset.max(p.end);
            let broker = brokers
                .iter()
                .find(|b| b.id == p.broker && b.up && p.fetching);
            let Some(b) = broker else {
                // Not being fetched: counting starts again once it is.
                self.since.remove(&key);
                continue;
            };
            match self.since.get(&key) {
                Some(&(id, from)) if id == b.id && b.fetches >= from + 2 => {
                    end.confirmed = Some(now);
                    self.since.insert(key, (b.id, b.fetches));
                }
                Some(&(id, _)) if id == b.id => {}
                _ => {
                    self.since.insert(key, (b.id, b.fetches));
                }
            }
        }
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<End> {
        self.ends.get(&(topic.to_string(), partition)).copied()
    }
}

/// `end` if it was confirmed within [`FRESH_FOR`] of `now`: a lag computed from an older one
/// could read 0 while the changelog grows.
pub fn fresh(end: Option<i64>, confirmed: Option<Instant>, now: Instant) -> Option<i64> {
    let at = confirmed?;
    (now.saturating_duration_since(at) <= FRESH_FOR).then_some(end?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(broker: i32, fetching: bool, end: i64) -> PartitionStat {
        PartitionStat {
            topic: "app-counts-changelog".into(),
            partition: 1,
            broker,
            fetching,
            end,
        }
    }

    fn broker(up: bool, fetches: i64) -> BrokerStat {
        BrokerStat { id: 7, up, fetches }
    }

    fn end(ends: &Ends) -> End {
        ends.get("app-counts-changelog", 1).expect("an end")
    }

    #[test]
    fn an_end_is_confirmed_only_once_a_fetch_returned_since() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut ends = Ends::default();
        ends.observe(&[broker(true, 10)], &[part(7, true, 100)], t0);
        assert_eq!(
            end(&ends).confirmed,
            None,
            "the first report only sets a baseline"
        );
        // One more fetch sent: it may still be waiting for its answer.
        ends.observe(&[broker(true, 11)], &[part(7, true, 100)], t0 + s);
        assert_eq!(end(&ends).confirmed, None);
        ends.observe(&[broker(true, 12)], &[part(7, true, 120)], t0 + 2 * s);
        assert_eq!(
            end(&ends),
            End {
                offset: 120,
                confirmed: Some(t0 + 2 * s)
            }
        );
    }

    #[test]
    fn statistics_that_repeat_an_end_without_fetches_do_not_confirm_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut ends = Ends::default();
        ends.observe(&[broker(true, 10)], &[part(7, true, 100)], t0);
        ends.observe(&[broker(true, 12)], &[part(7, true, 100)], t0 + s);
        assert_eq!(end(&ends).confirmed, Some(t0 + s));
        // The leader unreachable: the statistics keep saying 100, every second.
        for i in 2..30 {
            ends.observe(&[broker(false, 12)], &[part(7, true, 100)], t0 + i * s);
        }
        assert_eq!(end(&ends).confirmed, Some(t0 + s));
        assert_eq!(
            fresh(
                Some(100),
                end(&ends).confirmed,
                t0 + 11 * s + Duration::from_millis(1)
            ),
            None,
            "stale past the bound"
        );
        assert_eq!(
            fresh(Some(100), end(&ends).confirmed, t0 + 11 * s),
            Some(100)
        );
        // Back up: two fetches since it came back confirm it again.
        ends.observe(&[broker(true, 13)], &[part(7, true, 140)], t0 + 30 * s);
        assert_eq!(end(&ends).confirmed, Some(t0 + s));
        assert_eq!(end(&ends).offset, 140, "a later end is taken, unconfirmed");
        ends.observe(&[broker(true, 15)], &[part(7, true, 150)], t0 + 31 * s);
        assert_eq!(end(&ends).confirmed, Some(t0 + 31 * s));
    }

    #[test]
    fn fetches_count_only_while_the_partition_is_fetched_from_that_broker() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut ends = Ends::default();
        ends.observe(&[broker(true, 10)], &[part(7, true, 100)], t0);
        // Fetches went on, but not for this partition (offset lookup, backoff).
        ends.observe(&[broker(true, 20)], &[part(7, false, 100)], t0 + s);
        ends.observe(&[broker(true, 21)], &[part(7, true, 100)], t0 + 2 * s);
        assert_eq!(end(&ends).confirmed, None);
        // Moved to another broker: its own count starts there.
        let other = BrokerStat {
            id: 8,
            up: true,
            fetches: 500,
        };
        ends.observe(
            &[broker(true, 40), other],
            &[part(8, true, 100)],
            t0 + 3 * s,
        );
        assert_eq!(end(&ends).confirmed, None);
        let other = BrokerStat {
            fetches: 502,
            ..other
        };
        ends.observe(
            &[broker(true, 40), other],
            &[part(8, true, 100)],
            t0 + 4 * s,
        );
        assert_eq!(end(&ends).confirmed, Some(t0 + 4 * s));
    }

    #[test]
    fn librdkafka_statistics_are_read_by_broker_id_and_fetch_state() {
        use rdkafka::statistics::{Broker, Partition, Topic};
        let stats = |fetches: i64, state: &str| {
            let mut s = Statistics::default();
            s.brokers.insert(
                "localhost:9092/7".into(),
                Broker {
                    nodeid: 7,
                    state: state.into(),
                    req: HashMap::from([("Fetch".to_string(), fetches)]),
                    ..Broker::default()
                },
            );
            s.topics.insert(
                "app-counts-changelog".into(),
                Topic {
                    topic: "app-counts-changelog".into(),
                    partitions: HashMap::from([(
                        1,
                        Partition {
                            partition: 1,
                            broker: 7,
                            fetch_state: "active".into(),
                            ls_offset: 42,
                            ..Partition::default()
                        },
                    )]),
                    ..Topic::default()
                },
            );
            s
        };
        let t0 = Instant::now();
        let mut ends = Ends::default();
        ends.observe_stats(&stats(1, "UP"), t0);
        ends.observe_stats(&stats(3, "DOWN"), t0);
        assert_eq!(end(&ends).confirmed, None);
        ends.observe_stats(&stats(3, "UP"), t0);
        ends.observe_stats(&stats(5, "UP"), t0);
        assert_eq!(
            end(&ends),
            End {
                offset: 42,
                confirmed: Some(t0)
            }
        );
    }
}

//! The record collector: sends everything a task writes (outputs, repartition records,
//! changelog records, dead letters) through a Kafka producer, computes partitions with Kafka's
//! murmur2, and tracks the offset each changelog partition reached so the commit can store it
//! as the store's checkpoint.

use crate::changelog::Topics;
use crate::partitioner::partition_for;
use crate::processor::{ProcessError, Sink};
use crate::status::Lease;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer,
};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a send waits for queue space before giving up: the queue stays full only while
/// the brokers are away, and the worker then retries from its last commit instead.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(30);

/// The first delivery error since the last call, if any.
pub fn take_delivery_error(p: &Producer) -> Option<DeliveryError> {
    p.context().error.lock().ok().and_then(|mut e| e.take())
}

/// Delivery bookkeeping shared with librdkafka's callback thread.
#[derive(Default)]
pub struct Tracker {
    /// Next offset after the last delivered record, per tracked changelog partition.
    slots: RwLock<Vec<Arc<AtomicI64>>>,
    /// First delivery failure since the last check: a commit must not pretend it succeeded.
    error: Mutex<Option<DeliveryError>>,
}

/// A record the broker did not take.
#[derive(Clone, Debug, thiserror::Error)]
#[error("delivery to {topic}[{partition}] failed: {code}")]
pub struct DeliveryError {
    pub topic: String,
    pub partition: i32,
    pub code: RDKafkaErrorCode,
}

impl ClientContext for Tracker {}

impl ProducerContext for Tracker {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: usize) {
        match result {
            Ok(m) => {
                if slot > 0
                    && let Ok(slots) = self.slots.read()
                    && let Some(s) = slots.get(slot - 1)
                {
                    s.fetch_max(m.offset() + 1, Ordering::Relaxed);
                }
            }
            Err((e, m)) => {
                if let Ok(mut err) = self.error.lock() {
                    err.get_or_insert_with(|| DeliveryError {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                        code: e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
                    });
                }
            }
        }
    }
}

pub type Producer = ThreadedProducer<Tracker>;

/// A producer and what it knows of the topics it writes.
pub struct Collector {
    pub producer: Arc<Producer>,
    topics: Arc<Topics>,
    /// The lease every record is sent under (at-least-once under the operator), if any.
    lease: Option<Arc<Lease>>,
}

/// Handle on one changelog partition's delivered offset.
#[derive(Clone)]
pub struct Slot {
    id: usize,
    offset: Arc<AtomicI64>,
}

impl Slot {
    /// Next offset after the last delivered record, or -1 if nothing was delivered yet.
    pub fn delivered(&self) -> i64 {
        self.offset.load(Ordering::Relaxed)
    }
}

impl Collector {
    pub fn new(producer: Arc<Producer>, topics: Arc<Topics>) -> Self {
        Self {
            producer,
            topics,
            lease: None,
        }
    }

    /// Send only under `lease`: a record handed to the producer after it lapsed is purged
    /// from the producer's queue, with everything else not yet sent, and the send fails.
    pub fn under(mut self, lease: Arc<Lease>) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Checked after the record is queued, not before: a worker frozen between a check and
    /// the send would otherwise queue one record after its lease lapsed. Purging takes it
    /// back before librdkafka's batching (`linger.ms`) lets it out.
    fn check_lease(&self) -> Result<(), ProcessError> {
        match &self.lease {
            Some(lease) => lease.check().map_err(|e| {
                self.producer.purge(PurgeConfig::default().queue());
                ProcessError::Lease(e)
            }),
            None => Ok(()),
        }
    }

    pub fn track(&self) -> Slot {
        let offset = Arc::new(AtomicI64::new(-1));
        let mut slots = self
            .producer
            .context()
            .slots
            .write()
            .unwrap_or_else(|e| e.into_inner());
        slots.push(offset.clone());
        Slot {
            id: slots.len(),
            offset,
        }
    }

    pub fn partitions(&self, topic: &str) -> Option<i32> {
        self.topics.partitions.get(topic).copied()
    }

    /// Send one record. A record the topic cannot take (larger than its `max.message.bytes`,
    /// or keyless to a compacted topic) is refused here, before it reaches the producer, as
    /// a bad record for `onError` to handle: a record the broker rejected would instead
    /// poison the whole transaction under exactly-once.
    #[allow(clippy::too_many_arguments)]
    pub fn send_raw(
        &self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
        headers: Option<OwnedHeaders>,
        slot: Option<&Slot>,
    ) -> Result<(), ProcessError> {
        if let Some(limits) = self.topics.limits.get(topic) {
            let header_bytes = headers.as_ref().map_or(0, |h| {
                h.iter()
                    .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len) + 10)
                    .sum()
            });
            limits
                .check(topic, key, value, header_bytes)
                .map_err(ProcessError::BadRecord)?;
        }
        let mut rec: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(topic, slot.map_or(0, |s| s.id)).partition(partition);
        if timestamp >= 0 {
            rec = rec.timestamp(timestamp);
        }
        if let Some(k) = key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        if let Some(h) = headers {
            rec = rec.headers(h);
        }
        // Read the clock only once the queue is full, not for every record sent.
        let mut deadline = None;
        loop {
            match self.producer.send(rec) {
                Ok(()) => return self.check_lease(),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now()
                        < *deadline.get_or_insert_with(|| Instant::now() + QUEUE_FULL_WAIT) =>
                {
                    // Wait for deliveries to free queue space; the polling thread serves them.
                    self.producer.poll(Duration::from_millis(5));
                    rec = r;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                    return Err(ProcessError::BadRecord(format!(
                        "record for {topic}[{partition}] is larger than the producer's message.max.bytes"
                    )));
                }
                Err((source, _)) => {
                    return Err(ProcessError::Send {
                        topic: topic.to_string(),
                        partition,
                        cause: source,
                    });
                }
            }
        }
    }

    /// Partition for a key as Kafka's Java client computes it; keyless records are spread by librdkafka.
    pub fn partition(&self, topic: &str, key: Option<&[u8]>) -> Result<i32, ProcessError> {
        let n = self.partitions(topic).ok_or_else(|| {
            ProcessError::Fatal(format!("topic {topic:?} is not an output of this topology"))
        })?;
        Ok(key.map_or(rdkafka::producer::PARTITION_UA, |k| partition_for(k, n)))
    }
}

/// The collector as the processors' sink.
impl Sink for Collector {
    fn send(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), ProcessError> {
        let p = match partition {
            Some(p) => p,
            None => self.partition(topic, key)?,
        };
        self.send_raw(topic, p, key, value, timestamp, None, None)
    }

    fn partition_of(&self, topic: &str, key: &[u8]) -> Result<Option<i32>, ProcessError> {
        self.partition(topic, Some(key)).map(Some)
    }

    fn check_timestamp(&self, timestamp: i64) -> Result<(), String> {
        self.topics
            .check_timestamp(timestamp, crate::record::now_ms())
    }
}

/// Headers saying why a record went to the dead-letter topic.
pub fn dead_letter_headers(reason: &str, topic: &str, partition: i32, offset: i64) -> OwnedHeaders {
    let (p, o) = (partition.to_string(), offset.to_string());
    OwnedHeaders::new()
        .insert(Header {
            key: "eddy.error.reason",
            value: Some(reason),
        })
        .insert(Header {
            key: "eddy.error.topic",
            value: Some(topic),
        })
        .insert(Header {
            key: "eddy.error.partition",
            value: Some(&p),
        })
        .insert(Header {
            key: "eddy.error.offset",
            value: Some(&o),
        })
}

/// Wait until every record sent so far is delivered or failed.
///
/// rdkafka's `Producer::flush` (also called by `commit_transaction`) waits in 100 ms slices
/// for events that the `ThreadedProducer`'s own thread consumes, so any flush with records in
/// flight took at least 100 ms: under exactly-once that was most of every 100 ms commit.
/// librdkafka's `rd_kafka_flush` instead waits on the in-flight count, which that thread
/// brings to zero as it serves the delivery reports.
pub fn flush(p: &Producer, timeout: Duration) -> Result<(), KafkaError> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the pointer is the live client `p` owns; rd_kafka_flush is thread-safe and, in
    // event mode (rdkafka's), only waits for the count without serving any queue.
    let err = unsafe { rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), ms) };
    if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::Flush(err.into()))
    }
}

/// The transactional id of a worker's producer under exactly-once: stable across restarts
/// of the same worker (pod), so a restart fences the previous incarnation.
pub fn transactional_id(application_id: &str, instance: &str) -> String {
    format!("{application_id}-{instance}")
}

/// Under at-least-once with the operator, a record waits at most this long in the producer
/// before it is failed instead of sent. A worker writes only under its lease
/// ([`crate::status::Lease`]), and the operator fails it over 30 s after its last report, at
/// least 10 s after the lease ran out: a worker frozen (SIGSTOP, a stalled VM) with records
/// queued finds them expired when it resumes, and librdkafka fails expired records before it
/// sends anything (its producer loop scans for timeouts first after a pause of over a second).
pub const LEASED_MESSAGE_TIMEOUT: Duration = Duration::from_secs(8);

/// librdkafka settings of the worker's producer under the app's `kafka.properties`; public so
/// the engine benchmark's raw pass-through (its ceiling) produces with the same batching.
pub const PRODUCER_TUNING: &[(&str, &str)] = &[
    ("linger.ms", "10"),
    ("batch.num.messages", "10000"),
    ("queue.buffering.max.kbytes", "32768"),
];

/// The worker's producer, shared by all its tasks; transactional under exactly-once.
/// `batch_bytes` caps a batch below the smallest `max.message.bytes` of the topics written:
/// the broker checks the whole batch against it, so a batch of small records to a topic with
/// a low limit would otherwise be rejected as one.
///
/// `message_timeout`, when given, bounds how long a record may wait in the producer: it
/// overrides `message.timeout.ms` (see [`LEASED_MESSAGE_TIMEOUT`]).
pub fn producer(
    cfg: &crate::config::WorkerConfig,
    transactional_id: Option<&str>,
    batch_bytes: Option<usize>,
    message_timeout: Option<Duration>,
) -> Result<Arc<Producer>, KafkaError> {
    let batch = batch_bytes.map(|b| b.to_string());
    let mut defaults = PRODUCER_TUNING.to_vec();
    if let Some(b) = &batch {
        defaults.push(("batch.size", b));
    }
    let mut c = cfg.client_config_with(&defaults);
    c.set("enable.idempotence", "true");
    if let Some(t) = message_timeout {
        let ms = t.as_millis().to_string();
        if let Some(own) = c
            .get("message.timeout.ms")
            .or_else(|| c.get("delivery.timeout.ms"))
            && own.trim() != ms
        {
            tracing::warn!(
                "kafka.properties sets the producer's message timeout to {own} ms: under at-least-once with the operator it is {ms} ms, so that a worker frozen past its lease cannot send what it had queued"
            );
        }
        c.remove("delivery.timeout.ms");
        c.set("message.timeout.ms", ms);
    }
    if let Some(id) = transactional_id {
        c.set("transactional.id", id).set(
            "transaction.timeout.ms",
            cfg.transaction_timeout.as_millis().to_string(),
        );
    }
    Ok(Arc::new(c.create_with_context(Tracker::default())?))
}

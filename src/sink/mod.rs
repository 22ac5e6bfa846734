//! Where outputs go, and how they are made durable together with the group's offsets.
//!
//! A [`Sink`] is the seam: begin a unit of work, send records into it, commit it with the
//! offsets of the inputs it consumed, or abort it; and say what the group has committed, which
//! is where the loop rewinds to after an abort. One file per implementation, each carrying its
//! own state:
//!
//! - [`exactly_once`]: Kafka transactions. Outputs and offsets commit atomically.
//! - [`at_least_once`]: an idempotent producer; offsets commit after every output of the batch
//!   is delivered. A crash can duplicate outputs, never lose them.
//!
//! `sink_of` picks one (the only place the guarantee is looked at) and [`start`] connects it. [`Driver`] is what the
//! loop holds: the sink and the bookkeeping every sink shares: the open batch, the rewind an
//! abort leaves pending, the rejections learned ([`rejected`]), the back-off, the bounds of
//! every call.
//!
//! Invariants:
//! - a unit is open exactly when at least one input record was consumed since the last
//!   commit or abort (empty transactions are never begun, so never committed);
//! - the offsets sent with a unit are the next offsets of the partitions it consumed (or the
//!   consumer's position past transaction markers);
//! - after any abort, recreation or unknown commit outcome, nothing is open and a rewind is
//!   pending; the loop performs it before it processes another record.
//!
//! Every failed Kafka call goes through [`crate::error::classify`].

pub mod at_least_once;
mod batch;
mod driver;
pub mod exactly_once;
mod producer;
pub mod rejected;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::debug;

use crate::config::{Config, Guarantee};
use crate::error::{Action, Call, Error, Facts, classify};
use crate::events::{AbortReason, Ended};
use crate::health::Health;
use crate::records::Outgoing;
use crate::transform::Tp;

pub use batch::Consumed;
pub use driver::{Driver, start};

/// Bounded retries of one retriable call before it counts as a failure of its class.
const MAX_RETRIES: u32 = 5;

/// A sink: the seam between the loop and where its records go.
///
/// The [`Driver`] calls these in order: `begin`, `send`…, then `commit` or `abort`. A failure
/// says what it needs ([`Failed`]); the driver does the bookkeeping (rewind, back-off,
/// verdicts) that is the same for every sink.
pub trait Sink: Send {
    /// (Re)creates the client, fencing earlier incarnations. Called at start and after
    /// [`Failed::Recreate`].
    fn connect(&mut self, calls: &Calls) -> Result<(), KafkaError>;
    /// Why the cluster refused the client `connect` made, if it did: a wrong password, an
    /// untrusted certificate. Nothing a retry fixes.
    fn refused(&self) -> Option<String>;
    /// Opens a unit of work.
    fn begin(&mut self, calls: &Calls) -> Result<(), Failed>;
    /// Sends one record inside the open unit.
    fn send(&mut self, record: Record<'_, '_>, calls: &Calls) -> Result<(), Failed>;
    /// Waits until every record sent so far is delivered or failed. Whether it got there.
    fn settle(&mut self, calls: &Calls) -> bool;
    /// The records refused for what they are since the last take: (send index, code).
    fn take_rejections(&mut self, wait: Duration) -> Vec<(usize, RDKafkaErrorCode)>;
    /// Whether any record was refused for what it is since the last take.
    fn has_rejections(&self) -> bool;
    /// Why the open unit failed for want of a permission, if it did: no retry fixes that.
    fn denied(&self) -> Option<String> {
        None
    }
    /// Makes the open unit's records and the group's `offsets` durable.
    fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &dyn Group,
        calls: &Calls,
    ) -> Result<(), Failed>;
    /// Ends the open unit without committing it (`reason`: why, for the logs).
    fn abort(&mut self, reason: AbortReason, calls: &Calls) -> Result<(), Failed>;
    /// What the group has committed for `partitions`: where the loop rewinds to. Kafka sinks
    /// commit into the group; a sink that keeps offsets with its outputs reads them there.
    fn committed(
        &self,
        group: &dyn Group,
        partitions: TopicPartitionList,
        timeout: Duration,
    ) -> KafkaResult<TopicPartitionList> {
        group.committed(partitions, timeout)
    }
    /// Whether the destination `topic` exists.
    fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, KafkaError>;
    /// How an open unit ends when `abort` succeeds: aborted on the broker, or (at least
    /// once) dropped, its outputs left where they are.
    fn ended(&self) -> Ended {
        Ended::Aborted
    }
}

/// Picks the sink of the configured guarantee: one line per implementation.
fn sink_of(c: &Config) -> Box<dyn Sink> {
    let kafka = &c.kafka;
    match c.guarantee {
        Guarantee::ExactlyOnce => Box::new(exactly_once::Transactions::new(kafka, c)),
        Guarantee::AtLeastOnce => Box::new(at_least_once::Batches::new(kafka, &c.output_topic)),
    }
}

/// Why a sink call did not succeed, as the driver must react.
#[derive(Debug)]
pub enum Failed {
    /// The open unit cannot commit: abort it and rewind.
    Abort(AbortReason),
    /// The client is fenced or broken: replace it (which ends the open unit) and rewind.
    Recreate(AbortReason),
    /// A record is larger than the client takes: the record's fault.
    TooLarge,
    /// Nothing to do at run time: stop the process.
    Exit(Error),
}

impl Failed {
    /// [`Failed::Exit`] with what exactly was doing.
    pub fn exit(context: &str, source: KafkaError) -> Failed {
        Failed::Exit(unrecoverable(context, source))
    }
}

/// One record to send: its topic, the record (whose headers the send takes), its timestamp
/// and its index in the open unit (which comes back with a rejection).
pub struct Record<'a, 'b> {
    /// Destination topic.
    pub topic: &'a str,
    /// The record.
    pub out: &'a mut Outgoing<'b>,
    /// The input's timestamp, or `None` for the time of sending.
    pub timestamp: Option<i64>,
    /// Index in the open unit's [`rejected::SentLog`].
    pub index: usize,
}

/// The consumer group, as a sink sees it.
pub trait Group {
    /// The group's generation, for a transactional offset commit (`None` before joining).
    fn metadata(&self) -> Option<rdkafka::consumer::ConsumerGroupMetadata>;
    /// Commits `offsets` outside any transaction.
    fn commit_offsets(&self, offsets: &TopicPartitionList) -> KafkaResult<()>;
    /// The group's committed offsets of `partitions`.
    fn committed(
        &self,
        partitions: TopicPartitionList,
        timeout: Duration,
    ) -> KafkaResult<TopicPartitionList>;
    /// The consumer's position in each assigned partition that has one (a seek unsets it
    /// until the next record).
    fn positions(&self) -> Vec<(Tp, i64)>;
}

impl<X: ConsumerContext> Group for BaseConsumer<X> {
    fn metadata(&self) -> Option<rdkafka::consumer::ConsumerGroupMetadata> {
        self.group_metadata()
    }

    fn commit_offsets(&self, offsets: &TopicPartitionList) -> KafkaResult<()> {
        self.commit(offsets, CommitMode::Sync)
    }

    fn committed(
        &self,
        partitions: TopicPartitionList,
        timeout: Duration,
    ) -> KafkaResult<TopicPartitionList> {
        self.committed_offsets(partitions, timeout)
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let Ok(tpl) = self.position() else {
            return Vec::new();
        };
        tpl.elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(pos) => Some(((e.topic().to_string(), e.partition()), pos)),
                _ => None,
            })
            .collect()
    }
}

/// The bounds every blocking call runs within, and the watchdog that names it.
pub struct Calls {
    /// Heartbeat and the name of the call in progress.
    pub health: Arc<Health>,
    /// Every transactional call is bounded by the transaction timeout.
    call_timeout: Duration,
    /// The shutdown grace, once shutdown began.
    deadline: Option<Instant>,
}

impl Calls {
    /// The bound of the next call: the call timeout, or less once a deadline is near.
    pub fn timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self
                .call_timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => self.call_timeout,
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Calls `f` (named `name` to the watchdog) until it succeeds, or fails with anything but
    /// a retriable error of `call`, or has been retried [`MAX_RETRIES`] times, or the deadline
    /// passed. The error comes back with what it means.
    pub fn retry<T>(
        &self,
        call: Call,
        name: &'static str,
        mut f: impl FnMut(Duration) -> KafkaResult<T>,
    ) -> Result<T, (Action, KafkaError)> {
        let mut tries = 0;
        loop {
            let result = {
                let _g = self.health.in_call(name);
                f(self.timeout())
            };
            let e = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match classify(call, &Facts::of(&e)) {
                Action::Retry if tries < MAX_RETRIES && !self.past_deadline() => {
                    tries += 1;
                    debug!(error = %e, tries, "{name}: retrying");
                    std::thread::sleep(Duration::from_millis(50 * u64::from(tries)));
                }
                action => return Err((action, e)),
            }
        }
    }
}

/// What a commit attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No transaction was open.
    Empty,
    /// Committed, with this many input records.
    Committed {
        /// Input records in the transaction.
        records: u64,
    },
    /// Aborted (or its outcome was unknown); a rewind is pending.
    Aborted,
}

/// A send that did not go out.
#[derive(Debug)]
pub enum SendError {
    /// The client refuses the record as larger than message.max.bytes.
    TooLarge,
    /// The transaction was aborted because of the error; a rewind is pending.
    Aborted,
    /// Stop the process.
    Fatal(Error),
}

/// Whether `begin` opened a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Began {
    /// A unit is open.
    Open,
    /// The client had to be replaced: nothing is open and a rewind is pending.
    Replaced,
}

fn unrecoverable(context: &str, source: KafkaError) -> Error {
    Error::Unrecoverable {
        context: context.to_string(),
        source,
    }
}

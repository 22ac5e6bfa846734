//! The transaction driver: begin, produce, send offsets, commit, abort, recreate, and what to
//! rewind afterwards.
//!
//! Invariants:
//! - a transaction is open exactly when at least one input record was consumed since the last
//!   commit or abort (empty transactions are never begun, so never committed);
//! - the offsets sent with a transaction are the next offsets of the partitions it consumed;
//! - after any abort, recreation or unknown commit outcome, no transaction is open and a rewind
//!   is pending; the loop performs it (seek to the broker's committed offsets) before it
//!   processes another record.
//!
//! Every failed call goes through [`crate::error::classify`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::Guarantee;
use crate::error::{Action, Call, Error, Facts, classify, rejected_record};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::rejected::{SentLog, Source, Verdicts};

/// The transactional producer.
pub type TxnProducer = ThreadedProducer<DeliveryContext>;

/// (topic, partition).
pub type Tp = (String, i32);

/// Bounded retries of one retriable call before it counts as a failure of its class.
const MAX_RETRIES: u32 = 5;
/// Longest pause between producer re-creations.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Producer callbacks. In a transaction a failed delivery also makes the commit fail with an
/// abortable error; without one (at-least-once) the driver counts failures itself and does not
/// commit offsets past a batch that had any. Deliveries the broker rejected for what the record
/// is are kept by their opaque, the record's index in the driver's [`SentLog`].
#[derive(Default)]
pub struct DeliveryContext {
    /// Records sent and not yet reported.
    pending: AtomicU64,
    /// Failed deliveries since the batch began.
    failed: AtomicU64,
    /// (send index, code) of each delivery rejected for the record's own fault.
    rejections: Mutex<Vec<(usize, RDKafkaErrorCode)>>,
}

impl DeliveryContext {
    fn take_rejections(&self) -> Vec<(usize, RDKafkaErrorCode)> {
        std::mem::take(&mut *self.rejections.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        if let Err((e, _)) = result {
            debug!(error = %e, "delivery failed; the batch will not commit");
            self.failed.fetch_add(1, Ordering::SeqCst);
            if let Some(code) = e
                .rdkafka_error_code()
                .filter(|c| rejected_record(*c).is_some())
            {
                self.rejections
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((index, code));
            }
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
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
    /// librdkafka refuses the record as larger than message.max.bytes.
    TooLarge,
    /// The transaction was aborted because of the error; a rewind is pending.
    Aborted,
    /// Stop the process.
    Fatal(Error),
}

/// Why a transaction ended without a commit, or a producer was replaced: the `reason` label
/// of the abort and recreation counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The partitions were lost (session timeout): another member may own them.
    PartitionsLost,
    /// A revoke found no group metadata to commit with.
    NoGroupMetadata,
    /// The consumer was fenced (static membership) and is replaced.
    ConsumerFenced,
    /// The loop stopped on an unrecoverable error.
    ShutdownOnError,
    /// A record failed with --on-error fail.
    RecordFailed,
    /// An output or DLQ copy is larger than the producer accepts.
    OutputTooLarge,
    /// Producing a record failed.
    ProduceFailed,
    /// Producing a record found the producer fenced or fatally failed.
    ProduceFenced,
    /// begin_transaction failed.
    BeginFailed,
    /// Testing only: --test-abort-every / --test-abort-probability.
    TestInjected,
    /// send_offsets_to_transaction failed with an abortable error.
    SendOffsetsFailed,
    /// send_offsets_to_transaction found the producer fenced, or timed out.
    SendOffsetsFenced,
    /// commit_transaction failed with an abortable error.
    CommitFailed,
    /// commit_transaction found the producer fenced.
    CommitFenced,
    /// commit_transaction's outcome is unknown (timeout): rewound to what the broker holds.
    CommitOutcomeUnknown,
    /// At-least-once: a record of the batch was not delivered, so its offsets are not committed.
    DeliveryFailed,
    /// At-least-once: committing the batch's offsets failed.
    OffsetCommitFailed,
    /// A record sent alone was rejected by the broker: its replay sends its dead-letter copy.
    RecordRejected,
}

impl Reason {
    /// Every reason, so the counters start at 0 for each.
    pub const ALL: [Reason; 18] = {
        use Reason::*;
        [
            PartitionsLost,
            NoGroupMetadata,
            ConsumerFenced,
            ShutdownOnError,
            RecordFailed,
            OutputTooLarge,
            ProduceFailed,
            ProduceFenced,
            BeginFailed,
            TestInjected,
            SendOffsetsFailed,
            SendOffsetsFenced,
            CommitFailed,
            CommitFenced,
            CommitOutcomeUnknown,
            DeliveryFailed,
            OffsetCommitFailed,
            RecordRejected,
        ]
    };

    /// The label value.
    pub fn as_str(self) -> &'static str {
        use Reason::*;
        match self {
            PartitionsLost => "partitions_lost",
            NoGroupMetadata => "no_group_metadata",
            ConsumerFenced => "consumer_fenced",
            ShutdownOnError => "shutdown_on_error",
            RecordFailed => "record_failed",
            OutputTooLarge => "output_too_large",
            ProduceFailed => "produce_failed",
            ProduceFenced => "produce_fenced",
            BeginFailed => "begin_failed",
            TestInjected => "test_injected",
            SendOffsetsFailed => "send_offsets_failed",
            SendOffsetsFenced => "send_offsets_fenced",
            CommitFailed => "commit_failed",
            CommitFenced => "commit_fenced",
            CommitOutcomeUnknown => "commit_outcome_unknown",
            DeliveryFailed => "delivery_failed",
            OffsetCommitFailed => "offset_commit_failed",
            RecordRejected => "record_rejected",
        }
    }
}

/// One input record, as the open transaction counts it.
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// Key and value bytes.
    pub bytes: u64,
    /// Input timestamp, ms since the epoch.
    pub timestamp: Option<i64>,
}

/// One open transaction.
#[derive(Debug)]
struct OpenTxn {
    began: Instant,
    records: u64,
    bytes: u64,
    /// First offset consumed, next offset to consume, and records consumed, per topic and
    /// partition. Keyed by topic first so that the per-record look-up borrows the topic name
    /// instead of copying it.
    offsets: HashMap<String, HashMap<i32, (i64, i64, u64)>>,
    /// Input timestamps (ms since the epoch), for the end-to-end latency at commit.
    timestamps: Vec<i64>,
    /// Inputs that yielded no output, and DLQ records by reason (index in
    /// `transform::Reason::ALL`): counted when the transaction commits, so that a record
    /// replayed after an abort counts once.
    filtered: u64,
    dead_lettered: [u64; crate::transform::Reason::ALL.len()],
}

impl OpenTxn {
    fn new() -> OpenTxn {
        OpenTxn {
            began: Instant::now(),
            records: 0,
            bytes: 0,
            offsets: HashMap::new(),
            timestamps: Vec::new(),
            filtered: 0,
            dead_lettered: Default::default(),
        }
    }

    fn consumed(&mut self, record: Consumed<'_>) {
        let Consumed {
            topic,
            partition,
            offset,
            bytes,
            timestamp,
        } = record;
        self.records += 1;
        self.bytes += bytes;
        if let Some(ts) = timestamp {
            self.timestamps.push(ts);
        }
        let partitions = match self.offsets.get_mut(topic) {
            Some(p) => p,
            None => self.offsets.entry(topic.to_string()).or_default(),
        };
        partitions
            .entry(partition)
            .and_modify(|e| {
                e.1 = offset + 1;
                e.2 += 1;
            })
            .or_insert((offset, offset + 1, 1));
    }

    /// What `send_offsets_to_transaction` gets: the next offset of each consumed partition.
    fn next_offsets(&self) -> impl Iterator<Item = (&str, i32, i64)> {
        self.offsets.iter().flat_map(|(t, ps)| {
            ps.iter()
                .map(move |(p, (_, next, _))| (t.as_str(), *p, *next))
        })
    }

    /// Where each consumed partition started in this transaction.
    fn first_offsets(self) -> impl Iterator<Item = (Tp, i64)> {
        self.offsets.into_iter().flat_map(|(t, ps)| {
            ps.into_iter()
                .map(move |(p, (first, _, _))| ((t.clone(), p), first))
        })
    }
}

/// Owns the producer and the state of the open transaction.
pub struct TxnDriver {
    guarantee: Guarantee,
    config: ClientConfig,
    producer: TxnProducer,
    open: Option<OpenTxn>,
    /// First offsets of an aborted transaction: a fallback for partitions without a committed
    /// offset when rewinding.
    rewind: Option<HashMap<Tp, i64>>,
    call_timeout: Duration,
    deadline: Option<Instant>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    failures_in_a_row: u32,
    fatal: Option<Error>,
    attempts: u64,
    test_aborts: Option<TestAborts>,
    /// Testing only: sends left to fail (--test-fail-sends).
    test_fail_sends: u64,
    rng: u64,
    /// Where each record sent in the open transaction came from (the delivery opaque).
    sent: SentLog,
    /// What the broker said about inputs whose records it rejected.
    verdicts: Verdicts,
    /// The offsets the commit in progress sends, and what the last commits sent per
    /// partition: a position past them (control records) is committed too.
    committing: HashMap<Tp, i64>,
    last_committed: HashMap<Tp, i64>,
    last_advance_check: Instant,
}

/// Testing only: transactions to abort instead of committing, through the same path as an
/// abortable commit error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TestAborts {
    /// Every Nth commit.
    Every(u64),
    /// Each commit with this probability.
    Probability(f64),
}

impl TxnDriver {
    /// Creates the producer and initialises transactions, retrying until --startup-timeout.
    pub fn start(
        c: &crate::config::Config,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<TxnDriver, Error> {
        let (guarantee, startup_timeout, test_aborts) =
            (c.guarantee, c.startup_timeout, c.test_aborts);
        // Every transactional call is bounded by the transaction timeout.
        let call_timeout = c.transaction_timeout;
        let config = crate::kafka::producer_config(c);
        let deadline = Instant::now() + startup_timeout;
        let mut last: Option<KafkaError> = None;
        let servers = config
            .get("bootstrap.servers")
            .unwrap_or_default()
            .to_string();
        while Instant::now() < deadline && !shutdown.is_cancelled() {
            let left = deadline.saturating_duration_since(Instant::now());
            match create_and_init(guarantee, &config, left.min(call_timeout), &health) {
                Ok(producer) => {
                    return Ok(TxnDriver {
                        guarantee,
                        config,
                        producer,
                        open: None,
                        rewind: None,
                        call_timeout,
                        deadline: None,
                        health,
                        metrics,
                        shutdown,
                        failures_in_a_row: 0,
                        fatal: None,
                        attempts: 0,
                        test_aborts,
                        test_fail_sends: c.test_fail_sends,
                        rng: seed(),
                        sent: SentLog::default(),
                        verdicts: Verdicts::default(),
                        committing: HashMap::new(),
                        last_committed: HashMap::new(),
                        last_advance_check: Instant::now(),
                    });
                }
                Err(e) => {
                    if classify(Call::Init, &Facts::of(&e)) == Action::Exit {
                        return Err(Error::Unrecoverable {
                            context: "initialising transactions".into(),
                            source: e,
                        });
                    }
                    warn!(error = %e, "init_transactions failed; retrying");
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(500).min(left));
                }
            }
        }
        Err(Error::Startup(format!(
            "--bootstrap-servers {servers}: could not initialise transactions within {} \
             (--startup-timeout){}",
            humantime::format_duration(startup_timeout),
            last.map(|e| format!(": {e}")).unwrap_or_default()
        )))
    }

    /// The producer, for metadata look-ups.
    pub fn producer(&self) -> &TxnProducer {
        &self.producer
    }

    /// Bounds every later call by `deadline` (shutdown grace).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// How long the open transaction has been open (zero when none is).
    pub fn open_age(&self) -> Duration {
        self.open
            .as_ref()
            .map_or(Duration::ZERO, |t| t.began.elapsed())
    }

    /// The metrics this driver counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Time until the open transaction must commit by `interval`, or `None` if none is open.
    pub fn due_in(&self, interval: Duration) -> Option<Duration> {
        self.open
            .as_ref()
            .map(|t| interval.saturating_sub(t.began.elapsed()))
    }

    /// The open transaction has reached one of its bounds.
    pub fn should_commit(&self, interval: Duration, max_records: u64, max_bytes: u64) -> bool {
        self.open.as_ref().is_some_and(|t| {
            t.began.elapsed() >= interval || t.records >= max_records || t.bytes >= max_bytes
        })
    }

    /// A record polled but not counted in the transaction (its send failed, or it came while a
    /// rewind was pending) must come again even from a partition without a committed offset:
    /// the rewind falls back to the earliest such position.
    pub fn rewind_also(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(r) = self.rewind.as_mut() {
            r.entry((topic.to_string(), partition))
                .and_modify(|o| *o = (*o).min(offset))
                .or_insert(offset);
        }
    }

    /// Takes the pending rewind, if any: the aborted transaction's first offsets.
    pub fn take_rewind(&mut self) -> Option<HashMap<Tp, i64>> {
        debug_assert!(
            self.rewind.is_none() || self.open.is_none(),
            "rewind with an open txn"
        );
        self.rewind.take()
    }

    /// An error raised where it could not be returned (in a rebalance callback).
    pub fn take_fatal(&mut self) -> Option<Error> {
        self.fatal.take()
    }

    /// Consecutive aborts and recreations since the last commit.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failures_in_a_row
    }

    fn timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self
                .call_timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => self.call_timeout,
        }
    }

    /// What the broker said about inputs whose records it rejected.
    pub fn verdicts(&self) -> &Verdicts {
        &self.verdicts
    }

    /// A suspect whose records all went through alone is innocent.
    pub fn cleared(&mut self, topic: &str, partition: i32, offset: i64) {
        self.verdicts.clear(topic, partition, offset);
    }

    /// Makes sure a transaction is open before the first output of a record is sent.
    /// `Ok(false)`: the producer had to be recreated, a rewind is pending, nothing is open.
    pub fn begin(&mut self) -> Result<bool, Error> {
        if self.open.is_some() {
            return Ok(true);
        }
        self.sent.clear();
        // Reports of an earlier transaction that came after it was settled name nothing here.
        self.producer.context().take_rejections();
        if self.guarantee == Guarantee::AtLeastOnce {
            // A batch, not a transaction: failures of earlier batches are settled already.
            self.producer.context().failed.store(0, Ordering::SeqCst);
            self.open = Some(OpenTxn::new());
            return Ok(true);
        }
        let result = {
            let _g = self.health.in_call("begin_transaction");
            self.producer.begin_transaction()
        };
        if let Err(e) = result {
            if classify(Call::Begin, &Facts::of(&e)) == Action::Exit {
                return Err(unrecoverable("beginning a transaction", e));
            }
            warn!(error = %e, "begin_transaction failed; recreating the producer");
            self.fail_recreate(Reason::BeginFailed)?;
            return Ok(false);
        }
        self.open = Some(OpenTxn::new());
        Ok(true)
    }

    /// An input of the open transaction yielded no output.
    pub fn filtered(&mut self) {
        if let Some(t) = self.open.as_mut() {
            t.filtered += 1;
        }
    }

    /// An input of the open transaction went to the DLQ for `reason`.
    pub fn dead_lettered(&mut self, reason: crate::transform::Reason) {
        if let Some(t) = self.open.as_mut() {
            let i = crate::transform::Reason::ALL
                .iter()
                .position(|r| *r == reason)
                .unwrap_or_default();
            t.dead_lettered[i] += 1;
        }
    }

    /// Counts one consumed record into the open transaction (which must be open).
    pub fn consumed(&mut self, record: Consumed<'_>) {
        if let Some(t) = self.open.as_mut() {
            t.consumed(record);
        }
    }

    /// Sends one record of `source` inside the open transaction, waiting while the local queue
    /// is full. `alone`: a suspect of a rejected batch, sent in a batch of its own and waited
    /// for; if the broker rejects it now, the transaction is aborted (its replay sends the
    /// dead-letter copy).
    pub fn send(
        &mut self,
        mut record: BaseRecord<'_, [u8], [u8], usize>,
        source: Source<'_>,
        alone: bool,
    ) -> Result<(), SendError> {
        let flushed = alone && self.flush_alone();
        if alone && self.has_rejections() {
            // Something sent before it was rejected: learn from that first.
            self.abort(Reason::ProduceFailed)
                .map_err(SendError::Fatal)?;
            return Err(SendError::Aborted);
        }
        if self.test_fail_sends > 0 {
            self.test_fail_sends -= 1;
            warn!("test switch: failing this send");
            self.abort(Reason::ProduceFailed)
                .map_err(SendError::Fatal)?;
            return Err(SendError::Aborted);
        }
        record.delivery_opaque = self.sent.push(source);
        loop {
            match self.producer.send(record) {
                Ok(()) => {
                    self.producer
                        .context()
                        .pending
                        .fetch_add(1, Ordering::SeqCst);
                    if alone {
                        return self.check_alone(flushed);
                    }
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.health.beat();
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                    // librdkafka's own check: the record's fault, like a broker's rejection.
                    let code = RDKafkaErrorCode::MessageSizeTooLarge;
                    self.verdicts.learn(&[(source, code)], true);
                    return Err(SendError::TooLarge);
                }
                Err((e, _)) => {
                    return match classify(Call::Produce, &Facts::of(&e)) {
                        Action::Exit => Err(SendError::Fatal(unrecoverable("producing", e))),
                        Action::RecreateProducer => {
                            warn!(error = %e, "produce failed; recreating the producer");
                            self.fail_recreate(Reason::ProduceFenced)
                                .map_err(SendError::Fatal)?;
                            Err(SendError::Aborted)
                        }
                        _ => {
                            warn!(error = %e, "produce failed; aborting the transaction");
                            self.abort(Reason::ProduceFailed)
                                .map_err(SendError::Fatal)?;
                            Err(SendError::Aborted)
                        }
                    };
                }
            }
        }
    }

    /// Waits (within the call timeout) until every record sent so far is delivered or failed,
    /// so that what is sent next goes out in a batch of its own. Whether it got there.
    fn flush_alone(&mut self) -> bool {
        let _g = self.health.in_call("flush");
        if let Err(e) = flush(&self.producer, self.timeout()) {
            debug!(error = %e, "flush around a record sent alone");
        }
        self.wait_for_reports(self.timeout())
    }

    /// After a record sent alone: its delivery report decides. `flushed`: nothing else was in
    /// flight when it was sent, so a rejection now is certainly its own.
    fn check_alone(&mut self, flushed: bool) -> Result<(), SendError> {
        let alone = self.flush_alone() && flushed;
        if !self.has_rejections() {
            return Ok(());
        }
        self.abort_with(Reason::RecordRejected, alone)
            .map_err(SendError::Fatal)?;
        Err(SendError::Aborted)
    }

    fn has_rejections(&self) -> bool {
        let ctx = self.producer.context();
        !ctx.rejections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Waits up to `bound` for the delivery callbacks of everything sent (they run on the
    /// producer's thread, after librdkafka is done with a record). Whether all came.
    fn wait_for_reports(&self, bound: Duration) -> bool {
        let ctx = self.producer.context();
        let until = Instant::now() + bound;
        while ctx.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        ctx.pending.load(Ordering::SeqCst) == 0
    }

    /// Turns the rejections of a transaction that ended without a commit into verdicts.
    /// `alone`: the last record was sent alone, so a rejection is its own.
    fn harvest(&mut self, alone: bool) {
        self.wait_for_reports(Duration::from_secs(1));
        let codes = self.producer.context().take_rejections();
        if codes.is_empty() {
            return;
        }
        let rejected: Vec<_> = codes
            .iter()
            .filter_map(|&(i, code)| self.sent.get(i).map(|s| (s, code)))
            .collect();
        if let [(s, code)] = rejected[..].as_ref() {
            warn!(
                topic = s.topic, partition = s.partition, offset = s.offset, copy = ?s.copy,
                error = rejected_record(*code).unwrap_or("?"),
                "the broker rejected a record; its replay sends the dead-letter copy"
            );
        } else if let Some((s, code)) = rejected.first() {
            // librdkafka sends a partition's records in one batch, which the broker rejects
            // whole: one culprit can fail a hundred records.
            warn!(
                records = rejected.len(),
                topic = s.topic,
                partition = s.partition,
                first_offset = s.offset,
                error = rejected_record(*code).unwrap_or("?"),
                "the broker rejected records together; their replay sends each alone to find \
                 which one is at fault"
            );
        }
        let learned = self.verdicts.learn(&rejected, alone);
        self.sent.clear();
        if learned {
            // The replay sends something else for those records: progress, not an outage, so
            // the abort does not add to the back-off.
            self.failures_in_a_row = 0;
        }
    }

    /// Commits the open transaction: offsets first, then EndTxn. Any failure ends in an abort
    /// or a new producer, with a rewind pending; only unrecoverable errors are returned.
    /// At least once: waits for every delivery of the batch, then commits its offsets through
    /// the consumer.
    pub fn commit<X: ConsumerContext, C: Consumer<X>>(
        &mut self,
        consumer: &C,
    ) -> Result<Outcome, Error> {
        if self.open.is_none() {
            return Ok(Outcome::Empty);
        }
        self.attempts += 1;
        if self.test_abort_now() {
            info!("test switch: aborting this transaction instead of committing it");
            self.abort(Reason::TestInjected)?;
            return Ok(Outcome::Aborted);
        }
        let Some(t) = self.open.as_ref() else {
            return Ok(Outcome::Empty);
        };
        let started = Instant::now();
        let offsets = self.offsets_to_commit(t, consumer);
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .map_err(|e| unrecoverable("building the offsets to commit", e))?;
        }
        self.committing = offsets;

        if self.guarantee == Guarantee::AtLeastOnce {
            return self.commit_delivered(consumer, &tpl, started);
        }
        let Some(gm) = consumer.group_metadata() else {
            warn!("no group metadata to commit with; aborting");
            self.abort(Reason::NoGroupMetadata)?;
            return Ok(Outcome::Aborted);
        };
        let mut tries = 0;
        loop {
            let result = {
                let _g = self.health.in_call("send_offsets_to_transaction");
                self.producer
                    .send_offsets_to_transaction(&tpl, &gm, self.timeout())
            };
            let Err(e) = result else { break };
            match classify(Call::SendOffsets, &Facts::of(&e)) {
                Action::Retry if tries < MAX_RETRIES && !self.past_deadline() => {
                    tries += 1;
                    debug!(error = %e, tries, "send_offsets_to_transaction: retrying");
                    std::thread::sleep(Duration::from_millis(50 * u64::from(tries)));
                }
                Action::Exit => return Err(unrecoverable("sending offsets", e)),
                Action::RecreateProducer | Action::UnknownOutcome => {
                    warn!(error = %e, "send_offsets_to_transaction failed; recreating the producer");
                    self.fail_recreate(Reason::SendOffsetsFenced)?;
                    return Ok(Outcome::Aborted);
                }
                Action::Retry | Action::Abort => {
                    warn!(error = %e, "send_offsets_to_transaction failed; aborting");
                    self.abort(Reason::SendOffsetsFailed)?;
                    return Ok(Outcome::Aborted);
                }
            }
        }

        // commit_transaction flushes too, but through rust-rdkafka's slow flush; after this one
        // it finds nothing left. A flush that fails (a whole call timeout without every
        // delivery) ends the transaction here: commit_transaction would wait as long again.
        let flushed = {
            let _g = self.health.in_call("flush");
            flush(&self.producer, self.timeout())
        };
        if let Err(e) = flushed {
            match classify(Call::Commit, &Facts::of(&e)) {
                Action::Exit => return Err(unrecoverable("flushing before the commit", e)),
                Action::RecreateProducer => {
                    warn!(error = %e, "flush before the commit: producer fenced; recreating it");
                    self.fail_recreate(Reason::CommitFenced)?;
                }
                _ => {
                    warn!(error = %e, "flush before the commit failed; aborting");
                    self.abort(Reason::CommitFailed)?;
                }
            }
            return Ok(Outcome::Aborted);
        }
        let mut tries = 0;
        loop {
            let result = {
                let _g = self.health.in_call("commit_transaction");
                self.producer.commit_transaction(self.timeout())
            };
            let Err(e) = result else { break };
            match classify(Call::Commit, &Facts::of(&e)) {
                Action::Retry if tries < MAX_RETRIES && !self.past_deadline() => {
                    tries += 1;
                    debug!(error = %e, tries, "commit_transaction: retrying");
                    std::thread::sleep(Duration::from_millis(50 * u64::from(tries)));
                }
                Action::Exit => return Err(unrecoverable("committing", e)),
                Action::Abort => {
                    warn!(error = %e, "commit_transaction failed; aborting");
                    self.abort(Reason::CommitFailed)?;
                    return Ok(Outcome::Aborted);
                }
                Action::RecreateProducer => {
                    warn!(error = %e, "commit_transaction: producer fenced; recreating it");
                    self.fail_recreate(Reason::CommitFenced)?;
                    return Ok(Outcome::Aborted);
                }
                Action::Retry | Action::UnknownOutcome => {
                    // The commit may have happened. Abort if librdkafka still allows it, else a
                    // new producer's init_transactions settles it; either way the rewind reads
                    // what the broker holds as committed.
                    warn!(error = %e, "commit outcome unknown; aborting or recreating, then \
                                       rewinding to the broker's committed offsets");
                    self.abort(Reason::CommitOutcomeUnknown)?;
                    return Ok(Outcome::Aborted);
                }
            }
        }
        Ok(self.committed(started))
    }

    /// At least once: every output of the batch delivered, then its offsets committed.
    fn commit_delivered<X: ConsumerContext, C: Consumer<X>>(
        &mut self,
        consumer: &C,
        offsets: &TopicPartitionList,
        started: Instant,
    ) -> Result<Outcome, Error> {
        let flushed = {
            let _g = self.health.in_call("flush");
            flush(&self.producer, self.timeout())
        };
        let reported = self.wait_for_reports(Duration::from_secs(1));
        let failed = self.producer.context().failed.load(Ordering::SeqCst);
        if flushed.is_err() || failed > 0 || !reported {
            warn!(failed, flushed = ?flushed.err(), "outputs not all delivered; not committing \
                                                      offsets, rewinding (at least once)");
            self.abort(Reason::DeliveryFailed)?;
            return Ok(Outcome::Aborted);
        }
        let result = {
            let _g = self.health.in_call("commit offsets");
            consumer.commit(offsets, CommitMode::Sync)
        };
        if let Err(e) = result {
            warn!(error = %e, "committing offsets failed; rewinding (at least once)");
            self.abort(Reason::OffsetCommitFailed)?;
            return Ok(Outcome::Aborted);
        }
        Ok(self.committed(started))
    }

    /// The offsets a commit sends: the next offset after each partition's last processed
    /// record, or the consumer's position when that is further. librdkafka's position passes a
    /// record only once it handed it to the loop (processed, in this transaction or an earlier
    /// one) and passes control records (transaction markers, which follow the last record of
    /// every upstream transaction) as it skips them; after a rewind it is unset until the next
    /// record. So the position is never past a record not yet processed, and committing it
    /// keeps the group's offsets from staying one below the end behind every marker
    /// (KAFKA-6607): tools that read the group's lag would show 1 per partition forever. A
    /// partition outside the transaction goes in when its position moved past what was last
    /// committed for it.
    fn offsets_to_commit<X: ConsumerContext, C: Consumer<X>>(
        &self,
        t: &OpenTxn,
        consumer: &C,
    ) -> HashMap<Tp, i64> {
        let mut offsets: HashMap<Tp, i64> = t
            .next_offsets()
            .map(|(topic, p, next)| ((topic.to_string(), p), next))
            .collect();
        for (tp, pos) in positions(consumer) {
            match offsets.get_mut(&tp) {
                Some(next) => *next = (*next).max(pos),
                None if self.moved(&tp, pos) => {
                    offsets.insert(tp, pos);
                }
                None => {}
            }
        }
        offsets
    }

    /// The position `pos` of `tp` is past what was last committed for it (or nothing was).
    fn moved(&self, tp: &Tp, pos: i64) -> bool {
        self.last_committed.get(tp).is_none_or(|c| pos > *c)
    }

    /// No transaction is open, and the consumer's position passed control records (the marker
    /// after an upstream transaction) beyond what was last committed: an offsets-only
    /// transaction moves the group there. Checked at most once per `interval`.
    pub fn advance_due<X: ConsumerContext, C: Consumer<X>>(
        &mut self,
        consumer: &C,
        interval: Duration,
    ) -> bool {
        // With a rewind pending the position is past records that must come again.
        if self.open.is_some()
            || self.rewind.is_some()
            || self.last_advance_check.elapsed() < interval
        {
            return false;
        }
        self.last_advance_check = Instant::now();
        positions(consumer)
            .into_iter()
            .any(|(tp, pos)| self.moved(&tp, pos))
    }

    /// Bookkeeping of a successful commit.
    fn committed(&mut self, started: Instant) -> Outcome {
        let Some(t) = self.open.take() else {
            return Outcome::Empty;
        };
        self.last_committed
            .extend(std::mem::take(&mut self.committing));
        for (topic, partition, next) in t.next_offsets() {
            self.verdicts.committed(topic, partition, next);
        }
        self.failures_in_a_row = 0;
        let m = &self.metrics;
        for (topic, ps) in &t.offsets {
            for (p, (_, _, n)) in ps {
                m.records_consumed
                    .with_label_values(&[topic.as_str(), &p.to_string()])
                    .inc_by(*n);
            }
        }
        m.records_filtered.inc_by(t.filtered);
        for (r, n) in crate::transform::Reason::ALL.iter().zip(t.dead_lettered) {
            if n > 0 {
                m.records_dlq.with_label_values(&[r.as_str()]).inc_by(n);
            }
        }
        let (records, committed) = (t.records, t.timestamps);
        m.transactions.with_label_values(&["committed"]).inc();
        m.commit_duration.observe(started.elapsed().as_secs_f64());
        m.transaction_records.observe(records as f64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        m.last_commit_timestamp.set(now.as_secs_f64());
        let now_ms = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
        for ts in committed {
            // Clocks of producers upstream may be ahead of ours: never negative.
            m.end_to_end_latency
                .observe(now_ms.saturating_sub(ts).max(0) as f64 / 1000.0);
        }
        Outcome::Committed { records }
    }

    /// Aborts the open transaction (if any) and leaves a rewind pending. A failed abort
    /// recreates the producer, whose init_transactions aborts it on the broker.
    pub fn abort(&mut self, reason: Reason) -> Result<(), Error> {
        self.abort_with(reason, false)
    }

    /// [`TxnDriver::abort`]; `alone`: the last record was sent alone (its rejection is its own).
    fn abort_with(&mut self, reason: Reason, alone: bool) -> Result<(), Error> {
        let Some(t) = self.open.take() else {
            return Ok(());
        };
        self.failures_in_a_row += 1;
        self.set_rewind(t);
        self.count_abort(reason);
        if self.guarantee == Guarantee::AtLeastOnce {
            // Nothing to abort: what was sent stays, and comes again after the rewind.
            self.harvest(alone);
            info!(
                reason = reason.as_str(),
                "batch dropped; rewinding (at least once)"
            );
            return Ok(());
        }
        {
            // librdkafka#4849: an abort racing a partition registration that the coordinator
            // refused (CONCURRENT_TRANSACTIONS right after a commit) sends EndTxn for a
            // transaction the coordinator does not have, and INVALID_TXN_STATE is fatal. A
            // record is only delivered once its partition is registered, so waiting for the
            // deliveries first closes the window (queued records were purged already if the
            // transaction failed). Bounded: an unreachable broker is the recreate path's.
            let _g = self.health.in_call("flush");
            let _ = flush(&self.producer, self.timeout().min(Duration::from_secs(5)));
        }
        let mut tries = 0;
        loop {
            let result = {
                let _g = self.health.in_call("abort_transaction");
                self.producer.abort_transaction(self.timeout())
            };
            let Err(e) = result else {
                info!(reason = reason.as_str(), "transaction aborted");
                self.harvest(alone);
                return Ok(());
            };
            match classify(Call::Abort, &Facts::of(&e)) {
                Action::Exit => return Err(unrecoverable("aborting", e)),
                Action::Retry if tries < MAX_RETRIES && !self.past_deadline() => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50 * u64::from(tries)));
                }
                _ => {
                    warn!(error = %e, reason = reason.as_str(), "abort_transaction failed; recreating the producer");
                    return self.recreate(reason);
                }
            }
        }
    }

    fn count_abort(&self, reason: Reason) {
        let m = &self.metrics;
        m.transactions.with_label_values(&["aborted"]).inc();
        m.transaction_aborts
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Commit from a rebalance callback: errors are kept for the loop.
    pub fn commit_now<X: ConsumerContext, C: Consumer<X>>(
        &mut self,
        consumer: &C,
        why: &'static str,
    ) {
        match self.commit(consumer) {
            Ok(Outcome::Committed { records }) => info!(records, why, "transaction committed"),
            Ok(_) => {}
            Err(e) => self.fatal = Some(e),
        }
    }

    /// Abort from a rebalance callback: errors are kept for the loop.
    pub fn abort_now(&mut self, reason: Reason) {
        if let Err(e) = self.abort(reason) {
            self.fatal = Some(e);
        }
    }

    fn test_abort_now(&mut self) -> bool {
        match self.test_aborts {
            None => false,
            Some(TestAborts::Every(n)) => self.attempts % n == 0,
            Some(TestAborts::Probability(p)) => {
                // xorshift64: test-only randomness without a dependency.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                ((self.rng >> 11) as f64 / (1u64 << 53) as f64) < p
            }
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn set_rewind(&mut self, t: OpenTxn) {
        let r = self.rewind.get_or_insert_with(HashMap::new);
        for (tp, first) in t.first_offsets() {
            r.entry(tp)
                .and_modify(|o| *o = (*o).min(first))
                .or_insert(first);
        }
    }

    fn fail_recreate(&mut self, reason: Reason) -> Result<(), Error> {
        if let Some(t) = self.open.take() {
            // Replacing the producer aborts its transaction: counted like any other abort.
            self.set_rewind(t);
            self.count_abort(reason);
        }
        self.failures_in_a_row += 1;
        self.recreate(reason)
    }

    /// Replaces the producer: the new one's init_transactions bumps the epoch (fencing the old
    /// one) and completes whatever the old one left open. Backs off while failures repeat.
    fn recreate(&mut self, reason: Reason) -> Result<(), Error> {
        if let Some(t) = self.open.take() {
            self.set_rewind(t);
        }
        // The old producer's reports die with it.
        self.harvest(false);
        self.rewind.get_or_insert_with(HashMap::new);
        let mut backoff = backoff(self.failures_in_a_row);
        loop {
            if self.shutdown.is_cancelled() {
                // Nothing is open any more; the coordinator aborts what the old producer left,
                // or the next start fences it. Waiting for the broker would outlast the grace.
                return Err(Error::Startup(format!(
                    "shutting down before the producer could be recreated ({}); the open \
                     transaction is left to the coordinator to abort",
                    reason.as_str()
                )));
            }
            if !backoff.is_zero() {
                info!(
                    ?backoff,
                    reason = reason.as_str(),
                    "waiting before recreating the producer"
                );
                std::thread::sleep(backoff);
            }
            match create_and_init(self.guarantee, &self.config, self.timeout(), &self.health) {
                Ok(p) => {
                    self.producer = p;
                    warn!(reason = reason.as_str(), "producer recreated");
                    self.metrics
                        .producer_recreations
                        .with_label_values(&[reason.as_str()])
                        .inc();
                    return Ok(());
                }
                Err(e) => {
                    if classify(Call::Init, &Facts::of(&e)) == Action::Exit {
                        return Err(unrecoverable("recreating the producer", e));
                    }
                    error!(error = %e, reason = reason.as_str(), "could not recreate the producer; retrying");
                    backoff = (backoff * 2).clamp(Duration::from_millis(100), MAX_BACKOFF);
                }
            }
        }
    }
}

/// The consumer's position in each assigned partition that has one (a seek unsets it until
/// the next record).
fn positions<X: ConsumerContext, C: Consumer<X>>(consumer: &C) -> Vec<(Tp, i64)> {
    let Ok(tpl) = consumer.position() else {
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

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

/// 0, then 100 ms doubling to 10 s, by consecutive failures.
fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let ms = 100u64.saturating_mul(1 << (failures - 2).min(10));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

fn create_and_init(
    guarantee: Guarantee,
    config: &ClientConfig,
    timeout: Duration,
    health: &Health,
) -> Result<TxnProducer, KafkaError> {
    let producer: TxnProducer = config.create_with_context(DeliveryContext::default())?;
    if guarantee == Guarantee::ExactlyOnce {
        let _g = health.in_call("init_transactions");
        producer.init_transactions(timeout)?;
    }
    Ok(producer)
}

/// librdkafka's flush, waiting up to `timeout` for every outstanding delivery.
///
/// rust-rdkafka's `flush` (which its `commit_transaction` calls first) polls the producer's
/// event queue in steps of up to 100 ms, but a `ThreadedProducer`'s own thread takes those
/// events first, so every flush slept up to 100 ms after the last delivery: commits took
/// 65-100 ms and the loop stood still meanwhile (BENCHMARKS.md, "Profile"). With delivery
/// reports as events, librdkafka's flush waits on the count of outstanding messages instead.
fn flush(producer: &TxnProducer, timeout: Duration) -> Result<(), KafkaError> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the handle is alive for the call (borrowed from the producer); rd_kafka_flush is
    // thread-safe.
    let err = unsafe { rdkafka_sys::rd_kafka_flush(producer.client().native_ptr(), ms) };
    if err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::Flush(err.into()))
    }
}

fn unrecoverable(context: &str, source: KafkaError) -> Error {
    Error::Unrecoverable {
        context: context.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_txn_tracks_first_and_next_offset_per_partition() {
        let mut t = OpenTxn::new();
        t.consumed(Consumed {
            topic: "a",
            partition: 0,
            offset: 10,
            bytes: 5,
            timestamp: None,
        });
        t.consumed(Consumed {
            topic: "a",
            partition: 0,
            offset: 11,
            bytes: 5,
            timestamp: None,
        });
        t.consumed(Consumed {
            topic: "a",
            partition: 1,
            offset: 3,
            bytes: 1,
            timestamp: None,
        });
        t.consumed(Consumed {
            topic: "b",
            partition: 0,
            offset: 7,
            bytes: 1,
            timestamp: None,
        });
        t.consumed(Consumed {
            topic: "a",
            partition: 0,
            offset: 15,
            bytes: 5,
            timestamp: None,
        }); // a gap (filtered or aborted records) is fine
        assert_eq!((t.records, t.bytes), (5, 17));
        let mut next: Vec<_> = t
            .next_offsets()
            .map(|(t, p, o)| (t.to_string(), p, o))
            .collect();
        next.sort();
        assert_eq!(
            next,
            [("a".into(), 0, 16), ("a".into(), 1, 4), ("b".into(), 0, 8)]
        );
        let mut first: Vec<_> = t.first_offsets().collect();
        first.sort();
        assert_eq!(
            first,
            [
                (("a".into(), 0), 10),
                (("a".into(), 1), 3),
                (("b".into(), 0), 7)
            ]
        );
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(3), Duration::from_millis(200));
        assert_eq!(backoff(8), Duration::from_millis(6400));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(1000), MAX_BACKOFF);
    }
}

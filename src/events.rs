//! What happens to the pipeline, each as a small type whose `emit` logs it and counts it, so a
//! log line and its metric never drift apart (Vector's internal events).
//!
//! The loop's per-record counting stays out of here: it is batched per transaction
//! ([`TransactionCommitted`] counts the records of a committed transaction) or cached per topic
//! ([`crate::metrics::RecordCounters`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{debug, error, info, warn};

use crate::metrics::Metrics;
use crate::transform;

/// Why a transaction (or an at-least-once batch) ended without a commit, or a producer was
/// replaced: the `reason` label of the abort and recreation counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
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
    /// The transform cannot work right now (a service it calls is down): the records come
    /// again after a back-off.
    TransformUnavailable,
    /// A transactional request of the producer timed out: it is replaced before the next
    /// transaction, whose epoch no late copy of that request can reach.
    RequestTimedOut,
    /// A record's output went to a topic that does not exist or may not be written.
    RouteRefused,
    /// The database sink: another instance claimed a partition of the unit (its offset row's
    /// epoch moved): rolled back, the partition dropped.
    PartitionClaimed,
    /// The database sink: a serialization failure or a deadlock (SQLSTATE class 40).
    DatabaseConflict,
    /// The database sink: the database failed the transaction otherwise.
    DatabaseFailed,
    /// The database sink: the connection was lost (or ran past a bound): a new one.
    DatabaseUnavailable,
}

impl AbortReason {
    /// Every reason, so the counters start at 0 for each.
    pub const ALL: [AbortReason; 25] = {
        use AbortReason::*;
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
            TransformUnavailable,
            RequestTimedOut,
            RouteRefused,
            PartitionClaimed,
            DatabaseConflict,
            DatabaseFailed,
            DatabaseUnavailable,
        ]
    };

    /// The label value.
    pub fn as_str(self) -> &'static str {
        use AbortReason::*;
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
            TransformUnavailable => "transform_unavailable",
            RequestTimedOut => "request_timed_out",
            RouteRefused => "route_refused",
            PartitionClaimed => "partition_claimed",
            DatabaseConflict => "database_conflict",
            DatabaseFailed => "database_failed",
            DatabaseUnavailable => "database_unavailable",
        }
    }
}

/// Creates every series of the fixed-label counters at 0: a series that appears only on its
/// first increment makes `rate()` and `increase()` miss that first event, and leaves dashboards
/// and alerts without data until something goes wrong.
pub fn initialise(m: &Metrics, refusers: &[&transform::Refuser]) {
    for r in AbortReason::ALL {
        m.transaction_aborts.with_label_values(&[r.as_str()]);
        m.producer_recreations.with_label_values(&[r.as_str()]);
    }
    for r in transform::Reason::ALL {
        m.records_dlq.with_label_values(&[r.as_str()]);
    }
    for r in refusers {
        m.records_dlq.with_label_values(&[r.reason]);
    }
    for outcome in ["committed", "aborted"] {
        m.transactions.with_label_values(&[outcome]);
    }
    for event in Rebalance::ALL {
        m.rebalances.with_label_values(&[event.as_str()]);
    }
    for outcome in transform::call::OUTCOMES {
        m.calls.with_label_values(&[outcome]);
    }
    for outcome in ["written", "refused"] {
        m.database_rows.with_label_values(&[outcome]);
    }
    for kind in DATABASE_FAILURES {
        m.database_failures.with_label_values(&[kind]);
    }
}

/// The database sink's transaction committed.
pub struct DatabaseCommitted {
    /// Rows written in it.
    pub rows: u64,
    /// From BEGIN to the COMMIT's answer.
    pub took: Duration,
}

impl DatabaseCommitted {
    /// Counts it (the loop logs commits).
    pub fn emit(&self, m: &Metrics) {
        m.database_rows
            .with_label_values(&["written"])
            .inc_by(self.rows);
        m.database_transaction_duration
            .observe(self.took.as_secs_f64());
    }
}

/// The kinds of [`DatabaseFailed`], the `kind` label: a conflict (replayed), the connection
/// lost, a connection that could not be made (unreachable), the setup's (exactly stops),
/// other.
pub const DATABASE_FAILURES: [&str; 5] = ["conflict", "lost", "unreachable", "setup", "other"];

/// A database call of the sink failed (not a row's fault: [`RowRefused`]).
pub struct DatabaseFailed<'a> {
    /// One of [`DATABASE_FAILURES`].
    pub kind: &'static str,
    /// What the sink was doing.
    pub doing: &'a str,
    /// The server's code, if it gave one.
    pub code: Option<&'a str>,
    /// The failure.
    pub error: &'a dyn std::fmt::Display,
}

impl DatabaseFailed<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        let (kind, doing, code) = (self.kind, self.doing, self.code);
        match kind {
            "lost" => {
                warn!(error = %self.error, doing, "the database connection was lost; connecting again")
            }
            // The driver logs its reconnection attempts.
            "unreachable" => debug!(error = %self.error, doing, "the database is unreachable"),
            _ => {
                warn!(error = %self.error, kind, code, doing, "the database failed the transaction; aborting")
            }
        }
        m.database_failures.with_label_values(&[kind]).inc();
    }
}

/// The database refused a row for what it holds: its copy goes by --on-error (the record it
/// came from is named when its replay sends the copy).
pub struct RowRefused<'a> {
    /// Its table.
    pub table: &'a str,
    /// Its place among the unit's rows (from 0).
    pub position: Option<usize>,
    /// How many rows the unit wrote.
    pub rows: usize,
    /// The server's code.
    pub code: Option<&'a str>,
    /// The server's message.
    pub error: &'a dyn std::fmt::Display,
}

impl RowRefused<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        let (table, position, rows, code) = (self.table, self.position, self.rows, self.code);
        warn!(table, position, rows, code, error = %self.error, "the database refused a row");
        m.database_rows.with_label_values(&["refused"]).inc();
    }
}

/// Partitions whose offset's compare-and-set matched no row: the transaction rolled back.
pub struct PartitionsFenced<'a> {
    /// Their topic.
    pub topic: &'a str,
    /// The partitions.
    pub partitions: &'a [i32],
}

impl PartitionsFenced<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        warn!(
            topic = self.topic,
            partitions = ?self.partitions,
            "the offsets table did not move for these partitions (another instance claimed \
             them?); rolled back"
        );
        m.database_fenced_partitions
            .inc_by(self.partitions.len() as u64);
    }
}

/// A start or a rewind target below what this process committed in its partition, raised to
/// that: the group answered less.
pub struct OffsetWentBack<'a> {
    /// The partition's topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// Where it would have started or gone back to (`None`: the group answered nothing, so
    /// `auto.offset.reset`).
    pub was: Option<i64>,
    /// What this process committed there, where it starts instead.
    pub committed: i64,
}

impl OffsetWentBack<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        error!(
            topic = self.topic,
            partition = self.partition,
            was = ?self.was,
            committed = self.committed,
            "the group answered a committed offset below what this process committed there \
             (a broker that lost the group's offsets, RELIABILITY.md; or offsets reset while \
             this process was out of the group): starting or going back to what this process \
             committed instead of writing again what it wrote"
        );
        m.committed_offsets_went_back.inc();
    }
}

/// A claim whose starts could not be held: the group's committed offsets were unreadable in
/// time, so the claimed partitions start where librdkafka's own fetch says.
pub struct ClaimUnchecked<'a> {
    /// The partitions claimed.
    pub partitions: usize,
    /// Why the offsets could not be read.
    pub why: &'a str,
}

impl ClaimUnchecked<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        warn!(
            partitions = self.partitions,
            error = self.why,
            "where the claimed partitions start is unchecked: the group's committed offsets \
             could not be read, so they start where librdkafka's fetch says"
        );
        m.claims_unchecked.inc();
    }
}

/// A transaction (or at-least-once batch) committed, with everything it counted.
pub struct TransactionCommitted<'a> {
    /// Input records consumed, per topic and partition.
    pub consumed: &'a [(&'a str, i32, u64)],
    /// Inputs that yielded no output.
    pub filtered: u64,
    /// DLQ records by reason.
    pub dead_lettered: &'a [(transform::Reason, u64)],
    /// Input records in the transaction.
    pub records: u64,
    /// Input timestamps (ms since the epoch), for the end-to-end latency.
    pub timestamps: &'a [i64],
    /// From sending the offsets to the end of the commit.
    pub took: Duration,
}

impl TransactionCommitted<'_> {
    /// Counts it (the loop logs commits itself, at the level the occasion deserves). One that
    /// committed offsets and no record is counted apart: it is not a transaction of records.
    pub fn emit(&self, m: &Metrics) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        m.last_commit_timestamp.set(now.as_secs_f64());
        m.commit_duration.observe(self.took.as_secs_f64());
        if self.records == 0 {
            m.offsets_only_commits.inc();
            return;
        }
        for (topic, p, n) in self.consumed {
            m.records_consumed
                .with_label_values(&[*topic, p.to_string().as_str()])
                .inc_by(*n);
        }
        m.records_filtered.inc_by(self.filtered);
        for (r, n) in self.dead_lettered {
            if *n > 0 {
                m.records_dlq.with_label_values(&[r.as_str()]).inc_by(*n);
            }
        }
        m.transactions.with_label_values(&["committed"]).inc();
        m.transaction_records.observe(self.records as f64);
        let now_ms = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
        for ts in self.timestamps {
            // Clocks of producers upstream may be ahead of ours: never negative.
            m.end_to_end_latency
                .observe(now_ms.saturating_sub(*ts).max(0) as f64 / 1000.0);
        }
    }
}

/// A transaction ended without a commit, or an at-least-once batch was dropped: a rewind is
/// pending.
pub struct TransactionAborted {
    /// Why.
    pub reason: AbortReason,
    /// How it ended.
    pub ended: Ended,
}

/// How a transaction that did not commit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `abort_transaction` succeeded.
    Aborted,
    /// At-least-once: nothing to abort on the broker; the batch's offsets are not committed.
    Dropped,
    /// Its producer is replaced (fenced, or the abort failed): the new producer's
    /// `init_transactions` aborts it on the broker. The recreation logs for itself.
    Replaced,
    /// The process stops on an unrecoverable error; the coordinator aborts it (or the next
    /// start fences it). The error is logged on the way out.
    Abandoned,
}

impl TransactionAborted {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        let reason = self.reason.as_str();
        match self.ended {
            Ended::Aborted => info!(reason, "transaction aborted"),
            Ended::Dropped => info!(reason, "batch dropped; rewinding (at least once)"),
            Ended::Replaced => debug!(reason, "transaction ended by replacing the producer"),
            Ended::Abandoned => debug!(reason, "transaction abandoned"),
        }
        m.transactions.with_label_values(&["aborted"]).inc();
        m.transaction_aborts.with_label_values(&[reason]).inc();
    }
}

/// A new client of the sink replaced one that was fenced or broken: a producer, or a database
/// connection.
pub struct ProducerRecreated {
    /// Why the old one went.
    pub reason: AbortReason,
    /// Where outputs go: the broker (a producer) or the database (a connection).
    pub to: &'static transform::Refuser,
}

impl ProducerRecreated {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        let reason = self.reason.as_str();
        warn!(reason, "{}", self.to.replaced);
        m.producer_recreations.with_label_values(&[reason]).inc();
    }
}

/// A rebalance event, the `event` label of `exactly_rebalances_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rebalance {
    /// Partitions assigned.
    Assign,
    /// Partitions revoked: the open transaction commits first.
    Revoke,
    /// Partitions lost (session timeout): the open transaction is aborted.
    Lost,
}

impl Rebalance {
    /// Every event, so the counter starts at 0 for each.
    pub const ALL: [Rebalance; 3] = [Rebalance::Assign, Rebalance::Revoke, Rebalance::Lost];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rebalance::Assign => "assign",
            Rebalance::Revoke => "revoke",
            Rebalance::Lost => "lost",
        }
    }
}

/// Partitions moved in or out.
pub struct Rebalanced<'a> {
    /// What happened.
    pub event: Rebalance,
    /// Which partitions, `topic[0,1]`.
    pub partitions: &'a str,
}

impl Rebalanced<'_> {
    /// Logs and counts it.
    pub fn emit(&self, m: &Metrics) {
        let partitions = self.partitions;
        match self.event {
            Rebalance::Assign => info!(partitions, "partitions assigned"),
            Rebalance::Revoke => info!(partitions, "partitions revoked; committing first"),
            Rebalance::Lost => {
                warn!(partitions, "partitions lost; aborting the open transaction")
            }
        }
        m.rebalances.with_label_values(&[self.event.as_str()]).inc();
    }
}

/// The partitions owned after a rebalance.
pub struct Assignment<'a> {
    /// `topic[0,1]`.
    pub owned: &'a str,
    /// How many.
    pub count: usize,
}

impl Assignment<'_> {
    /// Logs it and sets the gauge.
    pub fn emit(&self, m: &Metrics) {
        info!(owned = self.owned, "assignment now");
        m.assigned_partitions
            .set(i64::try_from(self.count).unwrap_or(i64::MAX));
    }
}

/// A record the transform refused, and what the `--on-error` policy did with it. Counted when
/// its transaction commits (a record replayed after an abort counts once).
pub struct BadRecord<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// Why.
    pub error: &'a transform::TransformError,
    /// `Some(form)`: written to the DLQ as this copy; `None`: skipped.
    pub dead_letter: Option<&'a dyn std::fmt::Debug>,
    /// Where outputs go: the dead-letter copy goes to a topic (the broker's) or a table (the
    /// database's).
    pub to: &'static transform::Refuser,
}

impl BadRecord<'_> {
    /// Logs it.
    pub fn emit(&self) {
        let (topic, partition, offset) = (self.topic, self.partition, self.offset);
        let (reason, error) = (self.error.reason.as_str(), &self.error.message);
        match self.dead_letter {
            Some(copy) => warn!(
                topic, partition, offset, reason, error = %error, copy = ?copy,
                "{}", self.to.dead_letter
            ),
            None => warn!(topic, partition, offset, reason, error = %error, "record skipped"),
        }
    }
}

/// The transform said it cannot work right now.
pub struct TransformUnavailable<'a> {
    /// What it said.
    pub why: &'a str,
}

impl TransformUnavailable<'_> {
    /// Logs it (the abort that follows is counted as `transform_unavailable`).
    pub fn emit(&self) {
        warn!(
            error = self.why,
            "transform unavailable; aborting, rewinding and backing off"
        );
    }
}

/// A call to the application came back (or failed).
pub struct CallAnswered {
    /// `ok`, or the failure's [`transform::call::CallError::outcome`].
    pub outcome: &'static str,
    /// From sending to the decoded answer.
    pub took: Duration,
    /// Input records in the call.
    pub records: usize,
}

impl CallAnswered {
    /// Counts it (a failure is logged by the [`TransformUnavailable`] that follows).
    pub fn emit(&self, m: &Metrics) {
        m.calls.with_label_values(&[self.outcome]).inc();
        m.call_duration.observe(self.took.as_secs_f64());
        m.call_records.observe(self.records as f64);
        debug!(outcome = self.outcome, took = ?self.took, records = self.records, "call answered");
    }
}

/// Why a transaction committed when it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occasion {
    /// It reached its interval, record or byte bound: the steady case, logged at debug.
    Bound,
    /// Partitions are being revoked.
    Rebalance,
    /// The final commit on shutdown.
    Shutdown,
}

/// A commit the loop made (counted by [`TransactionCommitted`]), logged at the level its
/// occasion deserves.
pub fn committed(records: u64, occasion: Occasion) {
    match occasion {
        Occasion::Bound => debug!(records, "transaction committed"),
        Occasion::Rebalance => info!(records, why = "rebalance", "transaction committed"),
        Occasion::Shutdown => info!(records, "final transaction committed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_labels_exist_before_their_first_event() {
        let m = Metrics::new();
        initialise(&m, &[&transform::Refuser::TEST]);
        let text = m.render();
        assert!(text.contains("exactly_transaction_aborts_total{reason=\"commit_failed\"} 0"));
        assert!(text.contains("exactly_records_dlq_total{reason=\"not_json\"} 0"));
        assert!(text.contains("exactly_records_dlq_total{reason=\"rejected_by_broker\"} 0"));
        assert!(text.contains("exactly_producer_recreations_total{reason=\"commit_fenced\"} 0"));
        assert!(text.contains("exactly_rebalances_total{event=\"lost\"} 0"));
        assert!(text.contains("exactly_transactions_total{outcome=\"aborted\"} 0"));
    }

    #[test]
    fn an_event_counts_what_it_logs() {
        let m = Metrics::new();
        TransactionAborted {
            reason: AbortReason::CommitFailed,
            ended: Ended::Aborted,
        }
        .emit(&m);
        ProducerRecreated {
            reason: AbortReason::CommitFenced,
            to: &transform::Refuser::TEST,
        }
        .emit(&m);
        Rebalanced {
            event: Rebalance::Lost,
            partitions: "in[0]",
        }
        .emit(&m);
        TransactionCommitted {
            consumed: &[("in", 0, 3)],
            filtered: 1,
            dead_lettered: &[
                (transform::Reason::JqError, 2),
                (transform::Reason::Rejected(&transform::Refuser::TEST), 1),
            ],
            records: 3,
            timestamps: &[0],
            took: Duration::from_millis(4),
        }
        .emit(&m);
        let text = m.render();
        for line in [
            "exactly_transaction_aborts_total{reason=\"commit_failed\"} 1",
            "exactly_transactions_total{outcome=\"aborted\"} 1",
            "exactly_transactions_total{outcome=\"committed\"} 1",
            "exactly_producer_recreations_total{reason=\"commit_fenced\"} 1",
            "exactly_rebalances_total{event=\"lost\"} 1",
            "exactly_records_consumed_total{partition=\"0\",topic=\"in\"} 3",
            "exactly_records_filtered_total 1",
            "exactly_records_dlq_total{reason=\"jq_error\"} 2",
            "exactly_records_dlq_total{reason=\"rejected_by_broker\"} 1",
            "exactly_transaction_records_count 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // Offsets only: apart.
        TransactionCommitted {
            consumed: &[],
            filtered: 0,
            dead_lettered: &[],
            records: 0,
            timestamps: &[],
            took: Duration::from_millis(2),
        }
        .emit(&m);
        let text = m.render();
        assert!(
            text.contains("exactly_offsets_only_commits_total 1"),
            "{text}"
        );
        assert!(
            text.contains("exactly_transactions_total{outcome=\"committed\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let mut names: Vec<_> = AbortReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), AbortReason::ALL.len());
    }
}

//! The driver: the sink, and the bookkeeping every sink shares. The open batch and its counts,
//! the rewind an abort leaves pending, the verdicts on rejected records, the back-off of
//! failures in a row, and the test switches; it turns each [`Failed`] into an abort or a new
//! client, so a sink only says what went wrong.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::batch::{Batch, Consumed};
use super::rejected::{SentLog, Source, Verdicts};
use super::{
    Began, Calls, Failed, Group, Outcome, Record, SendError, Sink, sink_of, unrecoverable,
};
use crate::config::{Config, TestAborts};
use crate::error::{Action, Call, Error, Facts, classify, rejected_record};
use crate::events::{AbortReason, Ended, Occasion, ProducerRecreated, TransactionAborted};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::records::Outgoing;
use crate::transform::Tp;

/// Longest pause between producer re-creations.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The sink and the bookkeeping every sink shares.
pub struct Driver {
    sink: Box<dyn Sink>,
    calls: Calls,
    open: Option<Batch>,
    /// First offsets of an aborted transaction: a fallback for partitions without a committed
    /// offset when rewinding.
    rewind: Option<HashMap<Tp, i64>>,
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
    /// The first offset of each partition's records that were read but not yet applied (the
    /// call-out's batches): the consumer's position is past them, and no commit may be.
    staged: Vec<(Tp, i64)>,
}

/// Creates the configured sink and connects it, retrying until --startup-timeout.
pub fn start(
    c: &Config,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<Driver, Error> {
    let mut sink = sink_of(c);
    let deadline = Instant::now() + c.startup_timeout;
    let mut last: Option<KafkaError> = None;
    while Instant::now() < deadline && !shutdown.is_cancelled() {
        let left = deadline.saturating_duration_since(Instant::now());
        let calls = Calls {
            health: health.clone(),
            call_timeout: left.min(c.transaction_timeout),
            deadline: None,
        };
        match sink.connect(&calls) {
            Ok(()) => {
                return Ok(Driver {
                    sink,
                    calls: Calls {
                        health,
                        call_timeout: c.transaction_timeout,
                        deadline: None,
                    },
                    open: None,
                    rewind: None,
                    metrics,
                    shutdown,
                    failures_in_a_row: 0,
                    fatal: None,
                    attempts: 0,
                    test_aborts: c.test_aborts,
                    test_fail_sends: c.test_fail_sends,
                    rng: seed(),
                    sent: SentLog::default(),
                    verdicts: Verdicts::default(),
                    committing: HashMap::new(),
                    last_committed: HashMap::new(),
                    last_advance_check: Instant::now(),
                    staged: Vec::new(),
                });
            }
            Err(e) => {
                if let Some(reason) = sink.refused() {
                    return Err(Error::Refused(reason));
                }
                if classify(Call::Init, &Facts::of(&e)) == Action::Exit {
                    return Err(unrecoverable("initialising transactions", e));
                }
                warn!(error = %e, "init_transactions failed; retrying");
                last = Some(e);
                std::thread::sleep(Duration::from_millis(500).min(left));
            }
        }
    }
    Err(Error::Startup(format!(
        "--bootstrap-servers {}: could not initialise transactions within {} \
         (--startup-timeout){}",
        c.kafka.bootstrap_servers,
        humantime::format_duration(c.startup_timeout),
        last.map(|e| format!(": {e}")).unwrap_or_default()
    )))
}

impl Driver {
    /// Whether `topic` exists where outputs go.
    pub fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, KafkaError> {
        self.sink.topic_exists(topic, timeout)
    }

    /// Bounds every later call by `deadline` (shutdown grace).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.calls.deadline = Some(deadline);
    }

    /// How long the open transaction has been open (zero when none is).
    pub fn open_age(&self) -> Duration {
        self.open
            .as_ref()
            .map_or(Duration::ZERO, |t| t.began.elapsed())
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

    /// Whether an abort left a rewind pending.
    pub fn rewind_pending(&self) -> bool {
        self.rewind.is_some()
    }

    /// Makes a rewind pending even when no unit was open: records read but never applied
    /// (`firsts`: the first of each partition) must come again.
    pub fn rewind_from(&mut self, firsts: &[(Tp, i64)]) {
        self.rewind.get_or_insert_with(HashMap::new);
        for ((topic, partition), offset) in firsts {
            self.rewind_also(topic, *partition, *offset);
        }
    }

    /// A record was read but is applied later (the call-out stages it): commits stay below it.
    pub fn staged_also(&mut self, topic: &str, partition: i32, offset: i64) {
        if !self
            .staged
            .iter()
            .any(|((t, p), _)| *p == partition && t == topic)
        {
            self.staged.push(((topic.to_string(), partition), offset));
        }
    }

    /// The first offset of each partition's staged records, after some were applied or
    /// dropped.
    pub fn set_staged(&mut self, firsts: Vec<(Tp, i64)>) {
        self.staged = firsts;
    }

    /// The consumer's positions, none past a staged record.
    fn positions(&self, group: &dyn Group) -> Vec<(Tp, i64)> {
        below_staged(group.positions(), &self.staged)
    }

    /// Takes the pending rewind, if any: the aborted transaction's first offsets.
    pub fn take_rewind(&mut self) -> Option<HashMap<Tp, i64>> {
        debug_assert!(
            self.rewind.is_none() || self.open.is_none(),
            "rewind with an open txn"
        );
        self.rewind.take()
    }

    /// What the group has committed for `partitions`: the rewind's target.
    pub fn committed(
        &self,
        group: &dyn Group,
        partitions: TopicPartitionList,
        timeout: Duration,
    ) -> KafkaResult<TopicPartitionList> {
        self.sink.committed(group, partitions, timeout)
    }

    /// An error raised where it could not be returned (in a rebalance callback).
    pub fn take_fatal(&mut self) -> Option<Error> {
        self.fatal.take()
    }

    /// Consecutive aborts and recreations since the last commit.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failures_in_a_row
    }

    /// What the broker said about inputs whose records it rejected.
    pub fn verdicts(&self) -> &Verdicts {
        &self.verdicts
    }

    /// A suspect whose records all went through alone is innocent.
    pub fn cleared(&mut self, topic: &str, partition: i32, offset: i64) {
        self.verdicts.clear(topic, partition, offset);
    }

    /// Makes sure a unit is open before the first output of a record is sent.
    pub fn begin(&mut self) -> Result<Began, Error> {
        if self.open.is_some() {
            return Ok(Began::Open);
        }
        self.sent.clear();
        match self.sink.begin(&self.calls) {
            Ok(()) => {
                self.open = Some(Batch::new());
                Ok(Began::Open)
            }
            Err(Failed::Exit(e)) => Err(e),
            Err(Failed::Recreate(reason) | Failed::Abort(reason)) => {
                self.failures_in_a_row += 1;
                self.recreate(reason)?;
                Ok(Began::Replaced)
            }
            Err(Failed::TooLarge) => {
                self.failures_in_a_row += 1;
                self.recreate(AbortReason::BeginFailed)?;
                Ok(Began::Replaced)
            }
        }
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
            t.dead_lettered(reason);
        }
    }

    /// Counts one consumed record into the open transaction (which must be open).
    pub fn consumed(&mut self, record: Consumed<'_>) {
        if let Some(t) = self.open.as_mut() {
            t.consumed(record);
        }
    }

    /// Sends one record of `source` inside the open unit. `alone`: a suspect of a rejected
    /// batch, sent in a batch of its own and waited for; if the broker rejects it now, the
    /// transaction is aborted (its replay sends the dead-letter copy).
    pub fn send(
        &mut self,
        topic: &str,
        out: &mut Outgoing<'_>,
        timestamp: Option<i64>,
        source: Source<'_>,
        alone: bool,
    ) -> Result<(), SendError> {
        let flushed = alone && self.sink.settle(&self.calls);
        if alone && self.sink.has_rejections() {
            // Something sent before it was rejected: learn from that first.
            return self.aborted(AbortReason::ProduceFailed);
        }
        if self.test_fail_sends > 0 {
            self.test_fail_sends -= 1;
            warn!("test switch: failing this send");
            return self.aborted(AbortReason::ProduceFailed);
        }
        let index = self.sent.push(source);
        let record = Record {
            topic,
            out,
            timestamp,
            index,
        };
        match self.sink.send(record, &self.calls) {
            Ok(()) if alone => self.check_alone(flushed),
            Ok(()) => Ok(()),
            Err(Failed::TooLarge) => {
                let code = RDKafkaErrorCode::MessageSizeTooLarge;
                self.verdicts.learn(&[(source, code)], true);
                Err(SendError::TooLarge)
            }
            Err(Failed::Abort(reason)) => self.aborted(reason),
            Err(Failed::Recreate(reason)) => {
                self.fail_recreate(reason).map_err(SendError::Fatal)?;
                Err(SendError::Aborted)
            }
            Err(Failed::Exit(e)) => Err(SendError::Fatal(e)),
        }
    }

    fn aborted(&mut self, reason: AbortReason) -> Result<(), SendError> {
        self.abort(reason).map_err(SendError::Fatal)?;
        Err(SendError::Aborted)
    }

    /// After a record sent alone: its delivery report decides. `flushed`: nothing else was in
    /// flight when it was sent, so a rejection now is certainly its own.
    fn check_alone(&mut self, flushed: bool) -> Result<(), SendError> {
        let alone = self.sink.settle(&self.calls) && flushed;
        if !self.sink.has_rejections() {
            return Ok(());
        }
        self.abort_with(AbortReason::RecordRejected, alone)
            .map_err(SendError::Fatal)?;
        Err(SendError::Aborted)
    }

    /// Turns the rejections of a unit that ended without a commit into verdicts.
    /// `alone`: the last record was sent alone, so a rejection is its own.
    fn harvest(&mut self, alone: bool) {
        let codes = self.sink.take_rejections(Duration::from_secs(1));
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

    /// Commits the open unit with its offsets. Any failure ends in an abort or a new client,
    /// with a rewind pending; only unrecoverable errors are returned.
    pub fn commit(&mut self, group: &dyn Group) -> Result<Outcome, Error> {
        if self.open.is_none() {
            return Ok(Outcome::Empty);
        }
        self.attempts += 1;
        if self.test_abort_now() {
            info!("test switch: aborting this transaction instead of committing it");
            self.abort(AbortReason::TestInjected)?;
            return Ok(Outcome::Aborted);
        }
        let Some(t) = self.open.as_ref() else {
            return Ok(Outcome::Empty);
        };
        let started = Instant::now();
        let offsets = self.offsets_to_commit(t, group);
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .map_err(|e| unrecoverable("building the offsets to commit", e))?;
        }
        self.committing = offsets;
        match self.sink.commit(&tpl, group, &self.calls) {
            Ok(()) => Ok(self.settle_commit(started)),
            Err(Failed::Exit(e)) => Err(e),
            Err(Failed::Abort(reason)) => {
                self.abort(reason)?;
                Ok(Outcome::Aborted)
            }
            Err(Failed::TooLarge) => {
                self.abort(AbortReason::CommitFailed)?;
                Ok(Outcome::Aborted)
            }
            Err(Failed::Recreate(reason)) => {
                self.fail_recreate(reason)?;
                Ok(Outcome::Aborted)
            }
        }
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
    fn offsets_to_commit(&self, t: &Batch, group: &dyn Group) -> HashMap<Tp, i64> {
        let mut offsets: HashMap<Tp, i64> = t
            .next_offsets()
            .map(|(topic, p, next)| ((topic.to_string(), p), next))
            .collect();
        for (tp, pos) in self.positions(group) {
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

    /// No unit is open, and the consumer's position passed control records (the marker after
    /// an upstream transaction) beyond what was last committed: an offsets-only unit moves the
    /// group there. Checked at most once per `interval`.
    pub fn advance_due(&mut self, group: &dyn Group, interval: Duration) -> bool {
        // With a rewind pending the position is past records that must come again.
        if self.open.is_some()
            || self.rewind.is_some()
            || self.last_advance_check.elapsed() < interval
        {
            return false;
        }
        self.last_advance_check = Instant::now();
        self.positions(group)
            .into_iter()
            .any(|(tp, pos)| self.moved(&tp, pos))
    }

    /// Bookkeeping of a successful commit.
    fn settle_commit(&mut self, started: Instant) -> Outcome {
        let Some(t) = self.open.take() else {
            return Outcome::Empty;
        };
        self.last_committed
            .extend(std::mem::take(&mut self.committing));
        for (topic, partition, next) in t.next_offsets() {
            self.verdicts.committed(topic, partition, next);
        }
        self.failures_in_a_row = 0;
        t.emit_committed(started.elapsed(), &self.metrics);
        Outcome::Committed { records: t.records }
    }

    /// Aborts the open unit (if any) and leaves a rewind pending. A failed abort recreates
    /// the client, which aborts it on the broker.
    pub fn abort(&mut self, reason: AbortReason) -> Result<(), Error> {
        self.abort_with(reason, false)
    }

    /// [`Driver::abort`]; `alone`: the last record was sent alone (its rejection is its own).
    fn abort_with(&mut self, reason: AbortReason, alone: bool) -> Result<(), Error> {
        let Some(t) = self.open.take() else {
            return Ok(());
        };
        self.failures_in_a_row += 1;
        self.set_rewind(t);
        let result = self.sink.abort(reason, &self.calls);
        // A unit that failed for want of a permission fails again after any retry: stop,
        // with the unit aborted if the abort went through (else the coordinator aborts it).
        if let Some(denied) = self.sink.denied() {
            let ended = if result.is_ok() {
                self.sink.ended()
            } else {
                Ended::Abandoned
            };
            self.aborted_event(reason, ended);
            return Err(Error::Denied(denied));
        }
        match result {
            Ok(()) => {
                self.aborted_event(reason, self.sink.ended());
                self.harvest(alone);
                Ok(())
            }
            Err(Failed::Exit(e)) => {
                self.aborted_event(reason, Ended::Abandoned);
                Err(e)
            }
            Err(_) => {
                // The new producer's init_transactions aborts it; recreate harvests what the
                // old one reported.
                self.aborted_event(reason, Ended::Replaced);
                self.recreate(reason)
            }
        }
    }

    fn aborted_event(&self, reason: AbortReason, ended: Ended) {
        TransactionAborted { reason, ended }.emit(&self.metrics);
    }

    /// Commit from a rebalance callback: errors are kept for the loop.
    pub fn commit_now(&mut self, group: &dyn Group, occasion: Occasion) {
        match self.commit(group) {
            Ok(Outcome::Committed { records }) => crate::events::committed(records, occasion),
            Ok(_) => {}
            Err(e) => self.fatal = Some(e),
        }
    }

    /// Abort from a rebalance callback: errors are kept for the loop.
    pub fn abort_now(&mut self, reason: AbortReason) {
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

    fn set_rewind(&mut self, t: Batch) {
        let r = self.rewind.get_or_insert_with(HashMap::new);
        for (tp, first) in t.first_offsets() {
            r.entry(tp)
                .and_modify(|o| *o = (*o).min(first))
                .or_insert(first);
        }
    }

    fn fail_recreate(&mut self, reason: AbortReason) -> Result<(), Error> {
        if let Some(t) = self.open.take() {
            // Replacing the producer aborts its transaction: counted like any other abort.
            self.set_rewind(t);
            self.aborted_event(reason, Ended::Replaced);
        }
        self.failures_in_a_row += 1;
        self.recreate(reason)
    }

    /// Replaces the client: a new transactional producer's init_transactions bumps the epoch
    /// (fencing the old one) and completes whatever the old one left open. Backs off while
    /// failures repeat.
    fn recreate(&mut self, reason: AbortReason) -> Result<(), Error> {
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
                return Err(Error::Stopped(format!(
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
            match self.sink.connect(&self.calls) {
                Ok(()) => {
                    ProducerRecreated { reason }.emit(&self.metrics);
                    return Ok(());
                }
                Err(e) => {
                    if classify(Call::Init, &Facts::of(&e)) == Action::Exit {
                        return Err(unrecoverable("recreating the producer", e));
                    }
                    // The cluster took these settings before: a refusal now (credentials
                    // rotated, a certificate renewed on one broker) may pass; keep backing off.
                    let refused = self.sink.refused();
                    error!(error = %e, ?refused, reason = reason.as_str(), "could not recreate the producer; retrying");
                    backoff = (backoff * 2).clamp(Duration::from_millis(100), MAX_BACKOFF);
                }
            }
        }
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

/// `positions`, each at most its partition's first staged offset.
fn below_staged(mut positions: Vec<(Tp, i64)>, staged: &[(Tp, i64)]) -> Vec<(Tp, i64)> {
    for (tp, pos) in &mut positions {
        if let Some((_, first)) = staged.iter().find(|(s, _)| s == tp) {
            *pos = (*pos).min(*first);
        }
    }
    positions
}

/// 0, then 100 ms doubling to 10 s, by consecutive failures.
fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let ms = 100u64.saturating_mul(1 << (failures - 2).min(10));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn no_position_passes_a_staged_record() {
        let tp = |p| ("in".to_string(), p);
        let positions = vec![(tp(0), 50), (tp(1), 70), (tp(2), 9)];
        let staged = [(tp(0), 40), (tp(2), 12), (("other".to_string(), 1), 3)];
        assert_eq!(
            below_staged(positions, &staged),
            vec![(tp(0), 40), (tp(1), 70), (tp(2), 9)]
        );
    }
}

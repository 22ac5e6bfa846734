//! The driver: the sink and its open unit. It turns each [`Failed`] into an abort or a new
//! client (backing off while failures repeat), learns from the records the destination
//! refused ([`Rejections`]), and keeps the fact every ending without a commit leaves behind: a
//! rewind is owed, and nothing begins until the loop has performed it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;

mod connect;
mod rewind;
mod routed;
mod unknown;

use super::ledger::Ledger;
use super::offsets::CommitOffsets;
use super::rejected::{Rejections, Source, Verdict};
use super::routes::Routes;
use super::{
    Began, Bounds, Consumed, Content, Failed, Feedback, Group, Outcome, Record, SendError, Settled,
    Sink, Starts, Unapplied, Unit, Unreadable, Wait,
};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::events::{self, AbortReason, Ended, Occasion, TransactionAborted};
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::records::Outgoing;
use crate::transform::Reason;
use routed::Denial;

/// How long a claim waits for the group's committed offsets to hold them to what this
/// process committed ([`Driver::hold`]): unanswered, librdkafka starts the partitions.
const CHECK_STARTS: Duration = Duration::from_secs(5);

/// Where the unit of work stands.
enum State {
    /// Nothing open: the next record begins a unit.
    Idle,
    /// A unit is open.
    Open(Box<Unit>),
    /// The last unit ended without a commit (or the loop dropped records it had read): the
    /// consumer must go back to the committed offsets before anything begins.
    RewindOwed,
}

/// The sink, its open unit and what every sink shares around it.
pub struct Driver {
    sink: Box<dyn Sink>,
    bounds: Bounds,
    state: State,
    /// Each owned partition's offsets: first read, last committed.
    ledger: Ledger,
    offsets: CommitOffsets,
    rejections: Rejections,
    /// Aborts and recreations since the last commit.
    failures: u32,
    /// Units committed since start.
    commits: u64,
    /// A commit whose outcome was unknown, counted once the committed offsets tell.
    unresolved: Option<unknown::Unresolved>,
    /// How units ended since the last take, in order: one for every unit begun.
    settled: Vec<Settled>,
    /// Routes refusing the records sent there.
    routes: Routes,
    /// What the sink said and the driver has not acted on yet.
    heard: Feedback,
    /// An error raised where it could not be returned (a rebalance callback).
    fatal: Option<Error>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Driver {
    /// Whether the destination `name` exists.
    pub fn exists(&self, name: &str, timeout: Duration) -> Result<bool, String> {
        self.sink.exists(name, timeout)
    }

    /// Who refuses the sink's records for what they are.
    pub fn refuser(&self) -> &'static crate::transform::Refuser {
        self.sink.destination().refuser
    }

    /// What the destination is to the loop.
    pub fn destination(&self) -> super::Destination {
        self.sink.destination()
    }

    /// Bounds every later call by `deadline` (shutdown grace).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.bounds.set_deadline(deadline);
    }

    /// The open unit, if one is.
    pub fn unit(&self) -> Option<&Unit> {
        match &self.state {
            State::Open(u) => Some(u),
            _ => None,
        }
    }

    /// The bound of the next blocking call.
    pub fn call_timeout(&self) -> Duration {
        self.bounds.timeout()
    }

    /// An error raised where it could not be returned (in a rebalance callback).
    pub fn take_fatal(&mut self) -> Option<Error> {
        self.fatal.take()
    }

    /// Aborts and recreations since the last commit.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failures
    }

    /// Units committed since start: progress.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Each owned partition's offsets.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The ledger publishes the lag's floors to `positions` from now on.
    pub fn publish_floors(&mut self, positions: Arc<crate::lag::Positions>) {
        self.ledger.publish_to(positions);
    }

    /// A record of `topic`/`partition` at `offset` was polled: the ledger notes it.
    pub fn read(&mut self, topic: &str, partition: i32, offset: i64) {
        self.ledger.read(topic, partition, offset);
    }

    /// How units ended since the last take, in order, once that is known: one for every unit
    /// begun (a unit whose commit's outcome is unknown waits for the rewind to tell).
    pub fn take_settled(&mut self) -> Vec<Settled> {
        std::mem::take(&mut self.settled)
    }

    /// What the destination said about an input whose records it refused, and the
    /// fingerprint of the output it refused.
    pub fn verdict(&self, topic: &str, partition: i32, offset: i64) -> Option<(Verdict, u64)> {
        self.rejections.verdict(topic, partition, offset)
    }

    /// A suspect whose records all went through alone is innocent.
    pub fn cleared(&mut self, topic: &str, partition: i32, offset: i64) {
        self.rejections.cleared(topic, partition, offset);
    }

    /// Makes sure a unit is open before the first output of a record is sent.
    pub fn begin(&mut self) -> Result<Began, Error> {
        match self.state {
            State::Open(_) => return Ok(Began::Open),
            State::RewindOwed => return Ok(Began::RewindOwed),
            State::Idle => {}
        }
        let mut renewed = false;
        let reason = loop {
            // Lines heard after their unit ended are that unit's: a route's refusal stays known
            // (the route's state); a denial, a refusal, a delivery is not this unit's. Again
            // after a new client: the old one's last lines are heard as it goes.
            self.hear(Wait::Now);
            self.collect_routes();
            let watch = self.routes.began(Instant::now());
            match self.sink.begin(watch, &self.bounds) {
                Ok(()) => {
                    self.rejections.new_unit();
                    self.heard = Feedback::default();
                    self.state = State::Open(Box::new(Unit::new()));
                    return Ok(Began::Open);
                }
                Err(Failed::Renew(reason)) if !renewed => {
                    renewed = true;
                    self.renew(reason)?;
                }
                Err(Failed::Exit(e) | Failed::Denied(e)) => return Err(e),
                Err(
                    Failed::Recreate(reason)
                    | Failed::Renew(reason)
                    | Failed::Abort(reason)
                    | Failed::Unknown { reason, .. },
                ) => break reason,
                Err(Failed::TooLarge | Failed::Unroutable { .. }) => {
                    break AbortReason::BeginFailed;
                }
            }
        };
        self.failures += 1;
        self.recreate(reason)?;
        Ok(Began::RewindOwed)
    }

    /// Takes what the sink says, waiting as `wait` says first. Whether everything sent so far
    /// was reported.
    fn hear(&mut self, wait: Wait) -> bool {
        let heard = self.sink.hear(wait, &self.bounds);
        let settled = heard.settled;
        self.heard.merge(heard);
        settled
    }

    /// Nothing was read this turn (`last`: the process is stopping): between units, the sink
    /// keeps an idle connection alive and the group's copy of its offsets up to date.
    pub fn idle(&mut self, group: &dyn Group, last: bool) {
        if matches!(self.state, State::Idle) {
            self.sink.idle(group, last);
        }
    }

    /// Counts one input record into the open unit.
    pub fn consumed(&mut self, record: Consumed<'_>) {
        if let State::Open(u) = &mut self.state {
            u.consumed(record);
        }
    }

    /// An input of the open unit yielded no output.
    pub fn filtered(&mut self) {
        if let State::Open(u) = &mut self.state {
            u.filtered();
        }
    }

    /// An input of the open unit went to the DLQ for `reason`.
    pub fn dead_lettered(&mut self, reason: Reason) {
        if let State::Open(u) = &mut self.state {
            u.dead_lettered(reason);
        }
    }

    /// Sends one record of `source` inside the open unit. `alone`: a suspect of a refused
    /// batch, sent in a batch of its own and waited for; if the destination refuses it now,
    /// the unit is aborted (its replay sends the dead-letter copy).
    pub fn send(
        &mut self,
        topic: &str,
        out: &mut Outgoing<'_>,
        timestamp: Option<i64>,
        (source, kind): (Source<'_>, Content),
        alone: bool,
    ) -> Result<(), SendError> {
        let flushed = alone && self.hear(Wait::Flush);
        if alone && !self.heard.refused.is_empty() {
            // Something sent before it was refused: learn from that first.
            return self.aborted(AbortReason::ProduceFailed);
        }
        let index = self.rejections.sent(source);
        self.routes.sending(topic);
        let record = Record {
            topic,
            out,
            timestamp,
            index,
            kind,
        };
        match self.sink.send(record, &self.bounds) {
            Ok(()) if alone => self.check_alone(flushed),
            Ok(()) => Ok(()),
            Err(Failed::TooLarge) => {
                self.rejections.too_large(source);
                Err(SendError::TooLarge)
            }
            // Nothing is committed by a send: an unknown outcome is no send's.
            Err(
                Failed::Abort(reason)
                | Failed::Unknown {
                    reason,
                    recreate: false,
                },
            ) => self.aborted(reason),
            Err(
                Failed::Recreate(reason)
                | Failed::Renew(reason)
                | Failed::Unknown {
                    reason,
                    recreate: true,
                },
            ) => {
                self.fail_recreate(reason).map_err(SendError::Fatal)?;
                Err(SendError::Aborted)
            }
            Err(Failed::Exit(e) | Failed::Denied(e)) => Err(SendError::Fatal(e)),
            Err(Failed::Unroutable { topic, error }) => self.unroutable_send(&topic, error),
        }
    }

    fn aborted(&mut self, reason: AbortReason) -> Result<(), SendError> {
        self.abort(reason).map_err(SendError::Fatal)?;
        Err(SendError::Aborted)
    }

    /// After a record sent alone: its delivery report decides. `flushed`: nothing else was in
    /// flight when it was sent, so a refusal now is certainly its own.
    fn check_alone(&mut self, flushed: bool) -> Result<(), SendError> {
        let alone = self.hear(Wait::Flush) && flushed;
        if self.heard.refused.is_empty() {
            return Ok(());
        }
        self.abort_with(AbortReason::RecordRejected, alone)
            .map_err(SendError::Fatal)?;
        Err(SendError::Aborted)
    }

    /// Commits the open unit with its offsets, none past a record in `unapplied`. Any failure
    /// ends in an abort or a new client, with a rewind owed; only unrecoverable errors are
    /// returned.
    pub fn commit(
        &mut self,
        group: &dyn Group,
        unapplied: &dyn Unapplied,
    ) -> Result<Outcome, Error> {
        let State::Open(unit) = &self.state else {
            return Ok(Outcome::Empty);
        };
        if !self.heard.refused.is_empty() {
            // Heard before the commit (a route asked about mid-unit): a record of the unit was
            // refused, so the unit cannot commit without it, whatever the sink remembers.
            self.abort(AbortReason::RecordRejected)?;
            return Ok(Outcome::Aborted);
        }
        let started = Instant::now();
        let offsets = (self.offsets).to_commit(&self.ledger, unit, group.positions(), unapplied);
        let reply = self.sink.commit(&offsets, group, &self.bounds);
        self.heard.merge(reply.feedback);
        match reply.result {
            Ok(()) => Ok(self.committed_unit(offsets, started)),
            Err(Failed::Denied(e)) => match self.denial() {
                Denial::Route => {
                    self.abort(AbortReason::RouteRefused)?;
                    Ok(Outcome::Aborted)
                }
                Denial::Topic(named) => Err(named),
                Denial::Unsaid => Err(e),
            },
            Err(Failed::Exit(e)) => Err(e),
            Err(Failed::Unknown { reason, recreate }) => {
                self.set_aside(offsets, started, reason);
                if recreate {
                    self.fail_recreate(reason)?;
                } else {
                    self.abort(reason)?;
                }
                Ok(Outcome::Aborted)
            }
            Err(Failed::Abort(reason)) => {
                self.abort(reason)?;
                Ok(Outcome::Aborted)
            }
            Err(Failed::TooLarge | Failed::Unroutable { .. }) => {
                self.abort(AbortReason::CommitFailed)?;
                Ok(Outcome::Aborted)
            }
            Err(Failed::Recreate(reason) | Failed::Renew(reason)) => {
                self.fail_recreate(reason)?;
                Ok(Outcome::Aborted)
            }
        }
    }

    fn committed_unit(&mut self, offsets: Vec<(Tp, i64)>, started: Instant) -> Outcome {
        let State::Open(unit) = std::mem::replace(&mut self.state, State::Idle) else {
            return Outcome::Empty;
        };
        self.settled.push(Settled::Committed);
        self.count_commit(*unit, offsets, started)
    }

    /// The bookkeeping of a unit that committed `offsets`.
    fn count_commit(&mut self, unit: Unit, offsets: Vec<(Tp, i64)>, started: Instant) -> Outcome {
        for (topic, partition, next) in unit.next_offsets() {
            self.rejections.committed(topic, partition, next);
        }
        self.ledger.committed(&offsets);
        // A committed unit's records were all taken: nothing to learn from.
        self.heard.refused.clear();
        self.routes.committed();
        self.failures = 0;
        self.commits += 1;
        unit.emit_committed(started.elapsed(), &self.metrics);
        Outcome::Committed {
            records: unit.records(),
        }
    }

    /// Nothing is open or owed, and the consumer's position passed control records (the
    /// marker after an upstream transaction) beyond what was last committed: an offsets-only
    /// unit must move the group there. Checked at most once per `interval`.
    pub fn advance_due(
        &mut self,
        group: &dyn Group,
        unapplied: &dyn Unapplied,
        interval: Duration,
    ) -> bool {
        // With a rewind owed the position is past records that must come again.
        matches!(self.state, State::Idle)
            && self
                .offsets
                .advance_due(&self.ledger, || group.positions(), unapplied, interval)
    }

    /// Aborts the open unit (if any); a rewind is owed. A failed abort recreates the client,
    /// which aborts it on the broker.
    pub fn abort(&mut self, reason: AbortReason) -> Result<(), Error> {
        self.abort_with(reason, false)
    }

    /// [`Driver::abort`]; `alone`: the last record was sent alone (its refusal is its own).
    fn abort_with(&mut self, reason: AbortReason, alone: bool) -> Result<(), Error> {
        let unit = match std::mem::replace(&mut self.state, State::RewindOwed) {
            State::Open(unit) => unit,
            other => {
                self.state = other;
                return Ok(());
            }
        };
        if !self.keep_unresolved(*unit) {
            self.settled.push(Settled::Dropped);
        }
        self.failures += 1;
        let reply = self.sink.abort(reason, &self.bounds);
        self.heard.merge(reply.feedback);
        let result = reply.result;
        // A unit that failed for want of a permission fails again after any retry: stop,
        // with the unit aborted if the abort went through (else the coordinator aborts it).
        // Unless a route was refused the permission: that is the route's to answer for. The
        // route's refusal is logged before the unit's (librdkafka's ADDPARTS line, then
        // TXNERR), so taking the unit's first and the route's after never sees the unit's
        // alone.
        let denied = self.heard.denied.take();
        let own = self.collect_routes();
        let route_denied = self.routes.take_denied();
        if let Some(denied) = denied.filter(|_| !route_denied) {
            let ended = match result {
                Ok(()) => self.sink.destination().aborted,
                Err(_) => Ended::Abandoned,
            };
            self.aborted_event(reason, ended);
            return Err(own.map_or(Error::Denied(denied), |t| self.write_denied(&t)));
        }
        match result {
            Ok(()) => {
                self.aborted_event(reason, self.sink.destination().aborted);
                self.learn(alone);
                Ok(())
            }
            Err(Failed::Exit(e) | Failed::Denied(e)) => {
                self.aborted_event(reason, Ended::Abandoned);
                Err(e)
            }
            Err(_) => {
                // The new producer's init_transactions aborts it; recreate learns what the
                // old one reported.
                self.aborted_event(reason, Ended::Replaced);
                self.recreate(reason)
            }
        }
    }

    /// Turns what was heard of a unit that ended without a commit into verdicts (its
    /// abort's feedback, or the old client's last before it is replaced).
    fn learn(&mut self, alone: bool) {
        let rejections = std::mem::take(&mut self.heard.refused);
        self.collect_routes();
        // Then the unit's routes that took records (reported meanwhile) are cleared.
        self.routes
            .accepted(std::mem::take(&mut self.heard.accepted));
        self.routes.aborted();
        if self.rejections.learn(rejections, alone, self.refuser()) {
            // The replay sends something else for those records: progress, not an outage,
            // so the abort does not add to the back-off.
            self.failures = 0;
        }
    }

    fn aborted_event(&mut self, reason: AbortReason, ended: Ended) {
        if self.defer(reason, ended) {
            return;
        }
        TransactionAborted { reason, ended }.emit(&self.metrics);
    }

    /// Commit from a rebalance callback: errors are kept for the loop.
    pub fn commit_now(&mut self, group: &dyn Group, unapplied: &dyn Unapplied, occasion: Occasion) {
        match self.commit(group, unapplied) {
            Ok(Outcome::Committed { records }) => events::committed(records, occasion),
            Ok(_) => {}
            Err(e) => self.fatal = Some(e),
        }
    }

    /// An error met in a rebalance callback, kept for the loop to stop with.
    pub fn fail_later(&mut self, e: Error) {
        self.fatal.get_or_insert(e);
    }

    /// Partitions were assigned (in the rebalance callback): the sink claims them if it keeps
    /// the offsets itself, retried within the call timeout. Where each starts.
    pub fn claim(&mut self, group: &dyn Group, partitions: &[Tp]) -> Result<Starts, Error> {
        let deadline = Instant::now() + self.bounds.timeout();
        let mut attempts = 0;
        loop {
            // Retrying on purpose is no stuck loop.
            self.bounds.health.beat();
            let claimed = match self.sink.claim(partitions, group, &self.bounds) {
                Ok(starts) => self.held(group, partitions, starts),
                Err(Failed::Exit(e)) => Err(Unreadable::Exit(e)),
                Err(other) => Err(Unreadable::Retry(format!("{other:?}"))),
            };
            let why = match claimed {
                Ok(starts) => return Ok(starts),
                Err(Unreadable::Exit(e)) => return Err(e),
                Err(Unreadable::Retry(why)) => why,
            };
            attempts += 1;
            let pause = Backoff::READ_COMMITTED.after(attempts);
            if Instant::now() + pause >= deadline || self.shutdown.is_cancelled() {
                return Err(Error::Store(format!(
                    "claiming {} assigned partitions failed ({why}); stopping rather than \
                     reading them from anywhere else",
                    partitions.len()
                )));
            }
            warn!(
                attempts,
                error = why,
                ?pause,
                "claiming the assigned partitions failed; retrying"
            );
            crate::clock::pause(pause);
        }
    }

    /// Where the claimed `partitions` start: as `starts` says, and where that is the group's
    /// offsets, none below what this process committed there. The group's answer is read and
    /// held ([`Driver::hold`]); a partition it raised starts there explicitly, the others
    /// where librdkafka's own fetch says (with the offset's leader epoch). A group that lost
    /// its offsets answers none, and librdkafka would start at `auto.offset.reset`.
    fn held(
        &self,
        group: &dyn Group,
        partitions: &[Tp],
        starts: Starts,
    ) -> Result<Starts, Unreadable> {
        if starts != Starts::Group || !partitions.iter().any(|tp| self.ledger.ever_committed(tp)) {
            return Ok(starts);
        }
        let answer = {
            let _call = self.bounds.health.in_call("committed offsets");
            self.committed(group, partitions, CHECK_STARTS)
        };
        let mut answer = match answer {
            Ok(answer) => answer,
            // Offsets a transaction has not ended on yet (librdkafka waits for them), or a
            // coordinator that does not answer: librdkafka's own fetch starts the partitions.
            Err(Unreadable::Retry(why)) => {
                let event = events::ClaimUnchecked {
                    partitions: partitions.len(),
                    why: &why,
                };
                event.emit(&self.metrics);
                return Ok(Starts::Group);
            }
            Err(exit) => return Err(exit),
        };
        let raised = self.hold(&mut answer);
        if raised.is_empty() {
            return Ok(Starts::Group);
        }
        let at = (answer.into_iter())
            .map(|(tp, at)| {
                let keep = raised.contains(&tp);
                (tp, at.filter(|_| keep))
            })
            .collect();
        Ok(Starts::At(at))
    }

    /// Abort from a rebalance callback: errors are kept for the loop.
    pub fn abort_now(&mut self, reason: AbortReason) {
        if let Err(e) = self.abort(reason) {
            self.fatal = Some(e);
        }
    }
}

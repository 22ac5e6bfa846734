//! The session: the one owner of the state the loop and the rebalance callback share.
//!
//! The consumer's context holds it behind a lock (librdkafka runs the rebalance callback
//! inside `poll`, and that callback must settle the open unit before partitions move). The
//! loop takes the lock once per turn, after `poll` returns, and holds it for the whole turn; the
//! callback takes it inside `poll`; nothing else does, so it is never contended.
//!
//! What it owns, each in one place: the [`Writer`] (the sink's driver and its open unit, its
//! ledger of each partition's offsets, and the record path into it), the [`Intake`] (the
//! transform, or the call-out's stage: the one source of what was read but not yet applied,
//! which every commit stays below), and the partition changes the transform has yet to hear
//! of. A revoke is one call (`forget`) that tells each of them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::intake::{Change, Intake};
use super::rewind;
use super::stage::{Arrival, Stage};
use super::writer::Writer;
use super::{Interrupt, MAX_POLL};
use crate::backoff::Backoff;
use crate::config::CommitPolicy;
use crate::error::Error;
use crate::events::{self, AbortReason, CallAnswered, Occasion, TransformUnavailable};
use crate::health::Health;
use crate::kafka::Tp;
use crate::lag::Positions;
use crate::metrics::Metrics;
use crate::sink::{Began, Driver, Group, Outcome, Starts};
use crate::transform::{Failure, InputRecord, call};

/// What the loop does next: poll for up to `wait`, or (`read` false: the stage is full) not
/// read at all this turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poll {
    /// Longest wait in `poll`.
    pub wait: Duration,
    /// Whether to read a record.
    pub read: bool,
}

/// How partitions stopped being this instance's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gone {
    /// Revoked or lost in a rebalance: the others stay.
    Revoked,
    /// The consumer was replaced: every partition goes, the producer stays.
    Replaced,
}

/// The loop's state, owned in one place.
pub struct Session {
    writer: Writer,
    intake: Intake,
    commit: CommitPolicy,
    /// Partition changes the transform has not heard of yet, and what it was told it owns.
    changes: Vec<Change>,
    owned: BTreeSet<Tp>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
}

/// What the session is made of.
pub struct Parts {
    /// The record path into the sink.
    pub writer: Writer,
    /// How records come to be applied.
    pub intake: Intake,
    /// When the open unit commits.
    pub commit: CommitPolicy,
    /// The lag gauges' view of where each partition is.
    pub positions: Arc<Positions>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Heartbeat and readiness.
    pub health: Arc<Health>,
    /// Shutdown began.
    pub shutdown: CancellationToken,
}

impl Session {
    /// A session of `parts`, before any partition is assigned.
    pub fn new(mut parts: Parts) -> Session {
        // The lag counts from what is committed, as the driver's ledger keeps it.
        (parts.writer.driver).publish_floors(parts.positions.clone());
        Session {
            writer: parts.writer,
            intake: parts.intake,
            commit: parts.commit,
            changes: Vec::new(),
            owned: BTreeSet::new(),
            metrics: parts.metrics,
            health: parts.health,
            shutdown: parts.shutdown,
        }
    }

    /// Units committed since start: progress.
    pub fn commits(&self) -> u64 {
        self.writer.driver.commits()
    }

    /// An error a rebalance callback met, for the loop to stop with.
    pub fn take_fatal(&mut self) -> Option<Error> {
        self.writer.driver.take_fatal()
    }

    /// How the loop polls next: not past the open unit's commit interval, nor past what the
    /// stage waits for.
    pub fn next_poll(&self) -> Poll {
        let age = self.writer.driver.unit().map(|u| u.age());
        let age_s = age.map_or(0.0, |a| a.as_secs_f64());
        self.metrics.open_transaction_age.set(age_s);
        let due_in = age.map_or(MAX_POLL, |a| self.commit.interval.saturating_sub(a));
        let wait = due_in.min(MAX_POLL);
        match &self.intake {
            Intake::Direct(..) => Poll { wait, read: true },
            Intake::Staged(s) => Poll {
                wait: s.poll_wait(wait),
                read: !s.full(),
            },
        }
    }

    /// One turn of the loop, after `poll` gave `record` (or nothing): the transform hears of
    /// partition changes; an owed rewind is performed first (the record is past the rewind
    /// point, so it comes again); else the record is applied or staged, the stage's answers
    /// are applied, and the unit commits if it is due.
    pub fn turn(
        &mut self,
        record: Option<&InputRecord<'_>>,
        group: &dyn Group,
    ) -> Result<Poll, Interrupt> {
        self.hand_over_changes();
        if let Some(r) = record {
            // The rewind's last resort, and where the lag counts from until the first commit.
            self.writer.driver.read(r.topic, r.partition, r.offset);
        }
        if self.writer.driver.rewind_owed() {
            self.rewind_now(group)?;
            return Ok(self.next_poll());
        }
        if record.is_none() {
            self.writer.driver.idle(group, false);
        }
        // Whether the record is held is asked before any release: one read in the turn that
        // releases its partition comes again from the first record not taken.
        let waits = match (&self.intake, record) {
            (Intake::Direct(_, held), Some(r)) => held.holds(r.topic, r.partition),
            _ => false,
        };
        if let Some(held) = self.intake.held() {
            held.release(group, &self.metrics);
        }
        match (&mut self.intake, record) {
            // A record of a held partition (one read before its pause took): it comes again.
            (Intake::Direct(..), Some(_)) if waits => {}
            (Intake::Direct(t, held), Some(r)) => {
                let mut holding = None;
                let fate = self.writer.write(r, || {
                    let outputs = t.apply(r);
                    if let Err(Failure::Held(why)) = &outputs {
                        holding = Some(why.clone());
                    }
                    outputs
                })?;
                t.decided(fate);
                match holding {
                    Some(why) => {
                        held.hold(group, (r.topic, r.partition), r.offset, &why, &self.metrics)
                    }
                    None => held.taken(r.topic, r.partition),
                }
            }
            (Intake::Staged(stage), Some(r)) => stage.push(r),
            (_, None) => {}
        }
        if let Intake::Staged(stage) = &self.intake {
            // A full stage reads nothing until an answer (or the back-off) makes room.
            let wait = if stage.full() {
                MAX_POLL
            } else {
                Duration::ZERO
            };
            self.pump(group, wait, false)?;
        }
        self.commit_due(group)?;
        Ok(self.next_poll())
    }

    /// Partitions are revoked (inside `poll`): the open unit commits first (below anything
    /// staged), or, when they were lost, aborts (another member may own them already); then
    /// nothing staged of them is applied.
    pub fn revoked(&mut self, group: &dyn Group, partitions: Vec<Tp>, lost: bool) {
        let driver = &mut self.writer.driver;
        if lost {
            driver.abort_now(AbortReason::PartitionsLost);
            // Another member may have committed them already: nothing tells.
            driver.forget_unresolved();
        } else {
            match before_commit(&mut self.writer, &mut self.intake) {
                Ok(()) => {
                    let driver = &mut self.writer.driver;
                    driver.commit_now(group, &self.intake, Occasion::Rebalance);
                    resolve_now(driver, group);
                }
                // Without what the transform must write first, the unit must not commit.
                Err(e) => {
                    self.writer.driver.abort_now(AbortReason::ShutdownOnError);
                    self.writer.driver.fail_later(e);
                }
            }
        }
        self.forget(group, partitions, Gone::Revoked);
    }

    /// Everything kept of `partitions`, which are no longer this instance's, goes: what was
    /// read and staged, holds, rewind targets, what this assignment committed, verdicts, the
    /// sink's claims, lag floors (what this process last committed stays: `sink::ledger`); the transform's state is told (`Revoked`: at its next turn, after
    /// how its units ended; `Replaced`: now, with every partition).
    fn forget(&mut self, group: &dyn Group, partitions: Vec<Tp>, gone: Gone) {
        match gone {
            Gone::Revoked => self.intake.revoke(&partitions),
            Gone::Replaced => self.intake.clear(),
        }
        if let Some(held) = self.intake.held() {
            match gone {
                Gone::Revoked => held.revoked(group, &partitions, &self.metrics),
                Gone::Replaced => held.clear(&self.metrics),
            }
        }
        self.writer.driver.forget(&partitions);
        match gone {
            // Before the transform hears of the revoke, it hears how its units ended.
            Gone::Revoked => self.changes.push(Change::Revoked(partitions)),
            Gone::Replaced => {
                self.writer.driver.new_consumer();
                // An unknown outcome nobody can resolve now is heard before the revoke.
                self.hand_over_settled();
                self.owned.clear();
                if !partitions.is_empty() {
                    self.intake.hear(&Change::Revoked(partitions));
                }
            }
        }
    }

    /// Partitions are being assigned (inside `poll`, before the consumer takes them): the
    /// sink claims them if it keeps the offsets, and says where each starts. `None`: it could
    /// not, and the loop stops with why (kept for it); nothing may be assigned.
    pub fn claim(&mut self, group: &dyn Group, partitions: &[Tp]) -> Option<Starts> {
        let driver = &mut self.writer.driver;
        driver
            .claim(group, partitions)
            .map_err(|e| driver.fail_later(e))
            .ok()
    }

    /// An error met in a rebalance callback, for the loop to stop with.
    pub fn fail_later(&mut self, e: Error) {
        self.writer.driver.fail_later(e);
    }

    /// Partitions are assigned (inside `poll`).
    pub fn assigned(&mut self, partitions: Vec<Tp>) {
        self.changes.push(Change::Assigned(partitions));
    }

    /// The consumer is finished (fenced) and a new one takes over, with the same producer: what
    /// the old one read is aborted (its generation can no longer commit) and dropped, and the
    /// transform loses every partition first (the new consumer is assigned afresh).
    pub fn replaced(&mut self, group: &dyn Group) {
        self.writer.driver.abort_now(AbortReason::ConsumerFenced);
        self.hand_over_changes();
        let owned: Vec<Tp> = self.owned.iter().cloned().collect();
        self.forget(group, owned, Gone::Replaced);
    }

    /// Commits what is open, within the shutdown `grace`. The call-out's staged records
    /// first, as far as their answers come back within half of it: the rest is the commit's
    /// (what stays staged is read again next time).
    pub fn finish(&mut self, group: &dyn Group, grace: Duration) -> Result<(), Error> {
        debug_assert!(self.shutdown.is_cancelled());
        let now = Instant::now();
        let deadline = now + grace.saturating_sub(MAX_POLL * 10);
        self.writer.driver.set_deadline(deadline);
        let answers_by = now + deadline.saturating_duration_since(now) / 2;
        while self.intake.holds_records()
            && Instant::now() < answers_by
            && !self.writer.driver.rewind_owed()
        {
            self.health.beat();
            self.pump(group, MAX_POLL, true)?;
        }
        resolve_now(&mut self.writer.driver, group);
        match self.commit_open(group)? {
            Outcome::Committed { records } => events::committed(records, Occasion::Shutdown),
            Outcome::Aborted => {
                warn!("final transaction aborted; its records are read again next time")
            }
            Outcome::Empty => {}
        }
        // Nothing resolves an unknown outcome of the final commit any more.
        self.writer.driver.forget_unresolved();
        self.writer.driver.idle(group, true);
        // The instance gives every partition up: the transform hears it now, after the last
        // settle (the consumer's close revokes them after the loop's last turn).
        self.hand_over_changes();
        let owned: Vec<Tp> = std::mem::take(&mut self.owned).into_iter().collect();
        if !owned.is_empty() {
            self.intake.hear(&Change::Revoked(owned));
        }
        Ok(())
    }

    /// The loop stops on an error: nothing of the open unit may become visible.
    pub fn abandon(&mut self) {
        self.writer.driver.abort_now(AbortReason::ShutdownOnError);
    }

    /// Tells the transform how its units ended, then which partitions it gained and lost
    /// since the last turn (only those it was told it owns are revoked).
    fn hand_over_changes(&mut self) {
        self.hand_over_settled();
        if self.changes.is_empty() {
            return;
        }
        for change in std::mem::take(&mut self.changes) {
            let change = match change {
                Change::Assigned(ps) => {
                    self.owned.extend(ps.iter().cloned());
                    Change::Assigned(ps)
                }
                Change::Revoked(ps) => {
                    let ps: Vec<Tp> = ps.into_iter().filter(|p| self.owned.remove(p)).collect();
                    if ps.is_empty() {
                        continue;
                    }
                    Change::Revoked(ps)
                }
            };
            self.intake.hear(&change);
        }
    }

    /// Tells the transform how the units its records went into ended.
    fn hand_over_settled(&mut self) {
        for settled in self.writer.driver.take_settled() {
            self.intake.settle(settled);
        }
    }

    /// Commits the open unit when it reached a bound of the commit policy; an offsets-only
    /// unit when only control records arrived since the last commit.
    fn commit_due(&mut self, group: &dyn Group) -> Result<(), Interrupt> {
        let driver = &mut self.writer.driver;
        if driver.advance_due(group, &self.intake, self.commit.interval)
            && driver.begin()? == Began::Open
        {
            // Offsets only: no record of the transform's is in it.
            driver.commit(group, &self.intake)?;
        }
        let policy = &self.commit;
        let due = (self.writer.driver.unit())
            .is_some_and(|u| policy.due(u.age(), u.records(), u.bytes()));
        if !due {
            return Ok(());
        }
        if let Outcome::Committed { records } = self.commit_open(group)? {
            events::committed(records, Occasion::Bound);
        }
        if self.writer.driver.rewind_owed() {
            self.rewind_now(group)?;
        }
        Ok(())
    }

    /// Commits the open unit, with what the transform must write before.
    fn commit_open(&mut self, group: &dyn Group) -> Result<Outcome, Error> {
        before_commit(&mut self.writer, &mut self.intake)?;
        self.writer.driver.commit(group, &self.intake)
    }

    /// Performs the owed rewind: what is staged is dropped (read again), every partition read
    /// goes back to its committed offset. Aborts in a row back off ([`Backoff::ABORTS`]).
    fn rewind_now(&mut self, group: &dyn Group) -> Result<(), Interrupt> {
        self.intake.clear();
        let driver = &self.writer.driver;
        let timeout = driver.call_timeout();
        let done = rewind::perform(group, driver, timeout, &self.health, &self.shutdown)?;
        let Some(rewound) = done else {
            // Shutdown began: nothing is open, the loop ends next.
            return Ok(());
        };
        self.writer.driver.resolve(&rewound.committed);
        self.writer.driver.rewound();
        if let Some(held) = self.intake.held() {
            held.rewound(&rewound.to);
        }
        Backoff::ABORTS.wait(self.writer.driver.failures_in_a_row());
        Ok(())
    }

    /// The call-out's turn: sends the open batch when it is due (`flush`: whatever it holds),
    /// and applies every answer that is back, oldest call first; waits up to `wait` for the
    /// oldest (or for the back-off to pass, when no call is out).
    fn pump(&mut self, group: &dyn Group, mut wait: Duration, flush: bool) -> Result<(), Error> {
        loop {
            let Intake::Staged(stage) = &mut self.intake else {
                return Ok(());
            };
            for gone in stage.abandoned_arrivals() {
                counted(&gone, &self.metrics);
            }
            stage.send_due(flush);
            let arrival = stage.arrival(wait);
            self.metrics.calls_in_flight.set(stage.in_flight() as i64);
            if let Some(a) = &arrival {
                counted(a, &self.metrics);
            }
            if let Some(Arrival::Failed { error, .. }) = &arrival {
                return self.call_failed(group, &error.to_string());
            }
            self.apply_answered()?;
            if arrival.is_none() || self.writer.driver.rewind_owed() {
                return Ok(());
            }
            wait = Duration::ZERO;
        }
    }

    /// Applies the answered records in the order they were read, until an abort owes a rewind
    /// (the rest stay staged, and the rewind drops them).
    fn apply_answered(&mut self) -> Result<(), Error> {
        while !self.writer.driver.rewind_owed() {
            let Intake::Staged(stage) = &mut self.intake else {
                return Ok(());
            };
            let limits = *stage.limits();
            let Some((record, answer)) = stage.take() else {
                return Ok(());
            };
            let input = record.as_input();
            self.writer
                .write(&input, || call::outputs(&input, answer, &limits))?;
        }
        Ok(())
    }

    /// A call failed: the application is unavailable. What earlier answers put in the open
    /// unit commits (the failed call's records are still staged, so the commit stays below
    /// them); then everything staged is read again after a rewind, and the application is
    /// called again only after a back-off.
    fn call_failed(&mut self, group: &dyn Group, why: &str) -> Result<(), Error> {
        let pause = self.intake.stage().map_or(Duration::ZERO, Stage::failed);
        TransformUnavailable {
            why: &format!("{why}; calling again in {pause:?}"),
        }
        .emit();
        self.writer.not_ready();
        before_commit(&mut self.writer, &mut self.intake)?;
        let driver = &mut self.writer.driver;
        if let Outcome::Committed { records } = driver.commit_then_rewind(group, &self.intake)? {
            events::committed(records, Occasion::Bound);
        }
        Ok(())
    }
}

/// What the transform must write into the open unit before it commits: every commit of a
/// unit with its records goes through here first.
fn before_commit(writer: &mut Writer, intake: &mut Intake) -> Result<(), Error> {
    let Intake::Direct(t, _) = intake else {
        return Ok(());
    };
    if writer.driver.unit().is_none() {
        return Ok(());
    }
    writer.write_own(t.before_commit())
}

/// A commit whose outcome is unknown is resolved now, while its partitions are still owned
/// (after a revoke, another member's commits could move them): by one read of what is
/// committed for them, or as unknown if that fails.
fn resolve_now(driver: &mut Driver, group: &dyn Group) {
    let partitions = driver.unresolved_partitions();
    if partitions.is_empty() {
        return;
    }
    match driver.committed(group, &partitions, driver.call_timeout()) {
        Ok(committed) => driver.resolve(&committed),
        Err(e) => {
            warn!(error = ?e, "committed offsets unreadable; a commit's outcome stays unknown");
            driver.forget_unresolved();
        }
    }
}

/// Counts a call that came back.
fn counted(arrival: &Arrival, metrics: &Metrics) {
    let (outcome, took, records) = match arrival {
        Arrival::Answered { took, records } => ("ok", *took, *records),
        Arrival::Failed {
            error,
            took,
            records,
        } => (error.outcome(), *took, *records),
    };
    CallAnswered {
        outcome,
        took,
        records,
    }
    .emit(metrics);
}

/// What the session keeps of one partition (testing only): each fact a revoke must forget.
#[cfg(test)]
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The first offset read since it was assigned (the rewind's last resort).
    pub first_read: Option<i64>,
    /// What this instance last committed for it.
    pub committed: Option<i64>,
    /// Verdicts on its refused records.
    pub verdicts: usize,
    /// Where its lag is counted from.
    pub floor: Option<i64>,
    /// Held: the transform cannot take it now.
    pub held: bool,
}

#[cfg(test)]
impl Session {
    /// What is kept of `tp`.
    pub fn facts(&mut self, tp: &Tp) -> Facts {
        let driver = &self.writer.driver;
        Facts {
            first_read: driver.ledger().first_read(tp),
            committed: driver.ledger().last_committed(tp),
            verdicts: driver.verdicts_on(tp),
            floor: driver.ledger().published_floor(tp),
            held: (self.intake.held()).is_some_and(|h| h.holds(&tp.0, tp.1)),
        }
    }

    /// Whether the transform was told it owns `tp`.
    pub fn owns(&self, tp: &Tp) -> bool {
        self.owned.contains(tp)
    }
}

//! What the rewind asks of the driver, and what a rewind or a new consumer tells it.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Driver, State};
use crate::error::Error;
use crate::events;
use crate::kafka::Tp;
use crate::sink::{Committed, Group, OffsetHome, Outcome, Unapplied, Unreadable};

/// How long a revoke waits to learn whether its topics still exist.
const EXISTS: Duration = Duration::from_secs(2);

impl Driver {
    /// Whether a rewind is owed.
    pub fn rewind_owed(&self) -> bool {
        matches!(self.state, State::RewindOwed)
    }

    /// The loop drops records it has read but not applied (a failed call's): what is open
    /// commits first (below those records), then they come again after a rewind, which is
    /// owed whatever the commit did.
    pub fn commit_then_rewind(
        &mut self,
        group: &dyn Group,
        unapplied: &dyn Unapplied,
    ) -> Result<Outcome, Error> {
        let outcome = self.commit(group, unapplied)?;
        self.state = State::RewindOwed;
        Ok(outcome)
    }

    /// The consumer is back at the committed offsets (a rewind, or a new consumer).
    pub fn rewound(&mut self) {
        if self.rewind_owed() {
            self.state = State::Idle;
        }
    }

    /// What is committed for `partitions`: the rewind's target.
    pub fn committed(
        &self,
        group: &dyn Group,
        partitions: &[Tp],
        timeout: Duration,
    ) -> Result<Committed, Unreadable> {
        self.sink.committed(group, partitions, timeout)
    }

    /// Holds each start or rewind target of `answer` to what this process committed there,
    /// where the offsets are the group's (`sink::ledger`): each raised is logged and counted,
    /// and returned.
    pub fn hold(&self, answer: &mut Committed) -> Vec<Tp> {
        if self.sink.destination().offsets != OffsetHome::Group {
            return Vec::new();
        }
        let raised = self.ledger.hold(answer);
        for w in &raised {
            let event = events::OffsetWentBack {
                topic: &w.tp.0,
                partition: w.tp.1,
                was: w.answered,
                committed: w.committed,
            };
            event.emit(&self.metrics);
        }
        raised.into_iter().map(|w| w.tp).collect()
    }

    /// How many verdicts are kept on `tp`'s records (testing only).
    #[cfg(test)]
    pub fn verdicts_on(&self, tp: &Tp) -> usize {
        self.rejections.verdicts_on(tp)
    }

    /// `partitions` were revoked (or their consumer replaced): what was read and committed of
    /// them in this assignment is the group's business now, and so is judging their refused
    /// records. What this process last committed in them is kept (`sink::ledger`), unless
    /// their topic no longer exists.
    /// A topic that no longer exists takes what this process committed there with it.
    pub fn forget(&mut self, partitions: &[Tp]) {
        self.ledger.forget(partitions);
        self.rejections.revoked(partitions);
        self.sink.revoked(partitions);
        if self.sink.destination().offsets != OffsetHome::Group {
            return;
        }
        let topics: BTreeSet<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
        for topic in topics {
            if self.sink.exists(topic, EXISTS) == Ok(false) {
                self.ledger.deleted(topic);
            }
        }
    }

    /// The consumer is replaced: the new one starts from the committed offsets, owning
    /// nothing yet, and nothing is owed.
    pub fn new_consumer(&mut self) {
        self.forget_unresolved();
        self.ledger.clear();
        if self.rewind_owed() {
            self.state = State::Idle;
        }
    }
}

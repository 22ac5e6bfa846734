//! A commit whose outcome was unknown (a timeout on EndTxn, or a retry of it answered by a newer
//! epoch): the unit is set aside, not counted as aborted, until the rewind has read what the
//! sink committed. If the committed offsets are the ones the commit sent, it committed: its
//! records, outputs and latencies count as any committed unit's; otherwise it is counted as the
//! abort it was.

use std::time::Instant;

use tracing::info;

use super::Driver;
use crate::events::{self, AbortReason, Ended, Occasion, TransactionAborted};
use crate::kafka::Tp;
use crate::sink::{Committed, Settled, Unit};

/// The unit of a commit whose outcome was unknown.
pub(super) struct Unresolved {
    /// What the commit sent: set before the abort, with the unit once the abort takes it.
    offsets: Vec<(Tp, i64)>,
    started: Instant,
    /// Why its outcome is unknown.
    reason: AbortReason,
    unit: Option<Unit>,
    /// How the abort ended, should it turn out to be one.
    ended: Option<Ended>,
}

impl Driver {
    /// The commit of `offsets` begun at `started` had an unknown outcome: the abort that
    /// follows keeps its unit (`keep_unresolved`) instead of counting it.
    pub(super) fn set_aside(
        &mut self,
        offsets: Vec<(Tp, i64)>,
        started: Instant,
        reason: AbortReason,
    ) {
        self.unresolved = Some(Unresolved {
            offsets,
            started,
            reason,
            unit: None,
            ended: None,
        });
    }

    /// The aborted unit, kept if its commit's outcome is unknown. Whether it was.
    pub(super) fn keep_unresolved(&mut self, unit: Unit) -> bool {
        match &mut self.unresolved {
            Some(u) if u.unit.is_none() => {
                u.unit = Some(unit);
                true
            }
            _ => false,
        }
    }

    /// Whether an abort of `reason` is counted later (its commit's outcome is unknown); then
    /// how it `ended` is kept for that.
    pub(super) fn defer(&mut self, reason: AbortReason, ended: Ended) -> bool {
        match &mut self.unresolved {
            Some(u) if reason == u.reason && u.unit.is_some() => {
                u.ended.get_or_insert(ended);
                true
            }
            _ => false,
        }
    }

    /// The partitions of a unit whose commit's outcome is unknown: what is committed for them
    /// tells.
    pub fn unresolved_partitions(&self) -> Vec<Tp> {
        match &self.unresolved {
            Some(Unresolved {
                offsets,
                unit: Some(_),
                ..
            }) => offsets.iter().map(|(tp, _)| tp.clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// What is `committed` for the partitions of a unit whose commit's outcome was unknown
    /// (read before any of them moved): the outcome is known now, and counted. It settles as
    /// unknown if the read did not answer for one of them.
    pub fn resolve(&mut self, committed: &Committed) {
        let Some(Unresolved {
            offsets,
            started,
            reason,
            unit: Some(unit),
            ended,
        }) = self.unresolved.take()
        else {
            return;
        };
        let settled = told(committed, &offsets);
        self.settled.push(settled);
        if settled == Settled::Committed {
            info!(
                records = unit.records(),
                "a commit whose outcome was unknown had committed"
            );
            if let super::Outcome::Committed { records } = self.count_commit(unit, offsets, started)
            {
                events::committed(records, Occasion::Bound);
            }
            return;
        }
        if settled == Settled::Unknown {
            info!(
                records = unit.records(),
                "nothing tells whether a commit whose outcome was unknown took effect"
            );
        }
        // Counted as the abort it was, or may have been.
        TransactionAborted {
            reason,
            ended: ended.unwrap_or(Ended::Aborted),
        }
        .emit(&self.metrics);
    }

    /// Nothing can tell any more (the consumer is replaced, the process stops): an unknown
    /// outcome is counted as the abort it may have been.
    pub fn forget_unresolved(&mut self) {
        self.resolve(&Vec::new());
    }
}

/// How a commit of `sent` ended, as what is `committed` tells. The offsets of a transaction
/// commit together: all at the ones it sent, it did; one partition below its offset (or with
/// none), it did not; otherwise (a partition past it: another member, after this one lost
/// it, committed on top of whichever; a partition the read did not answer for) nobody can
/// tell.
fn told(committed: &Committed, sent: &[(Tp, i64)]) -> Settled {
    let answer = |tp: &Tp| committed.iter().find(|(c, _)| c == tp).map(|(_, v)| *v);
    if sent
        .iter()
        .any(|(tp, o)| answer(tp).is_some_and(|v| v.is_none_or(|v| v < *o)))
    {
        Settled::Dropped
    } else if sent.iter().all(|(tp, o)| answer(tp) == Some(Some(*o))) {
        Settled::Committed
    } else {
        Settled::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_offset_below_the_one_sent_says_a_commit_did_not_take_effect() {
        let tp = |p: i32| ("in".to_string(), p);
        let sent = [(tp(0), 5), (tp(1), 7)];
        let told = |c: &[(i32, Option<i64>)]| {
            let c: Committed = c.iter().map(|(p, o)| (tp(*p), *o)).collect();
            told(&c, &sent)
        };
        assert_eq!(told(&[(0, Some(5)), (1, Some(7))]), Settled::Committed);
        assert_eq!(told(&[(0, Some(5)), (1, Some(3))]), Settled::Dropped);
        assert_eq!(told(&[(0, None), (1, Some(7))]), Settled::Dropped);
        assert_eq!(told(&[(0, Some(9)), (1, Some(3))]), Settled::Dropped);
        // Past it: another member committed on top, after either outcome.
        assert_eq!(told(&[(0, Some(9)), (1, Some(7))]), Settled::Unknown);
        // Not answered for.
        assert_eq!(told(&[(0, Some(5))]), Settled::Unknown);
    }
}

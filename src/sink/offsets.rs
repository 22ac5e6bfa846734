//! What a commit sends for each partition, and when the group must move without a record.
//!
//! The offsets a commit sends are the next offset after each partition's last processed
//! record, or the consumer's position when that is further. librdkafka's position passes a
//! record only once it handed it to the loop, and passes control records (transaction markers,
//! which follow the last record of every upstream transaction) as it skips them; after a
//! rewind it is unset until the next record. Committing it keeps the group's offsets from
//! staying one below the end behind every marker (KAFKA-6607): tools that read the group's lag
//! would show 1 per partition for ever. A partition outside the unit goes in when its position
//! moved past what was last committed for it, which is also what makes an offsets-only unit
//! due when nothing but markers arrived.
//!
//! The position is past records that were read but not yet applied (the call-out's staged
//! records): [`Unapplied`] is the one source of their first offsets, asked at every commit,
//! and no position passes it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Unit;
use super::ledger::Ledger;
use crate::kafka::Tp;

/// Records read but not yet applied: no commit may pass them.
pub trait Unapplied {
    /// The first offset of each partition's records read but not yet applied.
    fn firsts(&self) -> Vec<(Tp, i64)>;
}

/// What a commit sends, from the [`Ledger`]'s record of what the last commits sent.
pub struct CommitOffsets {
    /// When [`CommitOffsets::advance_due`] last looked.
    last_check: Instant,
}

impl Default for CommitOffsets {
    fn default() -> Self {
        CommitOffsets {
            last_check: Instant::now(),
        }
    }
}

impl CommitOffsets {
    /// The offsets a commit of `unit` sends, given the consumer's `positions`.
    pub fn to_commit(
        &self,
        ledger: &Ledger,
        unit: &Unit,
        positions: Vec<(Tp, i64)>,
        unapplied: &dyn Unapplied,
    ) -> Vec<(Tp, i64)> {
        let firsts = unapplied.firsts();
        // A unit's own records come before what is unapplied; capped all the same.
        let unit_offsets = unit
            .next_offsets()
            .map(|(topic, p, next)| ((topic.to_string(), p), next))
            .collect();
        let mut offsets: HashMap<Tp, i64> = below(unit_offsets, &firsts).into_iter().collect();
        for (tp, pos) in below(positions, &firsts) {
            match offsets.get_mut(&tp) {
                Some(next) => *next = (*next).max(pos),
                None if moved(ledger, &tp, pos) => {
                    offsets.insert(tp, pos);
                }
                None => {}
            }
        }
        offsets.into_iter().collect()
    }

    /// Whether the consumer's `positions` passed control records beyond what was last
    /// committed, so that an offsets-only unit must move the group there. Checked at most
    /// once per `interval`; the caller asks only when no unit is open and no rewind is owed
    /// (then the position is past records that must come again).
    pub fn advance_due(
        &mut self,
        ledger: &Ledger,
        positions: impl FnOnce() -> Vec<(Tp, i64)>,
        unapplied: &dyn Unapplied,
        interval: Duration,
    ) -> bool {
        if self.last_check.elapsed() < interval {
            return false;
        }
        self.last_check = Instant::now();
        below(positions(), &unapplied.firsts())
            .into_iter()
            .any(|(tp, pos)| moved(ledger, &tp, pos))
    }
}

/// The position `pos` of `tp` is past what was last committed for it (or nothing was).
fn moved(ledger: &Ledger, tp: &Tp, pos: i64) -> bool {
    ledger.last_committed(tp).is_none_or(|c| pos > c)
}

/// `positions`, each at most its partition's first unapplied offset.
fn below(mut positions: Vec<(Tp, i64)>, firsts: &[(Tp, i64)]) -> Vec<(Tp, i64)> {
    if firsts.is_empty() {
        return positions;
    }
    for (tp, pos) in &mut positions {
        if let Some((_, first)) = firsts.iter().find(|(s, _)| s == tp) {
            *pos = (*pos).min(*first);
        }
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Consumed;

    fn tp(p: i32) -> Tp {
        ("in".to_string(), p)
    }

    /// Every record applied as it is read.
    struct Nothing;

    impl Unapplied for Nothing {
        fn firsts(&self) -> Vec<(Tp, i64)> {
            Vec::new()
        }
    }

    struct Staged(Vec<(Tp, i64)>);

    impl Unapplied for Staged {
        fn firsts(&self) -> Vec<(Tp, i64)> {
            self.0.clone()
        }
    }

    fn sorted(mut v: Vec<(Tp, i64)>) -> Vec<(Tp, i64)> {
        v.sort();
        v
    }

    #[test]
    fn no_position_passes_an_unapplied_record() {
        let positions = vec![(tp(0), 50), (tp(1), 70), (tp(2), 9)];
        let staged = [(tp(0), 40), (tp(2), 12), (("other".to_string(), 1), 3)];
        assert_eq!(
            below(positions, &staged),
            vec![(tp(0), 40), (tp(1), 70), (tp(2), 9)]
        );
    }

    #[test]
    fn a_commit_sends_the_furthest_of_records_and_positions_but_not_past_staged_ones() {
        let mut unit = Unit::new();
        let read = |partition, offset| Consumed {
            topic: "in",
            partition,
            offset,
            bytes: 1,
            timestamp: None,
        };
        unit.consumed(read(0, 10));
        unit.consumed(read(1, 5));
        let (offsets, mut ledger) = (CommitOffsets::default(), Ledger::default());
        // A marker after p0's record; p2 moved past markers only; p1's position is behind.
        let positions = vec![(tp(0), 12), (tp(1), 3), (tp(2), 7)];
        assert_eq!(
            sorted(offsets.to_commit(&ledger, &unit, positions.clone(), &Nothing)),
            vec![(tp(0), 12), (tp(1), 6), (tp(2), 7)]
        );
        // p2's record at 6 is staged: nothing of p2 goes; p0's position stops at its staged 11.
        let staged = Staged(vec![(tp(2), 6), (tp(0), 11)]);
        assert_eq!(
            sorted(offsets.to_commit(&ledger, &unit, positions.clone(), &staged)),
            vec![(tp(0), 11), (tp(1), 6), (tp(2), 6)]
        );
        ledger.committed(&[(tp(2), 7)]);
        // Committed already: p2 does not go again without moving.
        assert_eq!(
            sorted(offsets.to_commit(&ledger, &unit, positions, &Nothing)),
            vec![(tp(0), 12), (tp(1), 6)]
        );
    }

    #[test]
    fn an_offsets_only_unit_is_due_when_a_position_moved_past_the_last_commit() {
        let (mut offsets, mut ledger) = (CommitOffsets::default(), Ledger::default());
        ledger.committed(&[(tp(0), 10)]);
        let zero = Duration::ZERO;
        let at = |pos| move || vec![(tp(0), pos)];
        assert!(!offsets.advance_due(&ledger, at(10), &Nothing, zero));
        assert!(offsets.advance_due(&ledger, at(11), &Nothing, zero));
        // A staged record at 10 holds it.
        let staged = Staged(vec![(tp(0), 10)]);
        assert!(!offsets.advance_due(&ledger, at(11), &staged, zero));
        // Asked again within the interval: not yet.
        assert!(!offsets.advance_due(&ledger, at(11), &Nothing, Duration::from_secs(60)));
    }
}

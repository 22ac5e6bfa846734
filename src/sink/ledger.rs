//! Each owned partition's offsets, in one home; and what this process last committed in every
//! partition it owned.
//!
//! Two facts per partition, both since it was assigned: the first offset read (the rewind's
//! last resort, and where its lag starts), and what this instance's last commit that held it
//! sent (what a commit need not send again, the rewind's fallback when the sink has no answer).
//! A revoke forgets the partition's entry and a new consumer every entry, in one call each. The
//! lag's floor of each partition (the later of the two) is published from here to
//! [`Positions`], which the lag's own thread reads while the loop may be stuck: it is a view of
//! this ledger, written by nothing else.
//!
//! One fact per partition outlives the assignment: what this process last committed there,
//! kept for as long as it runs, unless a revoke finds its topic deleted. The group's offsets
//! do not go back while this process is a member (a reset needs the group empty), so an
//! answer below it, or none, is a broker that lost the group's offsets (RELIABILITY.md), or a
//! reset made while this process was out of the group. Where the offsets are the group's, the
//! driver holds starts and rewinds to it ([`Ledger::hold`]): a start at `auto.offset.reset`
//! would write again what this process wrote. Where they are kept with the outputs (a
//! database), they are not held: a table that went back took its rows with it.
//!
//! A sink that keeps the offsets itself knows another fact, which is the destination's, not
//! this instance's: what its table holds (the database sink's claims, the value its
//! compare-and-set expects). After a commit whose answer was lost the table may be ahead of
//! the last commit this instance knows of, until the rewind reads it back and the driver
//! resolves the outcome; so the two are kept apart, and forgotten in the same call.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::sync::Arc;

use crate::kafka::Tp;
use crate::lag::Positions;

/// What is kept of one partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    /// The first offset read since it was assigned.
    first_read: Option<i64>,
    /// What the last commit that held it sent.
    committed: Option<i64>,
}

impl Entry {
    /// The offset no record past has committed yet: the later of the two.
    fn floor(&self) -> Option<i64> {
        self.first_read.max(self.committed)
    }
}

/// The owned partitions' offsets.
#[derive(Default)]
pub struct Ledger {
    /// By topic, so that the per-record look-up borrows the topic name.
    entries: HashMap<String, HashMap<i32, Entry>>,
    /// The partition of the last record noted (its first read is known): the next is most
    /// often of the same one.
    last: Option<(String, i32)>,
    /// Where the lag's floors are published, if anywhere.
    floors: Option<Arc<Positions>>,
    /// What this process last committed in each partition, owned or not: forgotten only with
    /// its topic.
    process_committed: HashMap<Tp, i64>,
}

/// A partition whose committed offset was answered below what this process committed there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WentBack {
    /// The partition.
    pub tp: Tp,
    /// What was answered (`None`: nothing committed).
    pub answered: Option<i64>,
    /// What this process committed there: the answer now.
    pub committed: i64,
}

impl Ledger {
    /// Publishes every floor to `positions` from now on.
    pub fn publish_to(&mut self, positions: Arc<Positions>) {
        self.floors = Some(positions);
    }

    /// A record of `topic`/`partition` at `offset` was polled. Whether it is the partition's
    /// first since it was assigned.
    pub fn read(&mut self, topic: &str, partition: i32, offset: i64) -> bool {
        if let Some((t, p)) = &self.last
            && *p == partition
            && t == topic
        {
            return false;
        }
        let entry = match self.entries.get_mut(topic) {
            Some(ps) => ps.entry(partition).or_default(),
            None => (self.entries.entry(topic.to_string()).or_default())
                .entry(partition)
                .or_default(),
        };
        let first = entry.first_read.is_none();
        if first {
            entry.first_read = Some(offset);
            let floor = entry.floor();
            self.publish([((topic.to_string(), partition), floor)]);
        }
        match &mut self.last {
            // The name's buffer is reused: records of several partitions interleave.
            Some((t, p)) => {
                t.clear();
                t.push_str(topic);
                *p = partition;
            }
            None => self.last = Some((topic.to_string(), partition)),
        }
        first
    }

    /// A commit of this instance sent `offsets`, and they are durable.
    pub fn committed(&mut self, offsets: &[(Tp, i64)]) {
        let mut floors = Vec::with_capacity(offsets.len());
        for ((topic, partition), next) in offsets {
            let entry = match self.entries.get_mut(topic) {
                Some(ps) => ps.entry(*partition).or_default(),
                None => (self.entries.entry(topic.clone()).or_default())
                    .entry(*partition)
                    .or_default(),
            };
            entry.committed = Some(*next);
            floors.push(((topic.clone(), *partition), entry.floor()));
            // The latest, not the most: this process commits upwards, unless the topic was
            // deleted and created again under it (a mark that stayed would hold every rewind
            // past the new log's end).
            self.process_committed
                .insert((topic.clone(), *partition), *next);
        }
        self.publish(floors);
    }

    /// Raises each partition of `answer` (what the group says is committed) that is below, or
    /// missing, where this process committed there to that, and says which went back.
    pub fn hold(&self, answer: &mut [(Tp, Option<i64>)]) -> Vec<WentBack> {
        let mut went_back = Vec::new();
        for (tp, answered) in answer.iter_mut() {
            let Some(&committed) = self.process_committed.get(tp) else {
                continue;
            };
            if answered.is_none_or(|a| a < committed) {
                went_back.push(WentBack {
                    tp: tp.clone(),
                    answered: *answered,
                    committed,
                });
                *answered = Some(committed);
            }
        }
        went_back
    }

    /// `topic` was deleted: what this process committed there is no longer the least its
    /// partitions hold (a topic created again under its name starts at 0).
    pub fn deleted(&mut self, topic: &str) {
        self.process_committed.retain(|(t, _), _| t != topic);
    }

    /// Whether this process committed anything in `tp`, owned now or not.
    pub fn ever_committed(&self, tp: &Tp) -> bool {
        self.process_committed.contains_key(tp)
    }

    /// The first offset read of `tp` since it was assigned, if anything was.
    pub fn first_read(&self, tp: &Tp) -> Option<i64> {
        self.entry(tp)?.first_read
    }

    /// What the last commit that held `tp` sent for it, since it was assigned.
    pub fn last_committed(&self, tp: &Tp) -> Option<i64> {
        self.entry(tp)?.committed
    }

    /// `partitions` are no longer owned: a later assignment starts afresh (what this process
    /// committed in them may be outdated by the time they come back; it is kept, as the least
    /// a start there may be).
    pub fn forget(&mut self, partitions: &[Tp]) {
        for (topic, partition) in partitions {
            if let Slot::Occupied(mut ps) = self.entries.entry(topic.clone()) {
                ps.get_mut().remove(partition);
                if ps.get().is_empty() {
                    ps.remove();
                }
            }
        }
        self.last = None;
        self.publish(partitions.iter().map(|tp| (tp.clone(), None)));
    }

    /// A new consumer: nothing is owned yet (what this process committed is kept).
    pub fn clear(&mut self) {
        let all: Vec<Tp> = (self.entries.iter())
            .flat_map(|(t, ps)| ps.keys().map(|p| (t.clone(), *p)))
            .collect();
        self.forget(&all);
    }

    /// The floor of `tp` as published to the lag (testing only).
    #[cfg(test)]
    pub fn published_floor(&self, tp: &Tp) -> Option<i64> {
        self.floors.as_ref()?.floor(tp)
    }

    fn entry(&self, (topic, partition): &Tp) -> Option<&Entry> {
        self.entries.get(topic)?.get(partition)
    }

    fn publish(&self, floors: impl IntoIterator<Item = (Tp, Option<i64>)>) {
        if let Some(positions) = &self.floors {
            positions.floors(floors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> Tp {
        (t.to_string(), p)
    }

    #[test]
    fn the_first_read_of_each_partition_stays_until_it_is_revoked() {
        let mut l = Ledger::default();
        assert!(l.read("a", 0, 5));
        assert!(!l.read("a", 0, 6));
        assert!(l.read("a", 1, 9));
        assert!(l.read("b", 0, 3));
        // Back to a partition read before: not its first.
        assert!(!l.read("a", 0, 7));
        assert_eq!(l.first_read(&tp("a", 0)), Some(5));
        assert_eq!(l.first_read(&tp("a", 1)), Some(9));
        assert_eq!(l.first_read(&tp("b", 0)), Some(3));
        l.forget(&[tp("a", 0)]);
        assert_eq!(l.first_read(&tp("a", 0)), None);
        assert_eq!(l.first_read(&tp("a", 1)), Some(9));
        // Assigned again: its next record is its first.
        assert!(l.read("a", 0, 20));
        assert_eq!(l.first_read(&tp("a", 0)), Some(20));
        l.clear();
        assert_eq!(l.first_read(&tp("a", 1)), None);
        assert!(l.read("a", 1, 30));
    }

    #[test]
    fn a_commit_before_the_first_read_does_not_make_it_not_first() {
        let mut l = Ledger::default();
        // Markers only: the commit moved the group past them before any record came.
        l.committed(&[(tp("a", 0), 4)]);
        assert!(l.read("a", 0, 6));
        assert_eq!(l.first_read(&tp("a", 0)), Some(6));
        assert_eq!(l.last_committed(&tp("a", 0)), Some(4));
    }

    #[test]
    fn a_revoke_forgets_both_facts_and_the_published_floor() {
        let positions = Arc::new(Positions::default());
        let mut l = Ledger::default();
        l.publish_to(positions.clone());
        l.read("a", 0, 5);
        assert_eq!(positions.floor(&tp("a", 0)), Some(5));
        l.committed(&[(tp("a", 0), 8), (tp("a", 1), 3)]);
        assert_eq!(positions.floor(&tp("a", 0)), Some(8));
        assert_eq!(positions.floor(&tp("a", 1)), Some(3));
        l.forget(&[tp("a", 0)]);
        assert_eq!(
            (l.first_read(&tp("a", 0)), l.last_committed(&tp("a", 0))),
            (None, None)
        );
        assert_eq!(positions.floor(&tp("a", 0)), None);
        // The other partition keeps its facts.
        assert_eq!(l.last_committed(&tp("a", 1)), Some(3));
        assert_eq!(positions.floor(&tp("a", 1)), Some(3));
        l.clear();
        assert_eq!(l.last_committed(&tp("a", 1)), None);
        assert_eq!(positions.floor(&tp("a", 1)), None);
    }

    #[test]
    fn what_this_process_committed_outlives_a_revoke_and_holds_lower_answers() {
        let mut l = Ledger::default();
        l.committed(&[(tp("a", 0), 8), (tp("a", 1), 3)]);
        l.committed(&[(tp("a", 0), 12)]);
        l.forget(&[tp("a", 0)]);
        l.clear();
        assert!(l.ever_committed(&tp("a", 0)));
        let mut answer = vec![
            (tp("a", 0), None),    // the group forgot it
            (tp("a", 1), Some(5)), // another member committed past it
            (tp("a", 2), None),    // never committed here: believed
            (tp("b", 0), Some(1)),
        ];
        let went_back = l.hold(&mut answer);
        assert_eq!(
            went_back,
            vec![WentBack {
                tp: tp("a", 0),
                answered: None,
                committed: 12
            }]
        );
        assert_eq!(
            answer,
            vec![
                (tp("a", 0), Some(12)),
                (tp("a", 1), Some(5)),
                (tp("a", 2), None),
                (tp("b", 0), Some(1)),
            ]
        );
        let mut lower = vec![(tp("a", 1), Some(2))];
        assert_eq!(l.hold(&mut lower).len(), 1);
        assert_eq!(lower, vec![(tp("a", 1), Some(3))]);
    }
}

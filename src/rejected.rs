//! Records the broker rejects for what they are: their size, their bytes, their timestamp.
//!
//! Retrying such a record, or aborting and replaying it, meets the same rejection forever, and
//! in a transaction one rejected record aborts everything with it. So the driver learns which
//! input each rejected delivery came from, and the replay sends something else for it:
//!
//! 1. Every send carries an index into the open transaction's [`SentLog`] as its delivery
//!    opaque; the delivery callback keeps `(index, code)` of every rejection
//!    ([`crate::error::rejected_record`] says which codes are the record's fault).
//! 2. After the abort, the rejections become [`Verdict`]s by input position. A rejection is
//!    certain when it was the only one (librdkafka sends a partition's records in one batch
//!    and the broker rejects the batch whole, so several rejections can hide one culprit):
//!    then the input is [`Verdict::Rejected`]. Otherwise every rejected input is a
//!    [`Verdict::Suspect`].
//! 3. On the replay a suspect's outputs are sent one at a time, each flushed alone: one that
//!    the broker rejects alone is certain, and its transaction is aborted again; a suspect
//!    whose outputs all pass is cleared. A rejected input sends its dead-letter copy instead;
//!    if that copy is rejected too, a minimal copy (reason and source headers only, no
//!    timestamp of its own).
//!
//! Errors that are not the record's (an unknown topic, authorization, a broker that is down)
//! never become verdicts: they keep the abort, rewind and back-off of any failed call.

use std::collections::HashMap;

use rdkafka::error::RDKafkaErrorCode as Code;

/// Which copy of an input record a send was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// An output of the transform.
    Output,
    /// The dead-letter copy: the input with the reason headers.
    DeadLetter,
    /// The minimal dead-letter copy: reason and source headers only.
    Minimal,
}

impl Copy {
    /// What the replay sends after this copy was rejected, or `None` when nothing smaller is
    /// left.
    pub fn next(self) -> Option<Copy> {
        match self {
            Copy::Output => Some(Copy::DeadLetter),
            Copy::DeadLetter => Some(Copy::Minimal),
            Copy::Minimal => None,
        }
    }
}

/// Where a sent record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// Which copy was sent.
    pub copy: Copy,
}

/// The sources of everything the open transaction has sent, by delivery opaque. An opaque is
/// the transaction's generation in the high 32 bits and the send's index in the low ones, so
/// that a late report of an earlier transaction never names a record of this one.
#[derive(Debug, Default)]
pub struct SentLog {
    /// Input topics, so an entry stores an index instead of a name.
    topics: Vec<String>,
    sent: Vec<(u32, i32, i64, Copy)>,
    generation: u32,
}

impl SentLog {
    /// Logs one send; returns its opaque.
    pub fn push(&mut self, s: Source<'_>) -> usize {
        let t = match self.topics.iter().position(|t| t == s.topic) {
            Some(t) => t,
            None => {
                self.topics.push(s.topic.to_string());
                self.topics.len() - 1
            }
        };
        self.sent.push((t as u32, s.partition, s.offset, s.copy));
        ((self.generation as usize) << 32) | (self.sent.len() - 1)
    }

    /// The source of the send with `opaque`, if it was of this transaction.
    pub fn get(&self, opaque: usize) -> Option<Source<'_>> {
        if opaque >> 32 != self.generation as usize {
            return None;
        }
        let &(t, partition, offset, copy) = self.sent.get(opaque & 0xffff_ffff)?;
        Some(Source {
            topic: self.topics.get(t as usize)?,
            partition,
            offset,
            copy,
        })
    }

    /// Forgets the sends of a transaction that ended.
    pub fn clear(&mut self) {
        self.sent.clear();
        self.generation = self.generation.wrapping_add(1);
    }
}

/// What the broker said about one input record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Rejected together with others: sent alone on the replay to find out.
    Suspect {
        /// The broker's code.
        code: Code,
        /// The copy that was rejected.
        copy: Copy,
    },
    /// Rejected alone: its own fault.
    Rejected {
        /// The broker's code.
        code: Code,
        /// The copy that was rejected.
        copy: Copy,
    },
}

/// Verdicts by input position, kept until the position is committed.
#[derive(Debug, Default)]
pub struct Verdicts {
    by_topic: HashMap<String, HashMap<(i32, i64), Verdict>>,
}

impl Verdicts {
    /// The verdict on an input, if there is one. Cheap when there are none (the usual case).
    pub fn get(&self, topic: &str, partition: i32, offset: i64) -> Option<Verdict> {
        if self.by_topic.is_empty() {
            return None;
        }
        self.by_topic.get(topic)?.get(&(partition, offset)).copied()
    }

    /// Learns from the rejected sends of an aborted transaction: `(source, code)` of each.
    /// Rejections of one input only (a lone record, or a fan-out whose outputs the broker
    /// refused together), or of a record sent alone, are certain; others make suspects.
    pub fn learn(&mut self, rejected: &[(Source<'_>, Code)], alone: bool) {
        let one_input = rejected.windows(2).all(|w| {
            let (a, b) = (w[0].0, w[1].0);
            (a.topic, a.partition, a.offset) == (b.topic, b.partition, b.offset)
        });
        let certain = alone || one_input;
        for (s, code) in rejected {
            let v = if certain {
                Verdict::Rejected {
                    code: *code,
                    copy: s.copy,
                }
            } else {
                match self.get(s.topic, s.partition, s.offset) {
                    // Already known (its dead-letter copy was sent in a batch that failed):
                    // what was rejected now is the copy.
                    Some(Verdict::Rejected { .. }) => Verdict::Rejected {
                        code: *code,
                        copy: s.copy,
                    },
                    _ => Verdict::Suspect {
                        code: *code,
                        copy: s.copy,
                    },
                }
            };
            self.set(s.topic, s.partition, s.offset, v);
        }
    }

    /// Clears a suspect whose outputs all went through alone.
    pub fn clear(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(ps) = self.by_topic.get_mut(topic) {
            ps.remove(&(partition, offset));
            if ps.is_empty() {
                self.by_topic.remove(topic);
            }
        }
    }

    /// Forgets every verdict below a committed offset: those records are settled.
    pub fn committed(&mut self, topic: &str, partition: i32, next: i64) {
        if let Some(ps) = self.by_topic.get_mut(topic) {
            ps.retain(|&(p, o), _| p != partition || o >= next);
            if ps.is_empty() {
                self.by_topic.remove(topic);
            }
        }
    }

    fn set(&mut self, topic: &str, partition: i32, offset: i64, v: Verdict) {
        self.by_topic
            .entry(topic.to_string())
            .or_default()
            .insert((partition, offset), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(topic: &str, partition: i32, offset: i64, copy: Copy) -> Source<'_> {
        Source {
            topic,
            partition,
            offset,
            copy,
        }
    }

    #[test]
    fn the_log_maps_opaques_back_to_inputs() {
        let mut log = SentLog::default();
        let a = log.push(src("in", 0, 7, Copy::Output));
        let b = log.push(src("other", 3, 9, Copy::DeadLetter));
        let c = log.push(src("in", 1, 8, Copy::Output));
        assert_eq!(log.get(a), Some(src("in", 0, 7, Copy::Output)));
        assert_eq!(log.get(b), Some(src("other", 3, 9, Copy::DeadLetter)));
        assert_eq!(log.get(c), Some(src("in", 1, 8, Copy::Output)));
        assert_eq!(log.get(3), None);
        log.clear();
        assert_eq!(log.get(a), None);
        // A late report of the last transaction does not name this one's first record.
        let d = log.push(src("in", 2, 1, Copy::Output));
        assert_eq!(log.get(d), Some(src("in", 2, 1, Copy::Output)));
        assert_ne!(a, d);
        assert_eq!(log.get(a), None);
    }

    #[test]
    fn a_lone_rejection_is_certain_and_several_are_suspects() {
        let big = Code::MessageSizeTooLarge;
        let mut v = Verdicts::default();
        v.learn(&[(src("in", 0, 5, Copy::Output), big)], false);
        assert_eq!(
            v.get("in", 0, 5),
            Some(Verdict::Rejected {
                code: big,
                copy: Copy::Output
            })
        );
        v.learn(
            &[
                (src("in", 1, 1, Copy::Output), big),
                (src("in", 1, 2, Copy::Output), big),
            ],
            false,
        );
        assert!(matches!(v.get("in", 1, 1), Some(Verdict::Suspect { .. })));
        assert!(matches!(v.get("in", 1, 2), Some(Verdict::Suspect { .. })));
        // Alone, a suspect's rejection is certain.
        v.learn(&[(src("in", 1, 2, Copy::Output), big)], true);
        assert!(matches!(v.get("in", 1, 2), Some(Verdict::Rejected { .. })));
        v.clear("in", 1, 1);
        assert_eq!(v.get("in", 1, 1), None);
        // A rejected input's dead-letter copy, rejected in a batch with others, is certain.
        v.learn(
            &[
                (src("in", 0, 5, Copy::DeadLetter), big),
                (src("in", 0, 6, Copy::Output), big),
            ],
            false,
        );
        assert_eq!(
            v.get("in", 0, 5),
            Some(Verdict::Rejected {
                code: big,
                copy: Copy::DeadLetter
            })
        );
        assert!(matches!(v.get("in", 0, 6), Some(Verdict::Suspect { .. })));
        // Both outputs of one input (a fan-out) rejected together: certain.
        v.learn(
            &[
                (src("in", 3, 9, Copy::Output), big),
                (src("in", 3, 9, Copy::Output), big),
            ],
            false,
        );
        assert!(matches!(v.get("in", 3, 9), Some(Verdict::Rejected { .. })));
    }

    #[test]
    fn committed_positions_are_forgotten() {
        let big = Code::MessageSizeTooLarge;
        let mut v = Verdicts::default();
        v.learn(&[(src("in", 0, 5, Copy::Output), big)], true);
        v.learn(&[(src("in", 1, 5, Copy::Output), big)], true);
        v.committed("in", 0, 5);
        assert!(v.get("in", 0, 5).is_some(), "not yet committed");
        v.committed("in", 0, 6);
        assert_eq!(v.get("in", 0, 5), None);
        assert!(v.get("in", 1, 5).is_some(), "another partition");
        v.committed("in", 1, 100);
        assert!(v.by_topic.is_empty());
    }

    #[test]
    fn copies_shrink_to_nothing() {
        assert_eq!(Copy::Output.next(), Some(Copy::DeadLetter));
        assert_eq!(Copy::DeadLetter.next(), Some(Copy::Minimal));
        assert_eq!(Copy::Minimal.next(), None);
    }
}

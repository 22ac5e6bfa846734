//! Records the broker rejects for what they are: their size, their bytes, their timestamp.
//!
//! Retrying such a record, or aborting and replaying it, meets the same rejection forever, and
//! in a transaction one rejected record aborts everything with it. So the driver learns which
//! input each rejected delivery came from, and the replay sends something else for it:
//!
//! 1. Every send carries an index into the open transaction's [`SentLog`] (Kafka sinks: as its
//!    delivery opaque); the sink reports a [`Rejection`] with that index for each record the
//!    destination refused for what it is (for Kafka, [`crate::kafka::failure::rejected_record`] says
//!    which codes are).
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

use tracing::warn;

use super::Rejection;
use crate::kafka::Tp;
use crate::transform::Refuser;

/// Which copy of an input record a send was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// An output of the transform.
    Output,
    /// The dead-letter copy: the input with the reason headers.
    DeadLetter,
    /// The minimal dead-letter copy: reason and source headers only.
    Minimal,
}

impl Form {
    /// What the replay sends after this copy was rejected, or `None` when nothing smaller is
    /// left.
    pub fn next(self) -> Option<Form> {
        match self {
            Form::Output => Some(Form::DeadLetter),
            Form::DeadLetter => Some(Form::Minimal),
            Form::Minimal => None,
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
    pub copy: Form,
    /// The sent record's fingerprint (`Outgoing::fingerprint`), when it is an output.
    pub fingerprint: u64,
}

/// The sources of everything the open transaction has sent, by delivery opaque. An opaque is
/// the transaction's generation in the high 32 bits and the send's index in the low ones, so
/// that a late report of an earlier transaction never names a record of this one.
#[derive(Debug, Default)]
pub struct SentLog {
    /// Input topics, so an entry stores an index instead of a name.
    topics: Vec<String>,
    sent: Vec<(u32, i32, i64, Form, u64)>,
    generation: u32,
}

impl SentLog {
    /// Logs one send; returns its opaque.
    pub fn push(&mut self, s: Source<'_>) -> usize {
        const { assert!(usize::BITS >= 64, "the opaque packs two 32-bit numbers") };
        let t = match self.topics.iter().position(|t| t == s.topic) {
            Some(t) => t,
            None => {
                self.topics.push(s.topic.to_string());
                self.topics.len() - 1
            }
        };
        self.sent
            .push((t as u32, s.partition, s.offset, s.copy, s.fingerprint));
        ((self.generation as usize) << 32) | (self.sent.len() - 1)
    }

    /// The source of the send with `opaque`, if it was of this transaction.
    pub fn get(&self, opaque: usize) -> Option<Source<'_>> {
        if opaque >> 32 != self.generation as usize {
            return None;
        }
        let &(t, partition, offset, copy, fingerprint) = self.sent.get(opaque & 0xffff_ffff)?;
        Some(Source {
            topic: self.topics.get(t as usize)?,
            partition,
            offset,
            copy,
            fingerprint,
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
        /// The destination's name for the error.
        error: &'static str,
        /// The copy that was rejected.
        copy: Form,
    },
    /// Rejected for its own fault: the replay sends the next form.
    Rejected {
        /// The destination's name for the error.
        error: &'static str,
        /// The form that was rejected.
        copy: Form,
        /// The next form was refused too, together with others: send it again, alone.
        alone: bool,
    },
}

impl Verdict {
    /// The copy that was refused.
    pub fn copy(&self) -> Form {
        match self {
            Verdict::Suspect { copy, .. } | Verdict::Rejected { copy, .. } => *copy,
        }
    }
}

/// Verdicts by input position, kept until the position is committed, each with the
/// fingerprint of the output it is about (when it is about an output).
#[derive(Debug, Default)]
pub struct Verdicts {
    by_topic: HashMap<String, HashMap<(i32, i64), Fingerprinted>>,
}

/// A verdict and the fingerprint of the output it is about.
type Fingerprinted = (Verdict, u64);

impl Verdicts {
    /// The verdict on an input, if there is one. Cheap when there are none (the usual case).
    pub fn get(&self, topic: &str, partition: i32, offset: i64) -> Option<Verdict> {
        self.get_with(topic, partition, offset).map(|(v, _)| v)
    }

    /// The verdict on an input and the fingerprint of the output it was about.
    pub fn get_with(&self, topic: &str, partition: i32, offset: i64) -> Option<(Verdict, u64)> {
        if self.by_topic.is_empty() {
            return None;
        }
        self.by_topic.get(topic)?.get(&(partition, offset)).copied()
    }

    /// Learns from the rejected sends of an aborted transaction: each one's source and
    /// rejection; returns whether any verdict is new. A rejection is certain when it is the
    /// only one (batch-wide errors fail every record of the batch, so a lone one was alone in
    /// it), when the record was sent alone, or when the destination named each bad record
    /// (KIP-467: `INVALID_RECORD` when a batch had several) and all are of one input (a
    /// fan-out's outputs). Others make suspects, sent alone on the replay.
    pub fn learn(&mut self, rejected: &[(Source<'_>, Rejection)], alone: bool) -> bool {
        let certain = certain(rejected, alone);
        let mut changed = false;
        for &(s, r) in rejected {
            let known = self.get_with(s.topic, s.partition, s.offset);
            let v = match known {
                _ if certain => (
                    Verdict::Rejected {
                        error: r.error,
                        copy: s.copy,
                        alone: false,
                    },
                    s.fingerprint,
                ),
                // Rejected before; now its next form was refused together with others.
                Some((Verdict::Rejected { error, copy, .. }, fingerprint)) => (
                    Verdict::Rejected {
                        error,
                        copy,
                        alone: true,
                    },
                    fingerprint,
                ),
                _ => (
                    Verdict::Suspect {
                        error: r.error,
                        copy: s.copy,
                    },
                    s.fingerprint,
                ),
            };
            changed |= known.map(|(k, _)| k) != Some(v.0);
            self.set(s.topic, s.partition, s.offset, v);
        }
        changed
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

    /// How many verdicts are kept on `tp`'s records (testing only).
    #[cfg(test)]
    pub fn on(&self, (topic, partition): &Tp) -> usize {
        let of = self.by_topic.get(topic);
        of.map_or(0, |ps| ps.keys().filter(|(p, _)| p == partition).count())
    }

    /// Forgets every verdict on `partitions`: no longer owned, their records are another
    /// member's to judge (and, back here later, judged afresh).
    pub fn revoked(&mut self, partitions: &[Tp]) {
        for (topic, partition) in partitions {
            self.committed(topic, *partition, i64::MAX);
        }
    }

    fn set(&mut self, topic: &str, partition: i32, offset: i64, v: (Verdict, u64)) {
        self.by_topic
            .entry(topic.to_string())
            .or_default()
            .insert((partition, offset), v);
    }
}

/// What the driver knows of refused records: the open unit's sends and the verdicts.
#[derive(Debug, Default)]
pub struct Rejections {
    sent: SentLog,
    verdicts: Verdicts,
}

/// Whether the refusal of `rejected` is certainly each one's own: sent `alone`, each judged
/// alone, a single record, or records of one input all named.
fn certain(rejected: &[(Source<'_>, Rejection)], alone: bool) -> bool {
    let one_input = rejected.windows(2).all(|w| {
        let (a, b) = (w[0].0, w[1].0);
        (a.topic, a.partition, a.offset) == (b.topic, b.partition, b.offset)
    });
    let named = rejected.iter().all(|(_, r)| r.named);
    let judged_alone = rejected.iter().all(|(_, r)| r.alone);
    alone || judged_alone || rejected.len() == 1 || (one_input && named)
}

/// Says what `by` refused: each record it named or that is certainly at fault (the broker's
/// `INVALID_RECORD`, every row a database refused, judged alone, a batch of one: the same
/// rule as the verdicts, [`certain`]), or a batch it refused whole (the broker rejects a
/// partition's batch: one culprit can fail a hundred records).
fn said(rejected: &[(Source<'_>, Rejection)], by: &Refuser, alone: bool) {
    let all = certain(rejected, alone);
    let (named, together): (Vec<_>, Vec<_>) =
        (rejected.iter()).partition(|(_, r)| all || r.named || r.alone);
    for (s, r) in &named {
        let (topic, partition, offset, copy, error) =
            (s.topic, s.partition, s.offset, s.copy, r.error);
        warn!(topic, partition, offset, ?copy, error, "{}", by.refused);
    }
    let Some((s, r)) = together.first() else {
        return;
    };
    let mut partitions: Vec<i32> = together.iter().map(|(s, _)| s.partition).collect();
    partitions.sort_unstable();
    partitions.dedup();
    warn!(
        records = together.len(),
        topic = s.topic,
        partitions = ?partitions,
        first_offset = s.offset,
        error = r.error,
        "{} rejected records together; their replay sends each alone to find which one is at \
         fault",
        by.who
    );
}

impl Rejections {
    /// Logs one send of the open unit; returns its index.
    pub fn sent(&mut self, source: Source<'_>) -> usize {
        self.sent.push(source)
    }

    /// A new unit: the last one's sends are settled.
    pub fn new_unit(&mut self) {
        self.sent.clear();
    }

    /// The verdict on an input, if there is one, and the fingerprint of the output it is
    /// about.
    pub fn verdict(&self, topic: &str, partition: i32, offset: i64) -> Option<(Verdict, u64)> {
        self.verdicts.get_with(topic, partition, offset)
    }

    /// A suspect whose records all went through alone is innocent.
    pub fn cleared(&mut self, topic: &str, partition: i32, offset: i64) {
        self.verdicts.clear(topic, partition, offset);
    }

    /// `partitions` are no longer owned: their verdicts go.
    pub fn revoked(&mut self, partitions: &[Tp]) {
        self.verdicts.revoked(partitions);
    }

    /// How many verdicts are kept on `tp`'s records (testing only).
    #[cfg(test)]
    pub fn verdicts_on(&self, tp: &Tp) -> usize {
        self.verdicts.on(tp)
    }

    /// Verdicts below a committed offset are settled.
    pub fn committed(&mut self, topic: &str, partition: i32, next: i64) {
        self.verdicts.committed(topic, partition, next);
    }

    /// Learns from the rejections of a unit that ended without a commit, and forgets its
    /// sends. `alone`: the last record was sent alone, so a rejection is its own; `source`
    /// says what was sent with a `TooLarge` refusal the sink itself made. Whether a verdict is
    /// new (the replay sends something else: progress, not an outage).
    pub fn learn(&mut self, rejections: Vec<Rejection>, alone: bool, by: &Refuser) -> bool {
        if rejections.is_empty() {
            self.sent.clear();
            return false;
        }
        let rejected: Vec<_> = rejections
            .iter()
            .filter_map(|r| self.sent.get(r.index).map(|s| (s, *r)))
            .collect();
        said(&rejected, by, alone);
        let learned = self.verdicts.learn(&rejected, alone);
        self.sent.clear();
        learned
    }

    /// A record the sink refused itself as too large, before sending: certain.
    pub fn too_large(&mut self, source: Source<'_>) {
        let r = Rejection {
            index: 0,
            error: "MESSAGE_TOO_LARGE",
            named: true,
            alone: true,
        };
        self.verdicts.learn(&[(source, r)], true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A revoke forgets the verdicts on the partitions revoked, and only those.
    #[test]
    fn a_revoke_forgets_the_verdicts_of_its_partitions() {
        let mut v = Verdicts::default();
        let suspect = Verdict::Suspect {
            error: "INVALID_TIMESTAMP",
            copy: Form::Output,
        };
        for p in [0, 1] {
            v.set("in", p, 5, (suspect, 0));
        }
        v.revoked(&[("in".into(), 0), ("other".into(), 1)]);
        assert_eq!(v.get("in", 0, 5), None);
        assert_eq!(v.get("in", 1, 5), Some(suspect));
    }

    fn src(topic: &str, partition: i32, offset: i64, copy: Form) -> Source<'_> {
        Source {
            topic,
            partition,
            offset,
            copy,
            fingerprint: 0,
        }
    }

    #[test]
    fn the_log_maps_opaques_back_to_inputs() {
        let mut log = SentLog::default();
        let a = log.push(src("in", 0, 7, Form::Output));
        let b = log.push(src("other", 3, 9, Form::DeadLetter));
        let c = log.push(src("in", 1, 8, Form::Output));
        assert_eq!(log.get(a), Some(src("in", 0, 7, Form::Output)));
        assert_eq!(log.get(b), Some(src("other", 3, 9, Form::DeadLetter)));
        assert_eq!(log.get(c), Some(src("in", 1, 8, Form::Output)));
        assert_eq!(log.get(3), None);
        log.clear();
        assert_eq!(log.get(a), None);
        // A late report of the last transaction does not name this one's first record.
        let d = log.push(src("in", 2, 1, Form::Output));
        assert_eq!(log.get(d), Some(src("in", 2, 1, Form::Output)));
        assert_ne!(a, d);
        assert_eq!(log.get(a), None);
    }

    const BIG: Rejection = Rejection {
        index: 0,
        error: "MESSAGE_TOO_LARGE",
        named: false,
        alone: false,
    };

    #[test]
    fn a_lone_rejection_is_certain_and_several_are_suspects() {
        let mut v = Verdicts::default();
        assert!(v.learn(&[(src("in", 0, 5, Form::Output), BIG)], false));
        assert_eq!(
            v.get("in", 0, 5),
            Some(Verdict::Rejected {
                error: BIG.error,
                copy: Form::Output,
                alone: false,
            })
        );
        v.learn(
            &[
                (src("in", 1, 1, Form::Output), BIG),
                (src("in", 1, 2, Form::Output), BIG),
            ],
            false,
        );
        assert!(matches!(v.get("in", 1, 1), Some(Verdict::Suspect { .. })));
        assert!(matches!(v.get("in", 1, 2), Some(Verdict::Suspect { .. })));
        // Alone, a suspect's rejection is certain.
        v.learn(&[(src("in", 1, 2, Form::Output), BIG)], true);
        assert!(matches!(v.get("in", 1, 2), Some(Verdict::Rejected { .. })));
        v.clear("in", 1, 1);
        assert_eq!(v.get("in", 1, 1), None);
    }

    #[test]
    fn a_refused_dead_letter_copy_goes_again_alone() {
        let mut v = Verdicts::default();
        v.learn(&[(src("in", 0, 5, Form::Output), BIG)], false);
        // A rejected input's dead-letter copy, refused in a batch with others: that copy goes
        // again, alone.
        v.learn(
            &[
                (src("in", 0, 5, Form::DeadLetter), BIG),
                (src("in", 0, 6, Form::Output), BIG),
            ],
            false,
        );
        assert_eq!(
            v.get("in", 0, 5),
            Some(Verdict::Rejected {
                error: BIG.error,
                copy: Form::Output,
                alone: true,
            })
        );
        assert!(matches!(v.get("in", 0, 6), Some(Verdict::Suspect { .. })));
        // Alone, it is certain.
        v.learn(&[(src("in", 0, 5, Form::DeadLetter), BIG)], true);
        assert!(matches!(
            v.get("in", 0, 5),
            Some(Verdict::Rejected {
                copy: Form::DeadLetter,
                alone: false,
                ..
            })
        ));
    }

    #[test]
    fn a_fan_out_is_certain_only_when_the_destination_named_each_record() {
        let mut v = Verdicts::default();
        // Both outputs of one input (a fan-out) named by the broker: certain.
        let named = Rejection {
            error: "INVALID_RECORD",
            named: true,
            ..BIG
        };
        v.learn(
            &[
                (src("in", 3, 9, Form::Output), named),
                (src("in", 3, 9, Form::Output), named),
            ],
            false,
        );
        assert!(matches!(v.get("in", 3, 9), Some(Verdict::Rejected { .. })));
        // A fan-out in a batch over the topic's size: every output fails with the batch, so
        // one of them alone may well fit. Suspects.
        let fan_out = [
            (src("in", 4, 1, Form::Output), BIG),
            (src("in", 4, 1, Form::Output), BIG),
        ];
        v.learn(&fan_out, false);
        assert!(matches!(v.get("in", 4, 1), Some(Verdict::Suspect { .. })));
        // Learning the same again is no news.
        assert!(!v.learn(&fan_out, false));
    }

    #[test]
    fn committed_positions_are_forgotten() {
        let mut v = Verdicts::default();
        v.learn(&[(src("in", 0, 5, Form::Output), BIG)], true);
        v.learn(&[(src("in", 1, 5, Form::Output), BIG)], true);
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
        assert_eq!(Form::Output.next(), Some(Form::DeadLetter));
        assert_eq!(Form::DeadLetter.next(), Some(Form::Minimal));
        assert_eq!(Form::Minimal.next(), None);
    }
}

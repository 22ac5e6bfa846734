//! The open unit of work (a transaction, or an at-least-once batch of deliveries), as every
//! sink counts it: records, bytes, offsets per partition.

use std::time::{Duration, Instant};

use crate::events::TransactionCommitted;
use crate::metrics::Metrics;
use crate::transform::Reason;

/// One input record, as the open unit counts it.
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// Key and value bytes.
    pub bytes: u64,
    /// Input timestamp, ms since the epoch.
    pub timestamp: Option<i64>,
}

/// One open unit of work: a transaction, or an at-least-once batch of deliveries.
#[derive(Debug)]
pub struct Unit {
    began: Instant,
    records: u64,
    bytes: u64,
    /// Next offset to consume and records consumed, per topic and partition. Keyed by topic first so that the per-record look-up borrows the topic name
    /// instead of copying it.
    /// Keys are topic names and partitions, nothing a client chooses: a fast hasher is safe.
    offsets: foldhash::HashMap<String, foldhash::HashMap<i32, (i64, u64)>>,
    /// Input timestamps (ms since the epoch), for the end-to-end latency at commit.
    timestamps: Vec<i64>,
    /// Inputs that yielded no output, and DLQ records by reason (a few reasons at most):
    /// counted when the unit commits, so that a record replayed after an abort counts once.
    filtered: u64,
    dead_lettered: Vec<(Reason, u64)>,
}

impl Unit {
    pub(super) fn new() -> Unit {
        Unit {
            began: crate::clock::now(),
            records: 0,
            bytes: 0,
            offsets: Default::default(),
            timestamps: Vec::new(),
            filtered: 0,
            dead_lettered: Default::default(),
        }
    }

    /// How long it has been open.
    pub fn age(&self) -> Duration {
        crate::clock::now().saturating_duration_since(self.began)
    }

    /// Input records consumed.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Input bytes (keys and values) consumed.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(super) fn filtered(&mut self) {
        self.filtered += 1;
    }

    pub(super) fn consumed(&mut self, record: Consumed<'_>) {
        let Consumed {
            topic,
            partition,
            offset,
            bytes,
            timestamp,
        } = record;
        self.records += 1;
        self.bytes += bytes;
        if let Some(ts) = timestamp {
            self.timestamps.push(ts);
        }
        let partitions = match self.offsets.get_mut(topic) {
            Some(p) => p,
            None => self.offsets.entry(topic.to_string()).or_default(),
        };
        partitions
            .entry(partition)
            .and_modify(|e| {
                e.0 = offset + 1;
                e.1 += 1;
            })
            .or_insert((offset + 1, 1));
    }

    pub(super) fn dead_lettered(&mut self, reason: Reason) {
        match self.dead_lettered.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => self.dead_lettered.push((reason, 1)),
        }
    }

    /// What the commit sends: the next offset of each consumed partition.
    pub(super) fn next_offsets(&self) -> impl Iterator<Item = (&str, i32, i64)> {
        self.offsets
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, (next, _))| (t.as_str(), *p, *next)))
    }

    /// Counts the committed unit.
    pub(super) fn emit_committed(&self, took: Duration, m: &Metrics) {
        let consumed: Vec<(&str, i32, u64)> = self
            .offsets
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, (_, n))| (t.as_str(), *p, *n)))
            .collect();
        TransactionCommitted {
            consumed: &consumed,
            filtered: self.filtered,
            dead_lettered: &self.dead_lettered,
            records: self.records,
            timestamps: &self.timestamps,
            took,
        }
        .emit(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_the_next_offset_per_partition() {
        let mut t = Unit::new();
        let at = |topic, partition, offset, bytes| Consumed {
            topic,
            partition,
            offset,
            bytes,
            timestamp: None,
        };
        t.consumed(at("a", 0, 10, 5));
        t.consumed(at("a", 0, 11, 5));
        t.consumed(at("a", 1, 3, 1));
        t.consumed(at("b", 0, 7, 1));
        t.consumed(at("a", 0, 15, 5)); // a gap (filtered or aborted records) is fine
        assert_eq!((t.records, t.bytes), (5, 17));
        let mut next: Vec<_> = t
            .next_offsets()
            .map(|(t, p, o)| (t.to_string(), p, o))
            .collect();
        next.sort();
        assert_eq!(
            next,
            [("a".into(), 0, 16), ("a".into(), 1, 4), ("b".into(), 0, 8)]
        );
    }

    #[test]
    fn each_reason_counts_apart_and_a_destinations_refusal_under_its_own_name() {
        let mut t = Unit::new();
        t.consumed(Consumed {
            topic: "a",
            partition: 0,
            offset: 1,
            bytes: 1,
            timestamp: None,
        });
        let refused = Reason::Rejected(&crate::transform::Refuser::TEST);
        for r in [refused, Reason::JqError, refused] {
            t.dead_lettered(r);
        }
        let m = Metrics::new();
        t.emit_committed(Duration::ZERO, &m);
        let text = m.render();
        for line in [
            "exactly_records_dlq_total{reason=\"rejected_by_broker\"} 2",
            "exactly_records_dlq_total{reason=\"jq_error\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("not_json"), "{text}");
    }
}

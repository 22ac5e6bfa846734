//! Partitions the transform cannot take now ([`Failure::Held`]: their state has no home, the
//! input grew and the changelog could not): each is paused with the first offset that must
//! come again, and released after a back-off ([`Backoff::HELD`]) to be tried again. No commit
//! passes a held partition's first record (it is read but not applied, [`Unapplied`]); the
//! other partitions go on.
//!
//! [`Failure::Held`]: crate::transform::Failure::Held
//! [`Unapplied`]: crate::sink::Unapplied

use std::collections::BTreeMap;
use std::time::Instant;

use tracing::{error, info};

use crate::backoff::Backoff;
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::sink::Group;

/// One held partition.
#[derive(Debug)]
struct Hold {
    /// Its first record not taken: it comes again.
    offset: i64,
    /// Held this many times in a row.
    times: u32,
    /// When it is released; `None`: released, and not taken since.
    until: Option<Instant>,
}

/// The held partitions.
#[derive(Debug, Default)]
pub struct Held {
    partitions: BTreeMap<Tp, Hold>,
}

impl Held {
    /// Whether `topic`/`partition` is held: its records are not applied (they come again from
    /// its first one not taken). On every record: nothing to look up while nothing is held.
    pub fn holds(&self, topic: &str, partition: i32) -> bool {
        if self.partitions.is_empty() {
            return false;
        }
        let tp = (topic.to_string(), partition);
        self.partitions.get(&tp).is_some_and(|h| h.until.is_some())
    }

    /// The record of `topic`/`partition` at `offset` was not taken (`why`): its partition is
    /// paused until its back-off passed. Held already, it keeps its first record not taken.
    pub fn hold(
        &mut self,
        group: &dyn Group,
        (topic, partition): (&str, i32),
        offset: i64,
        why: &str,
        metrics: &Metrics,
    ) {
        let tp = (topic.to_string(), partition);
        let (offset, times) = match self.partitions.get(&tp) {
            Some(h) if h.until.is_some() => (h.offset.min(offset), h.times),
            Some(h) => (offset, h.times + 1),
            None => (offset, 1),
        };
        let pause = Backoff::HELD.after(times);
        error!(topic, partition, offset, why, retry_in = ?pause, "partition held: its records wait, the others go on");
        if let Err(e) = group.pause(std::slice::from_ref(&tp)) {
            error!(topic, partition, error = %e, "cannot pause a held partition: its records are read and left for later");
        }
        let until = Some(crate::clock::now() + pause);
        self.partitions.insert(
            tp,
            Hold {
                offset,
                times,
                until,
            },
        );
        self.gauge(metrics);
    }

    /// Releases the partitions whose back-off passed: back at their first record not taken
    /// (sought while still paused), then resumed, and tried again. One that cannot be sought
    /// stays paused for another back-off.
    pub fn release(&mut self, group: &dyn Group, metrics: &Metrics) {
        // Every turn asks: nothing held is the common case, and costs nothing.
        if self.partitions.is_empty() {
            return;
        }
        let now = crate::clock::now();
        let due: Vec<(Tp, i64)> = (self.partitions.iter())
            .filter(|(_, h)| h.until.is_some_and(|u| u <= now))
            .map(|(tp, h)| (tp.clone(), h.offset))
            .collect();
        for (tp, offset) in due {
            let sought = group.seek(&[(tp.clone(), offset)], std::time::Duration::from_secs(5));
            let resumed = sought.is_ok() && group.resume(std::slice::from_ref(&tp)).is_ok();
            let Some(h) = self.partitions.get_mut(&tp) else {
                continue;
            };
            if resumed {
                info!(topic = %tp.0, partition = tp.1, offset, "held partition released: tried again");
                h.until = None;
            } else {
                let _ = group.pause(std::slice::from_ref(&tp));
                h.until = Some(now + Backoff::HELD.after(h.times));
            }
            self.gauge(metrics);
        }
    }

    /// The consumer went back (a rewind) to `to`, the seek of each partition read: a held
    /// partition's first record not taken is never past where it went back to (the records
    /// before it were aborted with the unit: they come again).
    pub fn rewound(&mut self, to: &[(Tp, i64)]) {
        for (tp, at) in to {
            if let Some(h) = self.partitions.get_mut(tp) {
                h.offset = h.offset.min(*at);
            }
        }
    }

    /// A record of `topic`/`partition` was taken: released, it is held no more. On every
    /// record: nothing to look up while nothing is held.
    pub fn taken(&mut self, topic: &str, partition: i32) {
        if self.partitions.is_empty() {
            return;
        }
        let tp = (topic.to_string(), partition);
        if self.partitions.get(&tp).is_some_and(|h| h.until.is_none()) {
            self.partitions.remove(&tp);
        }
    }

    /// `partitions` are no longer owned: resumed (a later assignment starts as any other),
    /// and forgotten.
    pub fn revoked(&mut self, group: &dyn Group, partitions: &[Tp], metrics: &Metrics) {
        let held: Vec<Tp> = (partitions.iter())
            .filter(|tp| self.partitions.remove(*tp).is_some())
            .cloned()
            .collect();
        if !held.is_empty() {
            let _ = group.resume(&held);
            self.gauge(metrics);
        }
    }

    /// Everything is forgotten (a new consumer is assigned afresh).
    pub fn clear(&mut self, metrics: &Metrics) {
        self.partitions.clear();
        self.gauge(metrics);
    }

    /// The first record not taken of each held partition: no commit passes it.
    pub fn firsts(&self) -> impl Iterator<Item = (Tp, i64)> + '_ {
        (self.partitions.iter())
            .filter(|(_, h)| h.until.is_some())
            .map(|(tp, h)| (tp.clone(), h.offset))
    }

    fn gauge(&self, metrics: &Metrics) {
        let held = self
            .partitions
            .values()
            .filter(|h| h.until.is_some())
            .count();
        metrics.state_partitions_held.set(held as i64);
    }
}

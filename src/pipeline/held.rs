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
    /// The record of `topic`/`partition` at `offset` was not taken (`why`): its partition is
    /// paused until its back-off passed.
    pub fn hold(
        &mut self,
        group: &dyn Group,
        (topic, partition): (&str, i32),
        offset: i64,
        why: &str,
        metrics: &Metrics,
    ) {
        let tp = (topic.to_string(), partition);
        let times = self.partitions.get(&tp).map_or(0, |h| h.times) + 1;
        let pause = Backoff::HELD.after(times);
        error!(topic, partition, offset, why, retry_in = ?pause, "partition held: its records wait, the others go on");
        if let Err(e) = group.pause(std::slice::from_ref(&tp)) {
            error!(topic, partition, error = %e, "cannot pause a held partition: its records are read and held again");
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

    /// Releases the partitions whose back-off passed: resumed, and back at their first record
    /// not taken, which is tried again.
    pub fn release(&mut self, group: &dyn Group, metrics: &Metrics) {
        let now = crate::clock::now();
        let due: Vec<(Tp, i64)> = (self.partitions.iter())
            .filter(|(_, h)| h.until.is_some_and(|u| u <= now))
            .map(|(tp, h)| (tp.clone(), h.offset))
            .collect();
        if due.is_empty() {
            return;
        }
        let partitions: Vec<Tp> = due.iter().map(|(tp, _)| tp.clone()).collect();
        let resumed = group.resume(&partitions);
        let sought = resumed.is_ok() && group.seek(&due, std::time::Duration::from_secs(5)).is_ok();
        for (tp, offset) in &due {
            let Some(h) = self.partitions.get_mut(tp) else {
                continue;
            };
            if sought {
                info!(topic = %tp.0, partition = tp.1, offset, "held partition released: tried again");
                h.until = None;
            } else {
                // Tried again after the next back-off.
                h.until = Some(now + Backoff::HELD.after(h.times));
            }
        }
        self.gauge(metrics);
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

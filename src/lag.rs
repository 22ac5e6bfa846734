//! Lag that is right under read_committed.
//!
//! A read_committed consumer reads no further than a partition's last stable offset (LSO), so
//! its lag is the LSO minus its position, and the records between the LSO and the high
//! watermark belong to transactions still open upstream (a hanging one shows there).
//!
//! Positions come from librdkafka's statistics, which the consumer context receives inside
//! `poll` ([`Positions::update`]), held back to what is committed ([`Positions::floors`],
//! which the sink's ledger publishes at a partition's first read and after every commit): a
//! record read is not processed until its transaction commits, so a slow application's staged
//! records show as lag. The end offsets come from two clients of this module's own, queried
//! on a thread of their own, so the lag keeps growing on the dashboard while the loop is
//! stuck: "latest" is the LSO for a read_committed client and the high watermark for a
//! read_uncommitted one. librdkafka's statistics cannot give both: in read_committed mode
//! their `hi_offset` is the LSO too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::error::Error;
use crate::kafka::consumer::Read;
use crate::kafka::ends::Ends;
use crate::kafka::{Isolation, Role, Settings};
use crate::metrics::{Metrics, PartitionOffsets};

/// The next offset not yet committed, per owned partition: what the lag counts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset not yet committed, if known yet.
    pub next: Option<i64>,
}

/// The owned partitions and their positions: the last statistics report's, held back to what
/// is committed. A record read is no progress until its transaction commits: records in the
/// open transaction, or waiting for the application's answer, are lag.
#[derive(Default)]
pub struct Positions {
    read: Mutex<Vec<Read>>,
    /// Per owned partition, the offset no record past has committed yet: the later of the
    /// first read since it was assigned and what this instance's commits sent, published by
    /// the sink's ledger (`sink::ledger`), which owns both.
    floor: Mutex<HashMap<(String, i32), i64>>,
}

impl Positions {
    /// Takes the positions of the owned partitions from a statistics report.
    pub fn update(&self, read: Vec<Read>) {
        *self.read.lock().unwrap_or_else(|p| p.into_inner()) = read;
    }

    /// The floors of partitions, as the sink's ledger keeps them (`None`: no longer owned).
    pub fn floors(&self, floors: impl IntoIterator<Item = ((String, i32), Option<i64>)>) {
        let mut floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
        for (tp, f) in floors {
            match f {
                Some(f) => floor.insert(tp, f),
                None => floor.remove(&tp),
            };
        }
    }

    /// The offset below which `tp`'s lag is counted, if one is kept (testing only).
    #[cfg(test)]
    pub fn floor(&self, tp: &(String, i32)) -> Option<i64> {
        let floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
        floor.get(tp).copied()
    }

    fn snapshot(&self) -> Vec<Position> {
        let read = self.read.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
        read.into_iter()
            .map(|r| {
                let ours = floor.get(&r.tp).copied();
                Position {
                    next: held_back(r.next, r.start, ours),
                    topic: r.tp.0,
                    partition: r.tp.1,
                }
            })
            .collect()
    }
}

/// The next offset not yet committed: the position read to, but no further than the later of
/// the group's offset the consumer started from and this instance's floor (the later of its
/// first read and its last commit); the older of the two is stale (commits made since the start; a
/// partition that came back after another member committed it).
fn held_back(next: Option<i64>, start: Option<i64>, ours: Option<i64>) -> Option<i64> {
    let floor = start.into_iter().chain(ours).max();
    match (next, floor) {
        (Some(n), Some(f)) => Some(n.min(f)),
        (n, None) => n,
        (None, f) => f,
    }
}

/// Two clients that only ask for end offsets.
struct EndOffsets {
    committed: Ends,
    uncommitted: Ends,
    timeout: Duration,
    /// The last answer per partition: a failed query reports it again instead of dropping the
    /// partition's series, which alerts would read as a gap.
    last: Mutex<HashMap<(String, i32), (i64, i64)>>,
}

impl EndOffsets {
    fn new(kafka: &Settings, interval: Duration) -> Result<EndOffsets, Error> {
        let client = |isolation| -> Result<Ends, Error> {
            Ok(Ends::create(&kafka.client(Role::EndOffsets { isolation }))?)
        };
        Ok(EndOffsets {
            committed: client(Isolation::ReadCommitted)?,
            uncommitted: client(Isolation::ReadUncommitted)?,
            timeout: interval.clamp(Duration::from_secs(1), Duration::from_secs(10)),
            last: Mutex::default(),
        })
    }

    /// End offsets of the owned partitions; a partition whose query failed keeps its last
    /// answer (and is left out before it has one).
    fn query(&self, positions: &[Position]) -> Vec<PartitionOffsets> {
        // Serves the clients' events (errors, logs), which nothing else polls.
        self.committed.serve();
        self.uncommitted.serve();
        let latest = |client: &Ends, p: &Position| {
            client
                .watermarks(&p.topic, p.partition, self.timeout)
                .map(|(_, high)| high)
                .map_err(|e| debug!(topic = %p.topic, partition = p.partition, error = %e, "end offsets"))
                .ok()
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let owned: HashSet<_> = positions
            .iter()
            .map(|p| (p.topic.clone(), p.partition))
            .collect();
        last.retain(|k, _| owned.contains(k));
        positions
            .iter()
            .filter_map(|p| {
                let key = (p.topic.clone(), p.partition);
                let ends = match (latest(&self.committed, p), latest(&self.uncommitted, p)) {
                    (Some(lso), Some(hw)) => *last.entry(key).insert_entry((lso, hw)).get(),
                    _ => *last.get(&key)?,
                };
                Some(PartitionOffsets {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    last_stable: ends.0,
                    high_watermark: ends.1,
                    position: p.next,
                })
            })
            .collect()
    }
}

/// Every `interval` (`--lag-interval`) until `stop`: sets the lag and unstable-records gauges.
pub fn spawn(
    kafka: &Settings,
    interval: Duration,
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Result<(), Error> {
    let end_offsets = Arc::new(EndOffsets::new(kafka, interval)?);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let owned = positions.snapshot();
            let q = end_offsets.clone();
            // librdkafka's queries block.
            if let Ok(offsets) = tokio::task::spawn_blocking(move || q.query(&owned)).await {
                metrics.set_partition_offsets(&offsets);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_and_not_committed_are_lag() {
        // Read to 90 (staged for the application, say); committed at 40 by this instance.
        assert_eq!(held_back(Some(90), Some(10), Some(40)), Some(40));
        // Nothing committed here yet: the offset the consumer started from (or, with nothing
        // committed in the group, the first read: a floor of its own).
        assert_eq!(held_back(Some(90), Some(10), None), Some(10));
        assert_eq!(held_back(Some(90), None, Some(0)), Some(0));
        // Back after another member committed to 70: this instance's 40 is stale.
        assert_eq!(held_back(Some(90), Some(70), Some(40)), Some(70));
        // Caught up: the commit moved past markers to the position.
        assert_eq!(held_back(Some(91), Some(10), Some(91)), Some(91));
        assert_eq!(held_back(None, None, None), None);
        assert_eq!(held_back(Some(5), None, None), Some(5));
        let p = Positions::default();
        p.update(vec![Read {
            tp: ("in".into(), 0),
            next: Some(90),
            start: Some(10),
        }]);
        assert_eq!(p.snapshot()[0].next, Some(10));
        p.floors([(("in".to_string(), 0), Some(40))]);
        assert_eq!(p.snapshot()[0].next, Some(40));
        p.floors([(("in".to_string(), 0), None)]);
        p.floors([(("in".to_string(), 0), Some(5))]);
        assert_eq!(p.snapshot()[0].next, Some(10));
    }
}

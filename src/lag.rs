//! Lag that is right under read_committed.
//!
//! A read_committed consumer reads no further than a partition's last stable offset (LSO), so
//! its lag is the LSO minus its position, and the records between the LSO and the high
//! watermark belong to transactions still open upstream (a hanging one shows there).
//!
//! Positions come from librdkafka's statistics, which the consumer context receives inside
//! `poll` ([`Positions::update`]). The end offsets come from two clients of this module's own,
//! queried on a thread of their own, so the lag keeps growing on the dashboard while the loop
//! is stuck: "latest" is the LSO for a read_committed client and the high watermark for a
//! read_uncommitted one. librdkafka's statistics cannot give both: in read_committed mode
//! their `hi_offset` is the LSO too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::statistics::Statistics;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::error::Error;
use crate::kafka::{Isolation, Role, Settings};
use crate::metrics::{Metrics, PartitionOffsets};

/// The next offset the loop processes, per owned partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to process, if known yet.
    pub next: Option<i64>,
}

/// The owned partitions and their positions, as the last statistics report had them.
#[derive(Default)]
pub struct Positions(Mutex<Vec<Position>>);

impl Positions {
    /// Takes the positions of the owned partitions from a librdkafka statistics report.
    pub fn update(&self, stats: &Statistics) {
        let positions = from_statistics(stats);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = positions;
    }

    fn snapshot(&self) -> Vec<Position> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn from_statistics(stats: &Statistics) -> Vec<Position> {
    let mut out = Vec::new();
    for (topic, t) in &stats.topics {
        for p in t.partitions.values() {
            // -1 is librdkafka's internal "unassigned" partition; `desired` marks owned ones.
            if p.partition < 0 || !p.desired {
                continue;
            }
            // app_offset: after the last record handed to the loop; before the first one, the
            // committed offset the consumer starts from.
            let mut next = [p.app_offset, p.committed_offset]
                .into_iter()
                .find(|o| *o >= 0);
            // With nothing buffered (fetchq_cnt is the length of the consumer queue it is
            // forwarded to), the loop has seen everything below the fetch position. That
            // position is past transaction markers and aborted records, which app_offset never
            // passes: without this, a caught-up partition of transactional input would show a
            // lag of 1 forever.
            if p.fetchq_cnt == 0 && p.next_offset >= 0 {
                next = Some(next.map_or(p.next_offset, |o| o.max(p.next_offset)));
            }
            out.push(Position {
                topic: topic.clone(),
                partition: p.partition,
                next,
            });
        }
    }
    out
}

/// Two clients that only ask for end offsets.
struct EndOffsets {
    committed: BaseConsumer,
    uncommitted: BaseConsumer,
    timeout: Duration,
    /// The last answer per partition: a failed query reports it again instead of dropping the
    /// partition's series, which alerts would read as a gap.
    last: Mutex<HashMap<(String, i32), (i64, i64)>>,
}

impl EndOffsets {
    fn new(kafka: &Settings, interval: Duration) -> Result<EndOffsets, Error> {
        let client = |isolation| -> Result<BaseConsumer, Error> {
            kafka
                .to_rdkafka(Role::EndOffsets { isolation })
                .create()
                .map_err(|e| Error::Config(format!("--consumer-config: {e}")))
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
        let _ = self.committed.poll(Duration::ZERO);
        let _ = self.uncommitted.poll(Duration::ZERO);
        let latest = |client: &BaseConsumer, p: &Position| {
            client
                .fetch_watermarks(&p.topic, p.partition, self.timeout)
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
    use rdkafka::statistics::{Partition, Topic};

    fn partition(p: i32, desired: bool, app: i64, committed: i64) -> Partition {
        Partition {
            partition: p,
            desired,
            app_offset: app,
            committed_offset: committed,
            fetchq_cnt: 3,
            next_offset: -1001,
            ..Partition::default()
        }
    }

    fn stats(partitions: Vec<Partition>) -> Statistics {
        let mut topic = Topic::default();
        for p in partitions {
            topic.partitions.insert(p.partition, p);
        }
        let mut stats = Statistics::default();
        stats.topics.insert("in".into(), topic);
        stats
    }

    #[test]
    fn positions_of_owned_partitions_come_from_statistics() {
        let s = stats(vec![
            partition(-1, false, -1, -1),
            partition(0, true, 40, -1001),
            partition(1, true, -1001, 20),
            partition(2, false, 5, 5),
            partition(3, true, -1001, -1001),
        ]);
        let mut got = from_statistics(&s);
        got.sort_by_key(|p| p.partition);
        let next: Vec<_> = got.iter().map(|p| (p.partition, p.next)).collect();
        assert_eq!(next, vec![(0, Some(40)), (1, Some(20)), (3, None)]);
    }

    #[test]
    fn with_nothing_buffered_the_fetch_position_counts() {
        // A commit marker at 40: the fetcher is past it, the last record handed out was 39.
        let mut caught_up = partition(0, true, 40, -1001);
        caught_up.fetchq_cnt = 0;
        caught_up.next_offset = 41;
        assert_eq!(from_statistics(&stats(vec![caught_up]))[0].next, Some(41));
    }
}

//! The pipeline consumer's context: it settles the open transaction at every rebalance.
//!
//! The sink's driver lives here because librdkafka calls the rebalance callback from inside
//! `poll`, and that callback must commit (or abort) the open transaction before partitions
//! move. The loop thread is the only caller of `poll`, and it never holds the driver's lock
//! across `poll`, so the lock is never contended.
//!
//! The transform hears about partition changes from the loop, not from here: the callback
//! queues them and the loop hands them over after `poll` returns, before the next record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::warn;

use crate::events::{AbortReason, Assignment, Occasion, Rebalance as Event, Rebalanced};
use crate::kafka::describe;
use crate::lag::Positions;
use crate::metrics::Metrics;
use crate::sink::Driver;
use crate::transform::Tp;

/// The consumer of the pipeline.
pub type PipelineConsumer = BaseConsumer<PipelineContext>;

/// Partitions gained or lost, for the transform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Now owned.
    Assigned(Vec<Tp>),
    /// No longer owned; their last transaction is settled.
    Revoked(Vec<Tp>),
}

/// Consumer context: holds the sink's driver and settles it at every rebalance.
pub struct PipelineContext {
    /// Shared, so a replaced consumer (after a fatal consumer error) keeps the same producer.
    driver: Arc<Mutex<Driver>>,
    /// Where the loop is in each owned partition.
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
    /// Partition changes the transform has not heard of yet.
    changes: Mutex<Vec<Change>>,
    changed: AtomicBool,
}

impl PipelineContext {
    /// Wraps the driver; statistics reports go to `positions`.
    pub fn new(
        driver: Arc<Mutex<Driver>>,
        positions: Arc<Positions>,
        metrics: Arc<Metrics>,
    ) -> Self {
        PipelineContext {
            driver,
            positions,
            metrics,
            changes: Mutex::default(),
            changed: AtomicBool::new(false),
        }
    }

    /// The driver. Never hold this across `poll`: the rebalance callback takes it too.
    pub fn driver(&self) -> MutexGuard<'_, Driver> {
        self.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Partition changes since the last call, oldest first.
    pub fn take_changes(&self) -> Vec<Change> {
        if !self.changed.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn changed(&self, change: Change) {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(change);
        self.changed.store(true, Ordering::Release);
    }
}

/// (topic, partition) of each element.
pub fn partitions(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

impl ClientContext for PipelineContext {
    /// librdkafka's statistics, every `--lag-interval`, from inside `poll`: the positions the
    /// lag gauges are measured from.
    fn stats(&self, statistics: Statistics) {
        self.positions.update(&statistics);
    }
}

impl ConsumerContext for PipelineContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let lost = consumer.assignment_lost();
                let event = if lost { Event::Lost } else { Event::Revoke };
                Rebalanced {
                    event,
                    partitions: &describe(tpl),
                }
                .emit(&self.metrics);
                let mut driver = self.driver();
                if lost {
                    // Someone else may already own them: nothing of ours may commit.
                    driver.abort_now(AbortReason::PartitionsLost);
                } else {
                    driver.commit_now(consumer, Occasion::Rebalance);
                }
                drop(driver);
                self.changed(Change::Revoked(partitions(tpl)));
            }
            Rebalance::Assign(tpl) => {
                Rebalanced {
                    event: Event::Assign,
                    partitions: &describe(tpl),
                }
                .emit(&self.metrics);
                self.changed(Change::Assigned(partitions(tpl)));
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !matches!(rebalance, Rebalance::Error(_)) {
            let assignment = consumer.assignment().unwrap_or_default();
            Assignment {
                owned: &describe(&assignment),
                count: assignment.count(),
            }
            .emit(&self.metrics);
        }
    }
}

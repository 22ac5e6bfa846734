//! The pipeline as its consumer's [`Owner`]: it holds the [`Session`] and hands it every
//! rebalance.
//!
//! librdkafka calls the rebalance callbacks from inside `poll`, and they must commit (or abort)
//! the open unit before partitions move, so the session lives here, where both the loop and
//! the callbacks reach it. The loop thread is the only caller of `poll`, and it never holds the
//! session across `poll`, so the lock is never contended.

use std::sync::{Arc, Mutex, MutexGuard};

use super::session::Session;
use crate::error::Error;
use crate::events::{Assignment, Rebalance as Event, Rebalanced};
use crate::kafka::consumer::{Consumer, Owner, Read};
use crate::kafka::{Tp, describe};
use crate::lag::Positions;
use crate::metrics::Metrics;
use crate::sink::Starts;

/// The consumer of the pipeline.
pub type PipelineConsumer = Consumer<PipelineContext>;

/// What the consumer holds for the pipeline: the session, and where the loop is.
pub struct PipelineContext {
    /// Shared, so a replaced consumer (after a fatal consumer error) keeps the same session,
    /// and with it the same producer.
    session: Arc<Mutex<Session>>,
    /// Where the loop is in each owned partition.
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
}

impl PipelineContext {
    /// Holds `session`; statistics reports go to `positions`.
    pub fn new(
        session: Arc<Mutex<Session>>,
        positions: Arc<Positions>,
        metrics: Arc<Metrics>,
    ) -> Self {
        PipelineContext {
            session,
            positions,
            metrics,
        }
    }

    /// The session. Never hold it across `poll`: the rebalance callback takes it too.
    pub fn session(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Owner for PipelineContext {
    /// A sink that keeps the offsets itself claims the partitions, and each starts where it
    /// says. A claim that fails assigns nothing: the loop stops with why.
    fn claim(&self, consumer: &PipelineConsumer, partitions: &[Tp]) -> Option<Starts> {
        self.session().claim(consumer, partitions)
    }

    fn unstartable(&self, why: String) {
        self.session().fail_later(Error::Store(why));
    }

    fn revoking(&self, consumer: &PipelineConsumer, partitions: Vec<Tp>, lost: bool) {
        Rebalanced {
            event: if lost { Event::Lost } else { Event::Revoke },
            partitions: &describe(&partitions),
        }
        .emit(&self.metrics);
        self.session().revoked(consumer, partitions, lost);
    }

    fn assigning(&self, partitions: Vec<Tp>) {
        Rebalanced {
            event: Event::Assign,
            partitions: &describe(&partitions),
        }
        .emit(&self.metrics);
        self.session().assigned(partitions);
    }

    fn rebalanced(&self, assignment: Vec<Tp>) {
        Assignment {
            owned: &describe(&assignment),
            count: assignment.len(),
        }
        .emit(&self.metrics);
    }

    /// The positions the lag gauges are measured from.
    fn positions(&self, read: Vec<Read>) {
        self.positions.update(read);
    }
}

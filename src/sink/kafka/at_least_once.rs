//! At least once: an idempotent producer and no transactions. A unit's offsets are committed
//! (outside any transaction) only after every output of the unit is delivered, so a crash or
//! an error can duplicate outputs, never lose them.

use std::time::Duration;

use tracing::warn;

use super::exactly_once::REPORTS_AFTER_ABORT;
use super::producer::{Connection, TrackedProducer};
use crate::config::SinkConfig;
use crate::events::{AbortReason, Ended};
use crate::kafka::{Role, Settings, Tp};
use crate::sink::{
    Bounds, Destination, Failed, Feedback, Group, NotConnected, Record, Reply, Sink, Starts, Wait,
};

/// An idempotent producer, and offsets committed once a unit's outputs are delivered.
pub struct AtLeastOnce {
    connection: Connection,
}

impl AtLeastOnce {
    /// Not connected yet: [`Sink::connect`] creates the producer.
    pub fn new(kafka: &Settings, c: &SinkConfig) -> AtLeastOnce {
        AtLeastOnce {
            connection: Connection::new(kafka.client(Role::Idempotent), &c.output_topic),
        }
    }

    fn p(&self) -> &TrackedProducer {
        self.connection.producer()
    }

    /// Every output of the unit delivered, then its offsets committed.
    fn deliver_then_commit(
        &self,
        offsets: &[(Tp, i64)],
        group: &dyn Group,
        bounds: &Bounds,
    ) -> Result<(), Failed> {
        let p = self.p();
        let flushed = {
            let _g = bounds.health.in_call("flush");
            p.flush(bounds.timeout())
        };
        let reported = p.wait_for_reports(Duration::from_secs(1));
        let failed = p.failed();
        if flushed.is_err() || failed > 0 || !reported {
            warn!(failed, flushed = ?flushed.err(), "outputs not all delivered; not committing \
                                                      offsets, rewinding (at least once)");
            return Err(Failed::Abort(AbortReason::DeliveryFailed));
        }
        let result = {
            let _g = bounds.health.in_call("commit offsets");
            group.commit_offsets(offsets)
        };
        result.map_err(|e| {
            warn!(error = %e, "committing offsets failed; rewinding (at least once)");
            Failed::Abort(AbortReason::OffsetCommitFailed)
        })
    }
}

impl Sink for AtLeastOnce {
    fn connect(&mut self, bounds: &Bounds) -> Result<(), NotConnected> {
        (self.connection).connect(bounds.timeout(), "reaching the cluster", |_| Ok(()))
    }

    /// A unit of deliveries, not a transaction: failures of earlier ones are settled already.
    fn begin(&mut self, watch: bool, _bounds: &Bounds) -> Result<(), Failed> {
        self.p().reset();
        self.p().watch_routes(watch);
        Ok(())
    }

    fn send(&mut self, record: Record<'_, '_>, bounds: &Bounds) -> Result<(), Failed> {
        self.p().send(record, bounds)
    }

    fn hear(&mut self, wait: Wait, bounds: &Bounds) -> Feedback {
        self.p().hear(wait, bounds, false)
    }

    /// Every output of the unit delivered, then its offsets committed.
    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, bounds: &Bounds) -> Reply {
        let result = self.deliver_then_commit(offsets, group, bounds);
        Reply {
            result,
            feedback: self.hear(Wait::Now, bounds),
        }
    }

    /// Nothing to abort: what was sent stays, and comes again after the rewind.
    fn abort(&mut self, _reason: AbortReason, bounds: &Bounds) -> Reply {
        Reply {
            result: Ok(()),
            feedback: self.hear(Wait::For(REPORTS_AFTER_ABORT), bounds),
        }
    }

    fn claim(&mut self, _: &[Tp], _: &dyn Group, _: &Bounds) -> Result<Starts, Failed> {
        Ok(Starts::Group)
    }

    fn exists(&self, name: &str, timeout: Duration) -> Result<bool, String> {
        self.p().topic_exists(name, timeout)
    }

    /// A unit is dropped, not aborted: its outputs stay where they are.
    fn destination(&self) -> Destination {
        Destination {
            refuser: &super::BROKER,
            aborted: Ended::Dropped,
            max_record_bytes: self.connection.max_record_bytes(),
            offsets: crate::sink::OffsetHome::Group,
        }
    }
}

//! At least once: an idempotent producer and no transactions. A batch's offsets are committed
//! (outside any transaction) only after every output of the batch is delivered, so a crash or
//! an error can duplicate outputs, never lose them.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::warn;

use super::producer::{Connection, KafkaProducer};
use super::{Calls, Failed, Group, Record, Sink};
use crate::events::{AbortReason, Ended};
use crate::kafka::{Role, Settings};

/// Delivery-confirmed batches.
pub struct Batches {
    connection: Connection,
}

impl Batches {
    /// Not connected yet: [`Sink::connect`] creates the producer.
    pub fn new(kafka: &Settings, output_topic: &str) -> Batches {
        Batches {
            connection: Connection::new(kafka.to_rdkafka(Role::Idempotent), output_topic),
        }
    }

    fn p(&self) -> &KafkaProducer {
        self.connection.producer()
    }
}

impl Sink for Batches {
    fn connect(&mut self, calls: &Calls) -> Result<(), KafkaError> {
        self.connection.connect(calls.timeout(), |_| Ok(()))
    }

    fn refused(&self) -> Option<String> {
        self.connection.refused()
    }

    /// A batch, not a transaction: failures of earlier batches are settled already.
    fn begin(&mut self, _calls: &Calls) -> Result<(), Failed> {
        self.p().reset();
        Ok(())
    }

    fn send(&mut self, record: Record<'_, '_>, calls: &Calls) -> Result<(), Failed> {
        self.p().send(record, calls)
    }

    fn settle(&mut self, calls: &Calls) -> bool {
        self.p().settle(calls)
    }

    fn take_rejections(&mut self, wait: Duration) -> Vec<(usize, RDKafkaErrorCode)> {
        self.p().take_rejections(wait)
    }

    fn has_rejections(&self) -> bool {
        self.p().has_rejections()
    }

    /// Every output of the batch delivered, then its offsets committed.
    fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &dyn Group,
        calls: &Calls,
    ) -> Result<(), Failed> {
        let p = self.p();
        let flushed = {
            let _g = calls.health.in_call("flush");
            p.flush(calls.timeout())
        };
        let reported = p.wait_for_reports(Duration::from_secs(1));
        let failed = p.failed();
        if flushed.is_err() || failed > 0 || !reported {
            warn!(failed, flushed = ?flushed.err(), "outputs not all delivered; not committing \
                                                      offsets, rewinding (at least once)");
            return Err(Failed::Abort(AbortReason::DeliveryFailed));
        }
        let result = {
            let _g = calls.health.in_call("commit offsets");
            group.commit_offsets(offsets)
        };
        result.map_err(|e| {
            warn!(error = %e, "committing offsets failed; rewinding (at least once)");
            Failed::Abort(AbortReason::OffsetCommitFailed)
        })
    }

    /// Nothing to abort: what was sent stays, and comes again after the rewind.
    fn abort(&mut self, _reason: AbortReason, _calls: &Calls) -> Result<(), Failed> {
        Ok(())
    }

    fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, KafkaError> {
        self.p().topic_exists(topic, timeout)
    }

    fn ended(&self) -> Ended {
        Ended::Dropped
    }
}

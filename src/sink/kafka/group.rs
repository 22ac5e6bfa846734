//! The consumer group, as [`Group`] says it: rust-rdkafka's consumer.

use std::time::Duration;

use crate::kafka::failure::ClientError;
use crate::kafka::member::Generation;
use crate::kafka::{self, Tp};
use crate::sink::{Committed, Group, SeekFailed};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};

impl<X: ConsumerContext> Group for BaseConsumer<X> {
    fn metadata(&self) -> Option<Generation> {
        self.group_metadata().map(Generation)
    }

    fn member(&self) -> Option<kafka::member::Member> {
        kafka::member::of(self.client())
    }

    fn commit_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        Ok(self.commit(&kafka::offset_list(offsets)?, CommitMode::Sync)?)
    }

    fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        Ok(self.commit(&kafka::offset_list(offsets)?, CommitMode::Async)?)
    }

    fn committed(&self, partitions: &[Tp], timeout: Duration) -> Result<Committed, ClientError> {
        let tpl = self.committed_offsets(kafka::partition_list(partitions), timeout)?;
        // A partition the broker could not answer for is no partition without an offset.
        for e in tpl.elements() {
            e.error()?;
        }
        Ok(kafka::offsets_of(&tpl))
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let Ok(tpl) = self.position() else {
            return Vec::new();
        };
        kafka::offsets_of(&tpl)
            .into_iter()
            .filter_map(|(tp, pos)| Some((tp, pos?)))
            .collect()
    }

    fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
        Ok(Consumer::assignment(self).map(|tpl| kafka::partitions(&tpl))?)
    }

    fn pause(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        Ok(Consumer::pause(self, &kafka::partition_list(partitions))?)
    }

    fn resume(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        Ok(Consumer::resume(self, &kafka::partition_list(partitions))?)
    }

    fn seek(&self, offsets: &[(Tp, i64)], timeout: Duration) -> Result<(), SeekFailed> {
        let call = |e: rdkafka::error::KafkaError| SeekFailed::Call(e.into());
        let tpl = kafka::offset_list(offsets).map_err(call)?;
        let result = self.seek_partitions(tpl, timeout).map_err(call)?;
        for e in result.elements() {
            if let Err(err) = e.error() {
                let tp = (e.topic().to_string(), e.partition());
                return Err(SeekFailed::Partition(tp, err.into()));
            }
        }
        Ok(())
    }
}

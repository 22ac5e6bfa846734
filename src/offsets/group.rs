//! The Kafka consumer group as an offset store: its committed offsets, as the group
//! coordinator holds them.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::{OffsetStore, Offsets};
use crate::error::Error;
use crate::kafka::{Role, Settings};

/// Reads a group's committed offsets through a client of its own.
pub struct GroupStore {
    kafka: Settings,
    timeout: Duration,
}

impl GroupStore {
    /// A store on the cluster of `kafka`; each call is bounded by `timeout`.
    pub fn new(kafka: Settings, timeout: Duration) -> GroupStore {
        GroupStore { kafka, timeout }
    }
}

impl OffsetStore for GroupStore {
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error> {
        let consumer: BaseConsumer = self
            .kafka
            .to_rdkafka(Role::GroupOffsets { group })
            .create()
            .map_err(|e| Error::Config(format!("--consumer-config: {e}")))?;
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions {
            tpl.add_partition(t, *p);
        }
        let got = consumer
            .committed_offsets(tpl, self.timeout)
            .map_err(|source| Error::Unrecoverable {
                context: "reading the group's committed offsets".into(),
                source,
            })?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }
}

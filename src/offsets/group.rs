//! The Kafka consumer group as an offset store: its committed offsets, as the group
//! coordinator holds them.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
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

impl GroupStore {
    /// A client of `group` that is not a member of it.
    fn client(&self, group: &str) -> Result<BaseConsumer, Error> {
        Ok(self.kafka.client(Role::GroupOffsets { group }).create()?)
    }
}

impl OffsetStore for GroupStore {
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error> {
        let consumer = self.client(group)?;
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions {
            tpl.add_partition(t, *p);
        }
        let got = consumer
            .committed_offsets(tpl, self.timeout)
            .map_err(|source| Error::kafka("reading the group's committed offsets", source))?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    /// Commits `offsets` as the group's, from outside it: the coordinator refuses this while
    /// the group has members (a running job), which `migrate` checks first to say so clearly.
    fn write(&self, group: &str, offsets: &Offsets) -> Result<(), Error> {
        let consumer = self.client(group)?;
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(|source| Error::kafka(&format!("offset {o} of {t}[{p}]"), source))?;
        }
        // librdkafka's synchronous commit has no timeout of its own: bound it here.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(consumer.commit(&tpl, CommitMode::Sync));
        });
        match rx.recv_timeout(self.timeout) {
            Ok(result) => result.map_err(|source| {
                Error::kafka(&format!("committing the offsets of group {group}"), source)
            }),
            Err(_) => Err(Error::Store(format!(
                "committing the offsets of group {group}: no answer within {:?}; whether they \
                 were committed is unknown (exactly offsets show tells)",
                self.timeout
            ))),
        }
    }
}

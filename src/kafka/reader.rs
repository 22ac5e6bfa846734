//! Reading one partition from an offset, in no group: the changelog's restore.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::consumer::Received;
use super::failure::ClientError;
use super::{Client, NotCreated};

/// A consumer in no group, assigned one partition at a time.
pub struct Reader(BaseConsumer);

impl Reader {
    /// Created by `client` (a role that reads: its isolation says what it reads).
    pub fn create(client: &Client) -> Result<Reader, NotCreated> {
        Ok(Reader(client.create()?))
    }

    /// Reads `topic`'s `partition` from offset `from` (`None`: its beginning).
    pub fn assign(
        &self,
        topic: &str,
        partition: i32,
        from: Option<i64>,
    ) -> Result<(), ClientError> {
        let mut tpl = TopicPartitionList::new();
        let offset = from.map_or(Offset::Beginning, Offset::Offset);
        tpl.add_partition_offset(topic, partition, offset)?;
        Ok(self.0.assign(&tpl)?)
    }

    /// The next record, waiting up to `wait` (`None`: none came).
    pub fn poll(&self, wait: Duration) -> Option<Result<Received<'_>, ClientError>> {
        Some(self.0.poll(wait)?.map(Received).map_err(ClientError::from))
    }

    /// Where it reads `topic`'s `partition` now (past transaction markers and aborted records),
    /// if it has a position there.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let tpl = self.0.position().ok()?;
        match tpl.find_partition(topic, partition)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }

    /// Stops reading.
    pub fn unassign(&self) {
        let _ = self.0.unassign();
    }
}

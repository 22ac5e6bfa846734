//! A client that only asks where partitions begin and end (their watermarks): the lag's, the
//! restore's, the state command's.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::failure::ClientError;
use super::{Client, NotCreated};

/// A consumer in no group that only asks for watermarks.
pub struct Ends(BaseConsumer);

impl Ends {
    /// Created by `client` (a role that reads: its isolation says which end is the high one).
    pub fn create(client: &Client) -> Result<Ends, NotCreated> {
        Ok(Ends(client.create()?))
    }

    /// Serves the client's events (errors, logs), which nothing else polls.
    pub fn serve(&self) {
        let _ = self.0.poll(Duration::ZERO);
    }

    /// Where `topic`'s `partition` begins and ends now: (low, high). The high watermark of a
    /// `read_committed` client is the last stable offset.
    pub fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> Result<(i64, i64), ClientError> {
        Ok(self.0.fetch_watermarks(topic, partition, timeout)?)
    }
}

//! Where a consumer group's offsets can be read from: an [`OffsetStore`].
//!
//! The pipeline itself keeps its offsets in the group, inside each transaction (the sink's
//! business). Stores are for the tools around it: the audit reads the group's committed
//! offsets to tell judged inputs from pending ones, and a migration reads the offsets another
//! job kept by hand. One file per store; [`open`] is where a store is registered.
//!
//! - [`group`]: the Kafka consumer group (`kafka:`), the only store today.

pub mod group;

use std::collections::BTreeMap;

use crate::error::Error;
use crate::kafka::Settings;

/// The next offset to read, per (topic, partition).
pub type Offsets = BTreeMap<(String, i32), i64>;

/// A place that holds the offsets of consumer groups.
pub trait OffsetStore {
    /// What the store holds for `group` in `partitions` (those with no offset are left out).
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error>;
}

/// The store at `url`: one arm per kind of store.
pub fn open(
    url: &str,
    kafka: &Settings,
    timeout: std::time::Duration,
) -> Result<Box<dyn OffsetStore>, Error> {
    match url.split_once(':').map(|(scheme, _)| scheme) {
        Some("kafka") => Ok(Box::new(group::GroupStore::new(kafka.clone(), timeout))),
        _ => Err(Error::Config(format!(
            "'{url}' is not an offset store this build knows (kafka:)"
        ))),
    }
}

//! The Kafka sinks: outputs to topics, offsets into the consumer group.
//!
//! - [`exactly_once`]: Kafka transactions. Outputs and offsets commit atomically.
//! - [`at_least_once`]: an idempotent producer; offsets commit after every output of the unit
//!   is delivered. A crash can duplicate outputs, never lose them.
//!
//! Both send through `producer`'s `TrackedProducer` (delivery reports, refusals, the lines
//! librdkafka logs about denied topics); the group they commit into is the consumer's
//! ([`crate::kafka::consumer::Group`]).

pub mod at_least_once;
pub mod exactly_once;
mod producer;
#[cfg(test)]
mod size;

pub use at_least_once::AtLeastOnce;
pub use exactly_once::ExactlyOnce;

use crate::transform::Refuser;

/// The broker, rejecting records for what they are (their size, their bytes, their timestamp).
pub static BROKER: Refuser = Refuser {
    reason: "rejected_by_broker",
    header: crate::headers::ERROR_BROKER,
    who: "the broker",
    refused: "the broker rejected a record; its replay sends the dead-letter copy",
    replaced: "producer recreated",
    dead_letter: "record to the dead-letter topic",
};

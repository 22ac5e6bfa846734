//! Transforms: pure functions from one input record to zero or more output records.
//!
//! No I/O happens here; the pipeline hands a borrowed record in and writes what comes out.
//! Passthrough borrows key and value from the input, so it copies nothing.

mod jq;

use std::borrow::Cow;

use crate::config::TransformSpec;
use crate::error::Error;

pub use jq::Jq;

/// One consumed record, borrowed from the consumer's buffer.
#[derive(Clone, Debug)]
pub struct InputRecord<'a> {
    /// Source topic.
    pub topic: &'a str,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Record timestamp in milliseconds, when it has one.
    pub timestamp: Option<i64>,
    /// Key bytes.
    pub key: Option<&'a [u8]>,
    /// Value bytes; `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    /// Headers in order.
    pub headers: Vec<crate::raw_headers::Header<'a>>,
}

/// Headers of an output record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputHeaders {
    /// The input record's headers.
    Input,
    /// Headers set by the transform.
    Set(Vec<(String, Option<Vec<u8>>)>),
}

/// One record to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRecord<'a> {
    /// Destination; `None` means the configured output topic.
    pub topic: Option<String>,
    /// Key bytes.
    pub key: Option<Cow<'a, [u8]>>,
    /// Value bytes; `None` writes a tombstone.
    pub value: Option<Cow<'a, [u8]>>,
    /// Headers.
    pub headers: OutputHeaders,
}

/// Why a record could not be transformed. A small, fixed set: it is a metric label and a
/// DLQ header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The value is not JSON (or is nested too deeply to parse safely).
    NotJson,
    /// The jq program raised an error.
    JqError,
    /// An output exceeds --max-output-bytes (or the producer's message.max.bytes).
    OutputTooLarge,
    /// The program yielded more than --max-outputs-per-record outputs.
    TooManyOutputs,
    /// An --envelope output is not a valid envelope.
    BadEnvelope,
    /// The broker rejected an output for what it is (its size, its bytes, its timestamp).
    RejectedByBroker,
}

impl Reason {
    /// Every reason, so the DLQ counter starts at 0 for each.
    pub const ALL: [Reason; 6] = [
        Reason::NotJson,
        Reason::JqError,
        Reason::OutputTooLarge,
        Reason::TooManyOutputs,
        Reason::BadEnvelope,
        Reason::RejectedByBroker,
    ];

    /// Stable name, used in the `exactly.error.reason` header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::NotJson => "not_json",
            Reason::JqError => "jq_error",
            Reason::OutputTooLarge => "output_too_large",
            Reason::TooManyOutputs => "too_many_outputs",
            Reason::BadEnvelope => "bad_envelope",
            Reason::RejectedByBroker => "rejected_by_broker",
        }
    }
}

/// Longest error message kept, in bytes.
pub const MAX_MESSAGE: usize = 512;

/// A record that cannot be transformed (or written): the reason and a human message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct TransformError {
    /// Machine-readable reason.
    pub reason: Reason,
    /// What went wrong, for the DLQ header and the log.
    pub message: String,
    /// Kafka's name of the error the broker rejected a copy of the record with, if it did.
    pub broker: Option<&'static str>,
}

impl TransformError {
    /// Builds an error. The message is cut to [`MAX_MESSAGE`] bytes: jq errors quote values,
    /// and the message travels in a DLQ header.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        let mut message = message.into();
        truncate(&mut message, MAX_MESSAGE);
        TransformError {
            reason,
            message,
            broker: None,
        }
    }

    /// The broker rejected an output of the record with `broker` (Kafka's error name).
    pub fn rejected(broker: &'static str) -> Self {
        TransformError {
            broker: Some(broker),
            ..TransformError::new(
                Reason::RejectedByBroker,
                format!("the broker rejected an output of this record: {broker}"),
            )
        }
    }
}

/// Limits every transform obeys.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest output (key + value bytes).
    pub max_output_bytes: usize,
    /// Most outputs for one input.
    pub max_outputs: usize,
}

/// A configured transform.
pub enum Transform {
    /// Copy key, value and headers.
    Passthrough(Limits),
    /// Run a jq program.
    Jq(Box<Jq>),
}

impl Transform {
    /// Builds (and for jq, compiles) the transform.
    pub fn new(spec: &TransformSpec, limits: Limits) -> Result<Transform, Error> {
        match spec {
            TransformSpec::Passthrough => Ok(Transform::Passthrough(limits)),
            TransformSpec::Jq { program, envelope } => {
                let jq = Jq::compile(program, *envelope, limits).map_err(Error::Jq)?;
                Ok(Transform::Jq(Box::new(jq)))
            }
        }
    }

    /// Transforms one record.
    pub fn apply<'a>(
        &self,
        input: &InputRecord<'a>,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        match self {
            Transform::Passthrough(limits) => {
                let size = input.key.map_or(0, <[u8]>::len) + input.value.map_or(0, <[u8]>::len);
                check_size(size, limits)?;
                Ok(vec![OutputRecord {
                    topic: None,
                    key: input.key.map(Cow::Borrowed),
                    value: input.value.map(Cow::Borrowed),
                    headers: OutputHeaders::Input,
                }])
            }
            Transform::Jq(jq) => jq.apply(input),
        }
    }
}

/// Cuts `s` to at most `max` bytes on a char boundary, marking the cut with `…`.
pub(crate) fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push('…');
    }
}

fn check_size(size: usize, limits: &Limits) -> Result<(), TransformError> {
    if size > limits.max_output_bytes {
        return Err(TransformError::new(
            Reason::OutputTooLarge,
            format!(
                "output of {size} bytes exceeds --max-output-bytes {}",
                limits.max_output_bytes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record<'a>(value: Option<&'a [u8]>) -> InputRecord<'a> {
        InputRecord {
            topic: "in",
            partition: 2,
            offset: 41,
            timestamp: Some(1_700_000_000_000),
            key: Some(b"k1"),
            value,
            headers: vec![(b"h", Some(b"v")), (b"empty", None)],
        }
    }

    const LIMITS: Limits = Limits {
        max_output_bytes: 100,
        max_outputs: 10,
    };

    #[test]
    fn passthrough_copies_bytes_exactly() {
        let t = Transform::new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let value: &[u8] = b"\xff\x00not json";
        let out = t.apply(&record(Some(value))).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(out[0].value.as_deref(), Some(value));
        assert_eq!(out[0].headers, OutputHeaders::Input);
        assert_eq!(out[0].topic, None);
        // Borrowed, not copied.
        assert!(matches!(out[0].value, Some(Cow::Borrowed(_))));
    }

    #[test]
    fn passthrough_keeps_tombstones() {
        let t = Transform::new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let out = t.apply(&record(None)).unwrap();
        assert_eq!(out[0].value, None);
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let e = TransformError::new(Reason::JqError, "é".repeat(1000));
        assert!(e.message.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(e.message.ends_with('…'));
    }

    #[test]
    fn passthrough_enforces_size_limit() {
        let t = Transform::new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let big = vec![b'x'; 200];
        let e = t.apply(&record(Some(&big))).unwrap_err();
        assert_eq!(e.reason, Reason::OutputTooLarge);
    }
}

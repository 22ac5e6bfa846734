//! What goes out for one input record: its outputs with their headers, or its DLQ copy, each
//! checked against the size the producer accepts.
//!
//! The pipeline sends what these functions build, and the audit replays them, so both judge a
//! record the same way.

use std::borrow::Cow;

use rdkafka::message::{Header, OwnedHeaders};

use crate::headers;
use crate::transform::{InputRecord, Reason, Transform, TransformError};

/// One record ready to send.
pub struct Outgoing<'a> {
    /// Destination; `None` means the configured output topic.
    pub topic: Option<String>,
    /// Key bytes.
    pub key: Option<Cow<'a, [u8]>>,
    /// Value bytes; `None` writes a tombstone.
    pub value: Option<Cow<'a, [u8]>>,
    /// Headers, lineage included.
    pub headers: OwnedHeaders,
}

impl Outgoing<'_> {
    /// Bytes librdkafka counts against message.max.bytes.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.len())
            + self.value.as_ref().map_or(0, |v| v.len())
            + headers::size(&self.headers)
    }
}

/// Transforms `input` and attaches headers. The record is refused whole when any output is
/// larger than `max_message_bytes`: a transaction cannot take back half a fan-out.
pub fn outputs<'a>(
    transform: &Transform,
    input: &InputRecord<'a>,
    lineage: bool,
    max_message_bytes: usize,
) -> Result<Vec<Outgoing<'a>>, TransformError> {
    let outs = transform.apply(input)?;
    let mut prepared = Vec::with_capacity(outs.len());
    for (i, o) in outs.into_iter().enumerate() {
        let l = lineage.then(|| headers::lineage(input, i));
        let out = Outgoing {
            headers: headers::output(input, &o.headers, l.as_deref()),
            topic: o.topic,
            key: o.key,
            value: o.value,
        };
        let size = out.size();
        if size > max_message_bytes {
            return Err(TransformError::new(
                Reason::OutputTooLarge,
                format!(
                    "output of {size} bytes exceeds the producer's message.max.bytes {max_message_bytes}"
                ),
            ));
        }
        prepared.push(out);
    }
    Ok(prepared)
}

/// The DLQ copy of `input`: key, value and headers unchanged, plus the reason headers. When
/// that copy would be larger than the producer accepts, the value and the input's headers are
/// left out and `exactly.error.truncated` says so: the source headers still point at the
/// original record.
pub fn dead_letter<'a>(
    input: &InputRecord<'a>,
    err: &TransformError,
    lineage: bool,
    max_message_bytes: usize,
) -> Outgoing<'a> {
    let l = lineage.then(|| headers::lineage(input, 0));
    let full = Outgoing {
        topic: None,
        key: input.key.map(Cow::Borrowed),
        value: input.value.map(Cow::Borrowed),
        headers: headers::dlq(input, err, l.as_deref()),
    };
    if full.size() <= max_message_bytes {
        return full;
    }
    let dropped = full.value.as_ref().map_or(0, |v| v.len()) + headers::size(&full.headers);
    let note = format!(
        "value and headers ({dropped} bytes) left out: over message.max.bytes \
         {max_message_bytes}; read the source record"
    );
    let bare = InputRecord {
        headers: Vec::new(),
        ..input.clone()
    };
    let headers = headers::dlq(&bare, err, l.as_deref()).insert(Header {
        key: headers::ERROR_TRUNCATED,
        value: Some(&note),
    });
    Outgoing {
        topic: None,
        key: full.key,
        value: None,
        headers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TransformSpec;
    use crate::transform::Limits;
    use rdkafka::message::Headers;

    fn input<'a>(value: &'a [u8], headers: Vec<(&'a str, Option<&'a [u8]>)>) -> InputRecord<'a> {
        InputRecord {
            topic: "in",
            partition: 0,
            offset: 7,
            timestamp: None,
            key: Some(b"k"),
            value: Some(value),
            headers,
        }
    }

    fn passthrough() -> Transform {
        let limits = Limits {
            max_output_bytes: 1_000_000,
            max_outputs: 10,
        };
        Transform::new(&TransformSpec::Passthrough, limits).unwrap()
    }

    #[test]
    fn outputs_carry_lineage_and_fit() {
        let outs = outputs(&passthrough(), &input(b"v", vec![]), true, 1000).unwrap();
        assert_eq!(outs.len(), 1);
        let h = &outs[0].headers;
        assert_eq!(h.get(0).key, headers::LINEAGE);
        assert_eq!(h.get(0).value, Some(&b"in/0/7/0"[..]));
    }

    #[test]
    fn headers_count_toward_the_producer_limit() {
        let big = vec![b'h'; 600];
        let rec = input(b"small value", vec![("h", Some(&big))]);
        let e = outputs(&passthrough(), &rec, true, 500).err().unwrap();
        assert_eq!(e.reason, Reason::OutputTooLarge);
        assert!(outputs(&passthrough(), &rec, true, 1000).is_ok());
    }

    #[test]
    fn dead_letter_keeps_everything_when_it_fits() {
        let rec = input(b"not json", vec![("trace", Some(b"t"))]);
        let err = TransformError::new(Reason::NotJson, "nope");
        let d = dead_letter(&rec, &err, true, 10_000);
        assert_eq!(d.value.as_deref(), Some(&b"not json"[..]));
        assert!(d.headers.iter().any(|h| h.key == "trace"));
        assert!(!d.headers.iter().any(|h| h.key == headers::ERROR_TRUNCATED));
    }

    #[test]
    fn dead_letter_drops_value_and_input_headers_when_too_large() {
        let value = vec![b'x'; 5_000];
        let rec = input(&value, vec![("trace", Some(b"t"))]);
        let err = TransformError::new(Reason::OutputTooLarge, "too big");
        let d = dead_letter(&rec, &err, true, 1_000);
        assert_eq!(d.value, None);
        assert_eq!(d.key.as_deref(), Some(&b"k"[..]));
        assert!(d.size() <= 1_000);
        assert!(!d.headers.iter().any(|h| h.key == "trace"));
        let keys: Vec<&str> = d.headers.iter().map(|h| h.key).collect();
        for k in [
            headers::ERROR_REASON,
            headers::SOURCE_OFFSET,
            headers::LINEAGE,
            headers::ERROR_TRUNCATED,
        ] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
    }
}

//! What goes out for one input record: its outputs with their headers, or its DLQ copy, each
//! checked against the size the producer accepts.
//!
//! The pipeline sends what these functions build, and the audit replays them, so both judge a
//! record the same way.

use std::borrow::Cow;

use crate::headers::{self, Headers, LINEAGE};
use crate::transform::{Failure, InputRecord, OutputHeaders, OutputRecord, Reason, TransformError};

/// One record ready to send.
#[derive(Clone)]
pub struct Outgoing<'a> {
    /// Destination; `None` means the configured output topic.
    pub topic: Option<String>,
    /// Partition; `None` for the partitioner's (by key).
    pub partition: Option<i32>,
    /// Key bytes.
    pub key: Option<Cow<'a, [u8]>>,
    /// Value bytes; `None` writes a tombstone.
    pub value: Option<Cow<'a, [u8]>>,
    /// Headers, without the lineage.
    pub headers: Headers<'a>,
    /// The lineage it carries (`input/partition/offset/index`), if it carries one: Kafka
    /// writes it as the last header ([`Outgoing::headers_with_lineage`]), a table as a column.
    pub lineage: Option<String>,
}

/// librdkafka's worst-case framing of one record (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`: length,
/// attributes, timestamp and offset deltas, key and value lengths, header count, each at its
/// largest varint), which it adds to key, value and headers before it compares the sum with
/// message.max.bytes.
pub const RECORD_OVERHEAD: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;

impl Outgoing<'_> {
    /// A cheap fingerprint of this record sent to `topic`: its topic, the sizes of key and
    /// value and their first and last bytes. A verdict on refused outputs holds for outputs of
    /// the same fingerprint only: an application that answers differently is judged afresh.
    pub fn fingerprint(&self, topic: &str) -> u64 {
        fn mix(h: u64, x: u64) -> u64 {
            (h ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
        }
        fn word(b: &[u8]) -> u64 {
            let mut w = [0u8; 8];
            let n = b.len().min(8);
            w[..n].copy_from_slice(&b[..n]);
            u64::from_le_bytes(w)
        }
        fn ends(h: u64, b: Option<&[u8]>) -> u64 {
            let Some(b) = b else {
                return mix(h, u64::MAX);
            };
            let tail = &b[b.len().saturating_sub(16)..];
            let h = mix(mix(h, b.len() as u64), word(b));
            let h = mix(h, word(b.get(8..).unwrap_or_default()));
            mix(mix(h, word(tail)), word(tail.get(8..).unwrap_or_default()))
        }
        let mut h = mix(0, topic.len() as u64);
        for chunk in topic.as_bytes().chunks(8) {
            h = mix(h, word(chunk));
        }
        let h = ends(h, self.key.as_deref());
        ends(h, self.value.as_deref())
    }

    /// What librdkafka counts against message.max.bytes: a record is refused when this is
    /// larger than the limit (`rd_kafka_msg_new0`).
    pub fn size(&self) -> usize {
        RECORD_OVERHEAD
            + self.key.as_ref().map_or(0, |k| k.len())
            + self.value.as_ref().map_or(0, |v| v.len())
            + self.headers.size()
            + self
                .lineage
                .as_ref()
                .map_or(0, |l| headers::size(LINEAGE.len(), l.len()))
    }

    /// Its headers as a destination with headers writes them: the lineage last.
    pub fn headers_with_lineage(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let lineage = (self.lineage.as_ref()).map(|l| (LINEAGE.as_bytes(), Some(l.as_bytes())));
        self.headers.iter().chain(lineage)
    }
}

/// The outgoing records of `input`, from what the transform made of it (`outs`), with their
/// headers. The record is refused whole when any output is larger than `max_message_bytes`: a
/// transaction cannot take back half a fan-out.
pub fn outputs<'a>(
    input: &InputRecord<'a>,
    outs: Result<Vec<OutputRecord<'a>>, Failure>,
    lineage: bool,
    max_message_bytes: usize,
) -> Result<Vec<Outgoing<'a>>, Failure> {
    let outs = outs?;
    let mut prepared = Vec::with_capacity(outs.len());
    for (i, o) in outs.into_iter().enumerate() {
        let l = lineage.then(|| headers::lineage(input, i));
        let out = Outgoing {
            headers: headers::output(input, o.headers),
            topic: o.topic,
            partition: o.partition,
            key: o.key,
            value: o.value,
            lineage: l,
        };
        let size = out.size();
        if size > max_message_bytes {
            return Err(Failure::BadRecord(TransformError::new(
                Reason::OutputTooLarge,
                format!(
                    "output of {size} bytes exceeds the producer's message.max.bytes {max_message_bytes}"
                ),
            )));
        }
        prepared.push(out);
    }
    Ok(prepared)
}

/// A record of the open unit's own, of no input (a transform's change before the commit):
/// only the headers it set, no lineage.
pub fn own(o: OutputRecord<'static>) -> Outgoing<'static> {
    let headers = match o.headers {
        OutputHeaders::Input => Headers::default(),
        OutputHeaders::Set(set) => headers::set_only(set),
    };
    Outgoing {
        headers,
        topic: o.topic,
        partition: o.partition,
        key: o.key,
        value: o.value,
        lineage: None,
    }
}

/// The DLQ copy of `input`: key, value and headers unchanged, plus the reason headers. When
/// that copy would be larger than the producer accepts, the value and the input's headers are
/// left out and `exactly.error.truncated` says so (then the key too, if it is still too
/// large): the source headers still point at the original record.
pub fn dead_letter<'a>(
    input: &InputRecord<'a>,
    err: &TransformError,
    lineage: bool,
    max_message_bytes: usize,
) -> Outgoing<'a> {
    let l = lineage.then(|| headers::lineage(input, 0));
    let full = Outgoing {
        topic: None,
        partition: None,
        key: input.key.map(Cow::Borrowed),
        value: input.value.map(Cow::Borrowed),
        headers: headers::dlq(input, err),
        lineage: l.clone(),
    };
    if full.size() <= max_message_bytes {
        return full;
    }
    let dropped = full.value.as_ref().map_or(0, |v| v.len()) + full.headers.size();
    let note = format!(
        "value and headers ({dropped} bytes) left out: over message.max.bytes \
         {max_message_bytes}; read the source record"
    );
    let truncated = bare(input, err, l.as_deref(), full.key, &note);
    if truncated.size() <= max_message_bytes {
        return truncated;
    }
    let why = format!("over message.max.bytes {max_message_bytes}");
    minimal(input, err, lineage, &why, max_message_bytes)
}

/// A DLQ copy without value and input headers: the reason and source headers, `key`, and
/// `exactly.error.truncated` = `note`.
fn bare<'a>(
    input: &InputRecord<'_>,
    err: &TransformError,
    lineage: Option<&str>,
    key: Option<Cow<'a, [u8]>>,
    note: &str,
) -> Outgoing<'a> {
    let mut headers = Headers::with_capacity(7);
    headers::reasons(&mut headers, input, err);
    headers.text(headers::ERROR_TRUNCATED, note.to_string());
    Outgoing {
        topic: None,
        partition: None,
        key,
        value: None,
        headers,
        lineage: lineage.map(str::to_string),
    }
}

/// The minimal DLQ copy: the reason and source headers only, and `exactly.error.truncated`
/// saying what was left out and `why`; the error message too, as far as it fits in
/// `max_message_bytes`. The pipeline sends it without a timestamp of its own, so that a topic
/// bounding timestamps takes it too.
pub fn minimal<'a>(
    input: &InputRecord<'_>,
    err: &TransformError,
    lineage: bool,
    why: &str,
    max_message_bytes: usize,
) -> Outgoing<'a> {
    let l = lineage.then(|| headers::lineage(input, 0));
    let note = format!("key, value and headers left out: {why}; read the source record");
    let build = |err: &TransformError| bare(input, err, l.as_deref(), None, &note);
    let out = build(err);
    let over = out.size().saturating_sub(max_message_bytes);
    if over == 0 {
        return out;
    }
    let mut shorter = err.clone();
    crate::transform::truncate(
        &mut shorter.message,
        err.message.len().saturating_sub(over + 8),
    );
    build(&shorter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TransformSpec;
    use crate::transform::Limits;

    fn input<'a>(value: &'a [u8], headers: Vec<(&'a [u8], Option<&'a [u8]>)>) -> InputRecord<'a> {
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

    fn passthrough() -> Box<dyn crate::transform::Transform> {
        let limits = Limits {
            max_output_bytes: 1_000_000,
            max_outputs: 10,
        };
        crate::transform::new(&TransformSpec::Passthrough, limits).unwrap()
    }

    #[test]
    fn fingerprints_tell_other_outputs_apart() {
        let out = |key: Option<&'static [u8]>, value: Option<&'static [u8]>| Outgoing {
            topic: None,
            partition: None,
            key: key.map(Cow::Borrowed),
            value: value.map(Cow::Borrowed),
            headers: Headers::default(),
            lineage: None,
        };
        let a = out(Some(b"k"), Some(b"a value of some length, 1"));
        let fp = a.fingerprint("out");
        assert_eq!(fp, a.clone().fingerprint("out"));
        for other in [
            out(Some(b"k"), Some(b"a value of some length, 2")),
            out(Some(b"k"), Some(b"B value of some length, 1")),
            out(Some(b"j"), Some(b"a value of some length, 1")),
            out(None, Some(b"a value of some length, 1")),
            out(Some(b"k"), None),
        ] {
            assert_ne!(fp, other.fingerprint("out"));
        }
        assert_ne!(fp, a.fingerprint("out2"));
    }

    #[test]
    fn outputs_carry_lineage_and_fit() {
        let rec = input(b"v", vec![]);
        let outs = outputs(&rec, passthrough().apply(&rec), true, 1000).unwrap();
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].lineage.as_deref(), Some("in/0/7/0"));
        let written: Vec<_> = outs[0].headers_with_lineage().collect();
        assert_eq!(written, [(LINEAGE.as_bytes(), Some(&b"in/0/7/0"[..]))]);
    }

    #[test]
    fn headers_count_toward_the_producer_limit() {
        let big = vec![b'h'; 600];
        let rec = input(b"small value", vec![(b"h", Some(&big))]);
        let Err(Failure::BadRecord(e)) = outputs(&rec, passthrough().apply(&rec), true, 500) else {
            panic!("an output over message.max.bytes is the record's fault")
        };
        assert_eq!(e.reason, Reason::OutputTooLarge);
        assert!(outputs(&rec, passthrough().apply(&rec), true, 1000).is_ok());
    }

    #[test]
    fn dead_letter_keeps_everything_when_it_fits() {
        let rec = input(b"not json", vec![(b"trace", Some(b"t"))]);
        let err = TransformError::new(Reason::NotJson, "nope");
        let d = dead_letter(&rec, &err, true, 10_000);
        assert_eq!(d.value.as_deref(), Some(&b"not json"[..]));
        assert!(d.headers.get("trace").is_some());
        assert!(d.headers.get(headers::ERROR_TRUNCATED).is_none());
    }

    #[test]
    fn dead_letter_drops_value_and_input_headers_when_too_large() {
        let value = vec![b'x'; 5_000];
        let rec = input(&value, vec![(b"trace", Some(b"t"))]);
        let err = TransformError::new(Reason::OutputTooLarge, "too big");
        let d = dead_letter(&rec, &err, true, 1_000);
        assert_eq!(d.value, None);
        assert_eq!(d.key.as_deref(), Some(&b"k"[..]));
        assert!(d.size() <= 1_000);
        assert!(d.headers.get("trace").is_none());
        let keys: Vec<&str> = (d.headers_with_lineage())
            .map(|(k, _)| std::str::from_utf8(k).unwrap())
            .collect();
        for k in [
            headers::ERROR_REASON,
            headers::SOURCE_OFFSET,
            headers::LINEAGE,
            headers::ERROR_TRUNCATED,
        ] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
    }

    #[test]
    fn a_dead_letter_too_large_even_bare_leaves_the_key_out() {
        let key = vec![b'k'; 5_000];
        let rec = InputRecord {
            key: Some(&key),
            ..input(b"v", vec![])
        };
        let err = TransformError::new(Reason::OutputTooLarge, "too big");
        let d = dead_letter(&rec, &err, true, 1_000);
        assert_eq!((d.key.as_deref(), d.value.as_deref()), (None, None));
        assert!(d.size() <= 1_000, "{}", d.size());
        assert!(d.headers.get(headers::ERROR_TRUNCATED).is_some());
    }
}

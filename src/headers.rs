//! Headers exactly writes: the lineage of every output, and the reason of every DLQ record.
//!
//! The lineage header ties each output to the input record it came from, so that an audit can
//! match outputs to inputs one for one: `exactly.lineage = <topic>/<partition>/<offset>/<index>`,
//! where `index` numbers the outputs of one input from 0. Topic names cannot contain `/`.

use std::borrow::Cow;

use crate::transform::{InputRecord, OutputHeaders, TransformError};

/// Source topic, partition, offset and output index of a record.
pub const LINEAGE: &str = "exactly.lineage";
/// Why a record is in the DLQ (a [`crate::transform::Reason`] name), and its message: the
/// transform's, since the aggregates set them on a total its program failed for.
pub use crate::transform::{ERROR_MESSAGE, ERROR_REASON};
/// On a DLQ record whose value and input headers were left out (too large for the producer).
pub const ERROR_TRUNCATED: &str = "exactly.error.truncated";
/// Topic the DLQ record was read from.
pub const SOURCE_TOPIC: &str = "exactly.source.topic";
/// Partition the DLQ record was read from.
pub const SOURCE_PARTITION: &str = "exactly.source.partition";
/// Offset the DLQ record was read from.
pub const SOURCE_OFFSET: &str = "exactly.source.offset";
/// Kafka's name of the error a broker rejected a copy of the record with
/// (`MESSAGE_TOO_LARGE`, `INVALID_RECORD`, `INVALID_TIMESTAMP`, …).
pub const ERROR_BROKER: &str = "exactly.error.broker";
/// The database sink's name of the error the database refused the record's row with
/// (`CHECK_VIOLATION`, `UNIQUE_VIOLATION`, …).
pub const ERROR_DATABASE: &str = "exactly.error.database";

/// The lineage value of output `index` of `input` (written without `fmt`: it is on every
/// output's path).
pub fn lineage(input: &InputRecord<'_>, index: usize) -> String {
    let mut s = input.lineage();
    s.push('/');
    s.push_str(itoa::Buffer::new().format(index));
    s
}

/// Parses a lineage value back into (topic, partition, offset, index).
pub fn parse_lineage(value: &[u8]) -> Option<(String, i32, i64, usize)> {
    let s = std::str::from_utf8(value).ok()?;
    let mut parts = s.rsplitn(4, '/');
    let index = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next()?.to_string();
    Some((topic, partition, offset, index))
}

/// A record's headers in exactly's terms: names and values as bytes, in order, borrowed from
/// the input where they are its. A name is kept up to its first NUL byte, as Kafka's clients
/// read it back, so that what is counted against a size limit is what is sent. The lineage is
/// not among them: it is the record's own fact (`Outgoing::lineage`), which each destination
/// writes its way (Kafka as the [`LINEAGE`] header, last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers<'a>(Vec<Header<'a>>);

/// One header: its name and its value (`None`: no value), each borrowed or owned.
pub type Header<'a> = (Cow<'a, [u8]>, Option<Cow<'a, [u8]>>);

impl<'a> Headers<'a> {
    /// No headers, room for `n`.
    pub fn with_capacity(n: usize) -> Headers<'a> {
        Headers(Vec::with_capacity(n))
    }

    /// Adds `name` (up to its first NUL) with `value`, after the others.
    pub fn push(&mut self, name: Cow<'a, [u8]>, value: Option<Cow<'a, [u8]>>) {
        let name = match name.iter().position(|b| *b == 0) {
            None => name,
            Some(nul) => match name {
                Cow::Borrowed(n) => Cow::Borrowed(&n[..nul]),
                Cow::Owned(mut n) => {
                    n.truncate(nul);
                    Cow::Owned(n)
                }
            },
        };
        self.0.push((name, value));
    }

    /// Adds a header of exactly's own: a text name and value.
    pub fn text(&mut self, name: &'static str, value: String) {
        self.push(
            Cow::Borrowed(name.as_bytes()),
            Some(Cow::Owned(value.into_bytes())),
        );
    }

    /// Every header, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.0.iter().map(|(n, v)| (n.as_ref(), v.as_deref()))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of the first header named `name` (`Some(None)`: there, without a value).
    pub fn get(&self, name: &str) -> Option<Option<&[u8]>> {
        self.iter()
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, v)| v)
    }

    /// Bytes they add to a record, as librdkafka counts them against message.max.bytes.
    pub fn size(&self) -> usize {
        self.iter()
            .map(|(n, v)| size(n.len(), v.map_or(0, <[u8]>::len)))
            .sum()
    }
}

/// Headers of an output: the transform's choice, without an upstream lineage header (a chain
/// of pipelines keeps one lineage: the nearest, which the destination adds).
pub fn output<'a>(input: &InputRecord<'a>, chosen: OutputHeaders) -> Headers<'a> {
    match chosen {
        OutputHeaders::Input => copy_input(input),
        OutputHeaders::Set(set) => set_only(set),
    }
}

/// Headers a transform set (never a lineage header of its own).
pub fn set_only(set: Vec<(String, Option<Vec<u8>>)>) -> Headers<'static> {
    let mut h = Headers::with_capacity(set.len());
    // A name is compared as it is sent: up to its first NUL.
    let lineage = |k: &String| k.split('\0').next() == Some(LINEAGE);
    for (key, value) in set.into_iter().filter(|(k, _)| !lineage(k)) {
        h.push(Cow::Owned(key.into_bytes()), value.map(Cow::Owned));
    }
    h
}

/// Headers of a DLQ record: the input's, then the reason and where the record came from.
pub fn dlq<'a>(input: &InputRecord<'a>, err: &TransformError) -> Headers<'a> {
    let mut h = copy_input(input);
    reasons(&mut h, input, err);
    h
}

/// Adds the reason, the destination's error (if any) and the source to `h`.
pub fn reasons(h: &mut Headers<'_>, input: &InputRecord<'_>, err: &TransformError) {
    h.text(ERROR_REASON, err.reason.as_str().to_string());
    h.text(ERROR_MESSAGE, err.message.clone());
    h.text(SOURCE_TOPIC, input.topic.to_string());
    h.text(SOURCE_PARTITION, input.partition.to_string());
    h.text(SOURCE_OFFSET, input.offset.to_string());
    if let Some((by, name)) = err.refused {
        h.text(by.header, name.to_string());
    }
}

/// The input's headers, borrowed, without an upstream lineage header.
fn copy_input<'a>(input: &InputRecord<'a>) -> Headers<'a> {
    let mut h = Headers::with_capacity(input.headers.len());
    for (name, value) in input
        .headers
        .iter()
        .filter(|(n, _)| *n != LINEAGE.as_bytes())
    {
        h.push(Cow::Borrowed(*name), value.map(Cow::Borrowed));
    }
    h
}

/// Bytes one header of a `name`-byte name and a `value`-byte value adds to a record, as
/// librdkafka counts it against message.max.bytes: name and value with a zigzag-varint length
/// each (a missing value counts as length 0), as `rd_kafka_header_add` adds them up.
pub fn size(name: usize, value: usize) -> usize {
    name + value + varint_len(name) + varint_len(value)
}

/// Length of `n` as a zigzag varint, as the record format writes lengths.
pub(crate) fn varint_len(n: usize) -> usize {
    let mut v = (n as u64) << 1;
    let mut len = 1;
    while v > 0x7f {
        v >>= 7;
        len += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::Reason;

    fn input() -> InputRecord<'static> {
        InputRecord {
            topic: "orders.v1",
            partition: 3,
            offset: 1234,
            timestamp: None,
            key: None,
            value: Some(b"x"),
            headers: vec![
                (b"trace", Some(b"abc")),
                (LINEAGE.as_bytes(), Some(b"up/0/1/0")),
            ],
        }
    }

    fn pairs(h: &Headers<'_>) -> Vec<(String, Option<String>)> {
        h.iter()
            .map(|(k, v)| {
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                (text(k), v.map(text))
            })
            .collect()
    }

    #[test]
    fn lineage_round_trips() {
        let l = lineage(&input(), 2);
        assert_eq!(l, "orders.v1/3/1234/2");
        assert_eq!(
            parse_lineage(l.as_bytes()),
            Some(("orders.v1".into(), 3, 1234, 2))
        );
        assert_eq!(parse_lineage(b"nope"), None);
    }

    #[test]
    fn output_drops_upstream_lineage() {
        let h = output(&input(), OutputHeaders::Input);
        assert_eq!(pairs(&h), [("trace".into(), Some("abc".into()))]);
        let set = vec![
            ("a".into(), None),
            (LINEAGE.into(), Some(b"x".to_vec())),
            (format!("{LINEAGE}\0x"), Some(b"y".to_vec())),
        ];
        assert_eq!(
            pairs(&output(&input(), OutputHeaders::Set(set))),
            [("a".into(), None)]
        );
    }

    #[test]
    fn a_name_is_kept_up_to_its_first_nul_and_sized_as_sent() {
        let mut h = Headers::default();
        h.push(Cow::Borrowed(b"a\0b"), Some(Cow::Borrowed(b"v")));
        h.push(Cow::Owned(b"c\0".to_vec()), None);
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [(&b"a"[..], Some(&b"v"[..])), (&b"c"[..], None)]
        );
        // Per header: the name and value, and a one-byte varint length for each ("c" has
        // no value: a length of 0).
        assert_eq!(h.size(), (1 + 1 + 1 + 1) + (1 + 1 + 1));
    }

    #[test]
    fn dlq_headers_carry_reason_and_source() {
        let e = TransformError::new(Reason::NotJson, "value is not JSON");
        let h = dlq(&input(), &e);
        let p = pairs(&h);
        let get = |k: &str| p.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone());
        assert_eq!(get(ERROR_REASON).as_deref(), Some("not_json"));
        assert_eq!(get(ERROR_MESSAGE).as_deref(), Some("value is not JSON"));
        assert_eq!(get(SOURCE_TOPIC).as_deref(), Some("orders.v1"));
        assert_eq!(get(SOURCE_PARTITION).as_deref(), Some("3"));
        assert_eq!(get(SOURCE_OFFSET).as_deref(), Some("1234"));
        assert_eq!(get("trace").as_deref(), Some("abc"));
        // The upstream lineage is dropped; the destination adds this record's.
        assert_eq!(p.iter().filter(|(n, _)| n == LINEAGE).count(), 0);
    }
}

//! Headers exactly writes: the lineage of every output, and the reason of every DLQ record.
//!
//! The lineage header ties each output to the input record it came from, so that an audit can
//! match outputs to inputs one for one: `exactly.lineage = <topic>/<partition>/<offset>/<index>`,
//! where `index` numbers the outputs of one input from 0. Topic names cannot contain `/`.

use rdkafka::message::{Header, OwnedHeaders};

use crate::kafka::raw_headers;
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

/// Headers of an output: the transform's choice, with the input's own lineage header replaced
/// by ours (a chain of pipelines keeps one lineage: the nearest).
pub fn output(
    input: &InputRecord<'_>,
    chosen: &OutputHeaders,
    lineage: Option<&str>,
) -> OwnedHeaders {
    let mut h = match chosen {
        OutputHeaders::Input => copy_input(input),
        OutputHeaders::Set(set) => set_only(set),
    };
    if let Some(l) = lineage {
        h = raw_headers::add(h, LINEAGE.as_bytes(), Some(l.as_bytes()));
    }
    h
}

/// Headers a transform set (never a lineage header of its own).
pub fn set_only(set: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(set.len() + 1);
    for (key, value) in set.iter().filter(|(k, _)| k != LINEAGE) {
        h = raw_headers::add(h, key.as_bytes(), value.as_deref());
    }
    h
}

/// Headers of a DLQ record: the input's, then the reason and where the record came from.
pub fn dlq(input: &InputRecord<'_>, err: &TransformError, lineage: Option<&str>) -> OwnedHeaders {
    reasons(copy_input(input), input, err, lineage)
}

/// The reason, the broker's error (if any), the source and the lineage, after `h`.
pub fn reasons(
    h: OwnedHeaders,
    input: &InputRecord<'_>,
    err: &TransformError,
    lineage: Option<&str>,
) -> OwnedHeaders {
    let mut h = h
        .insert(Header {
            key: ERROR_REASON,
            value: Some(err.reason.as_str()),
        })
        .insert(Header {
            key: ERROR_MESSAGE,
            value: Some(&err.message),
        })
        .insert(Header {
            key: SOURCE_TOPIC,
            value: Some(input.topic),
        })
        .insert(Header {
            key: SOURCE_PARTITION,
            value: Some(&input.partition.to_string()),
        })
        .insert(Header {
            key: SOURCE_OFFSET,
            value: Some(&input.offset.to_string()),
        });
    if let Some((by, name)) = err.refused {
        h = h.insert(Header {
            key: by.header,
            value: Some(name),
        });
    }
    if let Some(l) = lineage {
        h = h.insert(Header {
            key: LINEAGE,
            value: Some(l),
        });
    }
    h
}

/// The input's headers, names as bytes, without an upstream lineage header.
fn copy_input(input: &InputRecord<'_>) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(input.headers.len() + 1);
    for (name, value) in input
        .headers
        .iter()
        .filter(|(n, _)| *n != LINEAGE.as_bytes())
    {
        h = raw_headers::add(h, name, *value);
    }
    h
}

/// Bytes that headers add to a record, as librdkafka counts them against message.max.bytes:
/// per header, the name and value with a zigzag-varint length each (a missing value counts as
/// length 0), as `rd_kafka_header_add` adds them up.
pub fn size(h: &OwnedHeaders) -> usize {
    raw_headers::iter(h.as_borrowed())
        .map(|(name, value)| {
            let v = value.map_or(0, <[u8]>::len);
            name.len() + v + varint_len(name.len()) + varint_len(v)
        })
        .sum()
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
    use rdkafka::message::Headers;

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

    fn pairs(h: &OwnedHeaders) -> Vec<(String, Option<String>)> {
        h.iter()
            .map(|x| {
                (
                    x.key.to_string(),
                    x.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                )
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
    fn output_replaces_upstream_lineage() {
        let h = output(&input(), &OutputHeaders::Input, Some("orders.v1/3/1234/0"));
        assert_eq!(
            pairs(&h),
            [
                ("trace".into(), Some("abc".into())),
                (LINEAGE.into(), Some("orders.v1/3/1234/0".into()))
            ]
        );
        let h = output(&input(), &OutputHeaders::Input, None);
        assert_eq!(pairs(&h), [("trace".into(), Some("abc".into()))]);
    }

    #[test]
    fn dlq_headers_carry_reason_and_source() {
        let e = TransformError::new(Reason::NotJson, "value is not JSON");
        let h = dlq(&input(), &e, Some("orders.v1/3/1234/0"));
        let p = pairs(&h);
        let get = |k: &str| p.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone());
        assert_eq!(get(ERROR_REASON).as_deref(), Some("not_json"));
        assert_eq!(get(ERROR_MESSAGE).as_deref(), Some("value is not JSON"));
        assert_eq!(get(SOURCE_TOPIC).as_deref(), Some("orders.v1"));
        assert_eq!(get(SOURCE_PARTITION).as_deref(), Some("3"));
        assert_eq!(get(SOURCE_OFFSET).as_deref(), Some("1234"));
        assert_eq!(get("trace").as_deref(), Some("abc"));
        assert_eq!(p.iter().filter(|(n, _)| n == LINEAGE).count(), 1);
    }
}

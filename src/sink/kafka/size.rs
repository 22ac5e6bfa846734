//! The size check against librdkafka's own (testing only): what `records` judges too large for
//! the Kafka destination's message.max.bytes is exactly what its producer refuses, headers
//! written as this sink writes them (`kafka::raw_headers::owned`, the lineage last).

use std::borrow::Cow;

use crate::headers::Headers;
use crate::records::Outgoing;

/// The pre-check against librdkafka's own: a producer that cannot reach any broker still
/// checks the size when a record is handed to it, so `send` is the judge.
#[test]
fn the_size_check_agrees_with_librdkafka_at_the_boundary() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::BaseProducer;

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("message.max.bytes", BOUNDARY_MAX.to_string())
        .set("message.timeout.ms", "1000")
        .create()
        .unwrap();
    let mut counts = (0, 0);
    // Key, value and headers of sizes around the varint steps (63/64, 8191/8192 is
    // beyond the limit) and around the limit.
    for key in [None, Some(0), Some(1), Some(63), Some(64), Some(200)] {
        for names in [0, 1, 2, 70] {
            for header_value in [None, Some(0), Some(63), Some(64), Some(130)] {
                agree_at_the_boundary(&producer, key, names, header_value, &mut counts);
            }
        }
    }
    let (accepted, refused) = counts;
    assert!(
        accepted > 100 && refused > 100,
        "{accepted} accepted, {refused} refused"
    );
    rdkafka::producer::Producer::purge(
        &producer,
        rdkafka::producer::PurgeConfig::default().queue(),
    );
}

const BOUNDARY_MAX: usize = 5_000;

/// Values a few bytes either side of the limit, with this key and these headers: the
/// pre-check and librdkafka agree on each; `counts`: (accepted, refused).
fn agree_at_the_boundary(
    producer: &rdkafka::producer::BaseProducer,
    key: Option<usize>,
    names: usize,
    header_value: Option<usize>,
    counts: &mut (u32, u32),
) {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::producer::BaseRecord;

    const MAX: usize = BOUNDARY_MAX;
    let bytes = vec![0xa5u8; MAX];
    let mut h = Headers::default();
    for i in 0..names {
        let name = Cow::Owned(vec![b'n'; i % 66]);
        h.push(name, header_value.map(|n| Cow::Borrowed(&bytes[..n])));
    }
    let probe = Outgoing {
        topic: None,
        partition: None,
        key: key.map(|n| Cow::Borrowed(&bytes[..n])),
        value: None,
        headers: h.clone(),
        lineage: None,
    };
    let fixed = probe.size();
    for slack in -3i64..=3 {
        let Some(value) = (MAX as i64 - fixed as i64 + slack)
            .try_into()
            .ok()
            .filter(|v: &usize| *v <= MAX)
        else {
            continue;
        };
        let out = Outgoing {
            value: Some(Cow::Borrowed(&bytes[..value])),
            headers: h.clone(),
            ..probe.clone()
        };
        let fits = out.size() <= MAX;
        let mut rec = BaseRecord::<[u8], [u8]>::to("t")
            .payload(&bytes[..value])
            .headers(crate::kafka::raw_headers::owned(h.len(), h.iter()));
        if let Some(k) = key {
            rec = rec.key(&bytes[..k]);
        }
        let sent = match producer.send(rec) {
            Ok(()) => true,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => false,
            Err((e, _)) => panic!("unexpected {e}"),
        };
        assert_eq!(
            fits,
            sent,
            "key {key:?}, {names} headers of {header_value:?}, value {value}: \
             pre-check says {} bytes",
            out.size()
        );
        if sent { counts.0 += 1 } else { counts.1 += 1 }
    }
}

/// Arbitrary records near the limits: what the pre-check says is what librdkafka does, and a
/// DLQ copy always fits.
#[cfg(test)]
mod properties {
    use std::sync::OnceLock;

    use proptest::prelude::*;
    use rdkafka::ClientConfig;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer, PurgeConfig};

    use super::*;
    use crate::config::TransformSpec;
    use crate::headers;
    use crate::records::{Outgoing, dead_letter, minimal, outputs};
    use crate::transform::{Failure, InputRecord, Limits, Reason, TransformError};

    const LIMITS: [usize; 3] = [1_000, 1_500, 4_000];

    /// A producer per limit, reaching no broker: `send` only runs librdkafka's own checks.
    fn producer(max: usize) -> &'static BaseProducer {
        static P: OnceLock<Vec<BaseProducer>> = OnceLock::new();
        let all = P.get_or_init(|| {
            LIMITS
                .iter()
                .map(|m| {
                    ClientConfig::new()
                        .set("bootstrap.servers", "127.0.0.1:1")
                        .set("message.max.bytes", m.to_string())
                        .set("message.timeout.ms", "1000")
                        .create()
                        .unwrap()
                })
                .collect()
        });
        &all[LIMITS.iter().position(|m| *m == max).unwrap()]
    }

    /// Whether librdkafka takes `o` under `max`.
    fn librdkafka_takes(o: &Outgoing<'_>, max: usize) -> bool {
        let p = producer(max);
        let written = o.headers_with_lineage();
        let headers = crate::kafka::raw_headers::owned(o.headers.len() + 1, written);
        let mut rec = BaseRecord::<[u8], [u8]>::to("t").headers(headers);
        if let Some(k) = o.key.as_deref() {
            rec = rec.key(k);
        }
        if let Some(v) = o.value.as_deref() {
            rec = rec.payload(v);
        }
        let taken = match p.send(rec) {
            Ok(()) => true,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => false,
            Err((e, _)) => panic!("unexpected {e}"),
        };
        p.purge(PurgeConfig::default().queue());
        taken
    }

    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..max)
    }

    prop_compose! {
        fn record()(
            key in prop::option::of(bytes(1_200)),
            value in prop::option::of(bytes(4_200)),
            headers in prop::collection::vec(
                (bytes(70), prop::option::of(bytes(300))),
                0..8,
            ),
            offset in 0i64..i64::MAX,
        ) -> (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(Vec<u8>, Option<Vec<u8>>)>, i64) {
            (key, value, headers, offset)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn the_pre_check_is_librdkafkas_and_dead_letters_always_fit(
            (key, value, headers, offset) in record(),
            max in prop::sample::select(LIMITS.to_vec()),
            lineage in any::<bool>(),
            message in "\\PC{0,600}",
            long_topic in any::<bool>(),
        ) {
            let topic = if long_topic { "t".repeat(249) } else { "in".into() };
            let input = InputRecord {
                topic: &topic,
                partition: 7,
                offset,
                timestamp: Some(1),
                key: key.as_deref(),
                value: value.as_deref(),
                headers: headers.iter().map(|(n, v)| (n.as_slice(), v.as_deref())).collect(),
            };
            let limits = Limits { max_output_bytes: usize::MAX, max_outputs: 1 };
            let mut passthrough = crate::transform::new(&TransformSpec::Passthrough, limits).unwrap();
            match outputs(&input, passthrough.apply(&input), lineage, max) {
                Ok(outs) => {
                    prop_assert_eq!(outs.len(), 1);
                    prop_assert!(outs[0].size() <= max);
                    prop_assert!(librdkafka_takes(&outs[0], max));
                }
                Err(Failure::Unavailable(why) | Failure::Held(why)) => {
                    prop_assert!(false, "unavailable: {why}")
                }
                Err(Failure::BadRecord(e)) => {
                    prop_assert_eq!(e.reason, Reason::OutputTooLarge);
                    // Refused exactly when librdkafka would refuse it.
                    let out = Outgoing {
                        topic: None,
                        partition: None,
                        key: input.key.map(Cow::Borrowed),
                        value: input.value.map(Cow::Borrowed),
                        headers: headers::output(
                            &input,
                            crate::transform::OutputHeaders::Input,
                        ),
                        lineage: lineage.then(|| headers::lineage(&input, 0)),
                    };
                    prop_assert!(!librdkafka_takes(&out, max));
                }
            }
            let err = TransformError {
                refused: Some((&crate::transform::Refuser::TEST, "MESSAGE_TOO_LARGE")),
                ..TransformError::new(Reason::JqError, message)
            };
            let d = dead_letter(&input, &err, lineage, max);
            prop_assert!(d.size() <= max, "{} > {max}", d.size());
            prop_assert!(librdkafka_takes(&d, max));
            // Only what does not fit is left out.
            let full = dead_letter(&input, &err, lineage, usize::MAX);
            if full.size() <= max {
                prop_assert_eq!(d.value.as_deref(), input.value);
                prop_assert_eq!(d.key.as_deref(), input.key);
            }
            let m = minimal(&input, &err, lineage, "test", max);
            prop_assert!(m.size() <= max, "{} > {max}", m.size());
            prop_assert!(librdkafka_takes(&m, max));
        }
    }
}

//! Hostile input against the real broker: invalid UTF-8, invalid JSON, deeply nested JSON, a
//! record over the size limit, an output over the producer's message.max.bytes, a huge
//! fan-out, odd headers. None crashes the process; each goes where the error policy says;
//! the audit balances.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// Fans out `.fan` outputs, repeats `.big` `.times` times, or echoes `.v` with the number of
/// headers the record had.
const PROGRAM: &str = "if .fan then range(.fan) elif .times then [range(.times) as $i | .big] \
                       else {v, headers: ($headers | length)} end";

#[test]
fn hostile_records_go_where_the_policy_says_and_the_audit_balances() {
    let topics = Topics::create("bad", 2, 2);
    let group = unique("bad-g");
    let big = "x".repeat(60_000);
    let mut inputs = vec![
        In::raw(0, "utf8", b"\xff\xfe\x00\x80 not utf-8"),
        In::raw(0, "json", br#"{"a": [1, 2"#),
        In::raw(
            0,
            "deep",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).as_bytes(),
        ),
        // 250 KB in and out: over --max-output-bytes, and its DLQ copy over the 200 KB the
        // producer may send, so the copy leaves the value out.
        In::json(1, "large", json!({ "v": "y".repeat(250_000) })),
        // 60 KB in, 5 × 60 KB out: fine as input, too large as output.
        In::json(1, "amplified", json!({ "big": big, "times": 5 })),
        In::json(0, "fan", json!({ "fan": 1_000_000_000u64 })),
    ];
    // 100 KB of value is within --max-output-bytes, but with 110 KB of headers carried over
    // the output is larger than the producer's message.max.bytes.
    let mut heavy = In::json(0, "heavy", json!({ "v": "z".repeat(100_000) }));
    heavy.headers = (0..11)
        .map(|i| (format!("bulk{i}").into_bytes(), vec![b'b'; 10_000]))
        .collect();
    inputs.push(heavy);
    // Odd headers: no value, empty name, binary value, repeated names, many, and a forged
    // lineage header, which must be replaced rather than trusted.
    let mut odd = In::json(1, "odd", json!({ "v": "odd" }));
    odd.headers = vec![
        ("".into(), b"empty name".to_vec()),
        ("binary".into(), vec![0, 159, 146, 150, 255]),
        ("dup".into(), b"1".to_vec()),
        ("dup".into(), b"2".to_vec()),
        (LINEAGE.into(), b"forged/0/0/0".to_vec()),
        // A name that is not UTF-8 (Kafka header names are bytes to non-Java producers).
        (b"\xff\xfe name".to_vec(), b"bytes".to_vec()),
    ];
    odd.headers
        .extend((0..100).map(|i| (format!("h{i}").into_bytes(), vec![b'v'; i])));
    inputs.push(odd);
    for i in 0..20 {
        inputs.push(In::json(i % 2, &format!("ok{i}"), json!({ "v": i })));
    }
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "bad-0");
    args.extend(
        [
            "--jq",
            PROGRAM,
            "--producer-config",
            "message.max.bytes=200000",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();

    let dlq = read_all(&topics.dlq, "read_committed");
    let reason = |key: &str| {
        dlq.iter()
            .find(|d| d.key.as_deref() == Some(key.as_bytes()))
            .and_then(|d| d.header(ERROR_REASON))
            .unwrap_or_else(|| panic!("no DLQ record for {key}"))
    };
    assert_eq!(reason("utf8"), "not_json");
    assert_eq!(reason("json"), "not_json");
    assert_eq!(reason("deep"), "not_json");
    assert_eq!(reason("large"), "output_too_large");
    assert_eq!(reason("amplified"), "output_too_large");
    assert_eq!(reason("heavy"), "output_too_large");
    assert_eq!(reason("fan"), "too_many_outputs");
    assert_eq!(dlq.len(), 7);
    // DLQ copies keep the record unless it is too large to send; then the value is left out
    // and a header says so.
    let copy = |key: &str| {
        dlq.iter()
            .find(|d| d.key.as_deref() == Some(key.as_bytes()))
            .unwrap()
    };
    assert_eq!(
        copy("amplified").value.as_ref().map(Vec::len),
        Some(inputs[4].value.as_ref().unwrap().len())
    );
    for truncated in ["large", "heavy"] {
        let d = copy(truncated);
        assert_eq!(d.value, None, "{truncated}");
        assert!(d.header(ERROR_TRUNCATED).is_some(), "{truncated}");
        assert!(d.header(SOURCE_OFFSET).is_some(), "{truncated}");
    }

    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(outputs.len(), 21);
    let odd = outputs
        .iter()
        .find(|o| o.key.as_deref() == Some(&b"odd"[..]))
        .unwrap();
    // The program saw every header, the output carries them on, and the lineage is ours.
    assert_eq!(odd.json(), json!({"v": "odd", "headers": 105}));
    assert_eq!(odd.lineage().0, topics.input);
    assert_eq!(
        odd.headers
            .iter()
            .filter(|(k, _)| k == LINEAGE.as_bytes())
            .count(),
        1
    );
    assert_eq!(odd.headers.iter().filter(|(k, _)| k == b"dup").count(), 2);
    assert!(
        odd.headers
            .iter()
            .any(|(k, v)| k == b"\xff\xfe name" && v.as_deref() == Some(&b"bytes"[..]))
    );
    assert!(
        odd.headers
            .iter()
            .any(|(k, v)| k == b"binary" && v.as_deref() == Some(&[0, 159, 146, 150, 255][..]))
    );

    // The audit replays with the limits the run had.
    let b = bootstrap();
    let (code, report) = audit_json(&[
        "--bootstrap-servers",
        &b,
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--group-id",
        &group,
        "--jq",
        PROGRAM,
        "--max-output-bytes",
        "150000",
        "--max-message-bytes",
        "200000",
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["dlq"], 7);
    assert_eq!(report["outputs"], 21);
}

//! Hostile records against the real broker, among 600 good ones.
//!
//! Records the broker rejects for what they are: an output routed to a topic whose
//! max.message.bytes is smaller than the producer's, outputs whose timestamps are outside the
//! output topic's bounds (ten days ahead, 1970), dead-letter copies that the dead-letter
//! topic rejects too. And records of every size around the producer's message.max.bytes, a
//! null key, a tombstone, a fan-out larger than --max-bytes-per-txn. None stops the pipeline:
//! each rejected one goes to the DLQ once with `rejected_by_broker` and the broker's error name
//! (as a minimal copy when even its DLQ copy is rejected), every other one is in the output or
//! the DLQ once, the good records arrive exactly once, and the audit balances.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::{Value, json};

/// Routes `.v` to `.route` when it is set, fans `.pad` out `.fan` times, else writes the input
/// value to the output topic (a tombstone stays a tombstone).
const PROGRAM: &str = "if .route then {topic: .route, value: .v} \
                       elif .fan then (.pad as $p | range(.fan) | {value: {i: ., pad: $p}}) \
                       else {value: .} end";

/// The producer's message.max.bytes in this test.
const MAX: usize = 20_000;
/// Padding around MAX (the output adds its key, headers and librdkafka's framing): the first
/// two always fit, the last two never do.
const SIZES: [usize; 9] = [
    0, 100, 19_700, 19_800, 19_850, 19_900, 19_950, 20_000, 30_000,
];

const BROKER: &str = "exactly.error.broker";
const UNBOUNDED: &str = "9223372036854775807";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn hostile_records(small: &str) -> Vec<In> {
    let mut bad = vec![
        // 3 KB routed to a topic that takes 1.5 KB: MESSAGE_TOO_LARGE, its DLQ copy fits.
        In::json(
            0,
            "route-big",
            json!({"route": small, "v": "x".repeat(3000)}),
        ),
        // Outside the output topic's timestamp bounds (a day either way): INVALID_TIMESTAMP.
        // (Timestamp 0 is "now" to a librdkafka producer and negative ones are refused by
        // the client, so 1970 stands for them.)
        In::json(0, "future", json!({"n": -1})),
        In::json(1, "ancient", json!({"n": -2})),
        // Not JSON, 6 KB: its DLQ copy is over the DLQ topic's 4 KB, so a minimal copy goes.
        In::raw(1, "not-json-big", &[b'!'; 6000]),
        // Routed and small enough: delivered.
        In::json(1, "route-ok", json!({"route": small, "v": "ok"})),
        // 30 outputs of 2 KB from one record: more than --max-bytes-per-txn at once.
        In::json(1, "fan", json!({"fan": 30, "pad": "y".repeat(2_000)})),
    ];
    bad[1].timestamp = Some(now_ms() + 10 * 86_400_000);
    bad[2].timestamp = Some(1_000);
    for (i, size) in SIZES.iter().enumerate() {
        let v = json!({"n": 700 + i, "pad": "z".repeat(*size)});
        bad.push(In::json(i as i32 % 2, &format!("size-{size}"), v));
    }
    let mut null_key = In::json(1, "", json!({"n": 800}));
    null_key.key = None;
    bad.push(null_key);
    let mut tombstone = In::json(0, "tombstone", json!(null));
    tombstone.value = None;
    bad.push(tombstone);
    bad
}

#[test]
fn no_record_stops_the_pipeline_and_each_lands_once() {
    let topics = Topics {
        input: unique("hostile-in"),
        output: unique("hostile-out"),
        dlq: unique("hostile-out-dlq"),
    };
    let small = unique("hostile-small");
    let day = "86400000";
    let any_time = [
        ("message.timestamp.after.max.ms", UNBOUNDED),
        ("message.timestamp.before.max.ms", UNBOUNDED),
    ];
    create_topics_with(&[
        (&topics.input, 2, &any_time),
        (
            &topics.output,
            2,
            &[
                ("message.timestamp.after.max.ms", day),
                ("message.timestamp.before.max.ms", day),
            ],
        ),
        (
            &topics.dlq,
            1,
            &[("max.message.bytes", "4000"), any_time[0], any_time[1]],
        ),
        (&small, 1, &[("max.message.bytes", "1500")]),
    ]);
    let group = unique("hostile-g");

    let mut bad = hostile_records(&small);
    let hostile = bad.len();
    let mut inputs = Vec::new();
    for i in 0..600 {
        if i % 30 == 15 && !bad.is_empty() {
            inputs.push(bad.remove(0));
        }
        inputs.push(In::json(i % 2, &format!("k{i}"), json!({"n": i})));
    }
    assert!(bad.is_empty());
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "hostile-0");
    args.extend(
        [
            "--jq",
            PROGRAM,
            "--envelope",
            "--dlq-topic",
            &topics.dlq,
            "--producer-config",
            &format!("message.max.bytes={MAX}"),
            "--max-bytes-per-txn",
            "50000",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.stop_cleanly();

    // Where each output and DLQ record came from, by the input's key.
    let keys: HashMap<(i32, i64), Option<Vec<u8>>> = read_all(&topics.input, "read_committed")
        .into_iter()
        .map(|r| ((r.partition, r.offset), r.key))
        .collect();
    let source_key = |o: &Out| {
        let (_, p, off, _) = o.lineage();
        String::from_utf8_lossy(keys[&(p, off)].as_deref().unwrap_or(b"<none>")).into_owned()
    };
    let outputs = read_all(&topics.output, "read_committed");
    let dlq = read_all(&topics.dlq, "read_committed");
    let mut landed: HashMap<String, (usize, usize)> = HashMap::new();
    for o in &outputs {
        landed.entry(source_key(o)).or_default().0 += 1;
    }
    for d in &dlq {
        landed.entry(source_key(d)).or_default().1 += 1;
    }

    // Every good record exactly once, in order, with its key (or none).
    let near_limit = |k: &str| {
        k.strip_prefix("size-")
            .and_then(|s| s.parse::<usize>().ok())
            .is_some_and(|s| s >= 19_000)
    };
    let good: Vec<Out> = outputs
        .iter()
        .filter(|o| o.value.is_some() && !near_limit(&source_key(o)))
        .cloned()
        .collect();
    let expected = expected_outputs(&topics.input, |v: &Value| {
        if let Some(fan) = v["fan"].as_u64() {
            return (0..fan).map(|i| json!({"i": i, "pad": v["pad"]})).collect();
        }
        let rejected = v.get("route").is_some() || v["n"].as_i64().is_some_and(|n| n < 0);
        let near = v["pad"].as_str().is_some_and(|p| p.len() >= 19_000);
        if rejected || near || v.is_null() {
            vec![]
        } else {
            vec![v.clone()]
        }
    });
    // 600 good, the null key, two small sizes, 30 fanned out.
    assert_eq!(expected.len(), 633);
    assert_exactly_once(&good, &expected);
    assert!(good.iter().any(|o| o.key.is_none()), "the null-key record");
    // The tombstone stays one.
    assert_eq!(landed["tombstone"], (1, 0));
    assert!(
        outputs
            .iter()
            .any(|o| o.key.as_deref() == Some(&b"tombstone"[..]) && o.value.is_none())
    );
    let routed = read_all(&small, "read_committed");
    assert_eq!(routed.len(), 1);
    assert_eq!(routed[0].value.as_deref(), Some(&br#""ok""#[..]));

    // Near the limit: each record once, in the output if it fits, else in the DLQ as too
    // large (which ones fit is the audit's to judge below: it replays the same size check).
    let mut near_in_dlq = 0;
    for size in SIZES.iter().filter(|s| **s >= 19_000) {
        let key = format!("size-{size}");
        let (out, dead) = landed.get(&key).copied().unwrap_or_default();
        assert_eq!(
            out + dead,
            1,
            "{key}: {out} in the output, {dead} in the DLQ"
        );
        near_in_dlq += dead;
    }
    assert_eq!(landed["size-30000"], (0, 1));
    assert_eq!(landed["size-20000"], (0, 1));
    assert_eq!(landed["size-19700"], (1, 0));

    // The rejected ones, each in the DLQ once, with the broker's reason.
    assert_eq!(dlq.len(), 4 + near_in_dlq, "{dlq:?}");
    for (key, broker) in [
        ("route-big", "MESSAGE_TOO_LARGE"),
        ("future", "INVALID_TIMESTAMP"),
        ("ancient", "INVALID_TIMESTAMP"),
    ] {
        assert_eq!(landed[key], (0, 1), "{key}");
        let d = dlq.iter().find(|d| source_key(d) == key).unwrap();
        assert_eq!(
            d.header(ERROR_REASON).as_deref(),
            Some("rejected_by_broker"),
            "{key}"
        );
        assert_eq!(d.header(BROKER).as_deref(), Some(broker), "{key}");
        // The DLQ copy is the input, unchanged.
        assert!(d.value.is_some(), "{key}");
    }
    // The minimal copy: reason and source, no key, no value; what rejected the full copy.
    assert_eq!(landed["not-json-big"], (0, 1));
    let m = dlq
        .iter()
        .find(|d| source_key(d) == "not-json-big")
        .unwrap();
    assert_eq!(m.header(ERROR_REASON).as_deref(), Some("not_json"));
    assert_eq!(m.header(BROKER).as_deref(), Some("MESSAGE_TOO_LARGE"));
    assert_eq!((m.key.as_deref(), m.value.as_deref()), (None, None));
    assert!(m.header(ERROR_TRUNCATED).is_some());

    // Logged as rejections, learned from the delivery reports.
    assert!(
        !ex.events("the broker rejected a record; its replay sends the dead-letter copy")
            .is_empty(),
        "{}",
        ex.log_text()
    );

    // The audit counts the DLQ copies of rejected outputs as where those records went.
    let b = bootstrap();
    let max = MAX.to_string();
    let (code, report) = audit_json(&[
        "--bootstrap-servers",
        &b,
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--output-topic",
        &small,
        "--dlq-topic",
        &topics.dlq,
        "--group-id",
        &group,
        "--jq",
        PROGRAM,
        "--envelope",
        "--max-message-bytes",
        &max,
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["dlq"], 4 + near_in_dlq, "{report:#}");
    assert_eq!(report["rejected_by_broker"], 3, "{report:#}");
    assert_eq!(report["inputs"], 600 + hostile, "{report:#}");
    eprintln!(
        "hostile: {hostile} records among 600: {} outputs, {} DLQ ({near_in_dlq} of the 7 near \
         the limit), exit 0",
        outputs.len(),
        dlq.len()
    );
}

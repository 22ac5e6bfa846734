//! Records the broker rejects for what they are, against the real broker: an output routed to
//! a topic whose max.message.bytes is smaller than the producer's, outputs whose timestamps
//! are outside the output topic's bounds (far future, 1970), and a dead-letter copy that the
//! dead-letter topic rejects too. None stops the pipeline: each goes to the DLQ once with
//! `rejected_by_broker` and the broker's error name (or, when even its DLQ copy is rejected,
//! as a minimal copy), the good records around them arrive exactly once, and the audit
//! balances.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::{Value, json};

/// Routes `.v` to `.route` when it is set, else writes the input value to the output topic.
const PROGRAM: &str = "if .route then {topic: .route, value: .v} else {value: .} end";

const BROKER: &str = "exactly.error.broker";
const UNBOUNDED: &str = "9223372036854775807";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn records_the_broker_rejects_go_to_the_dlq_and_the_rest_flows() {
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

    let mut bad = vec![
        // 3 KB routed to a topic that takes 1.5 KB: MESSAGE_TOO_LARGE, its DLQ copy fits.
        In::json(
            0,
            "route-big",
            json!({"route": small, "v": "x".repeat(3000)}),
        ),
        // Outside the output topic's timestamp bounds (a day either way): INVALID_TIMESTAMP.
        In::json(0, "future", json!({"n": -1})),
        In::json(1, "ancient", json!({"n": -2})),
        // Not JSON, 6 KB: its DLQ copy is over the DLQ topic's 4 KB, so a minimal copy goes.
        In::raw(1, "not-json-big", &[b'!'; 6000]),
        // Routed and small enough: delivered.
        In::json(1, "route-ok", json!({"route": small, "v": "ok"})),
    ];
    bad[1].timestamp = Some(now_ms() + 10 * 86_400_000);
    bad[2].timestamp = Some(1_000);
    let mut inputs = Vec::new();
    for i in 0..600 {
        if i % 120 == 50 {
            inputs.push(bad.remove(0));
        }
        inputs.push(In::json(i % 2, &format!("k{i}"), json!({"n": i})));
    }
    assert!(bad.is_empty());
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "hostile-0");
    args.extend(["--jq", PROGRAM, "--envelope", "--dlq-topic", &topics.dlq].map(String::from));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        ex.wait(Duration::from_secs(15)).code(),
        Some(0),
        "{}",
        ex.log_text()
    );

    // Every good record exactly once, in order; none of the rejected ones.
    let expected = expected_outputs(&topics.input, |v: &Value| {
        let rejected = v.get("route").is_some() || v["n"].as_i64().is_some_and(|n| n < 0);
        if rejected { vec![] } else { vec![v.clone()] }
    });
    assert_eq!(expected.len(), 600);
    let outputs = read_all(&topics.output, "read_committed");
    assert_exactly_once(&outputs, &expected);
    let routed = read_all(&small, "read_committed");
    assert_eq!(routed.len(), 1);
    assert_eq!(routed[0].value.as_deref(), Some(&br#""ok""#[..]));

    // Each rejected record in the DLQ once, with the broker's reason.
    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(dlq.len(), 4, "{dlq:?}");
    let by_key = |key: &str| {
        let found: Vec<_> = dlq
            .iter()
            .filter(|d| d.key.as_deref() == Some(key.as_bytes()))
            .collect();
        assert_eq!(found.len(), 1, "{key}: {dlq:?}");
        found[0]
    };
    for (key, broker) in [
        ("route-big", "MESSAGE_TOO_LARGE"),
        ("future", "INVALID_TIMESTAMP"),
        ("ancient", "INVALID_TIMESTAMP"),
    ] {
        let d = by_key(key);
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
    let minimal: Vec<_> = dlq.iter().filter(|d| d.key.is_none()).collect();
    assert_eq!(minimal.len(), 1, "{dlq:?}");
    let m = minimal[0];
    assert_eq!(m.header(ERROR_REASON).as_deref(), Some("not_json"));
    assert_eq!(m.header(BROKER).as_deref(), Some("MESSAGE_TOO_LARGE"));
    assert_eq!(m.value, None);
    assert!(m.header(ERROR_TRUNCATED).is_some());
    assert_eq!(m.lineage().0, topics.input);

    // Logged as rejections, learned from the delivery reports.
    assert!(
        !ex.events("the broker rejected a record; its replay sends the dead-letter copy")
            .is_empty(),
        "{}",
        ex.log_text()
    );

    // The audit counts the DLQ copies of rejected outputs as where those records went.
    let b = bootstrap();
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
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["dlq"], 4, "{report:#}");
    assert_eq!(report["rejected_by_broker"], 3, "{report:#}");
    assert_eq!(report["outputs"], 601, "{report:#}");
}

//! The call-out against the real broker and a real application process (Python, the example in
//! `examples/call/app.py`, driven by `tests/apps/callee.py`): outputs exactly once, rejections
//! in the DLQ, and every way the application can fail — down, slow, wrong — ending in aborts
//! and retries, never in the DLQ and never in a loss.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// What the example makes of `{"id", "n"}`.
fn by_app(v: &Value) -> Vec<Value> {
    let mut o = v.clone();
    o["by"] = json!("app");
    o["doubled"] = json!(v["n"].as_i64().unwrap() * 2);
    vec![o]
}

fn call_args(topics: &Topics, group: &str, app: &App, extra: &[&str]) -> Vec<String> {
    let mut args = base_args(topics, group, &format!("{group}-0"));
    args.extend(["--call-url".into(), app.url()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn metrics(ex: &Exactly) -> String {
    get(&http_addr(ex), "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default()
}

/// `exactly audit` of a call-out pipeline, by lineage alone or (`replay`) asking the
/// application again.
fn audit(topics: &Topics, group: &str, app: &App, replay: bool) -> (i32, Value) {
    let b = bootstrap();
    let url = app.url();
    let mut args = vec![
        "--bootstrap-servers",
        &b,
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--group-id",
        group,
        "--call-url",
        &url,
    ];
    if replay {
        args.push("--replay-call");
    }
    audit_json(&args)
}

/// Waits until exactly's metrics say `pred`.
fn wait_metrics(ex: &Exactly, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred(&metrics(ex)) {
        assert!(!ex.has_exited(), "exactly exited: {}", ex.log_text());
        assert!(
            Instant::now() < deadline,
            "never saw {what}:\n{}",
            metrics(ex)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn calls(text: &str, outcome: &str) -> f64 {
    metric(text, "exactly_calls_total", &[("outcome", outcome)])
}

#[test]
fn twenty_thousand_records_through_the_python_example() {
    let topics = Topics::create("call-clean", 3, 3);
    let group = unique("call-clean-g");
    let mut inputs = numbered(20_000, 3);
    // Refused by the application: each to the DLQ with its message.
    inputs.extend((0..30).map(|i| In::json(i % 3, "r", json!({"name": "no id", "i": i}))));
    // Not JSON: sent in base64 and written back byte for byte.
    inputs.extend((0..6).map(|i| In::raw(i % 3, "b", &[0xff, 0x00, i as u8])));
    produce(&topics.input, &inputs);
    let app = App::start(None);

    let mut ex = Exactly::start(&call_args(
        &topics,
        &group,
        &app,
        &["--call-batch-records", "200"],
    ));
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    let text = metrics(&ex);
    ex.stop_cleanly();

    let outputs = read_all(&topics.output, "read_committed");
    let (json_out, raw_out): (Vec<Out>, Vec<Out>) = outputs
        .into_iter()
        .partition(|o| serde_json::from_slice::<Value>(o.value.as_deref().unwrap_or(b"")).is_ok());
    let expected = expected_outputs(&topics.input, |v| {
        if v.get("id").is_some() {
            by_app(v)
        } else {
            vec![]
        }
    });
    assert_eq!(assert_exactly_once(&json_out, &expected), 20_000);
    let mut raw: Vec<Vec<u8>> = raw_out.iter().map(|o| o.value.clone().unwrap()).collect();
    raw.sort();
    assert_eq!(
        raw,
        (0..6u8).map(|i| vec![0xff, 0x00, i]).collect::<Vec<_>>()
    );
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));

    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(dlq.len(), 30, "every rejected record in the DLQ, once");
    for d in &dlq {
        assert_eq!(
            d.header("exactly.error.reason").as_deref(),
            Some("app_rejected")
        );
        let message = d.header("exactly.error.message").unwrap();
        assert!(message.starts_with("no id in "), "{message}");
    }
    // Batches, not a call per record; each record sent once in a run without failures.
    let ok = calls(&text, "ok");
    assert!(
        ok > 0.0 && ok < 20_036.0 / 10.0,
        "{ok} calls for 20,036 records"
    );
    assert_eq!(app.seen().len(), 20_036);
    assert_eq!(
        sample(&text, "exactly_calls_total", &[("outcome", "malformed")]),
        Some(0.0)
    );

    // The audit: by lineage alone, then asking the (deterministic) application again.
    let (code, report) = audit(&topics, &group, &app, false);
    assert_eq!(
        (code, &report["replayed"]),
        (0, &json!(false)),
        "{report:#}"
    );
    assert_eq!(
        (report["outputs"].as_u64(), report["dlq"].as_u64()),
        (Some(20_006), Some(30))
    );
    let (code, report) = audit(&topics, &group, &app, true);
    assert_eq!((code, &report["replayed"]), (0, &json!(true)), "{report:#}");
    assert_eq!(report["expected_outputs"], 20_006);
    assert_eq!(report["expected_dlq"], 30);
    // A different answer now is an anomaly the replay finds and lineage alone cannot.
    app.set(json!({"mode": "wrong_value"}));
    let (code, report) = audit(&topics, &group, &app, true);
    assert_eq!(code, 1, "{report:#}");
    assert!(report["unexpected"].as_u64().unwrap() > 0, "{report:#}");
}

#[test]
fn the_application_killed_three_times_loses_and_duplicates_nothing() {
    let topics = Topics::create("call-kill", 3, 3);
    let group = unique("call-kill-g");
    produce(&topics.input, &numbered(6_000, 3));
    let mut app = App::start(None);
    // Slow enough that the kills land mid-stream.
    app.set(json!({"delay_ms": 60}));
    let ex = Exactly::start(&call_args(
        &topics,
        &group,
        &app,
        &["--call-batch-records", "50", "--call-timeout", "2s"],
    ));
    let addr = http_addr(&ex);
    let mut not_ready_seen = 0;
    for round in 0..3 {
        wait_committed_at_least(
            &group,
            &topics.input,
            1_000 * (round + 1),
            Duration::from_secs(120),
        );
        app.kill9();
        // Down: calls fail, and exactly says it is not ready, but stays up.
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(&addr, "/readyz").map(|(s, _)| s) != Some(503) {
            assert!(
                Instant::now() < deadline,
                "/readyz never 503 while the app was down"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        not_ready_seen += 1;
        std::thread::sleep(Duration::from_secs(1));
        assert!(!ex.has_exited(), "{}", ex.log_text());
        app.restart();
        app.set(json!({"delay_ms": 60}));
    }
    app.set(json!({"delay_ms": 0}));
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    let text = metrics(&ex);
    assert_eq!(
        get(&addr, "/readyz").map(|(s, _)| s),
        Some(200),
        "ready again"
    );
    drop(ex);
    assert_eq!(not_ready_seen, 3);
    assert!(calls(&text, "unreachable") >= 3.0, "{text}");
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        6_000
    );
    assert!(
        read_all(&topics.dlq, "read_committed").is_empty(),
        "an unavailable app is never the DLQ"
    );
    assert!(
        app.seen().len() > 6_000 - 1,
        "the app saw every record at least once"
    );
}

#[test]
fn an_application_slower_than_the_call_timeout_aborts_and_retries() {
    let topics = Topics::create("call-slow", 2, 2);
    let group = unique("call-slow-g");
    produce(&topics.input, &numbered(500, 2));
    let app = App::start(None);
    app.set(json!({"delay_ms": 1_500}));
    let ex = Exactly::start(&call_args(
        &topics,
        &group,
        &app,
        &["--call-timeout", "500ms"],
    ));
    wait_metrics(&ex, "two timed-out calls", Duration::from_secs(60), |m| {
        calls(m, "timeout") >= 2.0
    });
    assert_eq!(
        committed_total(&group, &topics.input),
        0,
        "nothing commits without answers"
    );
    app.set(json!({"delay_ms": 0}));
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    drop(ex);
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        500
    );
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
}

#[test]
fn wrong_answers_make_the_application_unavailable_never_the_dlq() {
    let topics = Topics::create("call-wrong", 2, 2);
    let group = unique("call-wrong-g");
    let app = App::start(None);
    let ex = Exactly::start(&call_args(&topics, &group, &app, &[]));
    let addr = http_addr(&ex);
    let mut sent = 0;
    for (mode, outcome) in [
        ("garbage", "malformed"),
        ("wrong_count", "malformed"),
        ("status_500", "http_error"),
    ] {
        app.set(json!({"mode": mode}));
        let before = calls(&metrics(&ex), outcome);
        produce(&topics.input, &numbered(100, 2));
        sent += 100;
        wait_metrics(
            &ex,
            &format!("a {outcome} call ({mode})"),
            Duration::from_secs(60),
            |m| calls(m, outcome) > before,
        );
        assert_eq!(
            get(&addr, "/readyz").map(|(s, _)| s),
            Some(503),
            "{mode}: not ready"
        );
        assert!(
            committed_total(&group, &topics.input) < sent,
            "{mode}: the new records wait"
        );
        app.set(json!({"mode": "ok"}));
        wait_committed_at_least(&group, &topics.input, sent, Duration::from_secs(60));
    }
    drop(ex);
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(outputs.len(), 300);
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
}

#[test]
fn kill9_with_calls_in_flight_loses_and_duplicates_nothing() {
    let topics = Topics::create("call-crash", 3, 3);
    let group = unique("call-crash-g");
    produce(&topics.input, &numbered(8_000, 3));
    let app = App::start(None);
    app.set(json!({"delay_ms": 40}));
    let args = call_args(
        &topics,
        &group,
        &app,
        &["--call-batch-records", "100", "--call-in-flight", "4"],
    );
    let mut ex = Exactly::start(&args);
    wait_committed_at_least(&group, &topics.input, 2_000, Duration::from_secs(120));
    wait_metrics(&ex, "calls in flight", Duration::from_secs(30), |m| {
        metric(m, "exactly_calls_in_flight", &[]) >= 2.0
    });
    ex.kill9();
    let mut ex = Exactly::start(&args);
    app.set(json!({"delay_ms": 0}));
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    ex.stop_cleanly();
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        8_000
    );
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));
}

#[test]
fn the_node_example_gives_the_same_outputs() {
    let topics = Topics::create("call-node", 2, 2);
    let group = unique("call-node-g");
    produce(&topics.input, &numbered(2_000, 2));
    let mut node = Command::new("node")
        .arg(repo().join("examples/call/app.js"))
        .arg("0")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs the example (scripts/test.sh's CI installs nodejs)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(node.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line.trim().trim_start_matches("listening on ").to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    let mut args = base_args(&topics, &group, "node-0");
    args.extend(["--call-url".into(), url]);
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    let _ = node.kill();
    let _ = node.wait();
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        2_000
    );
}

#[test]
fn a_rebalance_with_calls_in_flight_loses_and_duplicates_nothing() {
    let topics = Topics::create("call-rebalance", 6, 3);
    let group = unique("call-rebalance-g");
    produce(&topics.input, &numbered(1_200, 6));
    let app = App::start(None);
    // Slow answers: calls for the partitions that move are still out when their new owner
    // starts reading them, and must not be applied by the old one.
    app.set(json!({"delay_ms": 1_500}));
    let extra = ["--call-batch-records", "20", "--call-in-flight", "4"];
    let mut args = call_args(&topics, &group, &app, &extra);
    let mut first = Exactly::start(&args);
    wait_committed_at_least(&group, &topics.input, 100, Duration::from_secs(120));
    let i = args.iter().position(|a| a == "--instance-id").unwrap();
    args[i + 1] = format!("{group}-1");
    let mut second = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    first.stop_cleanly();
    second.stop_cleanly();
    assert!(
        !first
            .events("partitions revoked; committing first")
            .is_empty(),
        "no partition moved"
    );
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        1_200
    );
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));
}

#[test]
fn sigterm_with_calls_in_flight_commits_what_was_answered_and_exits_0() {
    let topics = Topics::create("call-term", 3, 3);
    let group = unique("call-term-g");
    produce(&topics.input, &numbered(4_000, 3));
    let app = App::start(None);
    app.set(json!({"delay_ms": 200}));
    let args = call_args(&topics, &group, &app, &["--call-batch-records", "100"]);
    let mut ex = Exactly::start(&args);
    wait_committed_at_least(&group, &topics.input, 500, Duration::from_secs(120));
    wait_metrics(&ex, "calls in flight", Duration::from_secs(30), |m| {
        metric(m, "exactly_calls_in_flight", &[]) >= 1.0
    });
    // Exit 0 within the grace, with the answered records committed (none of the unanswered).
    ex.stop_cleanly();
    let committed_at_stop = committed_total(&group, &topics.input);
    assert!(committed_at_stop >= 500, "{committed_at_stop}");
    app.set(json!({"delay_ms": 0}));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(
        assert_exactly_once(&outputs, &expected_outputs(&topics.input, by_app)),
        4_000
    );
}

#[test]
fn records_waiting_for_a_slow_application_are_lag() {
    let topics = Topics::create("call-lag", 1, 1);
    let group = unique("call-lag-g");
    produce(&topics.input, &numbered(400, 1));
    let app = App::start(None);
    app.set(json!({"delay_ms": 20_000}));
    let ex = Exactly::start(&call_args(
        &topics,
        &group,
        &app,
        &[
            "--lag-interval",
            "500ms",
            "--call-batch-records",
            "1000",
            "--call-timeout",
            "40s",
        ],
    ));
    let lag = |m: &str| {
        metric(
            m,
            "exactly_consumer_lag_records",
            &[("topic", topics.input.as_str()), ("partition", "0")],
        )
    };
    // Every record read, in calls out or the open batch; nothing answered yet: all are lag.
    wait_metrics(&ex, "every record read", Duration::from_secs(15), |m| {
        metric(m, "exactly_calls_in_flight", &[]) >= 1.0 && lag(m) == 400.0
    });
    assert_eq!(committed_total(&group, &topics.input), 0);
    app.set(json!({"delay_ms": 0}));
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    wait_metrics(&ex, "no lag", Duration::from_secs(30), |m| lag(m) == 0.0);
}

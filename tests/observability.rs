//! Metrics and health endpoints against the real broker: counters reconcile with what the
//! topics hold, aborts are counted, /readyz turns 503 on SIGTERM, /livez on a wedged loop.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use rdkafka::producer::Producer;
use serde_json::json;

#[test]
fn lag_and_unstable_records_follow_the_last_stable_offset() {
    let topics = Topics::create("obs-lag", 1, 1);
    let group = unique("obs-lag-g");
    let input = &topics.input;
    let upstream = Writer::transactional(&unique("obs-lag-upstream"));
    let p = upstream.producer();
    p.begin_transaction().unwrap();
    upstream.write(input, &numbered(1_000, 1));
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    // A transaction left open upstream: 50 records a read_committed consumer must not see yet.
    let pending: Vec<In> = (1_000..1_050)
        .map(|i| In::json(0, &format!("k{i}"), json!({"id": i, "n": i})))
        .collect();
    p.begin_transaction().unwrap();
    upstream.write(input, &pending);

    let mut args = base_args(&topics, &group, "obs-lag-0");
    // Small transactions: slow enough to watch the lag shrink.
    args.extend(["--max-records-per-txn", "20", "--lag-interval", "100ms"].map(String::from));
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    let series = [("topic", input.as_str()), ("partition", "0")];
    let scrape = || get(&addr, "/metrics").unwrap().1;
    let mut lags = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Offsets 0..999 committed upstream, a marker at 1000, the open transaction from 1001.
    let text = loop {
        let text = scrape();
        let lag = sample(&text, "exactly_consumer_lag_records", &series);
        let unstable = sample(&text, "exactly_partition_unstable_records", &series);
        lags.extend(lag);
        if lag == Some(0.0) && unstable == Some(50.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "lag {lag:?} unstable {unstable:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        lags.iter().any(|l| *l > 0.0 && *l <= 1_001.0),
        "never saw the backlog: {lags:?}"
    );
    // Past the marker at 1000 (KAFKA-6607), and not into the open transaction.
    assert_eq!(committed(&group, input).get(&0), Some(&1_001));
    assert_eq!(
        sample(&text, "exactly_end_to_end_latency_seconds_count", &[]),
        Some(1_000.0)
    );

    // The upstream commit makes the 50 visible: processed, and nothing unstable any more.
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape();
        let lag = sample(&text, "exactly_consumer_lag_records", &series);
        let unstable = sample(&text, "exactly_partition_unstable_records", &series);
        let e2e = sample(&text, "exactly_end_to_end_latency_seconds_count", &[]);
        if lag == Some(0.0) && unstable == Some(0.0) && e2e == Some(1_050.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag {lag:?} unstable {unstable:?} e2e {e2e:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read_all(&topics.output, "read_committed").len(), 1_050);
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
}

#[test]
fn counters_reconcile_with_the_topics_and_readiness_follows_shutdown() {
    let topics = Topics::create("obs", 2, 2);
    let group = unique("obs-g");
    let mut inputs = numbered(2_000, 2);
    for i in 0..10 {
        inputs.push(In::raw(i % 2, "bad", b"not json"));
    }
    // Filtered: the program drops records whose id ends in 7.
    produce(&topics.input, &inputs);
    let mut args = base_args(&topics, &group, "obs-0");
    args.extend(["--jq", "select(.id % 10 != 7) | {id}"].map(String::from));
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));

    let (status, text) = get(&addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    let outputs = read_all(&topics.output, "read_committed");
    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(
        metric(&text, "exactly_records_consumed_total", &[]),
        2_010.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "exactly_records_produced_total",
            &[("topic", &topics.output)]
        ),
        outputs.len() as f64
    );
    assert_eq!(outputs.len(), 1_800);
    assert_eq!(metric(&text, "exactly_records_filtered_total", &[]), 200.0);
    assert_eq!(
        metric(
            &text,
            "exactly_records_dlq_total",
            &[("reason", "not_json")]
        ),
        dlq.len() as f64
    );
    assert_eq!(dlq.len(), 10);
    assert!(
        metric(
            &text,
            "exactly_transactions_total",
            &[("outcome", "committed")]
        ) >= 1.0
    );
    assert_eq!(
        metric(
            &text,
            "exactly_transactions_total",
            &[("outcome", "aborted")]
        ),
        0.0
    );
    assert_eq!(metric(&text, "exactly_assigned_partitions", &[]), 2.0);
    assert_eq!(metric(&text, "exactly_ready", &[]), 1.0);
    assert!(metric(&text, "exactly_last_commit_timestamp_seconds", &[]) > 1.7e9);
    let commits = metric(
        &text,
        "exactly_transaction_commit_duration_seconds_count",
        &[],
    );
    assert!(commits >= 1.0);
    // Each commit's phases are timed by call (a retry is a call of its own).
    for call in ["send_offsets_to_transaction", "flush", "commit_transaction"] {
        let n = metric(
            &text,
            "exactly_blocking_call_duration_seconds_count",
            &[("call", call)],
        );
        assert!(n >= commits, "{call}: {n} timed, {commits} commits");
    }
    assert_eq!(
        metric(
            &text,
            "exactly_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(get(&addr, "/readyz").unwrap().0, 200);
    assert_eq!(get(&addr, "/livez").unwrap().0, 200);
    assert_eq!(get(&addr, "/healthz").unwrap().0, 200);

    // SIGTERM: not ready at once, while the process still commits and leaves the group.
    ex.signal(Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen_503 = false;
    while Instant::now() < deadline {
        match get(&addr, "/readyz") {
            Some((503, _)) => {
                seen_503 = true;
                break;
            }
            Some(_) => std::thread::sleep(Duration::from_millis(2)),
            None => break,
        }
    }
    assert!(seen_503, "/readyz never answered 503 before exit");
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
}

#[test]
fn forced_aborts_are_counted_by_reason() {
    let topics = Topics::create("obs-abort", 1, 1);
    let group = unique("obs-abort-g");
    let mut inputs = numbered(1_000, 1);
    for i in 0..10 {
        inputs.insert(i * 97, In::raw(0, "bad", b"not json"));
    }
    produce(&topics.input, &inputs);
    let mut args = base_args(&topics, &group, "obs-abort-0");
    args.extend(
        [
            "--max-records-per-txn",
            "100",
            "--test-abort-every",
            "2",
            // Filters the ids ending in 7.
            "--jq",
            "select(.id % 10 != 7)",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    let text = get(&addr, "/metrics").unwrap().1;
    // Each injected abort ends its transaction aborted, whether abort_transaction succeeds or
    // the producer has to be replaced (librdkafka#4849 makes an abort right after the first
    // sends fail with INVALID_TXN_STATE, a fatal error for that producer).
    let aborts = ex
        .events("test switch: aborting this transaction instead of committing it")
        .len() as f64;
    assert!(aborts >= 1.0);
    assert_eq!(
        metric(
            &text,
            "exactly_transaction_aborts_total",
            &[("reason", "test_injected")]
        ),
        aborts
    );
    assert_eq!(
        metric(
            &text,
            "exactly_transactions_total",
            &[("outcome", "aborted")]
        ),
        aborts
    );
    // Produced counts what was handed to the producer, aborted transactions included (an
    // abort purges what was not sent yet, so the log may hold fewer).
    let written = read_all(&topics.output, "read_uncommitted").len() as f64;
    assert!(metric(&text, "exactly_records_produced_total", &[]) >= written);
    assert_eq!(read_all(&topics.output, "read_committed").len(), 900);
    // Records consumed, filtered and dead-lettered count what committed: a record replayed
    // after an abort is counted once.
    assert_eq!(
        metric(&text, "exactly_records_consumed_total", &[]),
        1_010.0
    );
    assert_eq!(metric(&text, "exactly_records_filtered_total", &[]), 100.0);
    assert_eq!(
        metric(
            &text,
            "exactly_records_dlq_total",
            &[("reason", "not_json")]
        ),
        10.0
    );
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
}

#[test]
fn livez_fails_when_the_loop_is_wedged_and_the_grace_bounds_shutdown() {
    let topics = Topics::create("obs-wedge", 1, 1);
    let group = unique("obs-wedge-g");
    // A program that runs for ages on one record without yielding anything.
    let program = "if .stall then last(range(1e15)) else . end";
    produce(&topics.input, &[In::json(0, "k", json!({"stall": true}))]);
    let mut args = base_args(&topics, &group, "obs-wedge-0");
    args.extend(
        [
            "--jq",
            program,
            "--transaction-timeout",
            "6s",
            "--shutdown-grace",
            "2s",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    // The bound is the transaction timeout + 15 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let (status, body) = get(&addr, "/livez").unwrap();
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "/livez stayed {status}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        body.contains("not turned") || body.contains("stuck"),
        "{body}"
    );
    // The metrics endpoint still answers while the loop is wedged.
    assert_eq!(get(&addr, "/metrics").unwrap().0, 200);
    // SIGTERM cannot finish in the 2 s grace: exit 3, nothing committed.
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(10)).code(), Some(3));
    assert!(committed(&group, &topics.input).is_empty());
}

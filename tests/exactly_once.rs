//! Exactly-once against the real broker: a clean run, aborted transactions, and kill -9.
//!
//! Every check reads the output the way a downstream consumer does (read_committed) and
//! matches each output to its input through the lineage header.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdkafka::producer::Producer;

#[test]
fn twenty_thousand_records_through_jq_exactly_once() {
    let topics = Topics::create("clean", 3, 3);
    let group = unique("clean-g");
    produce(&topics.input, &numbered(20_000, 3));

    let mut args = base_args(&topics, &group, "clean-0");
    args.extend(["--jq".into(), DOUBLE.into()]);
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        ex.wait(Duration::from_secs(15)).success(),
        "{}",
        ex.log_text()
    );

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, doubled);
    assert_eq!(expected.len(), 20_000);
    let checked = assert_exactly_once(&outputs, &expected);
    assert_eq!(checked, 20_000);
    // The group's offsets are exactly the input's end, also after the final commit of the
    // shutdown: nothing left, nothing committed past what was read.
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    // Keys carry over: every output keeps the key of the input it came from.
    for o in &outputs {
        let id = o.json()["id"].as_i64().unwrap();
        assert_eq!(
            o.key.as_deref(),
            Some(format!("k{id}").as_bytes()),
            "{:?}",
            o.lineage()
        );
    }
    eprintln!("clean run: {checked} outputs, each exactly once, duplicates found: 0");
}

#[test]
fn aborted_transactions_are_invisible_to_read_committed() {
    let topics = Topics::create("abort", 2, 2);
    let group = unique("abort-g");
    produce(&topics.input, &numbered(3_000, 2));

    let mut args = base_args(&topics, &group, "abort-0");
    args.extend(
        [
            "--jq",
            DOUBLE,
            "--max-records-per-txn",
            "200",
            "--test-abort-every",
            "3",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());

    let aborts = ex.events("transaction aborted");
    assert!(
        aborts.len() >= 3,
        "expected several injected aborts, log:\n{}",
        ex.log_text()
    );
    assert!(aborts.iter().all(|e| e["reason"] == "test_injected"));
    assert!(!ex.events("rewound to the committed offsets").is_empty());

    // The aborted records were written: read_uncommitted sees them, as duplicates.
    let uncommitted = read_all(&topics.output, "read_uncommitted");
    assert!(
        uncommitted.len() > 3_000,
        "aborted records should be in the log: {}",
        uncommitted.len()
    );
    // read_committed sees each output exactly once.
    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, doubled);
    assert_exactly_once(&outputs, &expected);
    eprintln!(
        "aborts: {} injected; read_uncommitted {} records, read_committed {} (duplicates found: 0)",
        aborts.len(),
        uncommitted.len(),
        outputs.len()
    );
}

/// kill -9, then a restart of the same instance at once, with the shipped defaults (librdkafka's
/// 45 s session and 3 s heartbeat): nothing is lost or doubled, and the restart commits within
/// seconds. Under the classic protocol the instance is a static member by default: its restart
/// takes its old place back without waiting for the dead member's session.
#[test]
fn kill_9_mid_stream_then_restart_resumes_within_seconds_and_loses_nothing() {
    let topics = Topics::create("kill", 3, 3);
    let group = unique("kill-g");
    let total = 100_000;
    produce(&topics.input, &numbered(total, 3));

    let mut args = with_shipped_session(base_args(&topics, &group, "kill-0"));
    args.extend(["--jq", DOUBLE].map(String::from));
    let mut first = Exactly::start(&args);
    let at_kill = wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(120));
    first.kill9();
    // What the dead process left: committed outputs, and (usually) an open transaction.
    let after_kill = committed_total(&group, &topics.input);
    assert!(
        after_kill < total as i64,
        "the kill came after the end ({at_kill}, {after_kill}); not mid-stream"
    );

    let started = Instant::now();
    let mut second = Exactly::start(&args);
    // The restart's own first commit (its counter), not the group's offsets: a commit the
    // killed process sent just before the kill may land after `after_kill` was read.
    let addr = http_addr(&second);
    let committed = |text: &str| {
        metric(
            text,
            "exactly_transactions_total",
            &[("outcome", "committed")],
        ) + metric(text, "exactly_offsets_only_commits_total", &[])
    };
    while get(&addr, "/metrics").is_none_or(|(_, text)| committed(&text) == 0.0) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{}",
            second.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let resumed = started.elapsed();
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    let recovery = started.elapsed();
    second.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(second.wait(Duration::from_secs(15)).success());

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, doubled);
    let n = assert_exactly_once(&outputs, &expected);
    eprintln!(
        "kill -9 after {after_kill} of {total} committed; the restart committed after \
         {resumed:?} and finished in {recovery:?}; {n} outputs exactly once (duplicates found: 0)"
    );
    // The consumer protocol's members are dynamic by default: the broker's session (6 s on
    // the test brokers) passes first.
    let bound = match group_protocol().as_str() {
        "classic" => Duration::from_secs(5),
        _ => Duration::from_secs(15),
    };
    assert!(
        resumed <= bound,
        "the restart first committed after {resumed:?}, more than {bound:?}: {}",
        second.log_text()
    );
}

/// A send that fails before anything was committed: on a fresh group no partition has a
/// committed offset, so the rewind must go back to every record that was polled and not
/// committed (the failed record itself, and the one polled while the rewind was pending),
/// not only to records the aborted transaction had counted.
#[test]
fn a_failed_send_on_a_fresh_group_loses_nothing() {
    let topics = Topics::create("fresh", 6, 2);
    let group = unique("fresh-g");
    produce(&topics.input, &numbered(18, 6));

    let mut args = base_args(&topics, &group, "fresh-0");
    args.extend(["--jq", DOUBLE, "--test-fail-sends", "3"].map(String::from));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());
    assert_eq!(ex.events("test switch: failing this send").len(), 3);

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, doubled);
    assert_eq!(assert_exactly_once(&outputs, &expected), 18);
}

/// A transactional upstream leaves a marker after every transaction. The group's offsets must
/// end past the last one (the consumer's position), or every tool that reads the group's lag
/// shows 1 per partition forever; and never past a record not processed.
#[test]
fn offsets_pass_the_markers_of_a_transactional_upstream() {
    let topics = Topics::create("markers", 2, 2);
    let group = unique("markers-g");
    let records = numbered(25, 2);
    let upstream = Writer::transactional(&unique("upstream"));
    let p = upstream.producer();
    for (range, commit) in [(0..10, true), (10..15, false), (15..25, true)] {
        p.begin_transaction().unwrap();
        upstream.write(&topics.input, &records[range]);
        if commit {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }

    let mut args = base_args(&topics, &group, "markers-0");
    args.extend(["--jq", DOUBLE].map(String::from));
    let mut ex = Exactly::start(&args);
    // The end offsets count the markers: 3 per partition.
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, doubled);
    assert_eq!(assert_exactly_once(&outputs, &expected), 20);
}

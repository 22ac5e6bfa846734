//! `--guarantee at-least-once` against the real broker: no transactions, offsets committed
//! only after delivery, so a crash or a dropped batch duplicates outputs and never loses one.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;

/// Every expected output present with the right value; returns how many extra copies.
fn assert_at_least_once(
    outputs: &[Out],
    expected: &HashMap<(String, i32, i64, usize), Value>,
) -> usize {
    let mut seen: HashMap<_, usize> = HashMap::new();
    for o in outputs {
        let lineage = o.lineage();
        assert_eq!(
            Some(&o.json()),
            expected.get(&lineage),
            "wrong or unexpected output {lineage:?}"
        );
        *seen.entry(lineage).or_default() += 1;
    }
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !seen.contains_key(*k))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "lost outputs (first 5): {missing:?}");
    outputs.len() - expected.len()
}

fn args(topics: &Topics, group: &str, instance: &str, extra: &[&str]) -> Vec<String> {
    let mut args = base_args(topics, group, instance);
    args.extend(["--guarantee", "at-least-once", "--jq", DOUBLE].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn without_transactions_every_output_arrives_and_no_marker_is_written() {
    let topics = Topics::create("alo", 3, 3);
    let group = unique("alo-g");
    produce(&topics.input, &numbered(6_000, 3));
    let mut ex = Exactly::start(&args(&topics, &group, "alo-0", &[]));
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
    // Nothing failed: at least once drops a batch (instead of aborting a transaction) only
    // when something did.
    assert!(
        ex.events("batch dropped; rewinding (at least once)")
            .is_empty(),
        "{}",
        ex.log_text()
    );

    let outputs = read_all(&topics.output, "read_uncommitted");
    let expected = expected_outputs(&topics.input, doubled);
    // Nothing failed: no copies either.
    assert_eq!(assert_at_least_once(&outputs, &expected), 0);
    // No transaction markers: the output's end offsets count exactly its records (a
    // transactional producer leaves a commit marker behind every transaction).
    let end: i64 = end_offsets(&topics.output).values().sum();
    assert_eq!(end, outputs.len() as i64);
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));
}

#[test]
fn dropped_batches_and_kill_9_duplicate_but_never_lose() {
    let topics = Topics::create("alo-kill", 3, 3);
    let group = unique("alo-kill-g");
    let total = 20_000;
    produce(&topics.input, &numbered(total, 3));
    // Every 4th batch dropped instead of committed, through the same path as a failed
    // delivery: its outputs stay, its offsets are not committed, the input comes again.
    let extra = ["--max-records-per-txn", "500", "--test-abort-every", "4"];
    let mut first = Exactly::start(&args(&topics, &group, "alo-kill-0", &extra));
    let at_kill = wait_committed_at_least(&group, &topics.input, 2_000, Duration::from_secs(120));
    first.kill9();
    assert!(at_kill < total as i64, "not mid-stream: {at_kill}");
    let dropped = first
        .events("batch dropped; rewinding (at least once)")
        .len();
    assert!(dropped >= 1, "{}", first.log_text());

    let mut second = Exactly::start(&args(&topics, &group, "alo-kill-1", &[]));
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    second.signal(Signal::SIGTERM);
    assert_eq!(second.wait(Duration::from_secs(15)).code(), Some(0));

    let outputs = read_all(&topics.output, "read_uncommitted");
    let expected = expected_outputs(&topics.input, doubled);
    let copies = assert_at_least_once(&outputs, &expected);
    assert!(copies > 0, "dropped batches and a kill must leave copies");
    eprintln!(
        "at least once: {dropped} batches dropped, kill -9 after {at_kill} of {total}; \
         {} outputs, {copies} duplicates, lost: 0",
        outputs.len()
    );
}

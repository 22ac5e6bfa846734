//! Bad records: to the DLQ exactly once with their reason (dlq), or stop the pipeline (fail).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Fails for `"n": "x"` (string + number); fine for numbers.
const NEXT: &str = "{id, next: (.n + 1)}";

#[test]
fn poison_records_land_in_the_dlq_exactly_once_and_good_ones_flow() {
    let topics = Topics::create("dlq", 3, 2);
    let group = unique("dlq-g");
    let mut inputs = Vec::new();
    for i in 0..3_000usize {
        let p = (i % 3) as i32;
        let key = format!("k{i}");
        inputs.push(match i % 100 {
            7 => In::raw(p, &key, b"this is not json"),
            57 => In::json(p, &key, json!({"id": i, "n": "x"})),
            _ => In::json(p, &key, json!({"id": i, "n": i})),
        });
        if i % 100 == 7 {
            inputs
                .last_mut()
                .unwrap()
                .headers
                .push(("trace".into(), b"t-1".to_vec()));
        }
    }
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "dlq-0");
    args.extend(["--jq", NEXT, "--max-records-per-txn", "500"].map(String::from));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());

    // Good records: each output exactly once.
    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, |v: &Value| match v["n"].as_i64() {
        Some(n) => vec![json!({"id": v["id"], "next": n + 1})],
        None => vec![],
    });
    assert_eq!(expected.len(), 2_940);
    assert_exactly_once(&outputs, &expected);

    // Poison records: each in the DLQ exactly once, unchanged, with the reason and its source.
    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(dlq.len(), 60, "{dlq:#?}");
    let input_by_offset: HashMap<(i32, i64), Out> = read_all(&topics.input, "read_committed")
        .into_iter()
        .map(|r| ((r.partition, r.offset), r))
        .collect();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    let mut sources = std::collections::HashSet::new();
    for d in &dlq {
        let p: i32 = d.header(SOURCE_PARTITION).unwrap().parse().unwrap();
        let o: i64 = d.header(SOURCE_OFFSET).unwrap().parse().unwrap();
        assert_eq!(
            d.header(SOURCE_TOPIC).as_deref(),
            Some(topics.input.as_str())
        );
        assert!(sources.insert((p, o)), "DLQ record for {p}/{o} twice");
        let original = &input_by_offset[&(p, o)];
        assert_eq!(d.key, original.key);
        assert_eq!(d.value, original.value);
        assert_eq!(d.lineage(), (topics.input.clone(), p, o, 0));
        let reason = d.header(ERROR_REASON).unwrap();
        match reason.as_str() {
            "not_json" => assert_eq!(d.header("trace").as_deref(), Some("t-1")),
            "jq_error" => assert!(d.header(ERROR_MESSAGE).unwrap().contains("cannot"), "{d:?}"),
            other => panic!("unexpected reason {other}"),
        }
        *reasons.entry(reason).or_default() += 1;
    }
    assert_eq!(reasons["not_json"], 30);
    assert_eq!(reasons["jq_error"], 30);
    // No record is both an output and a DLQ record.
    for o in &outputs {
        let (_, p, off, _) = o.lineage();
        assert!(
            !sources.contains(&(p, off)),
            "{p}/{off} is in both output and DLQ"
        );
    }
    eprintln!(
        "DLQ: {} records ({reasons:?}), {} outputs; duplicates found: 0",
        dlq.len(),
        outputs.len()
    );
}

#[test]
fn on_error_fail_stops_without_committing_the_bad_record() {
    let topics = Topics::create("fail", 1, 1);
    let group = unique("fail-g");
    let mut inputs = numbered(50, 1);
    inputs.insert(30, In::raw(0, "bad", b"{broken"));
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "fail-0");
    args.extend(["--jq", NEXT, "--on-error", "fail"].map(String::from));
    let mut ex = Exactly::start(&args);
    let status = ex.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(1), "{}", ex.log_text());
    let log = ex.log_text();
    assert!(
        log.contains(&format!("{}/0/30", topics.input)),
        "names the record: {log}"
    );
    assert!(log.contains("--on-error fail"), "{log}");

    // Whatever was committed stops before the bad record, and matches the outputs one to one.
    let done = committed(&group, &topics.input)
        .get(&0)
        .copied()
        .unwrap_or(0);
    assert!(done <= 30, "committed past the bad record: {done}");
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(outputs.len() as i64, done);
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
}

#[test]
fn on_error_skip_drops_and_moves_on() {
    let topics = Topics::create("skip", 1, 1);
    let group = unique("skip-g");
    let mut inputs = numbered(20, 1);
    inputs.insert(5, In::raw(0, "bad", b"nope"));
    produce(&topics.input, &inputs);

    let mut args = base_args(&topics, &group, "skip-0");
    args.extend(["--jq", NEXT, "--on-error", "skip"].map(String::from));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());
    assert_eq!(read_all(&topics.output, "read_committed").len(), 20);
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    assert_eq!(ex.events("record skipped").len(), 1);
}

#[test]
fn an_unavailable_transform_never_dead_letters_and_each_record_lands_once() {
    let topics = Topics::create("unavail", 1, 1);
    let group = unique("unavail-g");
    produce(&topics.input, &numbered(20, 1));

    let mut args = base_args(&topics, &group, "unavail-0");
    // The first three applies say "unavailable": each aborts, rewinds and comes again.
    args.extend(["--jq", NEXT, "--test-unavailable", "3"].map(String::from));
    let mut ex = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(ex.wait(Duration::from_secs(15)).success());

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, |v: &Value| {
        vec![json!({"id": v["id"], "next": v["n"].as_i64().unwrap() + 1})]
    });
    assert_exactly_once(&outputs, &expected);
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    assert_eq!(
        ex.events("transform unavailable; aborting, rewinding and backing off")
            .len(),
        3,
        "{}",
        ex.log_text()
    );
    let aborts = ex.events("transaction aborted");
    assert_eq!(aborts.len(), 3, "{}", ex.log_text());
    assert!(
        aborts
            .iter()
            .all(|e| e["reason"] == "transform_unavailable"),
        "{aborts:?}"
    );
}

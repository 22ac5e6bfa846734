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

/// Routes a record to `.route` when it has one, else to the output topic.
const ROUTE: &str = "if .route then {topic: .route, value: .} else {value: .} end";

/// Records `{"id": i}` for `ids` over `partitions`; those `picked` are routed to `topic`.
fn routed(
    ids: std::ops::Range<usize>,
    partitions: usize,
    picked: impl Fn(usize) -> bool,
    topic: &str,
) -> Vec<In> {
    ids.map(|i| {
        let v = if picked(i) {
            json!({"id": i, "route": topic})
        } else {
            json!({"id": i})
        };
        In::json((i % partitions) as i32, &format!("k{i}"), v)
    })
    .collect()
}

/// What exactly logs when an output's topic refuses it.
const REFUSED: &str = "an output's topic refuses it; aborting, rewinding, backing off";

#[test]
fn a_record_routed_to_a_missing_topic_goes_to_the_dlq_once_the_route_timeout_passes() {
    let topics = Topics::create("route", 3, 2);
    let group = unique("route-g");
    let missing = unique("route-missing");
    produce(
        &topics.input,
        &routed(0..3_000, 3, |i| i == 1_500, &missing),
    );

    let mut args = base_args(&topics, &group, "route-0");
    args.extend(
        [
            "--jq",
            ROUTE,
            "--envelope",
            "--route-timeout",
            "20s",
            "--max-records-per-txn",
            "500",
            // Below librdkafka's 30 s to call a topic missing: the refusal must come first.
            "--transaction-timeout",
            "10s",
        ]
        .map(String::from),
    );
    let started = std::time::Instant::now();
    let mut ex = Exactly::start(&args);
    // Held back for the bound (and librdkafka's 30 s to call a topic missing), not for ever.
    wait_all_committed(&group, &topics.input, Duration::from_secs(150));
    let took = started.elapsed();
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.stop_cleanly();

    let outputs = read_all(&topics.output, "read_committed");
    let expected = expected_outputs(&topics.input, |v: &Value| {
        if v["route"].is_string() {
            vec![]
        } else {
            vec![v.clone()]
        }
    });
    assert_eq!(expected.len(), 2_999);
    assert_exactly_once(&outputs, &expected);

    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(dlq.len(), 1, "{dlq:#?}");
    let d = &dlq[0];
    assert_eq!(d.header(ERROR_REASON).as_deref(), Some("route_refused"));
    let message = d.header(ERROR_MESSAGE).unwrap_or_default();
    assert!(message.contains(&missing), "{message}");
    assert_eq!(d.json()["id"], 1_500);
    let aborts = ex.events("transaction aborted");
    assert!(
        aborts.iter().any(|e| e["reason"] == "route_refused"),
        "{aborts:?}"
    );
    // The route was retried for the bound before its record became a bad one (less the
    // pause before its last retry: a back-off of up to 5 s, and 5 s for a new producer to
    // call the topic missing).
    let at = |e: &Value| {
        humantime::parse_rfc3339_weak(e["timestamp"].as_str().unwrap_or_default())
            .unwrap_or_else(|_| panic!("{e}"))
    };
    let refusals = ex.events(REFUSED);
    let (first, last) = (at(&refusals[0]), at(&refusals[refusals.len() - 1]));
    let retried = last.duration_since(first).unwrap_or_default();
    assert!(
        retried >= Duration::from_secs(10),
        "retried for {retried:?} only"
    );
    // The audit takes the DLQ copy for the output no replay can say was refused.
    let (code, report) = audit_of(&topics, &group, &["--jq", ROUTE, "--envelope"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["route_refused"], 1, "{report:#}");
    eprintln!(
        "route to a missing topic: 2,999 outputs, 1 in the DLQ, all committed after {took:?} \
         (--route-timeout 20s), {} aborts",
        aborts.len()
    );
}

#[test]
fn a_topic_created_30_s_late_still_gets_the_records_routed_to_it() {
    let topics = Topics::create("late", 2, 1);
    let group = unique("late-g");
    let late = unique("late-topic");
    produce(&topics.input, &routed(0..200, 2, |i| i % 7 == 3, &late));

    let mut args = base_args(&topics, &group, "late-0");
    args.extend(["--jq", ROUTE, "--envelope"].map(String::from));
    let started = std::time::Instant::now();
    let mut ex = Exactly::start(&args);
    // Created once exactly has been refused (librdkafka calls a topic missing after 30 s).
    ex.wait_log("the route refused", Duration::from_secs(90), |ex| {
        !ex.events(REFUSED).is_empty()
    });
    create_topics(&[(&late, 1)]);
    let created = started.elapsed();
    wait_all_committed(&group, &topics.input, Duration::from_secs(150));
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.stop_cleanly();

    let routed = read_all(&late, "read_committed");
    let expected = expected_outputs(&topics.input, |v: &Value| {
        if v["route"].is_string() {
            vec![v.clone()]
        } else {
            vec![]
        }
    });
    assert_eq!(expected.len(), 29);
    assert_exactly_once(&routed, &expected);
    let outputs = read_all(&topics.output, "read_committed");
    assert_eq!(outputs.len(), 171);
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    eprintln!("a route created {created:?} after the start got its 29 records, none in the DLQ");
}

#[test]
fn a_route_past_the_bound_is_tried_again_and_takes_records_once_it_exists() {
    let topics = Topics::create("quarantine", 1, 1);
    let group = unique("quarantine-g");
    let late = unique("quarantine-topic");
    let batch = |from: usize| routed(from..from + 20, 1, |i| i % 5 == 0, &late);
    produce(&topics.input, &batch(0));
    let mut args = base_args(&topics, &group, "quarantine-0");
    args.extend(
        [
            "--jq",
            ROUTE,
            "--envelope",
            "--route-timeout",
            "10s",
            "--transaction-timeout",
            "10s",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    // Past the bound: the first records routed there are bad ones.
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    assert_eq!(read_all(&topics.dlq, "read_committed").len(), 4);
    // The topic appears; records routed there after the quarantine get there.
    create_topics(&[(&late, 1)]);
    let batches = std::cell::Cell::new(1);
    ex.wait_log("records in the new topic", Duration::from_secs(120), |ex| {
        if committed_total(&group, &topics.input) == 20 * batches.get() as i64 {
            produce(&topics.input, &batch(20 * batches.get()));
            batches.set(batches.get() + 1);
        }
        ex.has_exited() || !read_all(&late, "read_committed").is_empty()
    });
    let batches = batches.get();
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.stop_cleanly();

    // Every routed input exactly once in the new topic or the DLQ, the others in the output.
    let outputs = read_all(&topics.output, "read_committed");
    let dlq = read_all(&topics.dlq, "read_committed");
    let routed = read_all(&late, "read_committed");
    let inputs = 20 * batches;
    assert_eq!(outputs.len(), inputs * 4 / 5);
    assert_eq!(dlq.len() + routed.len(), inputs / 5, "{dlq:#?} {routed:#?}");
    let mut ids: Vec<i64> = dlq
        .iter()
        .chain(&routed)
        .map(|r| r.json()["id"].as_i64().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), inputs / 5);
    assert!(
        dlq.iter()
            .all(|d| d.header(ERROR_REASON).as_deref() == Some("route_refused"))
    );
    eprintln!(
        "quarantined route: {} in the DLQ, then {} in the topic created after the bound",
        dlq.len(),
        routed.len()
    );
}

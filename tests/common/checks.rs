//! Assertions and waits: committed offsets reaching a point, settled transactions, the
//! exactly-once check of an output, and the metric families exactly exports.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::broker::{committed, committed_total, end_offsets, stability};
use super::data::Out;

/// Waits until the group's committed offsets have reached the input's end on every partition
/// (at or past it: a test that must see exactly the end asserts that itself).
pub fn wait_all_committed(group: &str, topic: &str, timeout: Duration) {
    let end = end_offsets(topic);
    let deadline = Instant::now() + timeout;
    loop {
        let c = committed(group, topic);
        if end.iter().all(|(p, e)| c.get(p).is_some_and(|o| o >= e)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed {c:?}, input ends at {end:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until the group has committed at least `n` input offsets; returns how many.
pub fn wait_committed_at_least(group: &str, topic: &str, n: i64, timeout: Duration) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let c = committed_total(group, topic);
        if c >= n {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed only {c} of {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks a read_committed output against the expected outputs, keyed by lineage:
/// every expected output exactly once, nothing else, and per source partition in order on
/// each output partition. Returns the number of records checked.
pub fn assert_exactly_once(
    outputs: &[Out],
    expected: &HashMap<(String, i32, i64, usize), serde_json::Value>,
) -> usize {
    let mut seen: HashMap<(String, i32, i64, usize), usize> = HashMap::new();
    for o in outputs {
        *seen.entry(o.lineage()).or_default() += 1;
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        duplicates.is_empty(),
        "duplicated outputs (lineage, count): {duplicates:?}"
    );
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !seen.contains_key(*k))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "lost outputs (first 5): {missing:?}");
    let unexpected: Vec<_> = seen
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected outputs (first 5): {unexpected:?}"
    );
    for o in outputs {
        let want = &expected[&o.lineage()];
        assert_eq!(&o.json(), want, "wrong value for {:?}", o.lineage());
    }
    // Order: on each output partition, the outputs of one source partition keep its order.
    let mut last: HashMap<(i32, String, i32), (i64, usize)> = HashMap::new();
    let mut sorted: Vec<&Out> = outputs.iter().collect();
    sorted.sort_by_key(|o| (o.partition, o.offset));
    for o in sorted {
        let (t, p, off, idx) = o.lineage();
        if let Some(prev) = last.insert((o.partition, t.clone(), p), (off, idx)) {
            assert!(
                prev < (off, idx),
                "order broken on output partition {}: {prev:?} then {:?}",
                o.partition,
                (off, idx)
            );
        }
    }
    assert_eq!(outputs.len(), expected.len());
    outputs.len()
}

/// Waits until no transaction is open on any partition of `topic` (LSO == high watermark).
pub fn wait_stable(topic: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stability(topic);
        if s.iter().all(|(_, lso, hw)| lso == hw) {
            return;
        }
        assert!(Instant::now() < deadline, "{topic} never settled: {s:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every metric family exactly exports (its own catalogue: docs/metrics.md is checked against
/// the same list in tests/docs.rs).
#[allow(dead_code)]
pub fn metric_families() -> Vec<String> {
    exactly::metrics::Metrics::new()
        .catalog()
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

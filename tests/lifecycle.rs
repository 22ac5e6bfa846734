//! Process lifecycle: SIGTERM with a clean exit and resume, and two instances of one group.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::json;

#[test]
fn sigterm_mid_stream_exits_zero_within_grace_and_restart_resumes() {
    let topics = Topics::create("term", 3, 3);
    let group = unique("term-g");
    let total = 30_000;
    produce(&topics.input, &numbered(total, 3));

    let mut args = base_args(&topics, &group, "term-0");
    args.extend(["--jq", DOUBLE, "--shutdown-grace", "10s"].map(String::from));
    let mut first = Exactly::start(&args);
    wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(120));
    let signalled = Instant::now();
    first.signal(Signal::SIGTERM);
    let status = first.wait(Duration::from_secs(20));
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{}", first.log_text());
    assert!(
        took < Duration::from_secs(10),
        "exit took {took:?}, beyond the 10 s grace"
    );
    assert!(!first.events("exactly stopped").is_empty());

    // Everything the first run consumed was committed with its outputs: the committed
    // offsets and the visible outputs agree, and the run stopped mid-stream.
    let done = committed_total(&group, &topics.input);
    assert!(done > 0 && done < total as i64, "not mid-stream: {done}");
    assert_eq!(
        read_all(&topics.output, "read_committed").len() as i64,
        done
    );
    // A clean stop leaves nothing to abort: no record beyond the committed ones was written.
    assert_eq!(
        read_all(&topics.output, "read_uncommitted").len() as i64,
        done
    );

    let mut second = Exactly::start(&args);
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    second.signal(Signal::SIGTERM);
    assert_eq!(second.wait(Duration::from_secs(15)).code(), Some(0));

    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!(
        "SIGTERM after {done} of {total}: exit 0 in {took:?}; restart resumed; {n} outputs \
         exactly once (duplicates found: 0)"
    );
}

#[test]
fn two_instances_share_partitions_and_survive_losing_one() {
    let topics = Topics::create("pair", 6, 3);
    let group = unique("pair-g");

    // a's open transaction at the kill holds its partitions' offsets as unstable until the
    // coordinator times it out (no one else has its transactional id to fence it): the
    // failover takes about session timeout + transaction timeout, so keep the latter short.
    let extra = ["--jq", DOUBLE, "--transaction-timeout", "10s"].map(String::from);
    let mut a_args = base_args(&topics, &group, "pair-a");
    a_args.extend(extra.clone());
    let mut b_args = base_args(&topics, &group, "pair-b");
    b_args.extend(extra);
    let mut a = Exactly::start(&a_args);
    a.wait_log("a owns partitions", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) == 6)
    });
    let b = Exactly::start(&b_args);
    // Cooperative rebalance: a gives up some partitions, b takes them.
    b.wait_log("b owns partitions", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) > 0)
    });
    a.wait_log("a gave some up", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) < 6)
    });
    let (owned_a, owned_b) = (a.owned().unwrap(), b.owned().unwrap());
    assert_eq!(count_partitions(&owned_a) + count_partitions(&owned_b), 6);

    let total = 40_000;
    produce(&topics.input, &numbered(total, 6));
    wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(120));
    a.kill9();
    let killed = Instant::now();
    // b takes over a's partitions once a's session times out.
    b.wait_log("b owns everything", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) == 6)
    });
    let took_over = killed.elapsed();
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    let finished = killed.elapsed();
    let mut b = b;
    b.signal(Signal::SIGTERM);
    assert_eq!(b.wait(Duration::from_secs(15)).code(), Some(0));

    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!(
        "two instances: a={owned_a} b={owned_b}; a killed; b owned all 6 after {took_over:?}, \
         all committed {finished:?} after the kill; {n} outputs exactly once (duplicates found: 0)"
    );
}

/// One of two instances stopped for good (a scale-down), with the shipped defaults
/// (librdkafka's 45 s session, 3 s heartbeat): the survivor owns every partition within
/// seconds. A static
/// member (the classic protocol's default) sends no LeaveGroup when it closes (KIP-345);
/// exactly unsubscribes first so that it leaves all the same.
#[test]
fn a_stopped_instance_hands_its_partitions_over_at_once() {
    let topics = Topics::create("down", 6, 3);
    let group = unique("down-g");
    let args = |instance| {
        let mut args = with_shipped_session(base_args(&topics, &group, instance));
        args.extend(["--jq", DOUBLE].map(String::from));
        args
    };
    let mut a = Exactly::start(&args("down-a"));
    a.wait_log("a owns partitions", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) == 6)
    });
    let mut b = Exactly::start(&args("down-b"));
    b.wait_log("b owns partitions", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) > 0)
    });
    a.wait_log("a gave some up", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) < 6)
    });
    produce(&topics.input, &numbered(20_000, 6));
    wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(120));

    let stopped = Instant::now();
    b.stop_cleanly();
    a.wait_log("a owns everything", Duration::from_secs(90), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) == 6)
    });
    let took_over = stopped.elapsed();
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    a.stop_cleanly();

    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!(
        "scale-down: b stopped (SIGTERM); a owned all 6 after {took_over:?}; {n} outputs \
         exactly once (duplicates found: 0)"
    );
    // The survivor hears of the leave at its next heartbeat (3 s), then rejoins.
    assert!(
        took_over <= Duration::from_secs(8),
        "a owned b's partitions {took_over:?} after b's SIGTERM: b did not leave the group"
    );
}

/// A second process of one instance on one host (the default instance id is the host name)
/// exits 5 at once, naming the clash, before it opens a client; the first one is undisturbed.
/// Once the first is killed (-9), the instance is free again.
#[test]
fn a_second_process_of_one_instance_on_a_host_exits_5_naming_the_clash() {
    let topics = Topics::create("clash", 3, 3);
    let group = unique("clash-g");
    let mut args = base_args(&topics, &group, "clash-0");
    args.extend(["--jq", DOUBLE].map(String::from));
    let mut a = Exactly::start(&args);
    a.wait_log("a running", Duration::from_secs(60), |e| {
        !e.events("exactly running").is_empty()
    });
    let started = Instant::now();
    let mut b = Exactly::start(&args);
    let status = b.wait(Duration::from_secs(30));
    let took = started.elapsed();
    assert_eq!(status.code(), Some(5), "{}", b.log_text());
    let log = b.log_text();
    assert!(
        log.contains("another exactly process on this host")
            && log.contains(&group)
            && log.contains("--instance-id"),
        "{log}"
    );
    assert!(b.events("exactly running").is_empty(), "{log}");
    assert!(!a.has_exited(), "{}", a.log_text());

    produce(&topics.input, &numbered(3_000, 3));
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    a.kill9();
    let mut c = Exactly::start(&args);
    c.wait_log("c running", Duration::from_secs(60), |e| {
        !e.events("exactly running").is_empty()
    });
    c.stop_cleanly();
    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!("the second process exited 5 after {took:?}; {n} outputs exactly once");
    assert!(took < Duration::from_secs(5), "exit 5 took {took:?}");
}

/// A rolling restart of three instances under steady input, with the shipped defaults
/// (librdkafka's 45 s session, 3 s heartbeat): each in turn gets SIGTERM, stays down for 12 s (a pod being
/// replaced), and starts again. The stopped one leaves the group, so the other two take its
/// partitions at once instead of after its session (or its return): no partition with input
/// waiting goes more than 10 s without a commit. Output exactly once.
#[test]
fn a_rolling_restart_of_three_keeps_every_partition_moving() {
    let topics = Topics::create("roll", 6, 3);
    let group = unique("roll-g");
    let args = |i: usize| {
        let mut args = with_shipped_session(base_args(&topics, &group, &format!("roll-{i}")));
        args.extend(["--jq", DOUBLE].map(String::from));
        args
    };
    let mut live: Vec<Exactly> = (0..3).map(|i| Exactly::start(&args(i))).collect();
    for e in &live {
        e.wait_log("each owns partitions", Duration::from_secs(90), |e| {
            e.owned().is_some_and(|o| count_partitions(&o) > 0)
        });
    }

    // Steady input, about 1,000 records a second, and a watch on every partition's commits.
    let stop = Arc::new(AtomicBool::new(false));
    let input = {
        let (stop, topic) = (stop.clone(), topics.input.clone());
        std::thread::spawn(move || {
            let writer = Writer::new();
            let mut next = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<In> = (next..next + 100)
                    .map(|i| In::json(i as i32 % 6, &format!("k{i}"), json!({"id": i, "n": i})))
                    .collect();
                writer.write(&topic, &batch);
                next += 100;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let watch = {
        let (stop, group, topic) = (stop.clone(), group.clone(), topics.input.clone());
        std::thread::spawn(move || longest_stall(&group, &topic, &stop))
    };

    let mut downs = Vec::new();
    for (i, slot) in live.iter_mut().enumerate() {
        std::thread::sleep(Duration::from_secs(5));
        slot.stop_cleanly();
        std::thread::sleep(Duration::from_secs(12));
        *slot = Exactly::start(&args(i));
        let back = Instant::now();
        slot.wait_log("back, owning partitions", Duration::from_secs(90), |e| {
            e.owned().is_some_and(|o| count_partitions(&o) > 0)
        });
        downs.push(back.elapsed());
    }
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    input.join().unwrap();
    let (stall, partition) = watch.join().unwrap();
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    for e in &mut live {
        e.stop_cleanly();
    }
    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!(
        "rolling restart of 3 (12 s down each): longest stall {stall:?} (partition \
         {partition}); each restart owned partitions again {downs:?} after it started; {n} \
         outputs exactly once (duplicates found: 0)"
    );
    assert!(
        stall <= Duration::from_secs(10),
        "partition {partition} went {stall:?} without a commit while input waited"
    );
}

/// The longest time any partition of `topic` with input waiting went without a commit of
/// `group`, and which partition, sampled until `stop`.
fn longest_stall(group: &str, topic: &str, stop: &AtomicBool) -> (Duration, i32) {
    let mut moved: BTreeMap<i32, (i64, Instant)> = BTreeMap::new();
    let mut longest = (Duration::ZERO, -1);
    while !stop.load(Ordering::Relaxed) {
        let (committed, ends) = (committed(group, topic), end_offsets(topic));
        let now = Instant::now();
        for (&p, &end) in &ends {
            let at = committed.get(&p).copied().unwrap_or(0);
            let (last, since) = moved.entry(p).or_insert((at, now));
            if at != *last || at >= end {
                (*last, *since) = (at, now);
            } else if now - *since > longest.0 {
                longest = (now - *since, p);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    longest
}

#[test]
fn a_fenced_static_consumer_is_replaced_and_nothing_is_lost() {
    let topics = Topics::create("fence", 3, 3);
    let group = unique("fence-g");
    let mut args = base_args(&topics, &group, "fence-0");
    args.extend(
        [
            "--jq",
            DOUBLE,
            "--membership",
            "static",
            // Two processes of one instance on one host: what the host claim refuses.
            "--test-no-host-claim",
            "--transaction-timeout",
            "10s",
        ]
        .map(String::from),
    );
    let mut a = Exactly::start(&args);
    a.wait_log("a owns partitions", Duration::from_secs(60), |e| {
        e.owned().is_some_and(|o| count_partitions(&o) == 3)
    });
    produce(&topics.input, &numbered(20_000, 3));
    wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(60));

    // A second process of the same instance (the same --instance-id on two hosts). Under the
    // classic protocol each one's join fences the other's consumer, which is replaced and
    // fences back: the first fenced a second time within 30 s yields (exit 5), naming the
    // clash, instead of the two fencing each other for ever, and the other runs on. Under the
    // consumer protocol (KIP-848) the broker refuses the newcomer instead
    // (UNRELEASED_INSTANCE_ID, fatal to its consumer): b must not take anything, and a is not
    // disturbed.
    let fenced = |e: &Exactly| !e.events("consumer fenced; replacing it").is_empty();
    if group_protocol() == "classic" {
        // The same transactional id too: each producer's init fences the other's.
        let started = Instant::now();
        let mut b = Exactly::start(&args);
        while !a.has_exited() && !b.has_exited() && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let took = started.elapsed();
        // From here on, b is the one that yielded: the first, or the newcomer.
        let which = if a.has_exited() {
            "the first"
        } else {
            "the newcomer"
        };
        if a.has_exited() {
            std::mem::swap(&mut a, &mut b);
        }
        assert!(b.has_exited(), "both run on; a's log:\n{}", a.log_text());
        assert_eq!(
            b.wait(Duration::from_secs(1)).code(),
            Some(5),
            "{}",
            b.log_text()
        );
        assert!(took < Duration::from_secs(30), "one left after {took:?}");
        let said = b.log_text();
        assert!(
            said.contains("another process runs instance 'fence-0' of group")
                && said.contains("--instance-id"),
            "{said}"
        );
        assert!(fenced(&b), "yielded at its first fencing: {said}");
        std::thread::sleep(Duration::from_secs(5));
        assert!(!a.has_exited(), "the survivor left too: {}", a.log_text());
        eprintln!("{which} yielded {took:.1?} after the newcomer started");
    } else {
        let mut b_args = args.clone();
        b_args.extend(["--transactional-id".to_string(), unique("fence-b")]);
        let mut b = Exactly::start(&b_args);
        b.wait_log("b refused its place", Duration::from_secs(60), fenced);
        assert!(
            b.log_text().contains("UnreleasedInstanceId"),
            "{}",
            b.log_text()
        );
        assert!(
            b.events("partitions assigned").is_empty(),
            "{}",
            b.log_text()
        );
        assert!(!fenced(&a), "{}", a.log_text());
        b.kill9();
    }
    assert!(!a.has_exited());
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    a.signal(Signal::SIGTERM);
    assert_eq!(
        a.wait(Duration::from_secs(15)).code(),
        Some(0),
        "{}",
        a.log_text()
    );
    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    eprintln!("fenced static consumer replaced; {n} outputs exactly once (duplicates found: 0)");
}

/// A member of the group sharing it with exactly (cooperative-sticky, as exactly's).
fn owner(group: &str, topic: &str) -> BaseConsumer {
    let owner: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    owner.subscribe(&[topic]).unwrap();
    owner
}

/// Polls `owner` until it holds `n` partitions; returns them.
fn hold(owner: &BaseConsumer, n: usize) -> Vec<i32> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        owner.poll(Duration::from_millis(100));
        let a = owner.assignment().unwrap();
        if a.count() == n {
            return a.elements().iter().map(|e| e.partition()).collect();
        }
        assert!(
            Instant::now() < until,
            "the owner never held {n} partitions"
        );
    }
}

/// `owner` dies with its offsets of `partitions` sent in a transaction that never ends: a
/// read_committed member's offset fetch for those partitions waits (unstable offsets) until
/// the transaction ends, so they are assigned to the next owner but do not fetch. Returns the
/// open transaction's producer.
fn die_with_pending_offsets(
    owner: BaseConsumer,
    topic: &str,
    partitions: &[i32],
) -> ThreadedProducer<DefaultProducerContext> {
    let txn: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("takeover-t"))
        .create()
        .unwrap();
    txn.init_transactions(Duration::from_secs(30)).unwrap();
    txn.begin_transaction().unwrap();
    let mut offsets = TopicPartitionList::new();
    for p in partitions {
        offsets
            .add_partition_offset(topic, *p, Offset::Offset(0))
            .unwrap();
    }
    let metadata = owner.group_metadata().unwrap();
    txn.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(30))
        .unwrap();
    drop(owner);
    txn
}

#[test]
fn aborts_while_a_dead_owners_partitions_wait_replace_no_consumer() {
    let topics = Topics::create("takeover", 4, 2);
    let group = unique("takeover-g");
    let mut written = 400;
    produce(&topics.input, &numbered(written, 4));
    let owner = owner(&group, &topics.input);
    hold(&owner, 4);
    let mut args = base_args(&topics, &group, "takeover-0");
    args.extend(["--jq", DOUBLE, "--test-abort-every", "2"].map(String::from));
    let mut ex = Exactly::start(&args);
    let held = hold(&owner, 2);
    // Until exactly reads its two: the owner takes part in the group meanwhile.
    let until = Instant::now() + Duration::from_secs(60);
    while ex.owned().is_none_or(|o| count_partitions(&o) < 2)
        || committed_total(&group, &topics.input) == 0
    {
        assert!(
            Instant::now() < until,
            "exactly never got going:\n{}",
            ex.log_text()
        );
        owner.poll(Duration::from_millis(100));
    }
    let txn = die_with_pending_offsets(owner, &topics.input, &held);
    let before = ex.events("transaction aborted").len();
    // Records keep coming on every partition while exactly takes the dead owner's over: its
    // own move on, one commit in two aborted and rewound, while the taken ones wait.
    let until = Instant::now() + Duration::from_secs(60);
    while ex.events("transaction aborted").len() < before + 3 {
        assert!(Instant::now() < until, "no aborts:\n{}", ex.log_text());
        let batch: Vec<In> = numbered(written + 40, 4).split_off(written);
        produce(&topics.input, &batch);
        written += 40;
        std::thread::sleep(Duration::from_millis(200));
    }
    txn.abort_transaction(Duration::from_secs(30)).unwrap();
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    for line in ["seek failed", "consumer fenced; replacing it"] {
        assert!(ex.events(line).is_empty(), "{line}:\n{}", ex.log_text());
    }
    let outputs = read_all(&topics.output, "read_committed");
    let n = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    let rewinds: Vec<String> = ex
        .events("rewound to the committed offsets")
        .iter()
        .filter_map(|e| e["partitions"].as_str().map(str::to_string))
        .collect();
    eprintln!("taken over {held:?} while they waited; rewinds: {rewinds:?}; {n} outputs once");
}

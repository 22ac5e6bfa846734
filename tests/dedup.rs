//! The dedup against the real broker (`--window`, issue 24): the seed's daily active
//! users, the first start-up event per device per day, exactly once across kill -9.
//!
//! Every check reads the outputs read_committed and finds each output's input through the
//! lineage header: the outputs must be exactly the first record of each (day, device) in its
//! partition's order.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;

const DAY: i64 = 86_400_000;

/// Midnight UTC three days ago: recent enough that the broker's retention keeps the records.
fn start() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    (now / DAY - 3) * DAY
}

/// `devices` devices over `days` days, `per_day` events each per day, in time order within a
/// partition; device `d` writes to partition `d % partitions` (its key's partition).
fn startups(devices: usize, days: i64, per_day: i64, partitions: i32) -> Vec<In> {
    let mut events = Vec::new();
    for day in 0..days {
        for n in 0..per_day {
            for d in 0..devices {
                let t = start() + day * DAY + (n * DAY / per_day) + d as i64 * 1000;
                let device = format!("dev-{d}");
                let mut r = In::json(
                    d as i32 % partitions,
                    &device,
                    serde_json::json!({"device": device, "event": "app_start", "n": n}),
                );
                r.timestamp = Some(t);
                events.push(r);
            }
        }
    }
    events
}

/// The (partition, offset) of the first record of each (UTC day, key) of `topic`, read from
/// the beginning.
fn firsts(topic: &str) -> BTreeSet<(i32, i64)> {
    let mut first: BTreeMap<(i32, i64, Vec<u8>), i64> = BTreeMap::new();
    for r in read_all(topic, "read_uncommitted") {
        let t = r.timestamp.expect("a timestamp");
        let key = (
            r.partition,
            t.div_euclid(DAY),
            r.key.clone().unwrap_or_default(),
        );
        first.entry(key).or_insert(r.offset);
    }
    first.into_iter().map(|((p, _, _), o)| (p, o)).collect()
}

fn args(topics: &Topics, group: &str, instance: &str) -> Vec<String> {
    let mut a = base_args(topics, group, instance);
    a.extend(
        [
            "--window",
            "1d",
            "--window-grace",
            "3d",
            "--max-records-per-txn",
            "200",
        ]
        .map(String::from),
    );
    a
}

/// Waits until `at_least` records of `topics.input` are committed by `group`, while `ex` runs.
fn committed_past(ex: &mut Exactly, group: &str, topics: &Topics, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while committed_total(group, &topics.input) < at_least {
        assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
        assert!(
            Instant::now() < deadline,
            "{at_least} never committed: {}",
            ex.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_first_startup_per_device_per_day_goes_on_exactly_once_across_kill_9() {
    let topics = Topics::create("dedup", 3, 3);
    let group = unique("dedup-g");
    let events = startups(90, 3, 6, 3);
    let total = events.len() as i64;
    let (early, late) = events.split_at(events.len() * 2 / 3);
    produce(&topics.input, early);

    // Killed once part of the input is committed, the state in memory lost with it (the
    // rest of the input comes after, so the restart has its state to read back).
    let mut ex = Exactly::start(&args(&topics, &group, "dedup-0"));
    committed_past(&mut ex, &group, &topics, total / 3);
    ex.kill9();
    assert!(
        committed_total(&group, &topics.input) < total,
        "killed too late to matter"
    );
    produce(&topics.input, late);

    let mut again = Exactly::start(&args(&topics, &group, "dedup-0"));
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    let log = again.log_text();
    assert!(log.contains("dedup state restored"), "{log}");
    again.stop_cleanly();

    let outputs = read_all(&topics.output, "read_committed");
    let got: Vec<(i32, i64)> = outputs
        .iter()
        .map(|o| {
            let (_, p, off, _) = o.lineage();
            (p, off)
        })
        .collect();
    let unique_got: BTreeSet<(i32, i64)> = got.iter().copied().collect();
    assert_eq!(got.len(), unique_got.len(), "an input went out twice");
    let want = firsts(&topics.input);
    assert_eq!(want.len(), 90 * 3, "one per device per day");
    assert_eq!(unique_got, want, "exactly the first of each (day, device)");
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    // The changelog: one partition per input partition, a record per key and day (plus the
    // stream times).
    let changelog = format!("{group}.dedup-changelog");
    let records = read_all(&changelog, "read_committed");
    let keys = records
        .iter()
        .filter(|r| r.key.as_deref().is_some_and(|k| k.get(1) == Some(&b'k')));
    assert_eq!(keys.count(), 90 * 3);
    assert_eq!(end_offsets(&changelog).len(), 3);

    // The audit, from the middle of each partition: what came before the range decides what
    // is first in it. Without the dedup's flags the later records look lost.
    let from = (end_offsets(&topics.input).iter())
        .map(|(p, end)| format!("{p}={}", end / 2))
        .collect::<Vec<_>>()
        .join(",");
    let audit = |dedup: &[&str]| {
        let mut a = vec!["--from-offsets", &from];
        a.extend(dedup);
        audit_of(&topics, &group, &a)
    };
    let (code, report) = audit(&["--window", "1d", "--window-grace", "3d"]);
    assert_eq!(code, 0, "{report:#}");
    assert!(
        report["replayed_before_range"].as_u64() > Some(0),
        "{report:#}"
    );
    assert!(report["dropped"].as_u64() > Some(0), "{report:#}");
    let in_range = unique_got
        .iter()
        .filter(|&&(p, off)| off >= end_offsets(&topics.input)[&p] / 2);
    assert_eq!(report["outputs"], in_range.count(), "{report:#}");
    let (code, without) = audit(&[]);
    assert_eq!(code, 1, "{without:#}");
    assert_eq!(without["lost"], report["dropped"], "{without:#}");
}

/// Two instances, partitions moving between them as the second joins and the first is killed,
/// every third transaction aborted (its changelog records too): each instance restores what
/// the other committed, never an aborted decision.
#[test]
fn partitions_moving_between_two_instances_keep_each_device_once_per_day() {
    let topics = Topics::create("dedup-moves", 4, 2);
    let group = unique("dedup-moves-g");
    let events = startups(60, 2, 8, 4);
    let total = events.len() as i64;
    let (early, late) = events.split_at(events.len() / 2);
    produce(&topics.input, early);
    let with_aborts = |instance: &str| {
        let mut a = args(&topics, &group, instance);
        a.extend(["--test-abort-every", "3"].map(String::from));
        a
    };
    let mut first = Exactly::start(&with_aborts("dedup-a"));
    committed_past(&mut first, &group, &topics, total / 4);
    let mut second = Exactly::start(&with_aborts("dedup-b"));
    second.wait_log("its share", Duration::from_secs(60), |ex| {
        ex.log_text()
            .contains(&format!("\"partitions\":\"{}[", topics.input))
    });
    // Its share's state is read back at the share's first record.
    produce(&topics.input, late);
    second.wait_log("its share restored", Duration::from_secs(60), |ex| {
        ex.log_text().contains("dedup state restored")
    });
    std::thread::sleep(Duration::from_millis(300));
    first.kill9();
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    assert!(!second.has_exited(), "{}", second.log_text());
    second.stop_cleanly();

    let outputs = read_all(&topics.output, "read_committed");
    let got: Vec<(i32, i64)> = outputs
        .iter()
        .map(|o| {
            let (_, p, off, _) = o.lineage();
            (p, off)
        })
        .collect();
    let unique_got: BTreeSet<(i32, i64)> = got.iter().copied().collect();
    assert_eq!(got.len(), unique_got.len(), "an input went out twice");
    let want = firsts(&topics.input);
    assert_eq!(want.len(), 60 * 2);
    assert_eq!(unique_got, want, "exactly the first of each (day, device)");
}

/// A changelog topic that cannot hold the state stops start-up, naming the flag and why: more
/// partitions than the input (another input's, or the input recreated smaller), or a policy
/// that never compacts. One with fewer grows (the input grew), but not before its policy is
/// checked: a topic refused is not altered.
#[test]
fn a_changelog_with_other_partitions_or_policy_stops_start_up_naming_it() {
    let topics = Topics::create("dedup-bad-cl", 3, 1);
    let group = unique("dedup-bad-cl-g");
    let wrong_count = unique("dedup-cl-4");
    create_topics(&[(&wrong_count, 4)]);
    let mut a = args(&topics, &group, "dedup-bad");
    a.extend(["--state-changelog", &wrong_count].map(String::from));
    let mut ex = Exactly::start(&a);
    assert!(!ex.wait(Duration::from_secs(60)).success());
    let log = ex.log_text();
    assert!(
        log.contains("--state-changelog") && log.contains("has 4 partitions"),
        "{log}"
    );
    // A plain topic (cleanup.policy=delete), smaller than the input: never compacted.
    let plain = unique("dedup-cl-plain");
    create_topics(&[(&plain, 2)]);
    let mut a = args(&topics, &group, "dedup-bad");
    a.extend(["--state-changelog", &plain].map(String::from));
    let mut ex = Exactly::start(&a);
    assert!(!ex.wait(Duration::from_secs(60)).success());
    let log = ex.log_text();
    assert!(log.contains("needs compact"), "{log}");
    assert!(
        !log.contains("changelog grown"),
        "altered, then refused: {log}"
    );
    assert_eq!(end_offsets(&plain).len(), 2, "its partitions as they were");
}

/// Input partitions added while exactly runs: the changelog grows with the input (partition n
/// holds input partition n's keys, so no key moves) and the new partition's records go
/// through the dedup like the others', while those never stop.
#[test]
fn input_partitions_added_while_running_grow_the_changelog_and_flow() {
    let topics = Topics::create("dedup-grow", 2, 1);
    let group = unique("dedup-grow-g");
    produce(&topics.input, &startups(20, 1, 3, 2));
    let mut a = args(&topics, &group, "grow");
    // The consumer notices the new partition within this (librdkafka's default: 5 min).
    a.extend(
        [
            "--consumer-config",
            "topic.metadata.refresh.interval.ms=1000",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&a);
    committed_past(&mut ex, &group, &topics, 60);
    add_partitions(&topics.input, 3);
    // Devices 0-19 again (duplicates of the day), and 30 on the new partition.
    let more: Vec<In> = startups(30, 1, 2, 1)
        .into_iter()
        .map(|mut r| {
            r.partition = 2;
            r
        })
        .chain(startups(20, 1, 1, 2))
        .collect();
    produce(&topics.input, &more);
    committed_past(&mut ex, &group, &topics, 60 + more.len() as i64);
    ex.stop_cleanly();
    let changelog = format!("{group}.dedup-changelog");
    assert_eq!(end_offsets(&changelog).len(), 3, "{}", ex.log_text());
    let got: Vec<(i32, i64)> = (read_all(&topics.output, "read_committed").iter())
        .map(|o| {
            let (_, p, off, _) = o.lineage();
            (p, off)
        })
        .collect();
    let unique_got: BTreeSet<(i32, i64)> = got.iter().copied().collect();
    assert_eq!(got.len(), unique_got.len(), "an input went out twice");
    assert_eq!(unique_got, firsts(&topics.input));
    assert!(
        unique_got.iter().any(|(p, _)| *p == 2),
        "the new partition's"
    );
}

/// The changelog as a previous owner left it: a key in an aborted transaction (never
/// restored: its record comes again and decides again) and one committed (restored: the
/// device was seen that day).
#[test]
fn a_restore_reads_what_committed_and_never_what_aborted() {
    use exactly::state::changelog::encode;
    use exactly::state::seen::Change;
    use rdkafka::producer::Producer;

    let topics = Topics::create("dedup-restore", 1, 1);
    let group = unique("dedup-restore-g");
    let changelog = format!("{group}.dedup-changelog");
    create_topics_with(&[(
        &changelog,
        1,
        &[("cleanup.policy", "compact,delete"), ("retention.ms", "-1")][..],
    )]);
    let start = start();
    let day0 = exactly::state::window::Window {
        start,
        end: start + DAY,
    };
    let seen = |device: &str| {
        let (k, v) = encode(&Change::Key {
            window: day0,
            key: device.as_bytes().into(),
        });
        let mut r = In::raw(0, "", &v);
        r.key = Some(k);
        r
    };
    let previous = Writer::transactional(&unique("previous-owner"));
    let p = previous.producer();
    p.begin_transaction().unwrap();
    previous.write(&changelog, &[seen("dev-0")]);
    p.abort_transaction(Duration::from_secs(30)).unwrap();
    p.begin_transaction().unwrap();
    previous.write(&changelog, &[seen("dev-1")]);
    p.commit_transaction(Duration::from_secs(30)).unwrap();

    let events: Vec<In> = ["dev-0", "dev-1", "dev-2"]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut r = In::json(0, d, serde_json::json!({"device": d}));
            r.timestamp = Some(start + 3_600_000 * (i as i64 + 1));
            r
        })
        .collect();
    produce(&topics.input, &events);
    let mut ex = Exactly::start(&args(&topics, &group, "dedup-r"));
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    let mut keys: Vec<Vec<u8>> = read_all(&topics.output, "read_committed")
        .into_iter()
        .filter_map(|o| o.key)
        .collect();
    keys.sort();
    assert_eq!(keys, [b"dev-0".to_vec(), b"dev-2".to_vec()]);
}

/// With `--state-dir`, a restart after kill -9 loads the keys from the local store and reads
/// only the changelog written after the store's last mark; the outputs stay exactly the first
/// of each (day, device).
#[test]
fn a_restart_with_its_local_store_reads_only_the_changelog_after_the_store() {
    let topics = Topics::create("dedup-store", 2, 2);
    let group = unique("dedup-store-g");
    let dir = std::env::temp_dir().join(unique("exactly-state"));
    let mut a = args(&topics, &group, "dedup-s");
    a.extend(["--state-dir".to_string(), dir.display().to_string()]);
    let events = startups(200, 2, 4, 2);
    let (first, rest) = events.split_at(events.len() / 2);
    let mut ex = Exactly::start(&a);
    produce(&topics.input, first);
    committed_past(&mut ex, &group, &topics, first.len() as i64);
    // A commit after the checkpoint interval (10 s) moves the store's marks.
    std::thread::sleep(Duration::from_secs(11));
    produce(&topics.input, &rest[..10]);
    committed_past(&mut ex, &group, &topics, (first.len() + 10) as i64);
    produce(&topics.input, &rest[10..20]);
    committed_past(&mut ex, &group, &topics, (first.len() + 20) as i64);
    ex.kill9();

    // A partition's state is read back at its first record: some wait in both.
    produce(&topics.input, &rest[20..30]);
    let mut again = Exactly::start(&a);
    again.wait_log("restored", Duration::from_secs(60), |ex| {
        ex.log_text().matches("dedup state restored").count() >= 2
    });
    let (mut from_changelog, mut from_store) = (0, 0);
    for line in again.log_lines() {
        if line.contains("dedup state restored") {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            from_changelog += v["records"].as_u64().unwrap();
            from_store += v["stored"].as_u64().unwrap();
        }
    }
    assert!(
        from_store >= 200,
        "the store held the first half's keys: {from_store}"
    );
    assert!(
        from_changelog < 40,
        "only what came after the store's mark: {from_changelog} records"
    );
    let last = rest.len() - 10;
    produce(&topics.input, &rest[30..last]);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    again.stop_cleanly();
    // After a clean stop the store holds everything; its marks are at most 10 s behind.
    produce(&topics.input, &rest[last..]);
    let mut third = Exactly::start(&a);
    third.wait_log("restored", Duration::from_secs(60), |ex| {
        ex.log_text().matches("dedup state restored").count() >= 2
    });
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    let again_read: u64 = (third.log_lines().iter())
        .filter(|l| l.contains("dedup state restored"))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["records"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let written: i64 = end_offsets(&format!("{group}.dedup-changelog"))
        .values()
        .sum();
    assert!(
        (again_read as i64) < written / 2,
        "the store's marks held: {again_read} of {written} read again"
    );
    third.stop_cleanly();
    let _ = std::fs::remove_dir_all(&dir);

    let got: Vec<(i32, i64)> = read_all(&topics.output, "read_committed")
        .iter()
        .map(|o| {
            let (_, p, off, _) = o.lineage();
            (p, off)
        })
        .collect();
    let unique_got: BTreeSet<(i32, i64)> = got.iter().copied().collect();
    assert_eq!(got.len(), unique_got.len(), "an input went out twice");
    assert_eq!(unique_got, firsts(&topics.input));
}

/// CRC-32 (IEEE) of `key`: the partition librdkafka's default partitioner gives it.
fn crc32_partition(key: &str, partitions: u32) -> i32 {
    let mut crc = !0u32;
    for &b in key.as_bytes() {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    ((!crc) % partitions) as i32
}

/// The seed's Redis set of today's devices, imported into the changelog before the first
/// start: those devices do not count again today; `exactly state show` finds them.
#[test]
fn the_seeds_redis_sets_imported_keep_their_devices_out_of_the_day() {
    let redis_url = std::env::var("EXACTLY_TEST_REDIS_URL")
        .expect("EXACTLY_TEST_REDIS_URL: run the tests through scripts/test.sh");
    let password = std::env::var("EXACTLY_TEST_STORE_PASSWORD").unwrap();
    let url = redis_url.replacen("redis://", &format!("redis://:{password}@"), 1);
    let url = format!("{}/2", url.rsplit_once('/').unwrap().0);
    let topics = Topics::create("dedup-import", 3, 1);
    let group = unique("dedup-import-g");
    let changelog = format!("{group}.dedup-changelog");
    let today = start() + 3 * DAY;
    let date = jiff::Timestamp::from_millisecond(today)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    let prefix = format!("{}:", unique("dau"));
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("SADD")
        .arg(format!("{prefix}{date}"))
        .arg("dev-0")
        .arg("dev-1")
        .query(&mut con)
        .unwrap();

    let state = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
            .arg("state")
            .args(args)
            .args([
                "--bootstrap-servers",
                &bootstrap(),
                "--state-changelog",
                &changelog,
            ])
            .env("EXACTLY_REDIS_URL", &url)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let pattern = format!("{prefix}*");
    let imported = state(&[
        "import",
        "--input-topic",
        &topics.input,
        "--redis-pattern",
        &pattern,
        "--partitioner",
        "crc32",
        "--window-grace",
        "3d",
    ]);
    assert!(imported.contains(r#""keys":2"#), "{imported}");

    // dev-0..5 land in partitions 2, 2, 0, 0, 1, 1: every partition has records.
    let events: Vec<In> = (0..6)
        .map(|d| {
            let device = format!("dev-{d}");
            let mut r = In::json(
                crc32_partition(&device, 3),
                &device,
                serde_json::json!({"device": device}),
            );
            r.timestamp = Some(today + 60_000 * (d + 1));
            r
        })
        .collect();
    produce(&topics.input, &events);
    let mut ex = Exactly::start(&args(&topics, &group, "dedup-i"));
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    let mut keys: Vec<Vec<u8>> = read_all(&topics.output, "read_committed")
        .into_iter()
        .filter_map(|o| o.key)
        .collect();
    keys.sort();
    let want: Vec<Vec<u8>> = (2..6).map(|d| format!("dev-{d}").into_bytes()).collect();
    assert_eq!(keys, want, "the imported devices are seen already");
    let shown = state(&["show", "--key", "dev-0"]);
    assert!(shown.contains(&format!("{date}T00:00:00Z")), "{shown}");
    assert_eq!(shown.lines().count(), 1, "{shown}");
}

/// Windowed aggregates (`--aggregate`): per shop per hour, the records, the sum of their
/// amounts and the distinct users, each window given once when it closes, across kill -9.
/// The totals are worked out here from the input, apart from exactly.
#[test]
fn windowed_totals_come_out_once_per_window_and_group_across_kill_9() {
    const HOUR: i64 = 3_600_000;
    let topics = Topics::create("aggregate", 3, 3);
    let group = unique("aggregate-g");
    let t0 = start();
    // 12 shops, 3 hours, 20 sales each per hour, in time order; shop s in partition s % 3.
    let mut events = Vec::new();
    let mut want: BTreeMap<(i64, String), (u64, i64, BTreeSet<String>)> = BTreeMap::new();
    for i in 0..3 * 20 {
        for s in 0..12 {
            let t = t0 + i * HOUR / 20 + s;
            let (shop, amount, user) = (
                format!("shop-{s}"),
                (i * 7 + s) % 13,
                format!("u{}", (i + s) % 5),
            );
            let mut r = In::json(
                s as i32 % 3,
                &shop,
                serde_json::json!({"shop": shop, "amount": amount, "user": user}),
            );
            r.timestamp = Some(t);
            events.push(r);
            let w = want.entry(((t - t0) / HOUR * HOUR + t0, shop)).or_default();
            w.0 += 1;
            w.1 += amount;
            w.2.insert(user);
        }
    }
    // A record a day on in each partition closes the last hour (its own window never closes).
    for p in 0..3 {
        let mut r = In::json(
            p,
            &format!("end-{p}"),
            serde_json::json!({"amount": 0, "user": "x"}),
        );
        r.timestamp = Some(t0 + 24 * HOUR);
        events.push(r);
    }
    let total = events.len() as i64;
    // Half now, the rest after the kill: the kill lands before the end whatever the speed.
    let (early, late) = events.split_at(events.len() / 2);
    produce(&topics.input, early);
    let flags = [
        "--window",
        "1h",
        "--window-grace",
        "5m",
        "--aggregate",
        "count,sum,distinct",
        "--aggregate-sum",
        ".amount",
        "--aggregate-distinct",
        ".user",
        "--aggregate-emit",
        "final",
    ];
    let args = || {
        let mut a = base_args(&topics, &group, "aggregate-0");
        a.extend(flags.map(String::from));
        a.extend(["--max-records-per-txn", "100"].map(String::from));
        a
    };
    let mut ex = Exactly::start(&args());
    committed_past(&mut ex, &group, &topics, total / 3);
    ex.kill9();
    produce(&topics.input, late);
    let mut again = Exactly::start(&args());
    wait_all_committed(&group, &topics.input, Duration::from_secs(180));
    assert!(again.log_text().contains("dedup state restored"));
    again.stop_cleanly();

    let mut got: BTreeMap<(i64, String), (u64, i64, BTreeSet<String>)> = BTreeMap::new();
    let outputs = read_all(&topics.output, "read_committed");
    for o in &outputs {
        let v = o.json();
        let key = (
            v["start"].as_i64().unwrap(),
            v["group"].as_str().unwrap().to_owned(),
        );
        let expected = &want[&key];
        assert_eq!(v["distinct"], expected.2.len(), "{v}");
        let totals = (
            v["count"].as_u64().unwrap(),
            v["sum"].as_i64().unwrap(),
            expected.2.clone(),
        );
        assert!(got.insert(key, totals).is_none(), "given twice: {v}");
        let k: serde_json::Value = serde_json::from_slice(o.key.as_deref().unwrap()).unwrap();
        assert_eq!(k[1], v["group"], "keyed by window and group");
    }
    assert_eq!(got, want, "every (hour, shop) once, with its totals");
    assert!(read_all(&topics.dlq, "read_committed").is_empty());
    // The audit replays the aggregate: every output is the one its input gives.
    let (code, report) = audit_of(&topics, &group, &flags);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["outputs"], outputs.len(), "{report:#}");
    let (code, without) = audit_of(&topics, &group, &[]);
    assert_ne!(code, 0, "{without:#}");
    // Replayed with other sums, the same outputs are wrong ones.
    let mut other = flags;
    other[7] = ".amount * 2";
    let (code, wrong) = audit_of(&topics, &group, &other);
    assert_ne!(code, 0, "{wrong:#}");
}

//! The stateful stage against a changelog in memory: restores, aborts, unknown outcomes, the
//! local store, the dedup's and the aggregate's verdicts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::config::Emit;
use crate::state::restore::{Each, Read, Unread};
use crate::state::store::{Batch, Redb};
use crate::state::window::{Size, Windows};

const HOUR: i64 = 3_600_000;

/// A changelog: what committed units wrote to it, by partition; how many records
/// restores read; and after how many records the next read fails (a previous owner's
/// transaction holding it back), if it is to.
#[derive(Clone, Default)]
struct Log(
    Arc<Mutex<Written>>,
    Arc<Mutex<Partitions>>,
    Arc<Mutex<Option<i64>>>,
);

/// The changelog's partitions (`None`: as many as asked for), and whether it may grow.
type Partitions = (Option<i32>, bool);

/// The records, how many restores read, after how many the next read fails.
type Written = (Vec<Entry>, u64, Option<u64>);

/// A changelog record: partition, key, value.
type Entry = (i32, Vec<u8>, Vec<u8>);

impl Log {
    fn read_so_far(&self) -> u64 {
        self.0.lock().unwrap().1
    }
}

impl Changelog for Log {
    fn read(
        &mut self,
        partition: i32,
        from: Option<i64>,
        each: &mut Each<'_>,
    ) -> Result<Read, Unread> {
        if self.1.lock().unwrap().0.is_some_and(|n| partition >= n) {
            return Err(Unread::Missing(format!("no partition {partition}")));
        }
        let mut log = self.0.lock().unwrap();
        let mine: Vec<_> = (log.0.iter())
            .filter(|(p, _, _)| *p == partition)
            .cloned()
            .collect();
        let from = from.unwrap_or(0);
        if from as usize > mine.len() {
            return Err(Unread::OutOfRange(format!("{from} past {}", mine.len())));
        }
        for (i, (_, k, v)) in mine.iter().enumerate().skip(from as usize) {
            if log.2 == Some(0) {
                log.2 = None;
                return Err(Unread::Failed(format!("held back at {i}")));
            }
            log.2 = log.2.map(|n| n - 1);
            log.1 += 1;
            each(i as i64, Some(k), Some(v));
        }
        let records = (mine.len() - from as usize) as u64;
        Ok(Read {
            records,
            end: mine.len() as i64,
            written: *self.2.lock().unwrap(),
        })
    }

    fn end(&mut self, partition: i32) -> Result<i64, String> {
        let log = self.0.lock().unwrap();
        Ok(log.0.iter().filter(|(p, _, _)| *p == partition).count() as i64)
    }

    fn grow(&mut self, partitions: usize) -> Result<(), String> {
        let mut p = self.1.lock().unwrap();
        if !p.1 {
            return Err("TOPIC_AUTHORIZATION_FAILED".into());
        }
        p.0 = Some(partitions as i32);
        Ok(())
    }
}

fn config(late: Late) -> DedupConfig {
    DedupConfig {
        windows: Windows::new(Size::Days(1), jiff::tz::TimeZone::UTC, Duration::ZERO),
        key: None,
        time: None,
        late,
        changelog: "cl".into(),
        retention: Duration::from_secs(86_400),
        state_dir: None,
        max_key: 64,
        max_keys: usize::MAX,
        max_ahead: 86_400_000,
        aggregate: None,
    }
}

fn dedup_with(log: &Log, late: Late, store: Option<Box<dyn Store>>) -> Dedup {
    dedup_of(log, &config(late), [None, None, None, None, None], store).0
}

/// A dedup of `config` over `log`, owning partition 0, and its metrics.
fn dedup_of(
    log: &Log,
    config: &DedupConfig,
    programs: [Option<Jq>; 5],
    store: Option<Box<dyn Store>>,
) -> (Dedup, Metrics) {
    let (source, metrics) = (Box::new(log.clone()), Metrics::new());
    let mut d = Dedup::new(config, programs, source, store, metrics.clone());
    d.assigned(&[("in".into(), 0)]);
    (d, metrics)
}

/// `d` applies `input`, and the writer sends what it made (a bad record: nothing).
fn sent<'a>(d: &mut Dedup, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
    let outputs = d.apply(input);
    d.decided(if outputs.is_ok() {
        Fate::Sent
    } else {
        Fate::Refused
    });
    outputs
}

fn dedup(log: &Log, late: Late) -> Dedup {
    dedup_with(log, late, None)
}

fn input(key: &'static str, t: i64) -> InputRecord<'static> {
    InputRecord {
        topic: "in",
        partition: 0,
        offset: 0,
        timestamp: Some(t),
        key: Some(key.as_bytes()),
        value: Some(b"{}"),
        headers: Vec::new(),
    }
}

/// How many outputs a record of key `key` at `t` makes.
fn offer(d: &mut Dedup, key: &'static str, t: i64) -> Result<usize, Failure> {
    Ok(sent(d, &input(key, t))?.len())
}

/// The unit commits: what it writes before goes to the log.
fn commit(d: &mut Dedup, log: &Log) -> usize {
    let written = commit_only_in_the_log(d, log);
    d.committed();
    written
}

/// The unit's records reach the changelog (the commit took effect), nothing more.
fn commit_only_in_the_log(d: &mut Dedup, log: &Log) -> usize {
    let written = d.before_commit();
    let n = written.len();
    let mut l = log.0.lock().unwrap();
    for o in written {
        assert_eq!(o.topic.as_deref(), Some("cl"));
        let p = o.partition.expect("a changelog record names its partition");
        l.0.push((
            p,
            o.key.unwrap().into_owned(),
            o.value.unwrap().into_owned(),
        ));
    }
    n
}

#[test]
fn the_first_of_a_key_per_day_goes_on_once_across_aborts_and_restarts() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    assert_eq!(
        offer(&mut d, "dev-1", HOUR).unwrap(),
        1,
        "the first goes on"
    );
    assert_eq!(
        offer(&mut d, "dev-1", 2 * HOUR).unwrap(),
        0,
        "a duplicate does not"
    );
    assert_eq!(commit(&mut d, &log), 2, "the key, then the stream time");

    // An aborted unit's decisions are forgotten: the replay decides the same.
    assert_eq!(offer(&mut d, "dev-2", 3 * HOUR).unwrap(), 1);
    d.dropped(true);
    assert_eq!(offer(&mut d, "dev-2", 3 * HOUR).unwrap(), 1);
    commit(&mut d, &log);

    // A restart restores what committed, and only that.
    let mut again = dedup(&log, Late::Dlq);
    assert_eq!(offer(&mut again, "dev-1", 4 * HOUR).unwrap(), 0);
    assert_eq!(offer(&mut again, "dev-2", 4 * HOUR).unwrap(), 0);
    assert_eq!(offer(&mut again, "dev-3", 4 * HOUR).unwrap(), 1);
    // The next day is a window of its own.
    assert_eq!(offer(&mut again, "dev-1", 25 * HOUR).unwrap(), 1);
}

#[test]
fn an_unknown_outcome_reads_the_state_back_from_the_changelog() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    offer(&mut d, "dev-1", HOUR).unwrap();
    // The commit took effect, but nobody can tell: the changelog has it.
    commit_only_in_the_log(&mut d, &log);
    d.dropped(false);
    assert_eq!(offer(&mut d, "dev-1", 2 * HOUR).unwrap(), 0, "read back");
}

#[test]
fn a_record_for_a_closed_window_follows_the_late_policy() {
    for (late, want) in [
        (Late::Dlq, None),
        (Late::Drop, Some(0)),
        (Late::Pass, Some(1)),
    ] {
        let log = Log::default();
        let mut d = dedup(&log, late);
        offer(&mut d, "a", 25 * HOUR).unwrap(); // day 0 closed (no grace)
        commit(&mut d, &log);
        match (want, offer(&mut d, "b", HOUR)) {
            (None, Err(Failure::BadRecord(e))) => assert_eq!(e.reason, Reason::Late),
            (Some(n), Ok(out)) => assert_eq!(out, n, "{late:?}"),
            (want, got) => panic!("{late:?}: wanted {want:?}, got {got:?}"),
        }
        assert_eq!(
            commit(&mut d, &log),
            0,
            "{late:?}: a late record is never remembered"
        );
    }
}

#[test]
fn a_first_record_its_program_fails_for_leaves_its_key_unseen() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    let limits = crate::transform::Limits {
        max_output_bytes: 1000,
        max_outputs: 10,
    };
    let program = r#"if .bad then error("bad") else {window: $window} end"#;
    d.then = Some(Jq::compile(program, false, limits).unwrap());
    // Two days ahead: had it moved the stream time, day 0 would be closed.
    let mut bad = input("a", 50 * HOUR);
    bad.value = Some(br#"{"bad":true}"#);
    assert!(matches!(sent(&mut d, &bad), Err(Failure::BadRecord(_))));
    let outs = sent(&mut d, &input("a", HOUR)).unwrap();
    assert_eq!(outs.len(), 1, "the first of its key after all: {outs:?}");
    assert_eq!(
        outs[0].value.as_deref(),
        Some(&br#"{"window":"1970-01-01"}"#[..])
    );
    assert_eq!(commit(&mut d, &log), 2, "one key, one stream time");
}

#[test]
fn a_key_whose_changelog_record_would_be_too_large_is_a_bad_record() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    let long: &'static str = Box::leak("k".repeat(65).into_boxed_str());
    match sent(&mut d, &input(long, HOUR)) {
        Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::DedupInput, "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        commit(&mut d, &log),
        0,
        "nothing of it reaches the changelog"
    );
}

#[test]
fn a_record_without_a_key_or_time_is_a_bad_record() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    let mut no_key = input("a", HOUR);
    no_key.key = None;
    match sent(&mut d, &no_key) {
        Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::DedupInput),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_event_time_far_past_its_records_timestamp_moves_nothing() {
    let log = Log::default();
    let limits = crate::transform::Limits {
        max_output_bytes: 1000,
        max_outputs: 10,
    };
    let at = Jq::compile(".at", false, limits).unwrap();
    let (mut d, _) = dedup_of(
        &log,
        &config(Late::Dlq),
        [None, Some(at), None, None, None],
        None,
    );
    let mut at = |key: &'static str, t: i64, ts: i64| {
        let value = format!(r#"{{"at":{t}}}"#);
        let mut r: InputRecord<'_> = input(key, ts);
        r.value = Some(value.as_bytes());
        sent(&mut d, &r).map(|o| o.len())
    };
    // 25 h past its own timestamp: a wrong clock, refused.
    match at("a", 26 * HOUR, HOUR) {
        Err(Failure::BadRecord(e)) => {
            assert_eq!(e.reason, Reason::DedupInput);
            assert!(e.message.contains("--window-max-ahead"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // It moved no stream time: today's records are not late.
    assert_eq!(at("b", 2 * HOUR, 2 * HOUR).unwrap(), 1);
    // Within the bound (23 h ahead) it is taken.
    assert_eq!(at("c", 25 * HOUR, 2 * HOUR).unwrap(), 1);
}

/// A restore says how old the state it read back is, against how long the changelog keeps
/// the keys of a window still open (--window-max-ahead and a day): state written longer ago
/// than that (a long outage without --state-dir) may have lost keys to retention.
#[test]
fn a_restore_says_how_old_the_state_it_read_is() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    offer(&mut d, "a", HOUR).unwrap();
    commit(&mut d, &log);
    *log.2.lock().unwrap() = Some(crate::clock::wall_ms() - 23 * HOUR);
    let (mut young, metrics) = dedup_of(&log, &config(Late::Dlq), Default::default(), None);
    assert_eq!(offer(&mut young, "a", 2 * HOUR).unwrap(), 0, "restored");
    assert_eq!(
        metrics.state_aged_restore_time.get(),
        0.0,
        "under half the margin"
    );
    *log.2.lock().unwrap() = Some(crate::clock::wall_ms() - 3 * 24 * HOUR);
    let (mut again, metrics) = dedup_of(&log, &config(Late::Dlq), Default::default(), None);
    assert_eq!(metrics.state_changelog_margin.get(), 2.0 * 86_400.0);
    assert_eq!(offer(&mut again, "a", 2 * HOUR).unwrap(), 0, "restored");
    let age = metrics.state_restored_age.get();
    assert!(
        (3.0 * 86_400.0..3.0 * 86_400.0 + 60.0).contains(&age),
        "{age}"
    );
    let now = crate::clock::wall_ms() as f64 / 1000.0;
    let when = metrics.state_aged_restore_time.get();
    assert!((now - 60.0..=now).contains(&when), "{when} at {now}");
}

/// An input partition whose changelog partition does not exist (the input grew) is held,
/// and the changelog grows where the cluster lets it: the record comes again later, and
/// then its partition's state is read from the grown (empty) partition.
#[test]
fn a_partition_the_changelog_does_not_have_is_held_and_the_changelog_grows() {
    let log = Log::default();
    *log.1.lock().unwrap() = (Some(1), false);
    let mut d = dedup(&log, Late::Dlq);
    d.assigned(&[("in".into(), 1)]);
    let mut of_1 = input("a", HOUR);
    of_1.partition = 1;
    match sent(&mut d, &of_1) {
        Err(Failure::Held(why)) => assert!(why.contains("TOPIC_AUTHORIZATION_FAILED"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.metrics.state_restoring.get(), 0, "held, not restoring");
    assert_eq!(offer(&mut d, "a", HOUR).unwrap(), 1, "partition 0 goes on");
    log.1.lock().unwrap().1 = true;
    assert!(
        matches!(sent(&mut d, &of_1), Err(Failure::Held(_))),
        "grown now"
    );
    assert_eq!(log.1.lock().unwrap().0, Some(2));
    assert_eq!(
        sent(&mut d, &of_1).unwrap().len(),
        1,
        "released: restored, taken"
    );
}

/// Without --window-time the event time is the record's timestamp: one further than
/// --window-max-ahead past this host's clock (a producer with a wrong clock) is refused,
/// and moves no stream time.
#[test]
fn a_timestamp_far_ahead_of_the_clock_is_a_bad_record_and_moves_nothing() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    let now = crate::clock::wall_ms();
    match offer(&mut d, "a", now + 2 * 24 * HOUR) {
        Err(Failure::BadRecord(e)) => {
            assert_eq!(e.reason, Reason::DedupInput);
            assert!(e.message.contains("this host's clock"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(offer(&mut d, "b", now).unwrap(), 1, "not late");
    assert_eq!(
        offer(&mut d, "c", now + 23 * HOUR).unwrap(),
        1,
        "within the bound"
    );
}

#[test]
fn a_new_key_for_a_full_window_is_a_bad_record_and_leaves_no_trace() {
    let log = Log::default();
    let config = DedupConfig {
        max_keys: 1,
        ..config(Late::Dlq)
    };
    let (mut d, metrics) = dedup_of(&log, &config, [None, None, None, None, None], None);
    assert_eq!(offer(&mut d, "a", HOUR).unwrap(), 1);
    match offer(&mut d, "b", 20 * HOUR) {
        Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::DedupFull),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        offer(&mut d, "a", HOUR).unwrap(),
        0,
        "a key held is still known"
    );
    assert_eq!(
        commit(&mut d, &log),
        2,
        "a's key and the stream time, nothing of b"
    );
    assert_eq!(metrics.state_window_keys_max.get(), 1);
    assert_eq!(metrics.state_window_keys_limit.get(), 1);
    // The refused record (at 20 h) moved no stream time.
    assert_eq!(d.keeper.seen().stream_time(&("in".into(), 0)), Some(HOUR));
    assert_eq!(
        offer(&mut d, "c", 25 * HOUR).unwrap(),
        1,
        "the next day has room"
    );
}

/// A restore held back midway goes on from where it got, and a unit's restores stop at
/// the budget (the rest wait for the next unit).
#[test]
fn a_restore_that_stops_midway_goes_on_from_where_it_got() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        offer(&mut d, key, HOUR * (i as i64 + 1)).unwrap();
        commit(&mut d, &log);
    }
    let total = log.0.lock().unwrap().0.len() as u64;
    assert_eq!(total, 8, "a key and a stream time a unit");
    log.0.lock().unwrap().2 = Some(5);
    let before = log.read_so_far();
    let (mut again, metrics) = dedup_of(&log, &config(Late::Dlq), Default::default(), None);
    assert_eq!(
        log.read_so_far(),
        before,
        "nothing read before a record comes"
    );
    assert_eq!(metrics.state_restoring.get(), 0, "no record waits");
    // The first record's restore stops after 5 records: its unit aborts.
    assert!(matches!(
        offer(&mut again, "a", 5 * HOUR),
        Err(Failure::Unavailable(_))
    ));
    assert_eq!(log.read_so_far() - before, 5);
    assert_eq!(metrics.state_restoring.get(), 1, "its records wait");
    again.dropped(true);
    assert_eq!(
        offer(&mut again, "a", 5 * HOUR).unwrap(),
        0,
        "a was read before"
    );
    assert_eq!(metrics.state_restoring.get(), 0);
    // The next restore read the 3 records left, not all 8 again.
    assert_eq!(log.read_so_far() - before, total);
    assert_eq!(offer(&mut again, "d", 5 * HOUR).unwrap(), 0, "d after");
    assert_eq!(offer(&mut again, "e", 5 * HOUR).unwrap(), 1);

    // Past the budget, a restore waits for the next unit without reading.
    let mut late = dedup(&log, Late::Dlq);
    late.revoked(&[("in".into(), 0)]);
    late.keeper.budget_spent();
    late.assigned(&[("in".into(), 0)]);
    let read = log.read_so_far();
    assert!(matches!(
        offer(&mut late, "a", 5 * HOUR),
        Err(Failure::Unavailable(_))
    ));
    assert_eq!(log.read_so_far(), read);
    late.dropped(true);
    assert_eq!(offer(&mut late, "a", 5 * HOUR).unwrap(), 0);
}

/// A restore stopped midway leaves what it read in the store, marked where it got: a
/// restart reads on from there, and decides as one that read it all.
#[test]
fn a_restore_stopped_midway_leaves_the_store_at_where_it_got() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cl.redb");
    let store = || Some(Box::new(Redb::open(&path).unwrap()) as Box<dyn Store>);
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        offer(&mut d, key, HOUR * (i as i64 + 1)).unwrap();
        commit(&mut d, &log);
    }
    log.0.lock().unwrap().2 = Some(3);
    let mut stopped = dedup_with(&log, Late::Dlq, store());
    assert!(offer(&mut stopped, "a", 5 * HOUR).is_err(), "held back");
    drop(stopped);
    let before = log.read_so_far();
    let mut again = dedup_with(&log, Late::Dlq, store());
    for (key, want) in [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 1)] {
        assert_eq!(offer(&mut again, key, 5 * HOUR).unwrap(), want, "{key}");
    }
    assert_eq!(
        log.read_so_far() - before,
        5,
        "the 8 records less the 3 stored"
    );
}

#[test]
fn a_restart_with_the_local_store_reads_only_the_changelog_after_its_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cl.redb");
    let log = Log::default();
    let store = || Some(Box::new(Redb::open(&path).unwrap()) as Box<dyn Store>);
    let mut d = dedup_with(&log, Late::Dlq, store());
    d.keeper.checkpoint_always();
    for key in ["a", "b", "c"] {
        offer(&mut d, key, HOUR).unwrap();
    }
    commit(&mut d, &log); // 4 records: a, b, c, the stream time
    // The next unit's marks: the changelog's end before its own changes.
    offer(&mut d, "x", HOUR).unwrap();
    commit(&mut d, &log); // 1 more (its stream time did not move)
    d.revoked(&[("in".into(), 0)]);
    drop(d);
    // Written after the store's last write (by another owner, or before a crash).
    let mut other = dedup(&log, Late::Dlq);
    offer(&mut other, "d", 2 * HOUR).unwrap();
    commit(&mut other, &log); // 2 more
    let before = log.read_so_far();
    let mut again = dedup_with(&log, Late::Dlq, store());
    for (key, want) in [("a", 0), ("b", 0), ("x", 0), ("d", 0), ("e", 1)] {
        assert_eq!(offer(&mut again, key, 3 * HOUR).unwrap(), want, "{key}");
    }
    let read = log.read_so_far() - before;
    assert_eq!(read, 3, "from the mark on: x, d, d's stream time");
}

/// An unknown outcome takes no mark past its unit before the restore read it.
#[test]
fn no_mark_passes_a_unit_whose_outcome_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cl.redb");
    let log = Log::default();
    let store = || Some(Box::new(Redb::open(&path).unwrap()) as Box<dyn Store>);
    let mut d = dedup_with(&log, Late::Dlq, store());
    d.keeper.checkpoint_always();
    offer(&mut d, "a", HOUR).unwrap();
    commit(&mut d, &log);
    offer(&mut d, "u", HOUR).unwrap();
    commit_only_in_the_log(&mut d, &log); // it committed; nobody can tell
    d.dropped(false);
    // Another unit on another partition commits meanwhile, taking marks.
    let other = InputRecord {
        partition: 1,
        ..input("z", HOUR)
    };
    d.assigned(&[("in".into(), 1)]);
    sent(&mut d, &other).unwrap();
    commit(&mut d, &log);
    drop(d);
    let mut again = dedup_with(&log, Late::Dlq, store());
    assert_eq!(
        offer(&mut again, "u", 2 * HOUR).unwrap(),
        0,
        "u is read back"
    );
}

#[test]
fn a_store_mark_the_changelog_does_not_hold_reads_it_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cl.redb");
    let mut store = Redb::open(&path).unwrap();
    let marks = Batch {
        marks: vec![(0, 99)],
        keys: vec![(
            0,
            Window {
                start: 0,
                end: 86_400_000,
            },
            (*b"ghost").into(),
        )],
        ..Batch::default()
    };
    store.write(&marks).unwrap();
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    offer(&mut d, "a", HOUR).unwrap();
    commit(&mut d, &log);
    let mut again = dedup_with(&log, Late::Dlq, Some(Box::new(store)));
    assert_eq!(
        offer(&mut again, "a", 2 * HOUR).unwrap(),
        0,
        "read from the beginning"
    );
    assert_eq!(
        offer(&mut again, "ghost", 2 * HOUR).unwrap(),
        1,
        "the store was wiped"
    );
}

/// The aggregates (count, sum of `.n`, distinct `.u`) by Kafka key per UTC day, with
/// `grace_hours` of grace.
fn aggregating(log: &Log, emit: Emit, grace_hours: u64) -> Dedup {
    aggregating_with(log, emit, grace_hours, None)
}

/// The same, with a local store.
fn aggregating_with(
    log: &Log,
    emit: Emit,
    grace_hours: u64,
    store: Option<Box<dyn Store>>,
) -> Dedup {
    let limits = crate::transform::Limits {
        max_output_bytes: 1000,
        max_outputs: 10,
    };
    let config = DedupConfig {
        windows: Windows::new(
            Size::Days(1),
            jiff::tz::TimeZone::UTC,
            Duration::from_secs(grace_hours * 3600),
        ),
        aggregate: Some(crate::config::AggregateConfig {
            count: true,
            sum: Some(".n".into()),
            distinct: Some(".u".into()),
            emit,
        }),
        max_key: 1000,
        ..config(Late::Dlq)
    };
    let compile = |p| Some(Jq::compile(p, false, limits).unwrap());
    let programs = [None, None, None, compile(".n"), compile(".u")];
    dedup_of(log, &config, programs, store).0
}

/// A record of group `key` at `t` with value `value`: its outputs' values, as JSON.
fn totals(d: &mut Dedup, key: &'static str, t: i64, value: &'static str) -> Vec<serde_json::Value> {
    let mut record = input(key, t);
    record.value = Some(value.as_bytes());
    let outputs = sent(d, &record).expect("taken");
    (outputs.iter())
        .map(|o| serde_json::from_slice(o.value.as_deref().unwrap()).unwrap())
        .collect()
}

/// Group, count, sum, distinct of an aggregate's value.
fn brief(v: &serde_json::Value) -> (String, u64, serde_json::Value, u64) {
    (
        v["group"].as_str().unwrap().to_owned(),
        v["count"].as_u64().unwrap(),
        v["sum"].clone(),
        v["distinct"].as_u64().unwrap(),
    )
}

fn t(
    group: &str,
    count: u64,
    sum: serde_json::Value,
    distinct: u64,
) -> (String, u64, serde_json::Value, u64) {
    (group.to_owned(), count, sum, distinct)
}

/// A record whose outputs did not go out (the broker refused one, or a route kept
/// refusing it: its dead-letter copy went instead) leaves no trace: its key is not seen,
/// its time closes no window, its changelog records are not written.
#[test]
fn a_record_whose_outputs_did_not_go_out_leaves_no_trace() {
    let log = Log::default();
    let mut d = dedup(&log, Late::Dlq);
    let refused = |d: &mut Dedup, key: &'static str, t: i64| {
        let outputs = d.apply(&input(key, t)).expect("taken");
        d.decided(Fate::Refused);
        outputs.len()
    };
    assert_eq!(refused(&mut d, "dev-1", HOUR), 1);
    assert_eq!(
        offer(&mut d, "dev-1", 2 * HOUR).unwrap(),
        1,
        "still its first"
    );
    assert_eq!(refused(&mut d, "dev-2", 30 * HOUR), 1);
    assert_eq!(
        offer(&mut d, "dev-3", 3 * HOUR).unwrap(),
        1,
        "day 0 is open"
    );
    assert_eq!(commit(&mut d, &log), 3, "dev-1, dev-3, the stream time");
}

/// The aggregates likewise: a refused record is not counted, and a record that would
/// close windows closes none, so their totals go out with the next one that does.
#[test]
fn a_refused_record_is_not_counted_and_closes_no_window() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    totals(&mut d, "a", HOUR, r#"{"n":2,"u":"x"}"#);
    let mut again = input("a", 2 * HOUR);
    again.value = Some(br#"{"n":5,"u":"y"}"#);
    d.apply(&again).expect("taken");
    d.decided(Fate::Refused);
    let next = totals(&mut d, "a", 3 * HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(
        brief(&next[0]),
        t("a", 2, 3.into(), 1),
        "the refused one is not in"
    );

    let log = Log::default();
    let mut d = aggregating(&log, Emit::Final, 0);
    totals(&mut d, "a", HOUR, r#"{"n":2,"u":"x"}"#);
    let mut closing = input("b", 25 * HOUR);
    closing.value = Some(br#"{"n":1,"u":"x"}"#);
    assert_eq!(d.apply(&closing).expect("taken").len(), 1, "day 0's totals");
    d.decided(Fate::Refused);
    let closed = totals(&mut d, "c", 26 * HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(closed.len(), 1, "day 0 closes with the next record instead");
    assert_eq!(brief(&closed[0]), t("a", 1, 2.into(), 1));
    assert!(totals(&mut d, "d", 27 * HOUR, r#"{"n":1,"u":"x"}"#).is_empty());
}

#[test]
fn updates_give_each_records_group_its_new_totals_across_aborts_and_restores() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    let first = totals(&mut d, "a", HOUR, r#"{"n":2,"u":"x"}"#);
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0],
        serde_json::json!({"window": "1970-01-01", "start": 0, "end": 86_400_000,
            "group": "a", "count": 1, "sum": 2, "distinct": 1})
    );
    assert_eq!(
        commit(&mut d, &log),
        3,
        "the distinct value, a's totals, the stream time"
    );
    let unit = |d: &mut Dedup| {
        [
            totals(d, "a", 2 * HOUR, r#"{"n":3,"u":"x"}"#),
            totals(d, "b", 2 * HOUR, r#"{"n":1.5,"u":"y"}"#),
            totals(d, "a", 3 * HOUR, r#"{"n":null,"u":"z"}"#),
        ]
        .map(|o| brief(&o[0]))
    };
    let once = unit(&mut d);
    assert_eq!(
        once,
        [
            t("a", 2, 5.into(), 1),
            t("b", 1, 1.5.into(), 1),
            t("a", 3, 5.into(), 2),
        ]
    );
    // An abort forgets the unit: its replay gives the same.
    d.dropped(true);
    assert_eq!(unit(&mut d), once);
    commit(&mut d, &log);
    // Restored from the changelog alone, the totals go on where they were.
    let mut again = aggregating(&log, Emit::Updates, 0);
    let next = totals(&mut again, "a", 4 * HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(brief(&next[0]), t("a", 4, 6.into(), 2));
    // The next day starts from nothing.
    let next = totals(&mut again, "a", 25 * HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(brief(&next[0]), t("a", 1, 1.into(), 1));
}

#[test]
fn final_gives_each_window_once_when_the_stream_time_passes_its_close() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Final, 2);
    assert!(totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#).is_empty());
    assert!(totals(&mut d, "b", 20 * HOUR, r#"{"n":2,"u":"x"}"#).is_empty());
    commit(&mut d, &log);
    // Day 0 ends at 24 h, closes at 26 h: within the grace, it still takes records.
    assert!(totals(&mut d, "c", 25 * HOUR, r#"{"n":5,"u":"q"}"#).is_empty());
    assert!(totals(&mut d, "a", 23 * HOUR, r#"{"n":1,"u":"y"}"#).is_empty());
    let closing = |d: &mut Dedup| {
        let out = totals(d, "c", 26 * HOUR, r#"{"n":1,"u":"q"}"#);
        out.iter().map(brief).collect::<Vec<_>>()
    };
    let day0 = closing(&mut d);
    assert_eq!(day0, [t("a", 2, 2.into(), 2), t("b", 1, 2.into(), 1)]);
    assert!(
        totals(&mut d, "c", 27 * HOUR, r#"{"n":1,"u":"q"}"#).is_empty(),
        "day 0 is given once, though it goes from the state only at the commit"
    );
    // A record for day 0 now is late.
    let mut late = input("a", 23 * HOUR);
    late.value = Some(br#"{"n":1,"u":"x"}"#);
    match sent(&mut d, &late) {
        Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::Late),
        other => panic!("{other:?}"),
    }
    // The closing record's unit aborts: the replay closes day 0 again, with the same.
    d.dropped(true);
    assert!(totals(&mut d, "c", 25 * HOUR, r#"{"n":5,"u":"q"}"#).is_empty());
    assert!(totals(&mut d, "a", 23 * HOUR, r#"{"n":1,"u":"y"}"#).is_empty());
    assert_eq!(closing(&mut d), day0);
    commit(&mut d, &log);
    // Committed, day 0 is never given again, not after a restore either.
    let mut again = aggregating(&log, Emit::Final, 2);
    assert!(totals(&mut again, "c", 40 * HOUR, r#"{"n":1,"u":"r"}"#).is_empty());
    let day1 = totals(&mut again, "z", 60 * HOUR, r#"{"n":1,"u":"r"}"#);
    assert_eq!(
        day1.iter().map(brief).collect::<Vec<_>>(),
        [t("c", 3, 7.into(), 2)],
        "day 1 holds c's three records (the aborted unit's fourth went), of two distinct values"
    );
    assert_eq!(day1[0]["window"], "1970-01-02");
}

#[test]
fn a_record_the_aggregate_cannot_read_is_a_bad_record_and_leaves_no_trace() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    for (value, why) in [
        (r#"{"n":"3","u":"x"}"#, "not a number"),
        (r#"{"n":[1],"u":"x"}"#, "not a number"),
        ("not json", "JSON"),
    ] {
        let mut record = input("a", 50 * HOUR);
        record.value = Some(value.as_bytes());
        match sent(&mut d, &record) {
            Err(Failure::BadRecord(e)) => {
                assert!(e.message.contains(why), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }
    // Nothing of it counted, and its time moved nothing: day 0 still takes records.
    let next = totals(&mut d, "a", 2 * HOUR, r#"{"n":1,"u":"y"}"#);
    assert_eq!(brief(&next[0]), t("a", 2, 2.into(), 2));
}

#[test]
fn a_sum_is_exact_for_integers_and_a_float_past_them() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    let big = r#"{"n":9223372036854775806,"u":null}"#;
    assert_eq!(
        totals(&mut d, "a", HOUR, big)[0]["sum"],
        serde_json::json!(9_223_372_036_854_775_806_i64),
        "exact"
    );
    let next = totals(&mut d, "a", HOUR, r#"{"n":2,"u":null}"#);
    assert!(next[0]["sum"].is_f64(), "{}", next[0]);
    assert_eq!(next[0]["distinct"], 0, "null is no value");
}

#[test]
fn a_window_at_its_cap_takes_no_new_group_or_value_and_still_counts_its_own() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    *d.keeper.seen_mut() = Seen::new(d.keeper.seen().windows().clone()).capped(3);
    // a and its value x: two held.
    totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    commit(&mut d, &log);
    // Again a (its copy in the open unit is not a new group), and b without a value.
    totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    totals(&mut d, "b", HOUR, r#"{"n":1,"u":null}"#);
    let mut full = input("c", HOUR);
    full.value = Some(br#"{"n":1,"u":null}"#);
    match sent(&mut d, &full) {
        Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::DedupFull),
        other => panic!("{other:?}"),
    }
    let mut new_value = input("a", HOUR);
    new_value.value = Some(br#"{"n":1,"u":"new"}"#);
    assert!(matches!(
        sent(&mut d, &new_value),
        Err(Failure::BadRecord(_))
    ));
    let next = totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(brief(&next[0]), t("a", 3, 3.into(), 1));
}

#[test]
fn a_closing_window_whose_program_fails_for_a_group_still_closes_once() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Final, 0);
    let limits = crate::transform::Limits {
        max_output_bytes: 1000,
        max_outputs: 10,
    };
    let program =
        r#"if .group == "b" then error("not b") else {g: .group, c: .count, w: $window} end"#;
    d.then = Some(Jq::compile(program, false, limits).unwrap());
    totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    totals(&mut d, "b", HOUR, r#"{"n":1,"u":"x"}"#);
    let mut closing = input("c", 25 * HOUR);
    closing.value = Some(br#"{"n":1,"u":"x"}"#);
    let out = sent(&mut d, &closing).expect("the closing record is not to blame");
    assert_eq!(out.len(), 2);
    let a: serde_json::Value = serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(a, serde_json::json!({"g": "a", "c": 1, "w": "1970-01-01"}));
    let b: serde_json::Value = serde_json::from_slice(out[1].value.as_deref().unwrap()).unwrap();
    assert_eq!(brief(&b), t("b", 1, 1.into(), 1), "b as it is");
    let OutputHeaders::Set(headers) = &out[1].headers else {
        panic!("{:?}", out[1].headers)
    };
    assert_eq!(
        headers[0],
        (
            crate::transform::ERROR_REASON.into(),
            Some(b"jq_error".to_vec())
        )
    );
    assert!(
        totals(&mut d, "c", 26 * HOUR, r#"{"n":1,"u":"x"}"#).is_empty(),
        "closed once"
    );
}

#[test]
fn a_group_whose_totals_would_be_too_large_is_a_bad_record() {
    let log = Log::default();
    let mut d = aggregating(&log, Emit::Updates, 0);
    let long: &'static str = Box::leak("g".repeat(400).into_boxed_str());
    let mut record = input(long, HOUR);
    record.value = Some(br#"{"n":1,"u":"x"}"#);
    match sent(&mut d, &record) {
        Err(Failure::BadRecord(e)) => assert!(e.message.contains("400 bytes"), "{}", e.message),
        other => panic!("{other:?}"),
    }
    let short: &'static str = Box::leak("g".repeat(300).into_boxed_str());
    assert_eq!(totals(&mut d, short, HOUR, r#"{"n":1,"u":"x"}"#).len(), 1);
}

#[test]
fn a_restart_with_the_local_store_loads_the_totals_and_reads_only_what_came_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cl.redb");
    let log = Log::default();
    let store = || Some(Box::new(Redb::open(&path).unwrap()) as Box<dyn Store>);
    let mut d = aggregating_with(&log, Emit::Updates, 0, store());
    d.keeper.checkpoint_always();
    totals(&mut d, "a", HOUR, r#"{"n":1,"u":"x"}"#);
    totals(&mut d, "b", HOUR, r#"{"n":2,"u":"x"}"#);
    commit(&mut d, &log); // 2 distinct values, 2 totals, the stream time
    totals(&mut d, "a", 2 * HOUR, r#"{"n":3,"u":"y"}"#);
    commit(&mut d, &log); // marks first, then y, a's totals, the stream time
    d.revoked(&[("in".into(), 0)]);
    drop(d);
    let before = log.read_so_far();
    let mut again = aggregating_with(&log, Emit::Updates, 0, store());
    let next = totals(&mut again, "a", 3 * HOUR, r#"{"n":1,"u":"x"}"#);
    assert_eq!(
        log.read_so_far() - before,
        3,
        "only the second unit's records"
    );
    assert_eq!(
        brief(&next[0]),
        t("a", 3, 5.into(), 2),
        "from the store and the delta"
    );
    let next = totals(&mut again, "b", 3 * HOUR, r#"{"n":1,"u":"z"}"#);
    assert_eq!(brief(&next[0]), t("b", 2, 3.into(), 2));
}

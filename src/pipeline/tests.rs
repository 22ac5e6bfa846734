//! The core's orderings, without a broker: each test drives a [`Session`] the way the loop
//! does, over the fakes, and checks what a `read_committed` reader would see.

use std::time::{Duration, Instant};

use super::Interrupt;
use super::fake::{Answers, Call, Core, always, calls_of, every};
use crate::kafka::Tp;
use crate::transform::call::CallError;

fn tp(p: i32) -> Tp {
    ("in".to_string(), p)
}

fn lineages(offsets: &[(i32, i64)]) -> Vec<String> {
    let mut v: Vec<String> = offsets
        .iter()
        .map(|(p, o)| format!("in/{p}/{o}/0"))
        .collect();
    v.sort();
    v
}

impl Core {
    /// Shutdown: the final commit, within a grace of 2 s.
    fn finish(&mut self) {
        self.shutdown.cancel();
        let grace = Duration::from_secs(2);
        self.session.finish(&self.group, grace).unwrap();
    }
}

/// The call-out over in/0's records 0 to 3, read and sent in two calls of two.
fn two_calls_out() -> (Answers, Core) {
    let app = Answers::default();
    let mut core = Core::staged(every(1000), calls_of(2), &app);
    core.broker().fill(("in", 0), 0, 4, &[]);
    core.assign(("in", 0), 0);
    for _ in 0..4 {
        core.turn();
    }
    (app, core)
}

#[test]
fn a_failed_call_commits_only_what_earlier_answers_applied() {
    let (app, mut core) = two_calls_out();
    assert_eq!(app.calls(), 2);
    app.answer(0, true);
    core.turn(); // records 0 and 1 into the open unit
    app.answer(1, false);
    core.turn(); // the call failed: what is applied commits
    {
        let b = core.broker();
        // Not 4, though the consumer has read to 4: records 2 and 3 were never applied.
        assert_eq!(b.commits(), [vec![(tp(0), 2)]]);
        assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 1)]));
    }
    core.turn(); // the rewind
    assert_eq!(core.group.seeks.borrow().last(), Some(&vec![(tp(0), 2)]));
    assert_eq!(core.group.fetch_at(("in", 0)), Some(2));
}

#[test]
fn a_rewind_brings_back_every_record_read_and_not_committed() {
    let mut core = Core::direct(every(6));
    {
        let mut b = core.broker();
        // Committed at 5 by an earlier owner; nothing committed, read from the earliest;
        // nothing committed, read from the latest.
        b.fill(("in", 0), 5, 4, &[]);
        b.committed.insert(tp(0), 5);
        b.fill(("in", 1), 0, 4, &[]);
        b.fill(("in", 2), 10, 4, &[]);
        b.fail_commits = 1;
    }
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    core.assign(("in", 2), 10);
    for _ in 0..6 {
        core.turn(); // two of each, then the commit fails
    }
    let seeks = core.group.seeks.borrow().clone();
    assert_eq!(seeks, [vec![(tp(0), 5), (tp(1), 0), (tp(2), 10)]]);
    core.run(100);
    core.finish();
    let b = core.broker();
    let all: Vec<(i32, i64)> = (5..9)
        .map(|o| (0, o))
        .chain((0..4).map(|o| (1, o)))
        .chain((10..14).map(|o| (2, o)))
        .collect();
    assert_eq!(b.lineages("out"), lineages(&all));
}

/// A commit that fails because the output (or dead-letter) topic may not be written stops
/// exactly naming the topic and the grant, not the call that failed ("sending offsets").
#[test]
fn an_output_topic_that_may_not_be_written_stops_exactly_naming_it_and_the_grant() {
    for (topic, which) in [("out", "output"), ("out.dlq", "dead-letter")] {
        let mut core = Core::direct(every(2));
        // The dead-letter topic is written only for a record the output refuses.
        core.broker().fill(("in", 0), 0, 2, &[1]);
        core.broker().refuse = (topic == "out.dlq").then(|| b"poison".to_vec());
        core.broker().denied = vec![topic.into()];
        core.assign(("in", 0), 0);
        let stopped = (0..50).find_map(|_| core.try_turn().err());
        let Some(Interrupt::Fail(crate::error::Error::Denied(said))) = stopped else {
            panic!("{topic}: not stopped for the permission: {stopped:?}");
        };
        assert_eq!(
            said,
            format!(
                "may not write the {which} topic '{topic}': grant the principal WRITE on \
                 topic '{topic}' (TOPIC_AUTHORIZATION_FAILED)"
            )
        );
        assert!(core.broker().committed.is_empty(), "{topic}");
    }
}

#[test]
fn without_committed_offsets_to_read_a_rewind_goes_back_to_what_was_committed_last() {
    let mut core = Core::direct(every(2));
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.broker().hide_committed = true;
    core.assign(("in", 0), 0);
    core.turn();
    core.turn(); // committed at 2
    core.broker().fail_commits = 1;
    core.turn();
    core.turn(); // the commit at 4 fails
    assert_eq!(core.group.seeks.borrow().last(), Some(&vec![(tp(0), 2)]));
    core.run(20);
    let all: Vec<(i32, i64)> = (0..6).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

#[test]
fn what_was_committed_before_a_partition_was_revoked_is_no_rewind_target_after() {
    let mut core = Core::direct(every(2));
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.broker().hide_committed = true;
    core.assign(("in", 0), 0);
    core.turn();
    core.turn(); // committed at 2
    core.revoke(("in", 0));
    // Another member committed up to 4 meanwhile; the partition comes back there.
    core.broker().committed.insert(tp(0), 4);
    core.assign(("in", 0), 4);
    core.broker().fail_commits = 1;
    core.turn();
    core.turn(); // records 4 and 5; the commit fails
    assert_eq!(core.group.seeks.borrow().last(), Some(&vec![(tp(0), 4)]));
}

/// in/0's records 0 to 5, committed at 2 then at 4, still owned.
fn committed_to_4() -> Core {
    let mut core = Core::direct(every(2));
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.assign(("in", 0), 0);
    for _ in 0..4 {
        core.turn();
    }
    assert_eq!(core.broker().committed.get(&tp(0)), Some(&4));
    core
}

/// Starts and rewinds raised to what this process committed, so far.
fn went_back(core: &Core) -> u64 {
    core.metrics.committed_offsets_went_back.get()
}

/// A broker restarted uncleanly and its coordinator served the group empty (RELIABILITY.md):
/// the partition comes back, and the group answers nothing committed.
#[test]
fn a_group_that_lost_its_offsets_does_not_start_a_partition_this_process_committed_again() {
    let mut core = committed_to_4();
    core.revoke(("in", 0));
    core.broker().committed.clear();
    core.rejoin(&[("in", 0)], 0);
    core.run(20);
    let all: Vec<(i32, i64)> = (0..6).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
    assert_eq!(went_back(&core), 1);
}

/// A partition this process never committed in starts where the group says.
#[test]
fn a_partition_this_process_never_committed_in_starts_where_the_group_says() {
    let mut core = Core::direct(every(2));
    core.broker().fill(("in", 0), 0, 7, &[]);
    core.broker().committed.insert(tp(0), 3);
    core.rejoin(&[("in", 0)], 0);
    core.run(20);
    let rest: Vec<(i32, i64)> = (3..7).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&rest));
    assert_eq!(went_back(&core), 0);
}

#[test]
fn a_rewind_never_goes_below_what_this_process_committed_in_the_group() {
    let mut core = committed_to_4();
    // The group goes back while the partition stays owned; the next commit fails.
    core.broker().committed.insert(tp(0), 1);
    core.broker().fail_commits = 1;
    core.turn();
    core.turn();
    assert_eq!(core.group.seeks.borrow().last(), Some(&vec![(tp(0), 4)]));
    core.run(20);
    let all: Vec<(i32, i64)> = (0..6).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
    assert_eq!(went_back(&core), 1);
}

/// Of the partitions a claim takes, only those the hold raised start explicitly; the others
/// start where librdkafka's own fetch says (the committed offset's leader epoch with it).
#[test]
fn a_claim_raises_only_the_partitions_this_process_committed_further_in() {
    let mut core = committed_to_4();
    core.broker().fill(("in", 1), 0, 6, &[]);
    core.revoke(("in", 0));
    core.broker().committed.clear();
    core.broker().committed.insert(tp(1), 3); // another member's
    let owned = vec![tp(0), tp(1)];
    let starts = core.session.claim(&core.group, &owned);
    let explicit = vec![(tp(0), Some(4)), (tp(1), None)];
    assert_eq!(starts, Some(crate::sink::Starts::At(explicit)));
    // Nothing below what it committed: librdkafka reads the group's offsets itself.
    core.broker().committed.insert(tp(0), 4);
    let starts = core.session.claim(&core.group, &owned);
    assert_eq!(starts, Some(crate::sink::Starts::Group));
}

/// A read of the group's offsets that fails (a transaction still open on them) leaves the
/// start to librdkafka, which waits for them.
#[test]
fn a_claim_whose_offsets_cannot_be_read_starts_where_librdkafka_says() {
    let mut core = committed_to_4();
    core.revoke(("in", 0));
    core.broker().unstable = true;
    let starts = core.session.claim(&core.group, &[tp(0)]);
    assert_eq!(starts, Some(crate::sink::Starts::Group));
    assert_eq!(core.metrics.claims_unchecked.get(), 1);
}

/// A topic deleted and created again under its name starts at 0: what this process committed
/// in the old one holds nothing.
#[test]
fn a_deleted_topic_takes_what_this_process_committed_there_with_it() {
    let mut core = committed_to_4();
    core.broker().missing = vec!["in".into()];
    core.revoke(("in", 0));
    core.broker().missing.clear();
    core.broker().committed.clear();
    core.broker().fill(("in", 0), 0, 8, &[]);
    core.rejoin(&[("in", 0)], 0);
    assert_eq!(core.group.fetch_at(("in", 0)), Some(0));
    assert_eq!(went_back(&core), 0);
}

/// A database restored from a backup took its rows back with its offsets: reading again from
/// there is right.
#[test]
fn offsets_kept_with_the_outputs_are_believed_when_they_go_back() {
    let mut core = Core::direct(every(2));
    core.broker().with_outputs = true;
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.rejoin(&[("in", 0)], 0);
    for _ in 0..4 {
        core.turn(); // committed at 2, then 4
    }
    core.revoke(("in", 0));
    core.broker().committed.insert(tp(0), 2);
    core.rejoin(&[("in", 0)], 0);
    assert_eq!(core.group.fetch_at(("in", 0)), Some(2));
    core.broker().fail_commits = 1;
    core.turn();
    core.turn();
    assert_eq!(core.group.seeks.borrow().last(), Some(&vec![(tp(0), 2)]));
    assert_eq!(went_back(&core), 0);
}

#[test]
fn a_record_read_while_a_rewind_is_owed_comes_again() {
    let mut core = Core::direct(every(100));
    core.broker().fill(("in", 0), 0, 3, &[]);
    core.broker().fill(("in", 1), 0, 3, &[]);
    core.broker().fail_sends = 1;
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    core.turn(); // in/0@0: its send fails, the unit aborts
    core.turn(); // in/1@0, the first record of in/1, read while the rewind is owed
    assert_eq!(
        core.group.seeks.borrow().last(),
        Some(&vec![(tp(0), 0), (tp(1), 0)])
    );
    core.run(100);
    core.finish();
    let all: Vec<(i32, i64)> = (0..3).flat_map(|o| [(0, o), (1, o)]).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

#[test]
fn no_commit_passes_a_record_whose_send_failed() {
    let mut core = Core::direct(always());
    core.broker().fill(("in", 0), 0, 3, &[]);
    core.broker().fail_sends = 1;
    core.assign(("in", 0), 0);
    core.run(20);
    let b = core.broker();
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 1), (0, 2)]));
    assert_eq!(b.committed.get(&tp(0)), Some(&3));
}

#[test]
fn a_revoke_commits_below_staged_records_and_drops_them() {
    let app = Answers::default();
    let mut core = Core::staged(every(1000), calls_of(2), &app);
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.broker().fill(("in", 1), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    for _ in 0..4 {
        core.turn();
    }
    assert_eq!(app.offsets(0), [(0, 0), (1, 0)]);
    assert_eq!(app.offsets(1), [(0, 1), (1, 1)]);
    app.answer(0, true);
    core.turn(); // 0@0 and 1@0 in the open unit; 0@1 and 1@1 out with the second call
    core.revoke(("in", 0));
    // The revoke committed first, below the staged records of both partitions.
    assert_eq!(core.broker().commits(), [vec![(tp(0), 1), (tp(1), 1)]]);
    app.answer(1, true);
    core.run(10);
    core.finish();
    let b = core.broker();
    // 0@1 was dropped with its partition: its next owner reads it from offset 1.
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (1, 0), (1, 1)]));
    assert_eq!(b.committed.get(&tp(0)), Some(&1));
    assert_eq!(b.committed.get(&tp(1)), Some(&2));
}

#[test]
fn commits_move_the_group_past_markers_with_records_or_without() {
    let mut core = Core::direct(every(2));
    {
        let mut b = core.broker();
        b.fill(("in", 0), 0, 4, &[]);
        b.mark(("in", 0), 1);
        b.mark(("in", 0), 3);
    }
    core.assign(("in", 0), 0);
    core.run(10);
    // Records 0 and 2, and the marker after 2 too.
    assert_eq!(core.broker().commits(), [vec![(tp(0), 4)]]);
    let mut core = Core::direct(always());
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.run(10);
    assert_eq!(core.broker().committed.get(&tp(0)), Some(&2));
    core.group.skip_to(("in", 0), 4); // markers at 2 and 3 arrive alone
    core.turn();
    let b = core.broker();
    assert_eq!(b.committed.get(&tp(0)), Some(&4));
    assert_eq!(
        b.calls
            .iter()
            .filter(|c| matches!(c, Call::Send { .. }))
            .count(),
        2
    );
}

#[test]
fn an_offsets_only_unit_stops_at_a_staged_record() {
    let app = Answers::default();
    let mut core = Core::staged(always(), calls_of(1), &app);
    core.broker().fill(("in", 0), 0, 1, &[]);
    core.assign(("in", 0), 0);
    core.turn(); // in/0@0 staged, its call out
    core.group.skip_to(("in", 0), 3); // markers behind it
    core.turn();
    core.turn();
    let passed = |core: &Core| {
        core.broker()
            .commits()
            .iter()
            .flatten()
            .any(|(t, o)| *t == tp(0) && *o > 0)
    };
    assert!(!passed(&core), "{:?}", core.broker().commits());
    app.answer(0, true);
    core.run(5);
    assert_eq!(core.broker().committed.get(&tp(0)), Some(&3));
    assert_eq!(core.broker().lineages("out"), lineages(&[(0, 0)]));
}

#[test]
fn a_refused_record_goes_to_the_dead_letter_topic_on_its_replay_and_the_rest_once() {
    let mut core = Core::direct(every(5));
    core.broker().fill(("in", 0), 0, 5, &[2]);
    core.broker().refuse = Some(b"poison".to_vec());
    core.assign(("in", 0), 0);
    core.run(50);
    core.finish();
    let b = core.broker();
    assert_eq!(
        b.lineages("out"),
        lineages(&[(0, 0), (0, 1), (0, 3), (0, 4)])
    );
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 2)]));
    let dlq: Vec<_> = b.outputs.iter().filter(|o| o.topic == "out.dlq").collect();
    assert_eq!(dlq[0].reason.as_deref(), Some("rejected_by_broker"));
    assert_eq!(b.calls.iter().filter(|c| **c == Call::Abort).count(), 1);
}

/// A stateful transform hears what became of each record before the next: the dedup keeps
/// nothing of a record whose output the broker refused (its dead-letter copy went instead),
/// so the next record of its key is the first that goes out.
#[test]
fn a_stateful_transform_keeps_nothing_of_a_record_whose_output_was_refused() {
    use crate::state::window::{Size, Windows};
    let config = crate::config::DedupConfig {
        windows: Windows::new(Size::Days(1), jiff::tz::TimeZone::UTC, Duration::ZERO),
        key: None,
        time: None,
        late: crate::config::Late::Dlq,
        changelog: "cl".into(),
        retention: Duration::from_secs(86_400),
        state_dir: None,
        max_key: 64,
        max_keys: usize::MAX,
        max_ahead: i64::MAX / 4,
        aggregate: None,
    };
    let changelog = Box::new(crate::state::restore::Empty);
    let metrics = crate::metrics::Metrics::new();
    let dedup =
        crate::transform::dedup::Dedup::new(&config, Default::default(), changelog, None, metrics);
    let mut core = Core::transformed(Box::new(dedup), every(3));
    core.broker().fill(("in", 0), 0, 3, &[0]);
    for r in core.broker().log.values_mut().flatten() {
        r.key = Some(b"dev-1".to_vec());
        r.timestamp = Some(1_700_000_000_000 + r.offset);
    }
    core.broker().refuse = Some(b"poison".to_vec());
    core.assign(("in", 0), 0);
    core.run(50);
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 0)]));
    assert_eq!(
        b.lineages("out"),
        lineages(&[(0, 1)]),
        "the first of dev-1 that went out"
    );
}

/// A transform that cannot take partition 1 (its state has no home) its first `left` times,
/// from its record at `from`.
struct Homeless {
    left: u32,
    from: i64,
}

impl crate::transform::Transform for Homeless {
    fn apply<'a>(
        &mut self,
        input: &crate::transform::InputRecord<'a>,
    ) -> Result<Vec<crate::transform::OutputRecord<'a>>, crate::transform::Failure> {
        if input.partition == 1 && input.offset >= self.from && self.left > 0 {
            self.left -= 1;
            return Err(crate::transform::Failure::Held("no home".into()));
        }
        Ok(vec![crate::transform::OutputRecord {
            topic: None,
            partition: None,
            key: None,
            value: input.value.map(std::borrow::Cow::Borrowed),
            headers: crate::transform::OutputHeaders::Input,
        }])
    }
}

/// A partition the transform cannot take is held: its records wait (no commit passes its
/// first one) while the other partitions go on; released after its back-off, it is read again
/// from there, and nothing of it is lost or doubled.
#[test]
fn a_held_partition_waits_while_the_others_go_on_and_nothing_of_it_is_lost() {
    for pause_ignored in [false, true] {
        for arriving in [false, true] {
            held_partition(pause_ignored, arriving);
        }
    }
}

/// [`a_held_partition_waits_while_the_others_go_on_and_nothing_of_it_is_lost`], with a
/// consumer whose pause takes or not (the held partition's records keep coming, and wait all
/// the same), and records `arriving` on the held partition when its back-off passes (the one
/// read in the turn that releases it is read again from its first record not taken: applied
/// in that turn too, it was doubled).
fn held_partition(pause_ignored: bool, arriving: bool) {
    crate::clock::simulated::start();
    let mut core = Core::transformed(Box::new(Homeless { left: 1, from: 0 }), every(2));
    core.group.pause_ignored.set(pause_ignored);
    core.broker().fill(("in", 0), 0, 4, &[]);
    core.broker().fill(("in", 1), 0, 4, &[]);
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    core.run(50);
    let held = |core: &Core| core.metrics.state_partitions_held.get();
    assert_eq!(held(&core), 1);
    assert_eq!(
        core.broker().lineages("out"),
        lineages(&[(0, 0), (0, 1), (0, 2), (0, 3)])
    );
    for offsets in core.broker().commits() {
        let p1 = offsets.iter().find(|(tp, _)| tp.1 == 1);
        assert!(
            p1.is_none_or(|(_, o)| *o == 0),
            "past the held record: {offsets:?}"
        );
    }
    crate::clock::simulated::pass(Duration::from_secs(2));
    let last = if arriving { 6 } else { 4 };
    core.broker().fill(("in", 1), 0, last, &[]);
    core.run(50);
    core.finish();
    assert_eq!(held(&core), 0);
    let ends = [4, last];
    let all: Vec<(i32, i64)> = (0..2)
        .flat_map(|p| (0..ends[p as usize]).map(move |o| (p, o)))
        .collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

/// A unit aborted while a partition is held, in a group that committed nothing yet: the
/// rewind takes the held partition back to its first record read, and its release does not
/// seek past it (the records before the hold were aborted: they come again).
#[test]
fn a_rewind_without_a_committed_offset_moves_a_hold_back_to_where_it_went() {
    crate::clock::simulated::start();
    let mut core = Core::transformed(Box::new(Homeless { left: 1, from: 2 }), every(6));
    core.broker().fill(("in", 0), 0, 4, &[3]);
    core.broker().fill(("in", 1), 0, 4, &[]);
    core.broker().refuse = Some(b"poison".to_vec());
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    core.run(50);
    crate::clock::simulated::pass(Duration::from_secs(2));
    core.run(50);
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 3)]));
    let all: Vec<(i32, i64)> = (0..2)
        .flat_map(|p| (0..4).map(move |o| (p, o)))
        .filter(|&(p, o)| (p, o) != (0, 3))
        .collect();
    assert_eq!(b.lineages("out"), lineages(&all));
}

#[test]
fn an_application_that_answers_differently_on_the_replay_is_judged_afresh() {
    let app = Answers::default();
    let mut core = Core::staged(every(1), calls_of(1), &app);
    core.broker().fill(("in", 0), 0, 1, &[]);
    core.broker().refuse = Some(b"poison".to_vec());
    core.assign(("in", 0), 0);
    core.turn(); // in/0@0 out to the application
    app.answer_value(0, b"poison, too large for the topic");
    core.turn(); // refused: the unit aborts, the verdict is learned
    core.turn(); // the rewind; in/0@0 read again and sent again
    core.turn();
    assert_eq!(app.calls(), 2, "{:?}", core.broker().calls);
    app.answer_value(1, b"a smaller answer");
    core.run(10);
    let b = core.broker();
    assert_eq!(b.lineages("out"), lineages(&[(0, 0)]));
    assert!(b.lineages("out.dlq").is_empty());
}

#[test]
fn no_unit_begins_on_a_client_whose_request_timed_out() {
    let mut core = Core::direct(every(1));
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.turn(); // record 0 committed
    core.broker().stale = true; // a request of that transaction timed out meanwhile
    core.turn(); // record 1
    let b = core.broker();
    let first = b
        .calls
        .iter()
        .position(|c| matches!(c, Call::Commit(_)))
        .unwrap();
    let send = |o| Call::Send {
        topic: "out".into(),
        lineage: format!("in/0/{o}/0"),
    };
    assert_eq!(
        b.calls[first + 1..],
        [
            Call::Connect,
            Call::Begin,
            send(1),
            Call::Commit(vec![(tp(0), 2)])
        ]
    );
    let recreated = r#"exactly_producer_recreations_total{reason="request_timed_out"}"#;
    drop(b);
    assert_eq!(sample(&core, recreated).as_deref(), Some("1"));
}

#[test]
fn a_record_routed_to_a_topic_that_keeps_refusing_goes_to_the_dead_letter_topic_alone() {
    let app = Answers::default();
    let mut core = Core::staged(every(3), calls_of(3), &app);
    core.broker().fill(("in", 0), 0, 3, &[]);
    core.broker().missing = vec!["nowhere".into()];
    core.assign(("in", 0), 0);
    let route = |r: &crate::transform::OwnedRecord| {
        let topic = (r.offset == 1).then(|| "nowhere".to_string());
        (topic, r.value.clone().unwrap_or_default())
    };
    for _ in 0..3 {
        core.turn();
    }
    app.answer_with(0, route);
    core.run(5); // the send to nowhere is refused: abort, rewind, read again
    assert_eq!(app.calls(), 2);
    app.answer_with(1, route);
    core.run(10);
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 2)]));
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 1)]));
    let dlq: Vec<_> = b.outputs.iter().filter(|o| o.topic == "out.dlq").collect();
    assert_eq!(dlq[0].reason.as_deref(), Some("route_refused"));
    // Deliveries are watched (for the evidence that clears a route) only while one refuses.
    assert_eq!(b.watched[..2], [false, true]);
    let aborted = r#"exactly_transaction_aborts_total{reason="route_refused"}"#;
    drop(b);
    assert_eq!(sample(&core, aborted).as_deref(), Some("1"));
}

/// librdkafka's lines come through a queue another thread serves: the commit's "topic
/// authorization failed" can come back before the line naming the route that caused it. The
/// driver waits to hear the denial (logged after the route's refusal) before it decides that
/// exactly itself may not write: CI saw exactly stop here.
#[test]
fn a_route_denied_a_permission_is_the_routes_fault_when_the_commit_fails_before_it_is_heard() {
    let app = Answers::default();
    let mut core = Core::staged(every(3), calls_of(3), &app);
    core.broker().fill(("in", 0), 0, 3, &[]);
    core.broker().denied = vec!["forbidden".into()];
    core.assign(("in", 0), 0);
    let route = |r: &crate::transform::OwnedRecord| {
        let topic = (r.offset == 1).then(|| "forbidden".to_string());
        (topic, r.value.clone().unwrap_or_default())
    };
    for _ in 0..3 {
        core.turn();
    }
    app.answer_with(0, route);
    core.run(5); // the commit fails for the route: abort, rewind, read again
    assert_eq!(app.calls(), 2);
    app.answer_with(1, route);
    core.run(10);
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 2)]));
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 1)]));
    let aborted = r#"exactly_transaction_aborts_total{reason="route_refused"}"#;
    drop(b);
    assert_eq!(sample(&core, aborted).as_deref(), Some("1"));
}

/// A denial heard only after its unit ended (the log is served by another thread) is not the
/// next unit's: a later abort for another reason does not stop exactly.
#[test]
fn a_denial_heard_after_its_unit_ended_does_not_stop_a_later_one() {
    let heard = Heard::default();
    let mut core = Core::transformed(Box::new(heard.clone()), every(2));
    core.broker().fill(("in", 0), 0, 4, &[]);
    core.assign(("in", 0), 0);
    core.turn();
    core.turn(); // 0, 1 committed; nothing open
    assert_eq!(core.broker().commits().len(), 1);
    core.broker().heard_denial = Some("may not write 'elsewhere'".into());
    core.broker().fail_sends = 1; // 2's send fails: an abort, not for a permission
    core.run(10);
    core.finish();
    let all: Vec<(i32, i64)> = (0..4).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

#[test]
fn a_route_that_took_a_record_in_the_open_unit_is_not_quarantined_in_it() {
    let app = Answers::default();
    // Long enough that the replay's first send comes before it on a busy machine.
    let bound = Duration::from_secs(1);
    let mut core = Core::routed(every(6), calls_of(3), &app, bound);
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.broker().missing = vec!["late".into()];
    core.assign(("in", 0), 0);
    let route = |r: &crate::transform::OwnedRecord| {
        let topic = [0, 4].contains(&r.offset).then(|| "late".to_string());
        (topic, r.value.clone().unwrap_or_default())
    };
    for _ in 0..6 {
        core.turn();
    }
    app.answer_with(0, route);
    core.run(10); // refused: abort, rewind, read again
    // The topic is created; the replay's first record goes there and is delivered.
    core.broker().missing.clear();
    let calls = app.calls();
    app.answer_with(calls - 2, route);
    core.run(3);
    // The bound passes while the unit is open: the delivery, not the old refusal, decides.
    std::thread::sleep(bound + Duration::from_millis(200));
    app.answer_with(calls - 1, route);
    core.run(10);
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("late"), lineages(&[(0, 0), (0, 4)]));
    assert_eq!(b.lineages("out.dlq"), lineages(&[]));
}

/// A refusal heard in the middle of a unit (the driver asks after a refusing route) is the
/// unit's: it does not commit, whatever the sink itself remembers (the fake, like the
/// database sink, forgets a refusal once it reported it). A review found the database sink
/// committing a refused record's offset without its row or its dead-letter copy.
#[test]
fn a_refusal_heard_in_the_middle_of_a_unit_keeps_it_from_committing() {
    let app = Answers::default();
    let bound = Duration::from_millis(300);
    let mut core = Core::routed(every(6), calls_of(6), &app, bound);
    core.broker().fill(("in", 0), 0, 6, &[3]);
    core.broker().refuse = Some(b"poison".to_vec());
    core.broker().missing = vec!["nowhere".into()];
    core.assign(("in", 0), 0);
    let route = |r: &crate::transform::OwnedRecord| {
        let topic = [1, 4].contains(&r.offset).then(|| "nowhere".to_string());
        (topic, r.value.clone().unwrap_or_default())
    };
    for _ in 0..6 {
        core.turn();
    }
    // The first unit: 1's route refuses (abort); its replay: 1 is the record's fault, 3 is
    // refused, then 4 asks after the route (heard: 3's refusal), then the unit ends.
    app.answer_with(0, route);
    core.run(10);
    std::thread::sleep(bound); // the route has refused for the bound: quarantined
    for _ in 0..4 {
        for i in 1..app.calls() {
            app.answer_with(i, route);
        }
        core.run(10);
    }
    core.finish();
    let b = core.broker();
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 2), (0, 5)]));
    assert_eq!(b.lineages("out.dlq"), lineages(&[(0, 1), (0, 3), (0, 4)]));
    let reasons: Vec<_> = (b.outputs.iter().filter(|o| o.topic == "out.dlq"))
        .map(|o| o.reason.as_deref().unwrap_or_default())
        .collect();
    assert_eq!(
        reasons,
        ["route_refused", "rejected_by_broker", "route_refused"]
    );
}

/// Two partitions of eight records each, poison at offset 3 of both, a commit every 4 records:
/// the first unit commits both at 2, the second is aborted for the refused poison (a verdict
/// on each). Every fact of either partition is kept.
fn with_facts_on_two_partitions() -> Core {
    let mut core = Core::direct(every(4));
    core.broker().fill(("in", 0), 0, 8, &[3]);
    core.broker().fill(("in", 1), 0, 8, &[3]);
    core.broker().refuse = Some(b"poison".to_vec());
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    for _ in 0..8 {
        core.turn();
    }
    for p in [0, 1] {
        let facts = core.session.facts(&tp(p));
        assert_eq!(
            (
                facts.first_read,
                facts.committed,
                facts.verdicts,
                facts.floor
            ),
            (Some(0), Some(2), 1, Some(2)),
            "in/{p}"
        );
        assert!(core.session.owns(&tp(p)));
    }
    assert_eq!(
        core.broker()
            .calls
            .iter()
            .filter(|c| **c == Call::Abort)
            .count(),
        1
    );
    core
}

/// A revoke forgets every fact of its partitions (what was read, committed, judged, held;
/// where the lag counts from; the transform is told) and keeps the others'.
#[test]
fn a_revoke_forgets_every_fact_of_its_partitions_and_keeps_the_others() {
    let mut core = with_facts_on_two_partitions();
    core.revoke(("in", 0));
    assert_eq!(core.session.facts(&tp(0)), Default::default());
    let kept = core.session.facts(&tp(1));
    assert_eq!(
        (kept.first_read, kept.committed, kept.verdicts),
        (Some(0), Some(2), 1)
    );
    core.turn();
    assert!(!core.session.owns(&tp(0)) && core.session.owns(&tp(1)));
    // The rest of in/1 goes on: its poison's dead-letter copy on the replay, then the rest.
    core.run(30);
    core.finish();
    let b = core.broker();
    let out: Vec<_> = b
        .lineages("out")
        .into_iter()
        .filter(|l| l.starts_with("in/1/"))
        .collect();
    assert_eq!(
        out,
        lineages(&[(1, 0), (1, 1), (1, 2), (1, 4), (1, 5), (1, 6), (1, 7)])
    );
    assert_eq!(b.lineages("out.dlq"), lineages(&[(1, 3)]));
}

/// A replaced consumer (fenced) forgets every partition's facts, its verdicts too (they were
/// kept until a review); the producer stays.
#[test]
fn a_replaced_consumer_forgets_every_partition_and_keeps_the_producer() {
    let mut core = with_facts_on_two_partitions();
    core.replace();
    for p in [0, 1] {
        assert_eq!(core.session.facts(&tp(p)), Default::default(), "in/{p}");
        assert!(!core.session.owns(&tp(p)), "in/{p}");
    }
    let connects = core
        .broker()
        .calls
        .iter()
        .filter(|c| **c == Call::Connect)
        .count();
    assert_eq!(connects, 1);
}

/// A new producer (a request of the old one timed out) is no new owner: every partition's
/// facts stay, and the verdicts still send the dead-letter copies.
#[test]
fn a_new_producer_keeps_every_partitions_facts() {
    let mut core = with_facts_on_two_partitions();
    core.broker().stale = true;
    core.turn(); // the rewind, then a record: a new producer before its unit begins
    let connects = core
        .broker()
        .calls
        .iter()
        .filter(|c| **c == Call::Connect)
        .count();
    assert_eq!(connects, 2);
    for p in [0, 1] {
        let facts = core.session.facts(&tp(p));
        assert_eq!(
            (facts.first_read, facts.committed, facts.verdicts),
            (Some(0), Some(2), 1)
        );
    }
    core.run(30);
    core.finish();
    assert_eq!(
        core.broker().lineages("out.dlq"),
        lineages(&[(0, 3), (1, 3)])
    );
}

#[test]
fn shutdown_commits_what_was_answered_within_the_grace() {
    let (app, mut core) = two_calls_out();
    app.answer(0, true); // the second call is never answered
    core.shutdown.cancel();
    let grace = Duration::from_secs(2);
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let finished = core.session.finish(&core.group, grace);
        let _ = tx.send((finished.is_ok(), core));
    });
    let (ok, core) = rx
        .recv_timeout(grace + Duration::from_secs(3))
        .expect("the final commit must come within the grace");
    assert!(ok);
    assert!(started.elapsed() < grace, "{:?}", started.elapsed());
    let b = core.broker();
    assert_eq!(b.commits(), [vec![(tp(0), 2)]]);
    assert_eq!(b.lineages("out"), lineages(&[(0, 0), (0, 1)]));
}

/// The value of the series `name` in `core`'s metrics, if it is there.
fn sample(core: &Core, name: &str) -> Option<String> {
    let text = core.metrics.render();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
}

#[test]
fn a_commit_whose_outcome_was_unknown_counts_as_what_the_broker_says() {
    let mut core = Core::direct(every(3));
    core.broker().fill(("in", 0), 0, 6, &[]);
    core.broker().commit_unknown = 1;
    core.assign(("in", 0), 0);
    for _ in 0..3 {
        core.turn(); // the commit of 0..3 took effect, its outcome unknown
    }
    let committed = r#"exactly_transactions_total{outcome="committed"}"#;
    let aborted = r#"exactly_transactions_total{outcome="aborted"}"#;
    let consumed = r#"exactly_records_consumed_total{partition="0",topic="in"}"#;
    assert_eq!(sample(&core, committed).as_deref(), Some("1"));
    assert_eq!(sample(&core, consumed).as_deref(), Some("3"));
    assert_eq!(sample(&core, aborted), None);
    core.broker().commit_unknown_lost = 1;
    for _ in 0..3 {
        core.turn(); // the commit of 3..6 did not take effect, its outcome unknown
    }
    assert_eq!(sample(&core, aborted).as_deref(), Some("1"));
    assert_eq!(sample(&core, committed).as_deref(), Some("1"));
    core.run(20);
    assert_eq!(sample(&core, consumed).as_deref(), Some("6"));
    let all: Vec<(i32, i64)> = (0..6).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

#[test]
fn a_call_out_when_another_failed_is_counted_when_it_comes_back() {
    let (app, mut core) = two_calls_out();
    app.answer(0, false);
    core.turn(); // the first call failed: the rewind drops both calls' records
    core.turn();
    app.answer_or(1, Some(CallError::Status(500, "internal error".into())));
    core.turn();
    let count = |outcome: &str| {
        sample(
            &core,
            &format!("exactly_calls_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(count("unreachable").as_deref(), Some("1"));
    assert_eq!(count("http_error").as_deref(), Some("1"));
}

#[test]
fn the_pause_between_replaced_consumers_starts_again_after_progress() {
    use super::replacements_after;
    let mut n = 0;
    for _ in 0..4 {
        n = replacements_after(n, false);
    }
    assert_eq!(n, 4);
    assert_eq!(replacements_after(n, true), 1);
    let pause = |n| crate::backoff::Backoff::CONSUMER.after(n);
    assert!(pause(replacements_after(n, true)) < pause(replacements_after(n, false)));
}

/// Passthrough that records what it hears of its units, in order.
#[derive(Clone, Default)]
struct Heard(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);

impl Heard {
    fn said(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

impl crate::transform::Transform for Heard {
    fn apply<'a>(
        &mut self,
        input: &crate::transform::InputRecord<'a>,
    ) -> Result<Vec<crate::transform::OutputRecord<'a>>, crate::transform::Failure> {
        self.0.lock().unwrap().push("applied");
        Ok(vec![crate::transform::OutputRecord {
            topic: None,
            partition: None,
            key: input.key.map(std::borrow::Cow::Borrowed),
            value: input.value.map(std::borrow::Cow::Borrowed),
            headers: crate::transform::OutputHeaders::Input,
        }])
    }
    fn committed(&mut self) {
        self.0.lock().unwrap().push("committed");
    }
    fn dropped(&mut self, known: bool) {
        self.0
            .lock()
            .unwrap()
            .push(if known { "dropped" } else { "unknown" });
    }
    fn revoked(&mut self, _: &[Tp]) {
        self.0.lock().unwrap().push("revoked");
    }
}

/// What `heard` said, with the records applied in a row counted: `2 applied`.
fn story(heard: &Heard) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut run = 0;
    for s in heard.said() {
        if s == "applied" {
            run += 1;
            continue;
        }
        if run > 0 {
            out.push(format!("{run} applied"));
            run = 0;
        }
        out.push(s.to_string());
    }
    if run > 0 {
        out.push(format!("{run} applied"));
    }
    out
}

#[test]
fn the_transform_hears_how_each_unit_ended_before_it_applies_more() {
    let heard = Heard::default();
    let mut core = Core::transformed(Box::new(heard.clone()), every(2));
    core.broker().fill(("in", 0), 0, 12, &[]);
    core.assign(("in", 0), 0);
    let settles = |h: &Heard| {
        h.said()
            .iter()
            .filter(|s| **s != "applied" && **s != "revoked")
            .count()
    };
    // Turns until the transform heard `n` settles (the next record is applied meanwhile).
    let until = |core: &mut Core, n: usize| {
        for _ in 0..50 {
            if settles(&heard) >= n {
                return;
            }
            core.turn();
        }
        panic!("{n} settles never came: {:?}", story(&heard));
    };
    until(&mut core, 1); // 0, 1 committed
    core.broker().fail_commits = 1;
    until(&mut core, 3); // 2, 3 aborted, read again and committed
    core.broker().commit_unknown = 1;
    until(&mut core, 4); // 4, 5: the outcome unknown, the committed offsets say it took effect
    core.broker().commit_unknown_lost = 1;
    until(&mut core, 6); // 6, 7: unknown, and it did not; read again and committed
    core.broker().fail_sends = 1;
    until(&mut core, 8); // 9's send refused (8 was applied already): both again
    core.broker().fence_commits = 1;
    until(&mut core, 9); // 10, 11: took effect, answered fenced: a new producer, and the
    // committed offsets say it committed
    let phases = [
        "2 applied, committed",                     // 0, 1
        "2 applied, dropped, 2 applied, committed", // 2, 3
        "2 applied, committed",                     // 4, 5, resolved by the rewind
        "2 applied, dropped, 2 applied, committed", // 6, 7
        "2 applied, dropped, 2 applied, committed", // 8, 9
        "2 applied, committed",                     // 10, 11, resolved by the rewind
    ];
    assert_eq!(story(&heard).join(", "), phases.join(", "));
    core.finish();
    let begun = core
        .broker()
        .calls
        .iter()
        .filter(|c| **c == Call::Begin)
        .count();
    assert_eq!(begun, settles(&heard), "one settle for each unit begun");
    let all: Vec<(i32, i64)> = (0..12).map(|o| (0, o)).collect();
    assert_eq!(core.broker().lineages("out"), lineages(&all));
}

/// At shutdown the transform hears, after how the final unit ended, that it gives its
/// partitions up (a stateful one checkpoints them then): the loop has no turn after the
/// consumer's close.
#[test]
fn shutdown_revokes_every_partition_after_the_final_settle() {
    let heard = Heard::default();
    let mut core = Core::transformed(Box::new(heard.clone()), every(100));
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.run(5);
    core.finish();
    assert_eq!(story(&heard), ["2 applied", "committed", "revoked"]);
}

#[test]
fn a_final_commit_whose_outcome_is_unknown_is_heard_as_unknown() {
    let heard = Heard::default();
    let mut core = Core::transformed(Box::new(heard.clone()), every(100));
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.run(5);
    core.broker().commit_unknown = 1;
    core.finish();
    assert_eq!(story(&heard), ["2 applied", "unknown", "revoked"]);
}

/// Passthrough that writes, before each commit, one record of its own to `state` (as the dedup
/// writes each partition's stream time).
struct Tallied {
    applied: usize,
}

impl crate::transform::Transform for Tallied {
    fn apply<'a>(
        &mut self,
        input: &crate::transform::InputRecord<'a>,
    ) -> Result<Vec<crate::transform::OutputRecord<'a>>, crate::transform::Failure> {
        self.applied += 1;
        Heard::default().apply(input)
    }
    fn before_commit(&mut self) -> Vec<crate::transform::OutputRecord<'static>> {
        let n = std::mem::take(&mut self.applied);
        vec![crate::transform::OutputRecord {
            topic: Some("state".into()),
            partition: Some(0),
            key: Some(std::borrow::Cow::Borrowed(b"applied")),
            value: Some(n.to_string().into_bytes().into()),
            headers: crate::transform::OutputHeaders::Set(Vec::new()),
        }]
    }
}

#[test]
fn every_commit_of_a_units_records_carries_what_the_transform_writes_before_it() {
    let mut core = Core::transformed(Box::new(Tallied { applied: 0 }), every(2));
    core.broker().fill(("in", 0), 0, 5, &[]);
    core.broker().fill(("in", 1), 0, 1, &[]);
    core.assign(("in", 0), 0);
    core.run(10); // two commits due by their bound; record 4 open
    core.revoke(("in", 0)); // its commit first
    core.assign(("in", 1), 0);
    core.run(5);
    core.finish(); // record 0 of in/1
    let b = core.broker();
    let commits: Vec<usize> = (b.calls.iter().enumerate())
        .filter(|(_, c)| matches!(c, Call::Commit(_)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(commits.len(), 4, "{:#?}", b.calls);
    for i in commits {
        let own = Call::Send {
            topic: "state".into(),
            lineage: String::new(),
        };
        assert_eq!(b.calls[i - 1], own, "before commit {i}: {:#?}", b.calls);
    }
    assert_eq!(b.lineages("state").len(), 4);
    assert_eq!(b.lineages("out").len(), 6);
}

/// Passthrough to the partition after the input's.
struct Pinned;

impl crate::transform::Transform for Pinned {
    fn apply<'a>(
        &mut self,
        input: &crate::transform::InputRecord<'a>,
    ) -> Result<Vec<crate::transform::OutputRecord<'a>>, crate::transform::Failure> {
        Ok(vec![crate::transform::OutputRecord {
            topic: None,
            partition: Some(input.partition + 1),
            key: input.key.map(std::borrow::Cow::Borrowed),
            value: input.value.map(std::borrow::Cow::Borrowed),
            headers: crate::transform::OutputHeaders::Input,
        }])
    }
}

#[test]
fn an_output_goes_to_the_partition_its_transform_names() {
    let mut core = Core::transformed(Box::new(Pinned), every(2));
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.broker().fill(("in", 3), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.assign(("in", 3), 0);
    core.run(10);
    core.finish();
    let mut got: Vec<_> = core.broker().outputs.iter().map(|o| o.partition).collect();
    got.sort();
    assert_eq!(got, [Some(1), Some(1), Some(4), Some(4)]);
}

#[test]
fn an_unknown_outcome_is_resolved_from_every_partition_of_its_unit() {
    // in/1 only moved past a marker (nothing was read of it): the rewind does not seek it,
    // but the unit committed its offset, so what is committed for it tells too.
    let heard = Heard::default();
    let mut core = Core::transformed(Box::new(heard.clone()), every(2));
    core.broker().fill(("in", 0), 0, 2, &[]);
    core.assign(("in", 0), 0);
    core.assign(("in", 1), 0);
    core.group.skip_to(("in", 1), 3);
    core.broker().commit_unknown = 1;
    core.run(10);
    let commits = core.broker().commits();
    assert!(
        commits
            .iter()
            .any(|c| c.iter().any(|(tp, o)| tp.1 == 1 && *o == 3)),
        "the unit commits in/1's position: {commits:?}"
    );
    assert_eq!(story(&heard), ["2 applied", "committed"]);
}

#[test]
fn an_unknown_outcome_of_the_commit_before_a_revoke_is_heard_before_the_revoke() {
    for (took_effect, heard_as) in [(true, "committed"), (false, "dropped")] {
        let heard = Heard::default();
        let mut core = Core::transformed(Box::new(heard.clone()), every(100));
        core.broker().fill(("in", 0), 0, 2, &[]);
        core.assign(("in", 0), 0);
        core.run(5);
        if took_effect {
            core.broker().commit_unknown = 1;
        } else {
            core.broker().commit_unknown_lost = 1;
        }
        core.revoke(("in", 0));
        core.run(5);
        assert_eq!(
            story(&heard),
            ["2 applied", heard_as, "revoked"],
            "the commit took effect: {took_effect}"
        );
    }
}

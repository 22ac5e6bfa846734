//! The call-out's stage: records read but not yet applied.
//!
//! With `--call-url` the loop does not apply a record as it reads it. It stages it in the open
//! batch; a batch is sent when it reaches `--call-batch-records`, `--call-batch-bytes` or
//! `--call-linger`, with up to `--call-in-flight` calls out at once; answers are applied in
//! the order the records were read (the oldest call first).
//!
//! A staged record is in no transaction yet, so no commit may pass it: [`Stage::firsts`] is
//! the one source of the commit's ceiling, read live at every commit. A record leaves the stage
//! only in two ways: [`Stage::take`] hands it out with its answer to be applied at once (into
//! the open unit, or, if that fails, into an abort that owes a rewind), or [`Stage::clear`]
//! drops everything for a rewind. A call that failed keeps its records staged, so the commit
//! that follows stays below them. Records of revoked partitions are dropped (the next owner
//! reads them from the committed offset).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::config::CallSpec;
use crate::kafka::Tp;
use crate::transform::call::{Answer, Application, CallError, InFlight};
use crate::transform::{InputRecord, Limits, OwnedRecord};

/// Records read but not yet applied, and the calls out for them.
pub struct Stage {
    spec: CallSpec,
    app: Box<dyn Application>,
    limits: Limits,
    open: Vec<Staged>,
    open_bytes: usize,
    opened: Instant,
    flights: VecDeque<Flight>,
    /// The oldest call's records, answered and not yet applied, in the order read.
    answered: VecDeque<(OwnedRecord, Answer)>,
    /// Calls failed in a row, and no call before this instant (back-off).
    failures: u32,
    not_before: Option<Instant>,
    /// Calls still out when a rewind dropped their records: their answers are not applied,
    /// but what the application said is counted all the same (with the records they held).
    abandoned: Vec<(InFlight, usize)>,
}

struct Flight {
    records: Vec<Staged>,
    call: InFlight,
    /// It failed: its records wait for the rewind.
    failed: bool,
}

/// A record copied out of the consumer's buffer.
struct Staged {
    record: OwnedRecord,
    /// Its partition was revoked while its call was out: not applied.
    dropped: bool,
}

/// The oldest call came back.
pub enum Arrival {
    /// With an answer for each record: [`Stage::take`] hands them out.
    Answered {
        /// From sending to the decoded answer.
        took: Duration,
        /// Records in the call.
        records: usize,
    },
    /// Without answers: the application is unavailable. The call's records stay staged.
    Failed {
        /// Why.
        error: CallError,
        /// From sending to the failure.
        took: Duration,
        /// Records in the call.
        records: usize,
    },
}

impl Stage {
    /// An empty stage calling `app`; answers become outputs within `limits`.
    pub fn new(spec: CallSpec, app: Box<dyn Application>, limits: Limits) -> Stage {
        Stage {
            spec,
            app,
            limits,
            open: Vec::new(),
            open_bytes: 0,
            opened: Instant::now(),
            flights: VecDeque::new(),
            answered: VecDeque::new(),
            failures: 0,
            not_before: None,
            abandoned: Vec::new(),
        }
    }

    /// The limits the application's answers are held to.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Stages a record read from the consumer.
    pub fn push(&mut self, input: &InputRecord<'_>) {
        if self.open.is_empty() {
            self.opened = Instant::now();
        }
        let record = OwnedRecord::of(input);
        self.open_bytes += record.bytes();
        self.open.push(Staged {
            record,
            dropped: false,
        });
    }

    /// Nothing staged, nothing out.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.flights.is_empty() && self.answered.is_empty()
    }

    /// Calls out now.
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    fn batch_full(&self) -> bool {
        self.open.len() >= self.spec.batch_records || self.open_bytes >= self.spec.batch_bytes
    }

    fn backing_off(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|t| now < t)
    }

    /// The open batch is full and cannot be sent yet (every call slot is taken, or the
    /// application is being given time): read nothing more until an answer or the back-off
    /// frees it.
    pub fn full(&self) -> bool {
        self.batch_full()
            && (self.flights.len() >= self.spec.in_flight || self.backing_off(Instant::now()))
    }

    /// Sends the open batch if it is due (`flush`: whatever it holds) and a call slot is free.
    pub fn send_due(&mut self, flush: bool) {
        let now = Instant::now();
        let due = self.batch_full() || flush || now.duration_since(self.opened) >= self.spec.linger;
        if self.open.is_empty()
            || !due
            || self.flights.len() >= self.spec.in_flight
            || self.backing_off(now)
        {
            return;
        }
        let records = std::mem::take(&mut self.open);
        self.open_bytes = 0;
        let inputs: Vec<InputRecord<'_>> = records.iter().map(|s| s.record.as_input()).collect();
        let call = self.app.submit(&inputs, self.spec.timeout);
        drop(inputs);
        self.flights.push_back(Flight {
            records,
            call,
            failed: false,
        });
    }

    /// Whether the oldest call came back: waits up to `wait` for it, or, with no call out,
    /// for the back-off to pass. Nothing arrives while answered records wait to be taken, or
    /// after the oldest call failed (until the rewind clears it).
    pub fn arrival(&mut self, wait: Duration) -> Option<Arrival> {
        if !self.answered.is_empty() {
            return None;
        }
        let Some(head) = self.flights.front_mut() else {
            if let Some(t) = self.not_before {
                std::thread::sleep(t.saturating_duration_since(Instant::now()).min(wait));
            }
            return None;
        };
        if head.failed {
            return None;
        }
        let called = if wait.is_zero() {
            head.call.try_take()?
        } else {
            head.call.wait(wait)?
        };
        let records = head.records.len();
        let answers = match called.answers {
            Ok(answers) => answers,
            Err(error) => {
                head.failed = true;
                return Some(Arrival::Failed {
                    error,
                    took: called.took,
                    records,
                });
            }
        };
        let flight = self.flights.pop_front()?;
        let kept = flight.records.into_iter().zip(answers);
        self.answered = kept
            .filter(|(s, _)| !s.dropped)
            .map(|(s, a)| (s.record, a))
            .collect();
        self.failures = 0;
        self.not_before = None;
        Some(Arrival::Answered {
            took: called.took,
            records,
        })
    }

    /// The next answered record and its answer, to be applied now: from here on no commit
    /// waits for it, so it must go into the open unit, or into an abort that owes a rewind.
    pub fn take(&mut self) -> Option<(OwnedRecord, Answer)> {
        self.answered.pop_front()
    }

    /// A call failed: no call for a while ([`Backoff::APPLICATION`]); returns the pause.
    pub fn failed(&mut self) -> Duration {
        self.failures += 1;
        let pause = Backoff::APPLICATION.after(self.failures);
        self.not_before = Some(Instant::now() + pause);
        pause
    }

    /// How long the loop may wait in `poll`: not past the open batch's linger, and briefly
    /// while calls are out (their answers are picked up between polls).
    pub fn poll_wait(&self, wait: Duration) -> Duration {
        if !self.flights.is_empty() || !self.answered.is_empty() {
            return wait.min(Duration::from_millis(1));
        }
        if self.open.is_empty() {
            return wait;
        }
        let now = Instant::now();
        let mut until = (self.opened + self.spec.linger).saturating_duration_since(now);
        if let Some(t) = self.not_before {
            until = until.max(t.saturating_duration_since(now));
        }
        wait.min(until)
    }

    /// Partitions were revoked: their staged records are not applied.
    pub fn revoke(&mut self, partitions: &[Tp]) {
        let gone = |r: &OwnedRecord| {
            partitions
                .iter()
                .any(|(t, p)| *p == r.partition && *t == r.topic)
        };
        for s in self.flights.iter_mut().flat_map(|f| f.records.iter_mut()) {
            if gone(&s.record) {
                s.dropped = true;
            }
        }
        self.answered.retain(|(r, _)| !gone(r));
        self.open.retain(|s| !gone(&s.record));
        self.open_bytes = self.open.iter().map(|s| s.record.bytes()).sum();
    }

    /// Drops everything (calls out are no longer waited for): the rewind reads it again.
    pub fn clear(&mut self) {
        self.answered.clear();
        for f in self.flights.drain(..).filter(|f| !f.failed) {
            self.abandoned.push((f.call, f.records.len()));
        }
        self.open.clear();
        self.open_bytes = 0;
    }

    /// How the abandoned calls that came back since the last look ended, for the counts. A
    /// call whose answer never came is let go after twice its timeout.
    pub fn abandoned_arrivals(&mut self) -> Vec<Arrival> {
        if self.abandoned.is_empty() {
            return Vec::new();
        }
        let give_up = self.spec.timeout * 2;
        let mut done = Vec::new();
        self.abandoned.retain(|(call, records)| {
            let Some(called) = call.try_take() else {
                return call.sent.elapsed() < give_up;
            };
            let records = *records;
            done.push(match called.answers {
                Ok(_) => Arrival::Answered {
                    took: called.took,
                    records,
                },
                Err(error) => Arrival::Failed {
                    error,
                    took: called.took,
                    records,
                },
            });
            false
        });
        done
    }

    /// The first offset of each partition's staged records, in the order they were read
    /// (answered, then the calls out, oldest first, then the open batch).
    pub fn firsts(&self) -> Vec<(Tp, i64)> {
        let flights = self.flights.iter().flat_map(|f| f.records.iter());
        let records = (self.answered.iter().map(|(r, _)| r)).chain(
            flights
                .chain(self.open.iter())
                .filter(|s| !s.dropped)
                .map(|s| &s.record),
        );
        let mut out: Vec<(Tp, i64)> = Vec::new();
        for r in records {
            if !out
                .iter()
                .any(|((t, p), _)| *p == r.partition && *t == r.topic)
            {
                out.push(((r.topic.clone(), r.partition), r.offset));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::fake::Answers;

    fn spec(batch_records: usize) -> CallSpec {
        CallSpec {
            url: "http://127.0.0.1:9/".into(),
            batch_records,
            batch_bytes: 1000,
            linger: Duration::from_secs(60),
            in_flight: 2,
            timeout: Duration::from_secs(1),
        }
    }

    fn stage(batch_records: usize, app: &Answers) -> Stage {
        let limits = Limits {
            max_output_bytes: 100,
            max_outputs: 10,
        };
        Stage::new(spec(batch_records), Box::new(app.clone()), limits)
    }

    fn record(partition: i32, offset: i64) -> InputRecord<'static> {
        InputRecord {
            topic: "in",
            partition,
            offset,
            timestamp: None,
            key: Some(b"k"),
            value: Some(b"1"),
            headers: vec![(b"h", None)],
        }
    }

    fn tp(p: i32) -> Tp {
        ("in".to_string(), p)
    }

    #[test]
    fn a_copy_reads_back_as_the_record() {
        let r = record(1, 5);
        let s = OwnedRecord::of(&r);
        let back = s.as_input();
        assert_eq!((back.topic, back.partition, back.offset), ("in", 1, 5));
        assert_eq!((back.key, back.value), (r.key, r.value));
        assert_eq!(back.headers, r.headers);
    }

    #[test]
    fn firsts_and_revoke_follow_the_read_order() {
        let app = Answers::default();
        let mut st = stage(3, &app);
        for (p, o) in [(0, 10), (1, 4), (0, 11)] {
            st.push(&record(p, o));
        }
        assert!(st.batch_full());
        assert_eq!(st.firsts(), vec![(tp(0), 10), (tp(1), 4)]);
        st.revoke(&[tp(0)]);
        assert_eq!(st.firsts(), vec![(tp(1), 4)]);
        assert!(!st.batch_full());
        st.clear();
        assert!(st.is_empty() && st.firsts().is_empty());
    }

    #[test]
    fn a_record_stays_staged_until_it_is_taken_and_a_failed_call_keeps_its_records() {
        let app = Answers::default();
        let mut st = stage(2, &app);
        for o in [10, 11, 12, 13] {
            st.push(&record(0, o));
            st.send_due(false);
        }
        assert_eq!(st.in_flight(), 2);
        app.answer(0, true);
        assert!(matches!(
            st.arrival(Duration::ZERO),
            Some(Arrival::Answered { records: 2, .. })
        ));
        // Answered but not applied: still the ceiling.
        assert_eq!(st.firsts(), vec![(tp(0), 10)]);
        assert_eq!(st.take().map(|(r, _)| r.offset), Some(10));
        assert_eq!(st.firsts(), vec![(tp(0), 11)]);
        assert!(st.arrival(Duration::ZERO).is_none(), "11 waits to be taken");
        assert_eq!(st.take().map(|(r, _)| r.offset), Some(11));
        app.answer(1, false);
        assert!(matches!(
            st.arrival(Duration::ZERO),
            Some(Arrival::Failed { records: 2, .. })
        ));
        // The failed call's records hold the ceiling until the rewind clears them.
        assert_eq!(st.firsts(), vec![(tp(0), 12)]);
        assert!(st.take().is_none() && st.arrival(Duration::ZERO).is_none());
        st.clear();
        assert!(st.is_empty());
    }

    #[test]
    fn a_revoked_partition_loses_its_answered_and_flying_records() {
        let app = Answers::default();
        let mut st = stage(2, &app);
        for (p, o) in [(0, 1), (1, 1), (0, 2), (1, 2)] {
            st.push(&record(p, o));
            st.send_due(false);
        }
        app.answer(0, true);
        st.arrival(Duration::ZERO);
        st.revoke(&[tp(0)]);
        assert_eq!(st.firsts(), vec![(tp(1), 1)]);
        assert_eq!(st.take().map(|(r, _)| r.partition), Some(1));
        assert!(st.take().is_none());
        app.answer(1, true);
        st.arrival(Duration::ZERO);
        assert_eq!(
            st.take().map(|(r, _)| (r.partition, r.offset)),
            Some((1, 2))
        );
        assert!(st.is_empty());
    }
}

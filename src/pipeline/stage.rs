//! The call-out's stage: records read but not yet applied.
//!
//! With `--call-url` the loop does not apply a record as it reads it. It stages it in the open
//! batch; a batch is sent when it reaches `--call-batch-records`, `--call-batch-bytes` or
//! `--call-linger`, with up to `--call-in-flight` calls out at once; answers are applied in
//! the order the records were read (the oldest call first), each record through the same path
//! as any transform's output. A staged record is not in any transaction yet: the driver keeps
//! every commit below the first staged offset of each partition, so a crash or an abort reads
//! it again. When an abort leaves a rewind pending, or the application fails, everything staged
//! is dropped and rewound; when partitions are revoked, their staged records are dropped (the
//! next owner reads them from the committed offset).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::CallSpec;
use crate::transform::call::{Call, Called, InFlight};
use crate::transform::{InputRecord, OwnedRecord, Tp};

/// Longest pause after calls failed in a row.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Records read but not yet applied, and the calls out for them.
pub(super) struct Stage {
    spec: CallSpec,
    open: Vec<Staged>,
    open_bytes: usize,
    opened: Instant,
    flights: VecDeque<Flight>,
    /// Calls failed in a row, and no call before this instant (back-off).
    failures: u32,
    not_before: Option<Instant>,
}

struct Flight {
    records: Vec<Staged>,
    call: InFlight,
}

/// A record copied out of the consumer's buffer, to be applied when its batch is answered.
pub(super) struct Staged {
    pub record: OwnedRecord,
    /// Its partition was revoked while it waited: not applied.
    pub dropped: bool,
}

/// A call that came back, with the records it was for.
pub(super) struct Answered {
    pub records: Vec<Staged>,
    pub called: Called,
}

impl Stage {
    pub fn new(spec: CallSpec) -> Stage {
        Stage {
            spec,
            open: Vec::new(),
            open_bytes: 0,
            opened: Instant::now(),
            flights: VecDeque::new(),
            failures: 0,
            not_before: None,
        }
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
        self.open.is_empty() && self.flights.is_empty()
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
    pub fn send_due(&mut self, call: &Call, flush: bool) {
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
        let call = call.submit(&inputs, self.spec.timeout);
        drop(inputs);
        self.flights.push_back(Flight { records, call });
    }

    /// The oldest call, if it has come back: waits up to `wait` for it, or, with no call out,
    /// for the back-off to pass.
    pub fn next_answer(&mut self, wait: Duration) -> Option<Answered> {
        let Some(head) = self.flights.front() else {
            if let Some(t) = self.not_before {
                std::thread::sleep(t.saturating_duration_since(Instant::now()).min(wait));
            }
            return None;
        };
        let called = if wait.is_zero() {
            head.call.try_take()?
        } else {
            head.call.wait(wait)?
        };
        let flight = self.flights.pop_front()?;
        Some(Answered {
            records: flight.records,
            called,
        })
    }

    /// How long the loop may wait in `poll`: not past the open batch's linger, and briefly
    /// while calls are out (their answers are picked up between polls).
    pub fn poll_wait(&self, wait: Duration) -> Duration {
        if !self.flights.is_empty() {
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

    /// A call came back with answers: the back-off is over.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }

    /// A call failed: no call for a while (100 ms, doubling with each failure in a row, up to
    /// 5 s); returns the pause.
    pub fn failed(&mut self) -> Duration {
        self.failures += 1;
        let pause = backoff(self.failures);
        self.not_before = Some(Instant::now() + pause);
        pause
    }

    /// Partitions were revoked: their staged records are not applied.
    pub fn revoke(&mut self, partitions: &[Tp]) {
        let gone = |s: &Staged| {
            partitions
                .iter()
                .any(|(t, p)| *p == s.record.partition && *t == s.record.topic)
        };
        for s in self.flights.iter_mut().flat_map(|f| f.records.iter_mut()) {
            if gone(s) {
                s.dropped = true;
            }
        }
        self.open.retain(|s| !gone(s));
        self.open_bytes = self.open.iter().map(|s| s.record.bytes()).sum();
    }

    /// Drops everything (calls out are no longer waited for) and returns the first offset of
    /// each partition's records, for the rewind.
    pub fn clear(&mut self) -> Vec<(Tp, i64)> {
        let firsts = self.firsts();
        self.flights.clear();
        self.open.clear();
        self.open_bytes = 0;
        firsts
    }

    /// The first offset of each partition's staged records (oldest call first, then the open
    /// batch: the order they were read).
    pub fn firsts(&self) -> Vec<(Tp, i64)> {
        firsts(
            self.flights
                .iter()
                .flat_map(|f| f.records.iter())
                .chain(self.open.iter()),
        )
    }
}

/// The first offset of each partition among `records`, in the order given.
pub(super) fn firsts<'a>(records: impl Iterator<Item = &'a Staged>) -> Vec<(Tp, i64)> {
    let mut out: Vec<(Tp, i64)> = Vec::new();
    for r in records.filter(|s| !s.dropped).map(|s| &s.record) {
        if !out
            .iter()
            .any(|((t, p), _)| *p == r.partition && *t == r.topic)
        {
            out.push(((r.topic.clone(), r.partition), r.offset));
        }
    }
    out
}

/// 100 ms doubling with each failure in a row, up to [`MAX_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << failures.saturating_sub(1).min(10));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CallSpec {
        CallSpec {
            url: "http://127.0.0.1:9/".into(),
            batch_records: 3,
            batch_bytes: 1000,
            linger: Duration::from_secs(60),
            in_flight: 1,
            timeout: Duration::from_secs(1),
        }
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
        let mut st = Stage::new(spec());
        for (p, o) in [(0, 10), (1, 4), (0, 11)] {
            st.push(&record(p, o));
        }
        assert!(st.batch_full());
        let tp = |p| ("in".to_string(), p);
        assert_eq!(st.firsts(), vec![(tp(0), 10), (tp(1), 4)]);
        st.revoke(&[tp(0)]);
        assert_eq!(st.firsts(), vec![(tp(1), 4)]);
        assert!(!st.batch_full());
        assert_eq!(st.clear(), vec![(tp(1), 4)]);
        assert!(st.is_empty() && st.firsts().is_empty());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(6), Duration::from_millis(3200));
        assert_eq!(backoff(7), MAX_BACKOFF);
        assert_eq!(backoff(100), MAX_BACKOFF);
    }
}

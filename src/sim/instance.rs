//! One exactly instance over the model: the real [`Session`] (the writer, the driver, the
//! rewind, the dedup) with the model behind each of its seams: a sink whose commit and abort
//! are `sink::kafka::exactly_once`'s own orderings over the model's transactions, a consumer of the
//! model's group, and the dedup's changelog in the model's topic.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::model::{CHANGELOG, EndFault, Entry, Heard, OUTPUT};
use super::oracle::{Mode, WINDOW_MS, canonical};
use super::{Shared, hook};
use crate::config::{AggregateConfig, CommitPolicy, DedupConfig, Emit, ErrorPolicy, Late, OnError};
use crate::events::AbortReason;
use crate::headers::{ERROR_REASON, LINEAGE};
use crate::health::Health;
use crate::kafka::Tp;
use crate::kafka::failure::{ClientError, Code};
use crate::pipeline::session::{Parts, Poll};
use crate::pipeline::writer::{Policy, Writer};
use crate::pipeline::{Intake, Interrupt, Session};
use crate::sink::kafka::exactly_once::{self, Transaction};
use crate::sink::{
    Bounds, Committed, Driver, Failed, Feedback, Group, NotConnected, Record, Rejection, Reply,
    SeekFailed, Sink, Starts, Wait,
};
use crate::state::restore::{Changelog, Each, Read, Unread};
use crate::state::window::{Size, Windows};
use crate::transform::Jq;
use crate::transform::OwnedRecord;
use crate::transform::dedup::Dedup;

/// One instance: its session and its consumer.
pub struct Instance {
    /// Its consumer of the model's group.
    pub group: SimGroup,
    session: Session,
    next: Poll,
    shutdown: CancellationToken,
}

impl Instance {
    /// Instance `i` starts: its producer is initialised (fencing its previous incarnation's),
    /// its consumer joins the group.
    pub fn start(shared: &Arc<Shared>, i: usize, commit: CommitPolicy, mode: Mode) -> Instance {
        // One registry for every instance of a schedule: the run reads back only that no
        // start was held (`committed_offsets_went_back_total`).
        let (health, metrics) = (Arc::new(Health::default()), shared.metrics.clone());
        let shutdown = CancellationToken::new();
        let bounds = Bounds::new(health.clone(), Duration::from_millis(20));
        let sink = Box::new(SimSink {
            shared: shared.clone(),
            i,
        });
        let timeout = Duration::from_secs(1);
        let driver = Driver::start(sink, bounds, timeout, metrics.clone(), shutdown.clone())
            .expect("the model's producer connects");
        let destination = driver.destination();
        let policy = Policy {
            output_topic: OUTPUT.into(),
            errors: ErrorPolicy {
                on_error: OnError::Dlq,
                dlq_topic: super::model::DLQ.into(),
                route_timeout: Duration::ZERO,
            },
            lineage: true,
            max_message_bytes: destination.max_record_bytes,
            refuser: destination.refuser,
        };
        let writer = Writer::new(
            driver,
            policy,
            metrics.clone(),
            health.clone(),
            shutdown.clone(),
        );
        let changelog = Box::new(SimChangelog(shared.clone()));
        let (config, programs) = stage(mode);
        let dedup = Dedup::new(&config, programs, changelog, None, (*metrics).clone());
        let session = Session::new(Parts {
            writer,
            intake: Intake::direct(Box::new(dedup)),
            commit,
            positions: Arc::default(),
            metrics,
            health,
            shutdown: shutdown.clone(),
        });
        let next = session.next_poll();
        Instance {
            group: SimGroup::join(shared, i),
            session,
            next,
            shutdown,
        }
    }

    /// One turn of the loop, as `pipeline::run_loop` takes it: the rebalance callbacks run
    /// inside the poll, then the record (if any) goes to the session. Whether a record was read.
    pub fn turn(&mut self) -> Result<bool, Interrupt> {
        self.rebalance();
        if let Some(e) = self.session.take_fatal() {
            return Err(e.into());
        }
        let record = if self.next.read {
            self.group.poll()
        } else {
            None
        };
        let input = record.as_ref().map(OwnedRecord::as_input);
        self.next = self.session.turn(input.as_ref(), &self.group)?;
        Ok(record.is_some())
    }

    /// The rebalance callbacks the coordinator owes this member, as `pipeline::context` runs
    /// them.
    fn rebalance(&mut self) {
        let heard = self.group.model_poll();
        for h in heard {
            match h {
                Heard::Lost(ps) => {
                    self.session.revoked(&self.group, ps.clone(), true);
                    self.group.unassign(&ps);
                    // Expelled: it joins again as a new member.
                    self.group.rejoin();
                }
                Heard::Revoke(ps) => {
                    self.session.revoked(&self.group, ps.clone(), false);
                    self.group.unassign(&ps);
                    self.group.released(&ps);
                }
                Heard::Assign(ps) => {
                    // A Kafka sink starts at the group's offsets: read by librdkafka, or
                    // by the driver to hold them to what this process committed.
                    let at = match self.session.claim(&self.group, &ps) {
                        Some(Starts::Group) => Vec::new(),
                        Some(Starts::At(at)) => at,
                        // The model's group errs only retriably: the claim falls back.
                        None => panic!("a Kafka sink's claim failed"),
                    };
                    self.session.assigned(ps.clone());
                    self.group.assign(&ps, &at);
                }
            }
        }
    }

    /// The consumer is finished: a new one joins, as `pipeline::run` replaces it.
    pub fn replace_consumer(&mut self) {
        self.session.replaced(&self.group);
        self.group.leave();
        self.group.rejoin();
    }

    /// A clean stop: what is open commits, the member leaves.
    pub fn stop(mut self) -> Result<(), crate::error::Error> {
        self.shutdown.cancel();
        let result = self.session.finish(&self.group, Duration::from_secs(5));
        if result.is_err() {
            self.session.abandon();
        }
        self.group.leave();
        result
    }
}

/// The stage the instances run in `mode`, per Kafka key per hour of the record's timestamp,
/// late records to the dead-letter topic; the aggregates count and sum `.n`. Its programs.
fn stage(mode: Mode) -> (DedupConfig, [Option<Jq>; 5]) {
    let emit = match mode {
        Mode::Dedup => None,
        Mode::Updates => Some(Emit::Updates),
        Mode::Final => Some(Emit::Final),
    };
    let aggregate = emit.map(|emit| AggregateConfig {
        count: true,
        sum: Some(".n".into()),
        distinct: None,
        emit,
    });
    let limits = crate::transform::Limits {
        max_output_bytes: 1 << 16,
        max_outputs: 100,
    };
    let sum = (aggregate.as_ref()).map(|_| Jq::compile(".n", false, limits).expect("compiles"));
    let config = DedupConfig {
        windows: Windows::new(
            Size::Fixed(Duration::from_millis(WINDOW_MS as u64)),
            jiff::tz::TimeZone::UTC,
            Duration::ZERO,
        ),
        key: None,
        time: None,
        late: Late::Dlq,
        changelog: CHANGELOG.into(),
        retention: Duration::from_secs(86_400),
        state_dir: None,
        max_key: 1024,
        max_keys: usize::MAX,
        max_ahead: i64::MAX / 4,
        aggregate,
    };
    (config, [None, None, None, sum, None])
}

/// The sink: a transactional producer of the model.
struct SimSink {
    shared: Arc<Shared>,
    i: usize,
}

impl SimSink {
    fn txn(&self) -> SimTxn<'_> {
        SimTxn {
            shared: &self.shared,
            i: self.i,
        }
    }
}

/// A header's value as text.
fn header(out: &crate::records::Outgoing<'_>, name: &str) -> Option<String> {
    (out.headers_with_lineage())
        .find(|(n, _)| *n == name.as_bytes())
        .and_then(|(_, v)| v)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl Sink for SimSink {
    fn connect(&mut self, _: &Bounds) -> Result<(), NotConnected> {
        let id = format!("t-{}", self.i);
        self.shared.model().init(self.i, &id);
        Ok(())
    }

    fn begin(&mut self, _watch: bool, _: &Bounds) -> Result<(), Failed> {
        let mut m = self.shared.model();
        if m.clients.get(&self.i).is_some_and(|c| c.stale) {
            // A late copy of a timed-out request could land in this unit: a new epoch first.
            return Err(Failed::Renew(AbortReason::RequestTimedOut));
        }
        if let Some(c) = m.clients.get_mut(&self.i) {
            c.failed = false;
            c.rejected.clear();
        }
        Ok(())
    }

    fn send(&mut self, r: Record<'_, '_>, _: &Bounds) -> Result<(), Failed> {
        let mut m = self.shared.model();
        if let Some(n) = m.send_faults.get_mut(&self.i).filter(|n| **n > 0) {
            *n -= 1;
            m.count("sends failed");
            return Err(Failed::Abort(AbortReason::ProduceFailed));
        }
        let entry = Entry {
            key: r.out.key.as_deref().map(<[u8]>::to_vec),
            value: r.out.value.as_deref().map(<[u8]>::to_vec),
            lineage: header(r.out, LINEAGE),
            reason: header(r.out, ERROR_REASON),
            canonical: canonical(self.shared.mode, r.out.value.as_deref().unwrap_or_default()),
            ..Entry::default()
        };
        let to = (r.topic, r.out.partition.unwrap_or(0));
        m.send(self.i, to, r.timestamp, entry, r.index);
        Ok(())
    }

    /// Only a flush delivers what is in flight; the model's refusals are named (KIP-467).
    fn hear(&mut self, wait: Wait, _: &Bounds) -> Feedback {
        let mut m = self.shared.model();
        if wait == Wait::Flush {
            m.deliver(self.i, usize::MAX);
        }
        let Some(c) = m.clients.get_mut(&self.i) else {
            return Feedback::default();
        };
        let refused = (c.rejected.drain(..))
            .map(|index| Rejection {
                index,
                error: "MESSAGE_TOO_LARGE",
                named: true,
                alone: false,
            })
            .collect();
        Feedback {
            refused,
            settled: wait == Wait::Flush,
            ..Feedback::default()
        }
    }

    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, b: &Bounds) -> Reply {
        let result = exactly_once::commit(&self.txn(), offsets, group, b);
        Reply {
            result,
            feedback: self.hear(Wait::Now, b),
        }
    }

    fn abort(&mut self, reason: AbortReason, b: &Bounds) -> Reply {
        let result = exactly_once::abort(&self.txn(), reason, b);
        Reply {
            result,
            feedback: self.hear(Wait::Now, b),
        }
    }

    fn claim(&mut self, _: &[Tp], _: &dyn Group, _: &Bounds) -> Result<Starts, Failed> {
        Ok(Starts::Group)
    }

    fn exists(&self, _: &str, _: Duration) -> Result<bool, String> {
        Ok(true)
    }

    fn destination(&self) -> crate::sink::Destination {
        crate::sink::Destination {
            refuser: &crate::sink::kafka::BROKER,
            aborted: crate::events::Ended::Aborted,
            max_record_bytes: 1 << 20,
            offsets: crate::sink::OffsetHome::Group,
        }
    }
}

/// Instance `i`'s transaction calls; each may find the process frozen first ([`hook`]).
struct SimTxn<'a> {
    shared: &'a Arc<Shared>,
    i: usize,
}

fn err(code: Code) -> ClientError {
    ClientError::of(code)
}

impl Transaction for SimTxn<'_> {
    fn flush(&self, _: Duration) -> Result<(), ClientError> {
        hook(self.shared, self.i, "flush");
        self.shared.model().deliver(self.i, usize::MAX);
        Ok(())
    }

    fn send_offsets(
        &self,
        offsets: &[(Tp, i64)],
        group: &dyn Group,
        _: Duration,
    ) -> Result<(), ClientError> {
        hook(self.shared, self.i, "send_offsets");
        let member = group.member().unwrap_or(crate::kafka::member::Member {
            generation: -1,
            id: String::new(),
        });
        let mut m = self.shared.model();
        m.send_offsets(self.i, &member.id, member.generation, offsets)
            .map_err(err)
    }

    fn commit(&self, _: Duration) -> Result<(), ClientError> {
        hook(self.shared, self.i, "commit_transaction");
        let mut m = self.shared.model();
        // librdkafka's commit_transaction flushes first.
        m.deliver(self.i, usize::MAX);
        if m.clients.get(&self.i).is_some_and(|c| c.failed) {
            // A delivery of the transaction failed: it must abort (librdkafka flags that
            // error as abortable; here the flush before the EndTxn says so).
            return Err(ClientError::flush(Code::InvalidRecord));
        }
        let fault = m.end_faults.remove(&self.i);
        if let Some(f) = fault {
            m.count(match f {
                EndFault::Abortable => "commits refused (abortable)",
                EndFault::UnknownCommitted => "commits unknown, committed",
                EndFault::UnknownLost => "commits unknown, lost",
                EndFault::FencedAfterCommit => "commits fenced after they took effect",
            });
        }
        let expelled = m.expelled(self.i);
        match fault {
            None => {
                m.end_txn(self.i, true).map_err(err)?;
                if expelled {
                    m.count("commits of an owner whose session expired");
                }
                Ok(())
            }
            Some(EndFault::Abortable) => Err(ClientError::flush(Code::InvalidTransactionalState)),
            Some(EndFault::UnknownLost) => Err(err(Code::OperationTimedOut)),
            Some(EndFault::UnknownCommitted) => {
                m.end_txn(self.i, true).map_err(err)?;
                Err(err(Code::OperationTimedOut))
            }
            Some(EndFault::FencedAfterCommit) => {
                m.end_txn(self.i, true).map_err(err)?;
                m.newcomer(self.i);
                Err(err(Code::ProducerFenced))
            }
        }
    }

    fn abort(&self, _: Duration) -> Result<(), ClientError> {
        let mut m = self.shared.model();
        m.purge(self.i);
        m.end_txn(self.i, false).map_err(err)
    }

    fn timed_out(&self) {
        if let Some(c) = self.shared.model().clients.get_mut(&self.i) {
            c.stale = true;
        }
    }
}

/// A `read_committed` consumer of the model's group: one record a poll, its partitions in
/// turn; a partition assigned starts only once its committed offset is stable.
pub struct SimGroup {
    /// Its instance.
    i: usize,
    shared: Arc<Shared>,
    member: RefCell<String>,
    assigned: RefCell<Vec<Tp>>,
    /// Where each partition reads next; `None` until its committed offset is stable.
    fetch: RefCell<HashMap<Tp, Option<i64>>>,
    position: RefCell<HashMap<Tp, i64>>,
    turn: RefCell<usize>,
}

impl SimGroup {
    fn join(shared: &Arc<Shared>, i: usize) -> SimGroup {
        let member = shared.model().join(i);
        SimGroup {
            i,
            shared: shared.clone(),
            member: RefCell::new(member),
            assigned: RefCell::default(),
            fetch: RefCell::default(),
            position: RefCell::default(),
            turn: RefCell::default(),
        }
    }

    /// Its member id.
    pub fn member_id(&self) -> String {
        self.member.borrow().clone()
    }

    fn model_poll(&self) -> Vec<Heard> {
        let id = self.member_id();
        let mut m = self.shared.model();
        m.heartbeat(&id);
        m.poll(&id)
    }

    fn released(&self, ps: &[Tp]) {
        let id = self.member_id();
        self.shared.model().released(&id, ps);
    }

    /// `ps` are assigned, each read from where `at` says, else from its committed offset
    /// once that is stable.
    fn assign(&self, ps: &[Tp], at: &[(Tp, Option<i64>)]) {
        for tp in ps {
            let start = at.iter().find(|(t, _)| t == tp).and_then(|a| a.1);
            self.fetch.borrow_mut().insert(tp.clone(), start);
            self.assigned.borrow_mut().push(tp.clone());
        }
    }

    fn unassign(&self, ps: &[Tp]) {
        self.assigned.borrow_mut().retain(|tp| !ps.contains(tp));
        for tp in ps {
            self.fetch.borrow_mut().remove(tp);
            self.position.borrow_mut().remove(tp);
        }
    }

    fn leave(&self) {
        let id = self.member_id();
        self.shared.model().leave(&id);
        let all = self.assigned.borrow().clone();
        self.unassign(&all);
    }

    fn rejoin(&self) {
        let id = self.shared.model().join(self.i);
        *self.member.borrow_mut() = id;
    }

    /// The next record of the assigned partitions whose committed offset is known.
    fn poll(&self) -> Option<OwnedRecord> {
        let m = self.shared.model();
        let assigned = self.assigned.borrow().clone();
        let mut fetch = self.fetch.borrow_mut();
        let mut unstable = false;
        for tp in &assigned {
            if fetch.get(tp) != Some(&None) {
                continue;
            }
            if m.unstable(tp) {
                unstable = true;
            } else {
                fetch.insert(tp.clone(), Some(m.committed.get(tp).copied().unwrap_or(0)));
            }
        }
        drop(m);
        if unstable {
            self.shared
                .count("fetches waiting for a transaction's offsets");
        }
        let m = self.shared.model();
        let n = assigned.len();
        for k in 0..n {
            let turn = (*self.turn.borrow() + k) % n;
            let tp = &assigned[turn];
            let Some(Some(at)) = fetch.get(tp).copied() else {
                continue;
            };
            let Some(r) = m.input[tp.1 as usize].get(at as usize).cloned() else {
                continue;
            };
            fetch.insert(tp.clone(), Some(at + 1));
            self.position.borrow_mut().insert(tp.clone(), at + 1);
            *self.turn.borrow_mut() = turn + 1;
            return Some(r);
        }
        None
    }
}

impl Group for SimGroup {
    fn metadata(&self) -> Option<crate::kafka::member::Generation> {
        None
    }

    fn member(&self) -> Option<crate::kafka::member::Member> {
        let id = self.member_id();
        let (generation, _) = self.shared.model().member(&id).unwrap_or((-1, false));
        Some(crate::kafka::member::Member { generation, id })
    }

    fn commit_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        self.shared
            .model()
            .committed
            .extend(offsets.iter().cloned());
        Ok(())
    }

    fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        self.commit_offsets(offsets)
    }

    fn committed(&self, partitions: &[Tp], _: Duration) -> Result<Committed, ClientError> {
        let m = self.shared.model();
        if partitions.iter().any(|tp| m.unstable(tp)) {
            return Err(err(Code::UnstableOffsetCommit));
        }
        Ok(partitions
            .iter()
            .map(|tp| (tp.clone(), m.committed.get(tp).copied()))
            .collect())
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let position = self.position.borrow();
        (self.assigned.borrow().iter())
            .filter_map(|tp| Some((tp.clone(), *position.get(tp)?)))
            .collect()
    }

    fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
        Ok(self.assigned.borrow().clone())
    }

    fn seek(&self, offsets: &[(Tp, i64)], _: Duration) -> Result<(), SeekFailed> {
        for (tp, o) in offsets {
            if self.fetch.borrow().get(tp) == Some(&None) {
                // librdkafka refuses to seek a partition still waiting for its offset.
                let e = err(Code::State);
                return Err(SeekFailed::Partition(tp.clone(), e));
            }
            self.fetch.borrow_mut().insert(tp.clone(), Some(*o));
            self.position.borrow_mut().remove(tp);
        }
        Ok(())
    }

    fn pause(&self, _: &[Tp]) -> Result<(), ClientError> {
        Ok(())
    }

    fn resume(&self, _: &[Tp]) -> Result<(), ClientError> {
        Ok(())
    }
}

/// The dedup's changelog, read `read_committed` from the model.
struct SimChangelog(Arc<Shared>);

impl Changelog for SimChangelog {
    fn read(
        &mut self,
        partition: i32,
        from: Option<i64>,
        each: &mut Each<'_>,
    ) -> Result<Read, Unread> {
        let (records, held, end) = {
            let m = self.0.model();
            let end = m.end_offset(CHANGELOG, partition);
            if from.is_some_and(|o| o > end) {
                return Err(Unread::OutOfRange(format!("{from:?} past {end}")));
            }
            let (records, held) = m.read(CHANGELOG, partition, from.unwrap_or(0));
            (records, held, end)
        };
        for (offset, e) in &records {
            each(*offset, e.key.as_deref(), e.value.as_deref());
        }
        if held {
            self.0.count("restores held back by an open transaction");
            return Err(Unread::Failed(format!(
                "changelog {partition}: an open transaction holds it short of {end}"
            )));
        }
        Ok(Read {
            records: records.len() as u64,
            end,
            written: None,
        })
    }

    fn end(&mut self, partition: i32) -> Result<i64, String> {
        Ok(self.0.model().end_offset(CHANGELOG, partition))
    }
}

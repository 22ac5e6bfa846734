//! Fakes for the core's unit tests, after Kafka's `MockProducer` and `MockConsumer`: a sink and
//! a consumer group over one in-memory broker that records every begin, send, commit (with its
//! offsets) and abort, and an application whose calls the test answers. A test says what fails;
//! the broker keeps what a `read_committed` reader would see.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::intake::Intake;
use super::session::{Parts, Poll, Session};
use super::stage::Stage;
use super::writer::{Policy, Writer};
use crate::config::{CallSpec, CommitPolicy, ErrorPolicy, OnError, TransformSpec};
use crate::events::AbortReason;
use crate::headers::ERROR_REASON;
use crate::health::Health;
use crate::kafka::Tp;
use crate::kafka::failure::{ClientError, Code};
use crate::metrics::Metrics;
use crate::sink::{
    Bounds, Driver, Failed, Feedback, Group, NotConnected, Record, Rejection, Reply, SeekFailed,
    Sink, Starts, Wait,
};
use crate::transform::call::{Answer, Answering, Application, CallError, Called, InFlight};
use crate::transform::{self, InputRecord, Limits, OwnedRecord};

/// What the sink was asked to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A new client.
    Connect,
    Begin,
    /// A record to `topic` for the input of `lineage` (`topic/partition/offset/index`).
    Send {
        topic: String,
        lineage: String,
    },
    /// A commit with these offsets, in the order given.
    Commit(Vec<(Tp, i64)>),
    Abort,
}

/// One record as a `read_committed` reader of an output topic sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub topic: String,
    /// The partition the record named, if it named one.
    pub partition: Option<i32>,
    pub lineage: String,
    /// The `exactly.error.reason` header, on DLQ records.
    pub reason: Option<String>,
}

/// The broker the fakes share.
#[derive(Default)]
pub struct Broker {
    /// Every input partition's records, from its first offset.
    pub log: BTreeMap<Tp, Vec<OwnedRecord>>,
    /// The group's committed offsets.
    pub committed: HashMap<Tp, i64>,
    /// What committed units wrote.
    pub outputs: Vec<Out>,
    /// What the open unit wrote so far.
    open: Vec<Out>,
    pub calls: Vec<Call>,
    /// Commits to fail (abortable) before one goes through.
    pub fail_commits: u32,
    /// Commits that take effect and are then answered "fenced" (a retried EndTxn meeting a
    /// newer epoch): the producer must be replaced, the outcome is unknown.
    pub fence_commits: u32,
    /// Commits whose outcome is reported unknown: the first `commit_unknown` of them took
    /// effect, the next `commit_unknown_lost` did not.
    pub commit_unknown: u32,
    pub commit_unknown_lost: u32,
    /// Sends to fail (abortable) before one goes through.
    pub fail_sends: u32,
    /// The group's committed offsets cannot be read (librdkafka's mock cluster: it takes
    /// transactional offset commits but does not answer OffsetFetch with them).
    pub hide_committed: bool,
    /// A request of the client timed out (until the next connect).
    pub stale: bool,
    /// The offsets are kept with the outputs (a database's table): a claim answers them, and
    /// what they answer is believed.
    pub with_outputs: bool,
    /// Reading the group's committed offsets fails: a transaction has not ended on them.
    pub unstable: bool,
    /// Topics that do not exist: a send there is refused at once.
    pub missing: Vec<String>,
    /// Topics the principal may not write: a send there is taken, the unit's commit fails
    /// for want of the permission, and the lines that say which topic it was are heard only
    /// when the sink waits for them (librdkafka's log, served by another thread) or aborts.
    pub denied: Vec<String>,
    /// The open unit sent to a denied topic.
    open_denied: Option<String>,
    /// What the log said but the sink has not heard yet: a denied route, then the denial.
    unheard: Vec<String>,
    /// What the sink heard: denied routes, and the denial.
    heard_routes: Vec<String>,
    pub heard_denial: Option<String>,
    /// Outputs (not DLQ records) whose value holds this are refused for what they are.
    pub refuse: Option<Vec<u8>>,
    /// What each unit asked of `watch_routes`, in order.
    pub watched: Vec<bool>,
    /// Topics records were delivered to while watching, since the last take.
    accepted: Vec<String>,
    refused: Vec<Rejection>,
}

impl Broker {
    /// Adds `n` records to `tp`, from offset `first`, each value `v<offset>` (`poison` at the
    /// offsets in `poison`).
    pub fn fill(&mut self, tp: (&str, i32), first: i64, n: i64, poison: &[i64]) {
        let records = (first..first + n)
            .map(|offset| OwnedRecord {
                topic: tp.0.to_string(),
                partition: tp.1,
                offset,
                value: Some(if poison.contains(&offset) {
                    b"poison".to_vec()
                } else {
                    format!("v{offset}").into_bytes()
                }),
                ..OwnedRecord::default()
            })
            .collect();
        self.log.insert((tp.0.to_string(), tp.1), records);
    }

    /// The record at `offset` of `tp` becomes a control record (a transaction marker): the
    /// consumer skips it, its position moving past.
    pub fn mark(&mut self, tp: (&str, i32), offset: i64) {
        let log = self.log.entry((tp.0.to_string(), tp.1)).or_default();
        if let Some(r) = log.iter_mut().find(|r| r.offset == offset) {
            r.value = None;
            r.key = Some(MARKER.to_vec());
        }
    }

    /// A unit's commit: its outputs and offsets visible at once.
    fn commit(&mut self, offsets: &[(Tp, i64)]) -> Result<(), Failed> {
        let mut offsets = offsets.to_vec();
        offsets.sort();
        self.calls.push(Call::Commit(offsets.clone()));
        if let Some(topic) = self.open_denied.take() {
            self.unheard.push(topic);
            let source = ClientError::of(Code::TopicAuthorizationFailed);
            let denied = crate::error::Error::kafka("sending offsets", source);
            return Err(Failed::Denied(denied));
        }

        if self.fail_commits > 0 || !self.refused.is_empty() {
            self.fail_commits = self.fail_commits.saturating_sub(1);
            return Err(Failed::Abort(AbortReason::CommitFailed));
        }
        if self.commit_unknown_lost > 0 && self.commit_unknown == 0 {
            self.commit_unknown_lost -= 1;
            return Err(Failed::unknown());
        }
        let open = std::mem::take(&mut self.open);
        self.outputs.extend(open);
        self.committed.extend(offsets);
        if self.fence_commits > 0 {
            self.fence_commits -= 1;
            return Err(Failed::Unknown {
                reason: AbortReason::CommitFenced,
                recreate: true,
            });
        }
        if self.commit_unknown > 0 {
            self.commit_unknown -= 1;
            return Err(Failed::unknown());
        }
        Ok(())
    }

    /// What the sink heard and the broker reported since the last report.
    fn report(&mut self) -> Feedback {
        Feedback {
            refused: std::mem::take(&mut self.refused),
            routes: (self.heard_routes.drain(..))
                .map(|t| (t, crate::kafka::failure::TOPIC_DENIED))
                .collect(),
            accepted: std::mem::take(&mut self.accepted),
            denied: self.heard_denial.take(),
            settled: true,
        }
    }

    /// The sink hears what the log said.
    fn hear(&mut self) {
        for topic in std::mem::take(&mut self.unheard) {
            self.heard_denial = Some(format!("may not write '{topic}'"));
            self.heard_routes.push(topic);
        }
    }

    /// Each committed output's lineage, by topic.
    pub fn lineages(&self, topic: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .outputs
            .iter()
            .filter(|o| o.topic == topic)
            .map(|o| o.lineage.clone())
            .collect();
        v.sort();
        v
    }

    /// The commits the sink was asked for, with their offsets.
    pub fn commits(&self) -> Vec<Vec<(Tp, i64)>> {
        self.calls
            .iter()
            .filter_map(|c| match c {
                Call::Commit(o) => Some(o.clone()),
                _ => None,
            })
            .collect()
    }
}

/// A shared broker.
pub type Shared = Arc<Mutex<Broker>>;

/// The key of a control record in the fake log.
const MARKER: &[u8] = b"\0marker";

fn is_marker(r: &OwnedRecord) -> bool {
    r.key.as_deref() == Some(MARKER)
}

fn lock(b: &Shared) -> MutexGuard<'_, Broker> {
    b.lock().unwrap()
}

/// A sink over the fake broker: a unit's outputs become visible when it commits.
pub struct FakeSink(pub Shared);

impl Sink for FakeSink {
    fn connect(&mut self, _: &Bounds) -> Result<(), NotConnected> {
        let mut b = lock(&self.0);
        b.stale = false;
        b.calls.push(Call::Connect);
        Ok(())
    }

    fn begin(&mut self, watch: bool, _: &Bounds) -> Result<(), Failed> {
        let mut b = lock(&self.0);
        if b.stale {
            return Err(Failed::Renew(AbortReason::RequestTimedOut));
        }
        b.watched.push(watch);
        b.accepted.clear();
        b.refused.clear();
        b.open.clear();
        b.open_denied = None;
        b.calls.push(Call::Begin);
        Ok(())
    }

    fn send(&mut self, r: Record<'_, '_>, _: &Bounds) -> Result<(), Failed> {
        let mut b = lock(&self.0);
        if b.denied.iter().any(|m| m == r.topic) {
            b.open_denied = Some(r.topic.to_string());
        }
        if b.missing.iter().any(|m| m == r.topic) {
            return Err(Failed::Unroutable {
                topic: r.topic.to_string(),
                error: "UNKNOWN_TOPIC_OR_PARTITION",
            });
        }
        if b.fail_sends > 0 {
            b.fail_sends -= 1;
            return Err(Failed::Abort(AbortReason::ProduceFailed));
        }
        let reason = (r.out.headers.get(ERROR_REASON).flatten())
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let lineage = r.out.lineage.clone().unwrap_or_default();
        let refused = b.refuse.as_ref().is_some_and(|bad| {
            let value = r.out.value.as_deref().unwrap_or_default();
            reason.is_none() && value.windows(bad.len()).any(|w| w == bad.as_slice())
        });
        if refused {
            b.refused.push(Rejection {
                index: r.index,
                error: "MESSAGE_TOO_LARGE",
                named: false,
                alone: false,
            });
        }
        if b.watched.last() == Some(&true) && !b.accepted.iter().any(|t| t == r.topic) {
            b.accepted.push(r.topic.to_string());
        }
        b.calls.push(Call::Send {
            topic: r.topic.to_string(),
            lineage: lineage.clone(),
        });
        b.open.push(Out {
            topic: r.topic.to_string(),
            partition: r.out.partition,
            lineage,
            reason,
        });
        Ok(())
    }

    /// What the log said is heard only on a commit's denial and on an abort (round trips).
    fn hear(&mut self, _: Wait, _: &Bounds) -> Feedback {
        lock(&self.0).report()
    }

    fn commit(&mut self, offsets: &[(Tp, i64)], _: &dyn Group, _: &Bounds) -> Reply {
        let mut b = lock(&self.0);
        let result = b.commit(offsets);
        if matches!(result, Err(Failed::Denied(_))) {
            b.hear(); // the sink waits to hear why
        }
        Reply {
            result,
            feedback: b.report(),
        }
    }

    fn abort(&mut self, _: AbortReason, _: &Bounds) -> Reply {
        let mut b = lock(&self.0);
        b.hear(); // an abort is a round trip: the log was served meanwhile
        b.open.clear();
        b.open_denied = None;
        b.calls.push(Call::Abort);
        Reply {
            result: Ok(()),
            feedback: b.report(),
        }
    }

    fn claim(&mut self, partitions: &[Tp], _: &dyn Group, _: &Bounds) -> Result<Starts, Failed> {
        let b = lock(&self.0);
        if !b.with_outputs {
            return Ok(Starts::Group);
        }
        let at = |tp: &Tp| (tp.clone(), b.committed.get(tp).copied());
        Ok(Starts::At(partitions.iter().map(at).collect()))
    }

    fn exists(&self, name: &str, _: Duration) -> Result<bool, String> {
        Ok(!lock(&self.0).missing.iter().any(|m| m == name))
    }

    fn destination(&self) -> crate::sink::Destination {
        crate::sink::Destination {
            refuser: &crate::sink::kafka::BROKER,
            aborted: crate::events::Ended::Aborted,
            max_record_bytes: 1 << 20,
            offsets: if lock(&self.0).with_outputs {
                crate::sink::OffsetHome::WithOutputs
            } else {
                crate::sink::OffsetHome::Group
            },
        }
    }
}

/// A consumer of the fake broker: reads its assigned partitions in turn, one record a poll.
pub struct FakeGroup {
    broker: Shared,
    assigned: RefCell<Vec<Tp>>,
    /// Where each partition reads next.
    fetch: RefCell<HashMap<Tp, i64>>,
    /// librdkafka's position: unset after a seek until the next record.
    position: RefCell<HashMap<Tp, i64>>,
    turn: RefCell<usize>,
    pub seeks: RefCell<Vec<Vec<(Tp, i64)>>>,
    /// Partitions paused: not read.
    paused: RefCell<std::collections::BTreeSet<Tp>>,
    /// A pause does not take (the partition's records keep coming).
    pub pause_ignored: std::cell::Cell<bool>,
}

impl FakeGroup {
    fn new(broker: Shared) -> FakeGroup {
        FakeGroup {
            broker,
            assigned: RefCell::default(),
            fetch: RefCell::default(),
            position: RefCell::default(),
            turn: RefCell::default(),
            seeks: RefCell::default(),
            paused: RefCell::default(),
            pause_ignored: std::cell::Cell::new(false),
        }
    }

    /// `tp` is assigned, reading from its committed offset, else from `reset`.
    pub fn assign(&self, tp: (&str, i32), reset: i64) {
        self.assign_at(tp, None, reset);
    }

    /// `tp` is assigned, reading from `start`, else from its committed offset, else from
    /// `reset` (librdkafka's assignment with an offset, or without one).
    pub fn assign_at(&self, tp: (&str, i32), start: Option<i64>, reset: i64) {
        let tp = (tp.0.to_string(), tp.1);
        let committed = lock(&self.broker).committed.get(&tp).copied();
        let from = start.or(committed).unwrap_or(reset);
        self.fetch.borrow_mut().insert(tp.clone(), from);
        self.assigned.borrow_mut().push(tp);
    }

    /// `tp` is no longer assigned.
    pub fn revoke(&self, tp: (&str, i32)) {
        let tp = (tp.0.to_string(), tp.1);
        self.assigned.borrow_mut().retain(|a| *a != tp);
        self.position.borrow_mut().remove(&tp);
    }

    /// The consumer skipped control records (transaction markers) up to `offset`.
    pub fn skip_to(&self, tp: (&str, i32), offset: i64) {
        let tp = (tp.0.to_string(), tp.1);
        self.fetch.borrow_mut().insert(tp.clone(), offset);
        self.position.borrow_mut().insert(tp, offset);
    }

    /// Where `tp` reads next.
    pub fn fetch_at(&self, tp: (&str, i32)) -> Option<i64> {
        self.fetch.borrow().get(&(tp.0.to_string(), tp.1)).copied()
    }

    /// The next record of the assigned partitions, taken in turn. Control records before and
    /// right after it are skipped, the position moving past them as librdkafka's does.
    pub fn poll(&self) -> Option<OwnedRecord> {
        let assigned = self.assigned.borrow().clone();
        let b = lock(&self.broker);
        let at = |tp: &Tp, offset: i64| {
            let log = b.log.get(tp)?;
            let first = log.first()?.offset;
            log.get(usize::try_from(offset - first).ok()?)
        };
        for i in 0..assigned.len() {
            let turn = (*self.turn.borrow() + i) % assigned.len();
            let tp = &assigned[turn];
            if self.paused.borrow().contains(tp) {
                continue;
            }
            let mut next = self.fetch.borrow().get(tp).copied().unwrap_or(0);
            while at(tp, next).is_some_and(is_marker) {
                next += 1;
            }
            let Some(r) = at(tp, next).cloned() else {
                continue;
            };
            next += 1;
            while at(tp, next).is_some_and(is_marker) {
                next += 1;
            }
            self.fetch.borrow_mut().insert(tp.clone(), next);
            self.position.borrow_mut().insert(tp.clone(), next);
            *self.turn.borrow_mut() = turn + 1;
            return Some(r);
        }
        None
    }
}

impl Group for FakeGroup {
    fn metadata(&self) -> Option<crate::kafka::member::Generation> {
        None
    }

    fn member(&self) -> Option<crate::kafka::member::Member> {
        Some(crate::kafka::member::Member {
            generation: 1,
            id: "fake-member".into(),
        })
    }

    fn commit_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        lock(&self.broker).committed.extend(offsets.iter().cloned());
        Ok(())
    }

    fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        self.commit_offsets(offsets)
    }

    fn committed(
        &self,
        partitions: &[Tp],
        _: Duration,
    ) -> Result<Vec<(Tp, Option<i64>)>, ClientError> {
        let b = lock(&self.broker);
        if b.unstable {
            return Err(ClientError::of(Code::UnstableOffsetCommit));
        }
        let committed = |tp: &Tp| b.committed.get(tp).copied().filter(|_| !b.hide_committed);
        Ok(partitions
            .iter()
            .map(|tp| (tp.clone(), committed(tp)))
            .collect())
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let assigned = self.assigned.borrow();
        let position = self.position.borrow();
        assigned
            .iter()
            .filter_map(|tp| Some((tp.clone(), *position.get(tp)?)))
            .collect()
    }

    fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
        Ok(self.assigned.borrow().clone())
    }

    fn pause(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        if !self.pause_ignored.get() {
            self.paused.borrow_mut().extend(partitions.iter().cloned());
        }
        Ok(())
    }

    fn resume(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        self.paused
            .borrow_mut()
            .retain(|tp| !partitions.contains(tp));
        Ok(())
    }

    fn seek(&self, offsets: &[(Tp, i64)], _: Duration) -> Result<(), SeekFailed> {
        let mut sorted = offsets.to_vec();
        sorted.sort();
        self.seeks.borrow_mut().push(sorted);
        for (tp, o) in offsets {
            self.fetch.borrow_mut().insert(tp.clone(), *o);
            self.position.borrow_mut().remove(tp);
        }
        Ok(())
    }
}

/// A call the application received: its records, and where to answer.
type Received = (Vec<OwnedRecord>, Answering);

/// An application whose calls the test answers.
#[derive(Clone, Default)]
pub struct Answers(Arc<Mutex<Vec<Received>>>);

impl Application for Answers {
    fn submit(&self, records: &[InputRecord<'_>], _timeout: Duration) -> InFlight {
        let (tx, call) = InFlight::channel();
        let records = records.iter().map(OwnedRecord::of).collect();
        self.0.lock().unwrap().push((records, tx));
        call
    }
}

impl Answers {
    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The offsets of call `i`'s records.
    pub fn offsets(&self, i: usize) -> Vec<(i32, i64)> {
        let calls = self.0.lock().unwrap();
        calls[i].0.iter().map(|r| (r.partition, r.offset)).collect()
    }

    /// Answers call `i`: each record passes through as its own value; or the call fails.
    pub fn answer(&self, i: usize, ok: bool) {
        let failed = CallError::Unreachable("down".into());
        self.answer_or(i, if ok { None } else { Some(failed) });
    }

    /// Answers call `i` with one output of `value` for each of its records.
    pub fn answer_value(&self, i: usize, value: &[u8]) {
        self.answer_with(i, |_| (None, value.to_vec()));
    }

    /// Answers call `i` with one output for each of its records: `f` says its topic and value.
    pub fn answer_with(&self, i: usize, f: impl Fn(&OwnedRecord) -> (Option<String>, Vec<u8>)) {
        let calls = self.0.lock().unwrap();
        let (records, tx) = &calls[i];
        let answers = records
            .iter()
            .map(|r| {
                let (topic, value) = f(r);
                Answer::Outputs(vec![transform::call::Output {
                    topic,
                    key: None,
                    value: Some(value),
                    headers: None,
                }])
            })
            .collect();
        let _ = tx.send(Called {
            answers: Ok(answers),
            took: Duration::ZERO,
        });
    }

    /// Answers call `i` as [`Answers::answer`] does, or fails it with `error`.
    pub fn answer_or(&self, i: usize, error: Option<CallError>) {
        let calls = self.0.lock().unwrap();
        let (records, tx) = &calls[i];
        let answers = if error.is_none() {
            Ok(records
                .iter()
                .map(|r| {
                    Answer::Outputs(vec![transform::call::Output {
                        topic: None,
                        key: None,
                        value: r.value.clone(),
                        headers: None,
                    }])
                })
                .collect())
        } else {
            Err(error.unwrap_or(CallError::Unreachable("down".into())))
        };
        let _ = tx.send(Called {
            answers,
            took: Duration::ZERO,
        });
    }
}

/// A session over the fakes, and the loop that drives it as `pipeline::run_loop` does.
pub struct Core {
    pub session: Session,
    pub group: FakeGroup,
    pub broker: Shared,
    pub shutdown: CancellationToken,
    pub metrics: Arc<Metrics>,
    next: Poll,
}

/// Commits after every `n` records, never by time.
pub fn every(n: u64) -> CommitPolicy {
    CommitPolicy {
        interval: Duration::from_secs(3600),
        max_records: n,
        max_bytes: u64::MAX,
    }
}

/// Commits every turn, and moves offsets-only past markers at once.
pub fn always() -> CommitPolicy {
    CommitPolicy {
        interval: Duration::ZERO,
        ..every(1)
    }
}

/// The call-out's batching for the tests: `batch` records a call, two calls out at once.
pub fn calls_of(batch: usize) -> CallSpec {
    CallSpec {
        url: "http://127.0.0.1:9/".into(),
        batch_records: batch,
        batch_bytes: 1 << 20,
        linger: Duration::from_secs(3600),
        in_flight: 2,
        timeout: Duration::from_secs(5),
    }
}

const LIMITS: Limits = Limits {
    max_output_bytes: 1 << 20,
    max_outputs: 10,
};

impl Core {
    /// Passthrough, applied as read.
    pub fn direct(commit: CommitPolicy) -> Core {
        let t = transform::new(&TransformSpec::Passthrough, LIMITS).unwrap();
        Core::transformed(t, commit)
    }

    /// `t`, applied as read.
    pub fn transformed(t: Box<dyn transform::Transform>, commit: CommitPolicy) -> Core {
        Core::new(Intake::direct(t), commit, Duration::ZERO)
    }

    /// The call-out, calling `app`.
    pub fn staged(commit: CommitPolicy, spec: CallSpec, app: &Answers) -> Core {
        Core::routed(commit, spec, app, Duration::ZERO)
    }

    /// The call-out, calling `app`; a route refusing for `route_timeout` is the record's fault.
    pub fn routed(
        commit: CommitPolicy,
        spec: CallSpec,
        app: &Answers,
        route_timeout: Duration,
    ) -> Core {
        let stage = Stage::new(spec, Box::new(app.clone()), LIMITS);
        Core::new(Intake::Staged(Box::new(stage)), commit, route_timeout)
    }

    fn new(intake: Intake, commit: CommitPolicy, route_timeout: Duration) -> Core {
        let broker = Shared::default();
        let (health, metrics) = (Arc::new(Health::default()), Arc::new(Metrics::new()));
        let shutdown = CancellationToken::new();
        let bounds = Bounds::new(health.clone(), Duration::from_secs(5));
        let sink = Box::new(FakeSink(broker.clone()));
        let timeout = Duration::from_secs(1);
        let driver =
            Driver::start(sink, bounds, timeout, metrics.clone(), shutdown.clone()).unwrap();
        let destination = driver.destination();
        let policy = Policy {
            output_topic: "out".into(),
            errors: ErrorPolicy {
                on_error: OnError::Dlq,
                dlq_topic: "out.dlq".into(),
                // Unless a test says otherwise, a refused route is the record's fault at once.
                route_timeout,
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
        let session = Session::new(Parts {
            writer,
            intake,
            commit,
            positions: Arc::default(),
            metrics: metrics.clone(),
            health,
            shutdown: shutdown.clone(),
        });
        let next = session.next_poll();
        Core {
            session,
            group: FakeGroup::new(broker.clone()),
            broker,
            shutdown,
            metrics,
            next,
        }
    }

    /// The broker.
    pub fn broker(&self) -> MutexGuard<'_, Broker> {
        lock(&self.broker)
    }

    /// `tp` is assigned (the rebalance callback), reading from `reset` if nothing is committed.
    pub fn assign(&mut self, tp: (&str, i32), reset: i64) {
        self.group.assign(tp, reset);
        self.session.assigned(vec![(tp.0.to_string(), tp.1)]);
    }

    /// `tps` are assigned as the consumer's rebalance callback assigns them: claimed first,
    /// then each read from where the claim says (where it says nothing: the committed offset,
    /// else `reset`).
    pub fn rejoin(&mut self, tps: &[(&str, i32)], reset: i64) {
        let owned: Vec<Tp> = tps.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        let starts = (self.session.claim(&self.group, &owned)).expect("the claim failed");
        let at = match starts {
            Starts::Group => Vec::new(),
            Starts::At(at) => at,
        };
        for (tp, t) in tps.iter().zip(&owned) {
            let start = at.iter().find(|(a, _)| a == t).and_then(|a| a.1);
            self.group.assign_at(*tp, start, reset);
        }
        self.session.assigned(owned);
    }

    /// `tp` is revoked (the rebalance callback).
    pub fn revoke(&mut self, tp: (&str, i32)) {
        self.session
            .revoked(&self.group, vec![(tp.0.to_string(), tp.1)], false);
        self.group.revoke(tp);
    }

    /// The consumer is replaced (fenced): the session forgets what it read; the new one is
    /// assigned nothing yet.
    pub fn replace(&mut self) {
        self.session.replaced(&self.group);
        let assigned = self.group.assigned.borrow().clone();
        for tp in assigned {
            self.group.revoke((tp.0.as_str(), tp.1));
        }
    }

    /// One turn of the loop; whether a record was read.
    pub fn turn(&mut self) -> bool {
        self.try_turn()
            .unwrap_or_else(|e| panic!("the turn failed: {e:?}"))
    }

    /// One turn of the loop: whether a record was read, or what interrupts the pipeline.
    pub fn try_turn(&mut self) -> Result<bool, super::Interrupt> {
        let record = if self.next.read {
            self.group.poll()
        } else {
            None
        };
        let input = record.as_ref().map(OwnedRecord::as_input);
        self.next = self.session.turn(input.as_ref(), &self.group)?;
        Ok(record.is_some())
    }

    /// Turns until `n` turns in a row read nothing (at most `max` turns).
    pub fn run(&mut self, max: usize) {
        let mut idle = 0;
        for _ in 0..max {
            idle = if self.turn() { 0 } else { idle + 1 };
            if idle >= 3 {
                return;
            }
        }
    }
}

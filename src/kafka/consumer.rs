//! A group's consumer in exactly's terms: created for a [`super::Role`], subscribed, polled for
//! [`Received`] records or a [`Fault`], told of every rebalance through its [`Owner`], and
//! closed within a deadline.
//!
//! librdkafka calls the rebalance callback from inside `poll`, and the owner must settle what
//! it holds (commit or abort the open unit) before partitions move, so the owner lives in the
//! consumer's context, where both the loop and the callback reach it.

use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::consumer::{CommitMode, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use ref_cast::RefCast;
use tracing::warn;

use super::failure::{Action, ClientError, Code, Facts, KafkaCall, classify};
use super::member::{self, Generation, Member};
use super::{Client, NotCreated, Tp, offset_list, offsets_of, partition_list, partitions};

/// Longest single poll while the consumer leaves or closes.
const CLOSING_POLL: Duration = Duration::from_millis(100);

/// Who owns a consumer: told of each rebalance from inside [`Consumer::poll`], in librdkafka's
/// order. The consumer hands itself along, so the owner can read or commit its group's offsets.
pub trait Owner: Send + Sync + Sized + 'static {
    /// Partitions are about to be assigned: where each starts, or `None` to assign nothing
    /// (the owner stops its loop, having said why).
    fn claim(&self, consumer: &Consumer<Self>, partitions: &[Tp]) -> Option<Starts>;
    /// Where a claimed partition starts could not be set (`why`): nothing was assigned.
    fn unstartable(&self, why: String);
    /// `partitions` are about to go (`lost`: the group took them without a revoke, its
    /// session having expired).
    fn revoking(&self, consumer: &Consumer<Self>, partitions: Vec<Tp>, lost: bool);
    /// `partitions` are about to be assigned.
    fn assigning(&self, partitions: Vec<Tp>);
    /// A rebalance ended with `assignment` owned.
    fn rebalanced(&self, assignment: Vec<Tp>);
    /// librdkafka's statistics report of every owned partition (`statistics.interval.ms`).
    fn positions(&self, read: Vec<Read>);
}

/// Where assigned partitions start reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Starts {
    /// At the group's committed offsets (the Kafka sinks commit there).
    Group,
    /// Where the owner says, per partition (`None`: nothing kept there; the consumer starts
    /// at the group's committed offset, else by its reset policy).
    At(Vec<(Tp, Option<i64>)>),
}

/// One owned partition, as a statistics report has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The partition.
    pub tp: Tp,
    /// After the last record handed to the loop (or the fetch position, past markers).
    pub next: Option<i64>,
    /// The group's offset the consumer started from.
    pub start: Option<i64>,
}

/// The consumer's context: its owner.
pub struct Context<O>(O);

/// A group's consumer, its owner inside.
#[derive(RefCast)]
#[repr(transparent)]
pub struct Consumer<O: Owner>(BaseConsumer<Context<O>>);

/// A record polled, borrowed from the consumer until the next poll.
pub struct Received<'a>(pub(super) BorrowedMessage<'a>);

impl Received<'_> {
    /// Its topic.
    pub fn topic(&self) -> &str {
        self.0.topic()
    }
    /// Its partition.
    pub fn partition(&self) -> i32 {
        self.0.partition()
    }
    /// Its offset.
    pub fn offset(&self) -> i64 {
        self.0.offset()
    }
    /// Its timestamp in milliseconds since the epoch, if it has one.
    pub fn timestamp(&self) -> Option<i64> {
        self.0.timestamp().to_millis()
    }
    /// Its key.
    pub fn key(&self) -> Option<&[u8]> {
        self.0.key()
    }
    /// Its value (`None`: a tombstone).
    pub fn value(&self) -> Option<&[u8]> {
        self.0.payload()
    }
    /// Its headers, names as bytes.
    pub fn headers(&self) -> Vec<super::raw_headers::Header<'_>> {
        super::raw_headers::of(&self.0)
    }
}

/// Why a poll gave no record and the consumer cannot go on as it is.
#[derive(Debug)]
pub enum Fault {
    /// Another consumer joined with this one's `group.instance.id` (KIP-345).
    InstanceFenced(String),
    /// This consumer is finished (a fatal error): a new one must take its place.
    Finished(String),
    /// Nothing at run time can fix it (authorisation): stop.
    Exit(ClientError),
}

impl<O: Owner> Consumer<O> {
    /// A consumer created by `client` (the pipeline's role), `owner` inside.
    pub fn create(client: &Client, owner: O) -> Result<Consumer<O>, NotCreated> {
        Ok(Consumer(client.create_with_context(Context(owner))?))
    }

    /// Subscribes to `topics` (one starting with `^` is a regular expression).
    pub fn subscribe(&self, topics: &[&str]) -> Result<(), ClientError> {
        Ok(self.0.subscribe(topics)?)
    }

    /// Its owner. Never hold what it locks across [`Consumer::poll`]: the callbacks take it.
    pub fn owner(&self) -> &O {
        &self.0.context().0
    }

    /// The next record, waiting up to `wait`; `Ok(None)`: none came, or an error the consumer
    /// gets over (logged).
    pub fn poll(&self, wait: Duration) -> Result<Option<Received<'_>>, Fault> {
        match self.0.poll(wait) {
            None => Ok(None),
            Some(Ok(m)) => Ok(Some(Received(m))),
            Some(Err(e)) => {
                let fatal = self.0.client().fatal_error().map(|(code, _)| code);
                fault(e, fatal).map(|()| None)
            }
        }
    }

    /// Makes a classic static member leave its group, as a dynamic one does when it closes, so
    /// its partitions move at once instead of after its session timeout: on close, a static
    /// member sends no LeaveGroup (KIP-345), but after an unsubscribe it does. The revoke
    /// callback finds nothing open (the owner finished). librdkafka clears the member id when
    /// it gives the membership up, then sends the LeaveGroup if it knows a coordinator (else
    /// the group times the member out); the close that follows waits for its answer.
    fn leave_group(&self, deadline: Instant) {
        self.0.unsubscribe();
        let left = || self.member().is_none_or(|m| m.id.is_empty());
        while !left() && Instant::now() < deadline {
            // Nothing polled now is processed: the subscription is gone.
            let _ = self.0.poll(CLOSING_POLL);
        }
        if !left() {
            warn!("the consumer did not leave its group in time; the group will time it out");
        }
    }

    /// Closes the consumer: it leaves the group (unless static), so its partitions move at
    /// once; the revoke callback finds no open transaction. librdkafka's close can wait on an
    /// unresponsive coordinator, and Drop would wait without bound: past `deadline` (or when a
    /// broken consumer cannot start closing) it is left as it is, and the group notices the
    /// session timeout instead.
    ///
    /// On the way out (`exiting`), a closed consumer is not dropped either: rust-rdkafka's Drop
    /// closes it a second time and logs that as an error, and the process ends next anyway.
    ///
    /// A classic static member leaves first when `leave` (see `leave_group`).
    pub fn close(self, deadline: Instant, exiting: bool, leave: bool) {
        if leave {
            self.leave_group(deadline);
        }
        if self.0.close_queue().is_ok() {
            while !self.0.closed() && Instant::now() < deadline {
                self.0.poll(CLOSING_POLL);
            }
        }
        if !self.0.closed() {
            warn!("the consumer did not close in time; the group will time it out");
            // Dropping it would block until it closes.
            std::mem::forget(self);
        } else if exiting {
            std::mem::forget(self);
        } else {
            drop(self);
        }
    }

    /// The final close, bounded by `deadline` even when one librdkafka call inside it blocks
    /// (the revoke callback's, say): it runs on a thread of its own, which the process's exit
    /// ends if it is still waiting. Leaving the group is a courtesy; the group times a member
    /// out anyway.
    pub fn close_bounded(self, deadline: Instant, leave: bool) {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("exactly-close".into())
            .spawn(move || {
                self.close(deadline, true, leave);
                let _ = tx.send(());
            });
        match spawned {
            Ok(_) => {
                let left = deadline.saturating_duration_since(Instant::now()) + CLOSING_POLL;
                if rx.recv_timeout(left).is_err() {
                    warn!("the consumer did not close in time; the group will time it out");
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot start the close thread; the group will time the consumer out")
            }
        }
    }
}

/// The consumer group, as the sinks and the rewind see it: Kafka's, since membership is. The
/// simulator and the core's tests have their own.
pub trait Group {
    /// The group's generation, for a transactional offset commit (`None` before joining).
    fn metadata(&self) -> Option<Generation>;
    /// This member's generation and id now (`None`: not known).
    fn member(&self) -> Option<Member>;
    /// Commits `offsets` outside any transaction.
    fn commit_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError>;
    /// Copies `offsets` into the group without waiting (what a sink that keeps its own
    /// offsets tells the group's readers: lag exporters, `kafka-consumer-groups`).
    fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError>;
    /// The group's committed offsets of `partitions` (`None`: nothing committed).
    fn committed(&self, partitions: &[Tp], timeout: Duration) -> Result<Committed, ClientError>;
    /// The consumer's position in each assigned partition that has one (a seek unsets it
    /// until the next record).
    fn positions(&self) -> Vec<(Tp, i64)>;
    /// The partitions assigned now.
    fn assignment(&self) -> Result<Vec<Tp>, ClientError>;
    /// Moves the consumer to `offsets`. A partition that could not move comes back with why.
    fn seek(&self, offsets: &[(Tp, i64)], timeout: Duration) -> Result<(), SeekFailed>;
    /// Stops fetching `partitions` until they are assigned again (another owner took them)
    /// or resumed.
    fn pause(&self, partitions: &[Tp]) -> Result<(), ClientError>;
    /// Fetches `partitions` again.
    fn resume(&self, partitions: &[Tp]) -> Result<(), ClientError>;
}

/// What the group has committed per partition (`None`: nothing yet).
pub type Committed = Vec<(Tp, Option<i64>)>;

/// Why a seek did not move every partition.
#[derive(Debug)]
pub enum SeekFailed {
    /// The call itself failed.
    Call(ClientError),
    /// This partition did not move.
    Partition(Tp, ClientError),
}

impl<O: Owner> Group for Consumer<O> {
    fn metadata(&self) -> Option<Generation> {
        self.0.group_metadata().map(Generation)
    }

    fn member(&self) -> Option<Member> {
        member::of(self.0.client())
    }

    fn commit_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        Ok(self.0.commit(&offset_list(offsets)?, CommitMode::Sync)?)
    }

    fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
        Ok(self.0.commit(&offset_list(offsets)?, CommitMode::Async)?)
    }

    fn committed(&self, partitions: &[Tp], timeout: Duration) -> Result<Committed, ClientError> {
        let tpl = self
            .0
            .committed_offsets(partition_list(partitions), timeout)?;
        // A partition the broker could not answer for is no partition without an offset.
        for e in tpl.elements() {
            e.error()?;
        }
        Ok(offsets_of(&tpl))
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let Ok(tpl) = self.0.position() else {
            return Vec::new();
        };
        offsets_of(&tpl)
            .into_iter()
            .filter_map(|(tp, pos)| Some((tp, pos?)))
            .collect()
    }

    fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
        Ok(partitions(&self.0.assignment()?))
    }

    fn seek(&self, offsets: &[(Tp, i64)], timeout: Duration) -> Result<(), SeekFailed> {
        let call = |e: KafkaError| SeekFailed::Call(e.into());
        let tpl = offset_list(offsets).map_err(call)?;
        let result = self.0.seek_partitions(tpl, timeout).map_err(call)?;
        for e in result.elements() {
            if let Err(err) = e.error() {
                let tp = (e.topic().to_string(), e.partition());
                return Err(SeekFailed::Partition(tp, err.into()));
            }
        }
        Ok(())
    }

    fn pause(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        Ok(self.0.pause(&partition_list(partitions))?)
    }

    fn resume(&self, partitions: &[Tp]) -> Result<(), ClientError> {
        Ok(self.0.resume(&partition_list(partitions))?)
    }
}

/// What a consumer error means: nothing (end of a partition, or a warning, logged here), a
/// consumer fenced by its instance id or otherwise finished, or the end. `fatal`: the code of
/// the consumer's fatal error, if it has one.
fn fault(e: KafkaError, fatal: Option<Code>) -> Result<(), Fault> {
    let exit = classify(KafkaCall::Produce, &Facts::of(&e)) == Action::Exit;
    match e {
        KafkaError::PartitionEOF(_) => Ok(()),
        KafkaError::MessageConsumptionFatal(_) if fatal == Some(Code::FencedInstanceId) => {
            Err(Fault::InstanceFenced(e.to_string()))
        }
        // A fatal consumer error means this consumer instance is done. Fenced by its
        // group.instance.id (by its own rejoin after a session timeout, librdkafka#3437, or by
        // another process of the instance): the owner decides. Otherwise it is replaced;
        // anything unrecoverable (authorization) still exits.
        KafkaError::MessageConsumptionFatal(_) if !exit => Err(Fault::Finished(e.to_string())),
        _ if exit || matches!(e, KafkaError::MessageConsumptionFatal(_)) => {
            Err(Fault::Exit(e.into()))
        }
        _ => {
            warn!(error = %e, "consumer error");
            Ok(())
        }
    }
}

impl<O: Owner> ClientContext for Context<O> {
    /// librdkafka's statistics, every `statistics.interval.ms`, from inside `poll`.
    fn stats(&self, statistics: Statistics) {
        self.0.positions(read(&statistics));
    }
}

impl<O: Owner> ConsumerContext for Context<O> {
    /// rust-rdkafka's rebalance, with one step before an assignment: the owner claims the
    /// partitions and says where each starts (set in the list the consumer is assigned: a
    /// seek right after an assignment fails in librdkafka). A claim that fails assigns
    /// nothing.
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        use RDKafkaRespErr::{
            RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS as ASSIGN,
            RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS as REVOKE,
        };
        let consumer = Consumer::ref_cast(base);
        let mut claimed = false;
        if err == ASSIGN {
            let starts = match self.0.claim(consumer, &partitions(tpl)) {
                None => return,
                Some(Starts::Group) => Vec::new(),
                Some(Starts::At(starts)) => starts,
            };
            claimed = !starts.is_empty();
            for ((topic, partition), start) in starts {
                let offset = start.map_or(Offset::Invalid, Offset::Offset);
                if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                    // Started anywhere else, it would repeat or skip records: nothing is
                    // assigned, and the loop stops.
                    let why = format!("setting where claimed {topic}[{partition}] starts: {e}");
                    self.0.unstartable(why);
                    return;
                }
            }
        }
        let rebalance = match err {
            ASSIGN => Rebalance::Assign(tpl),
            REVOKE => Rebalance::Revoke(tpl),
            e => Rebalance::Error(KafkaError::Rebalance(e.into())),
        };
        self.pre_rebalance(base, &rebalance);
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let done = match (err == ASSIGN, cooperative) {
            (true, true) => base.incremental_assign(tpl),
            (true, false) => base.assign(tpl),
            (false, true) => base.incremental_unassign(tpl),
            (false, false) => base.unassign(),
        };
        if let Err(e) = done {
            warn!(error = %e, "the consumer did not take the rebalance");
        }
        // A partition paused when another instance claimed it is this one's again.
        if claimed && let Err(e) = base.resume(tpl) {
            warn!(error = %e, "cannot resume the claimed partitions");
        }
        self.post_rebalance(base, &rebalance);
    }

    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let lost = base.assignment_lost();
                self.0
                    .revoking(Consumer::ref_cast(base), partitions(tpl), lost);
            }
            Rebalance::Assign(tpl) => self.0.assigning(partitions(tpl)),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !matches!(rebalance, Rebalance::Error(_)) {
            let assignment = base.assignment().unwrap_or_default();
            self.0.rebalanced(partitions(&assignment));
        }
    }
}

/// The owned partitions of a statistics report.
fn read(stats: &Statistics) -> Vec<Read> {
    let mut out = Vec::new();
    for (topic, t) in &stats.topics {
        for p in t.partitions.values() {
            // -1 is librdkafka's internal "unassigned" partition; `desired` marks owned ones.
            if p.partition < 0 || !p.desired {
                continue;
            }
            // app_offset: after the last record handed to the loop; before the first one, the
            // committed offset the consumer starts from.
            let mut next = [p.app_offset, p.committed_offset]
                .into_iter()
                .find(|o| *o >= 0);
            // With nothing buffered (fetchq_cnt is the length of the consumer queue it is
            // forwarded to), the loop has seen everything below the fetch position. That
            // position is past transaction markers and aborted records, which app_offset never
            // passes: without this, a caught-up partition of transactional input would show a
            // lag of 1 forever.
            if p.fetchq_cnt == 0 && p.next_offset >= 0 {
                next = Some(next.map_or(p.next_offset, |o| o.max(p.next_offset)));
            }
            out.push(Read {
                tp: (topic.clone(), p.partition),
                next,
                start: Some(p.committed_offset).filter(|o| *o >= 0),
            });
        }
    }
    out
}

/// An owner that claims nothing and hears nothing (tests of what a consumer alone does).
#[cfg(test)]
pub(crate) struct NoOwner;

#[cfg(test)]
impl Owner for NoOwner {
    fn claim(&self, _: &Consumer<Self>, _: &[Tp]) -> Option<Starts> {
        Some(Starts::Group)
    }
    fn unstartable(&self, _: String) {}
    fn revoking(&self, _: &Consumer<Self>, _: Vec<Tp>, _: bool) {}
    fn assigning(&self, _: Vec<Tp>) {}
    fn rebalanced(&self, _: Vec<Tp>) {}
    fn positions(&self, _: Vec<Read>) {}
}

/// A consumer of group `g` on a mock cluster with topic `topic`, not joined yet.
#[cfg(test)]
pub(crate) fn unjoined_mock(
    topic: &str,
) -> (
    rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Consumer<NoOwner>,
) {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(topic, 1, 1).expect("topic");
    let consumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", "g")
        .create_with_context(Context(NoOwner))
        .expect("consumer");
    (cluster, Consumer(consumer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::statistics::{Partition, Topic};

    /// A consumer fenced by another with its `group.instance.id` is told apart from any other
    /// fatal consumer error: only it may make a newcomer yield (the pipeline's `YIELD_WITHIN`).
    #[test]
    fn a_consumer_fenced_by_its_instance_id_is_told_apart_from_other_fatal_errors() {
        let fatal = || KafkaError::MessageConsumptionFatal(Code::Fatal);
        let fenced = fault(fatal(), Some(Code::FencedInstanceId));
        assert!(matches!(fenced, Err(Fault::InstanceFenced(_))));
        let other = fault(fatal(), Some(Code::UnreleasedInstanceId));
        assert!(matches!(other, Err(Fault::Finished(_))));
        let plain = KafkaError::MessageConsumption(Code::FencedInstanceId);
        assert!(fault(plain, Some(Code::FencedInstanceId)).is_ok());
        let denied = KafkaError::MessageConsumption(Code::GroupAuthorizationFailed);
        assert!(matches!(fault(denied, None), Err(Fault::Exit(_))));
        assert!(fault(KafkaError::PartitionEOF(3), None).is_ok());
    }

    fn partition(p: i32, desired: bool, app: i64, committed: i64) -> Partition {
        Partition {
            partition: p,
            desired,
            app_offset: app,
            committed_offset: committed,
            fetchq_cnt: 3,
            next_offset: -1001,
            ..Partition::default()
        }
    }

    fn stats(partitions: Vec<Partition>) -> Statistics {
        let mut topic = Topic::default();
        for p in partitions {
            topic.partitions.insert(p.partition, p);
        }
        let mut stats = Statistics::default();
        stats.topics.insert("in".into(), topic);
        stats
    }

    #[test]
    fn positions_of_owned_partitions_come_from_statistics() {
        let s = stats(vec![
            partition(-1, false, -1, -1),
            partition(0, true, 40, -1001),
            partition(1, true, -1001, 20),
            partition(2, false, 5, 5),
            partition(3, true, -1001, -1001),
        ]);
        let mut got = read(&s);
        got.sort_by_key(|p| p.tp.1);
        let next: Vec<_> = got.iter().map(|p| (p.tp.1, p.next, p.start)).collect();
        assert_eq!(
            next,
            vec![
                (0, Some(40), None),
                (1, Some(20), Some(20)),
                (3, None, None)
            ]
        );
    }

    #[test]
    fn with_nothing_buffered_the_fetch_position_counts() {
        // A commit marker at 40: the fetcher is past it, the last record handed out was 39.
        let mut caught_up = partition(0, true, 40, -1001);
        caught_up.fetchq_cnt = 0;
        caught_up.next_offset = 41;
        assert_eq!(read(&stats(vec![caught_up]))[0].next, Some(41));
    }
}

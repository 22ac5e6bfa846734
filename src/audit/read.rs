//! Reading a history for the audit: bounded input ranges, outputs and DLQ as read_committed
//! and read_uncommitted consumers see them, the group's committed offsets, and watermarks.
//!
//! The order matters on a live pipeline: committed offsets are read before the outputs, so
//! every input the group has committed has its outputs visible by the time they are read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::{History, PartitionState, Rec};
use crate::config::{Bound, Plan};
use crate::error::Error;
use crate::kafka::{Isolation, Role};
use crate::offsets;
use crate::transform::InputRecord;

/// Consumer context that does not report reaching the end of a partition as an error: the
/// audit asks for those events (`enable.partition.eof`) and handles them in its poll loop.
pub struct AuditContext;

impl ClientContext for AuditContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_))
            && error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::warn!(%error, reason, "kafka client error");
        }
    }
}

impl ConsumerContext for AuditContext {}

type AuditConsumer = BaseConsumer<AuditContext>;

/// The low watermark of each input partition.
type Lows = BTreeMap<(String, i32), i64>;

fn client(plan: &Plan, isolation: Isolation) -> Result<AuditConsumer, Error> {
    let role = Role::AuditReader { isolation };
    Ok(plan.kafka.client(role).create_with_context(AuditContext)?)
}

/// Calls `f` again while its error says a partition's leadership is moving (right after a
/// broker restart the client's metadata names the old leader for a moment): ten tries,
/// [`crate::backoff::Backoff::LEADER_MOVES`] apart; any other error at once.
fn leader_moves<T>(mut f: impl FnMut() -> KafkaResult<T>) -> KafkaResult<T> {
    let mut tries = 0;
    loop {
        match f() {
            Err(e)
                if tries < 10
                    && matches!(
                        e.rdkafka_error_code(),
                        Some(
                            RDKafkaErrorCode::NotLeaderForPartition
                                | RDKafkaErrorCode::LeaderNotAvailable
                                | RDKafkaErrorCode::NotCoordinator
                                | RDKafkaErrorCode::BrokerNotAvailable
                        )
                    ) =>
            {
                tries += 1;
                std::thread::sleep(crate::backoff::Backoff::LEADER_MOVES.after(tries));
            }
            result => return result,
        }
    }
}

fn kafka(context: &str) -> impl FnOnce(KafkaError) -> Error + '_ {
    move |source| Error::kafka(context, source)
}

/// The audit's two readers: `read_committed`, as a downstream consumer reads, and
/// `read_uncommitted`, which also sees what aborted transactions wrote.
struct Readers<'p> {
    plan: &'p Plan,
    committed: AuditConsumer,
    uncommitted: AuditConsumer,
}

/// Reads everything [`super::analyze`] needs.
pub fn collect(plan: &Plan) -> Result<History, Error> {
    let r = Readers {
        plan,
        committed: client(plan, Isolation::ReadCommitted)?,
        uncommitted: client(plan, Isolation::ReadUncommitted)?,
    };
    let partitions = r.partitions()?;
    let mut states = r.states(&partitions)?;
    let (range, lows) = r.input_range(&partitions, &states)?;
    // Committed offsets before outputs (see the module comment). Without require_stable
    // (a read_uncommitted client does not ask for it): a hanging transaction must not block.
    let committed = match &plan.group {
        None => None,
        Some(g) => {
            let partitions: Vec<(String, i32)> = range.keys().cloned().collect();
            let options = offsets::StoreOptions::kafka(&plan.kafka, plan.timeout);
            let store = offsets::open("kafka:", &options)?;
            Some(store.read(g, &partitions)?)
        }
    };
    let mut inputs = Vec::new();
    for t in &plan.inputs {
        let ranges: BTreeMap<i32, (i64, i64)> = range
            .iter()
            .filter(|((rt, _), _)| rt == t)
            .map(|((_, p), r)| (*p, *r))
            .collect();
        inputs.extend(read_ranges(&r.committed, t, &ranges, plan.timeout)?);
    }
    let (mut earlier, mut truncated) = (Vec::new(), Vec::new());
    if plan.earlier {
        truncated.extend(
            (lows.iter())
                .filter(|(_, low)| **low > 0)
                .map(|((t, p), low)| (t.clone(), *p, *low)),
        );
        for t in &plan.inputs {
            let ranges: BTreeMap<i32, (i64, i64)> = (range.iter())
                .filter(|((rt, _), _)| rt == t)
                .map(|((_, p), &(start, _))| (*p, (lows[&(t.clone(), *p)], start)))
                .collect();
            earlier.extend(read_ranges(&r.committed, t, &ranges, plan.timeout)?);
        }
    }
    let first_ts = inputs.iter().filter_map(|r| r.timestamp).min();
    let (outputs, dlq, aborted) = r.outputs(&partitions, first_ts)?;
    // Watermarks at the end: a partition whose LSO did not move while it stayed below the
    // high watermark holds a hanging transaction.
    for s in &mut states {
        let (hw, lso) = r.watermarks(&s.topic, s.partition)?;
        s.high_watermark_at_end = hw;
        s.last_stable_offset_at_end = lso;
    }
    Ok(History {
        earlier,
        truncated,
        inputs,
        range,
        outputs,
        dlq,
        rows: false,
        aborted,
        committed,
        partitions: states,
    })
}

impl Readers<'_> {
    /// The partition count of every audited topic.
    fn partitions(&self) -> Result<BTreeMap<String, i32>, Error> {
        let plan = self.plan;
        let mut partitions = BTreeMap::new();
        for t in plan
            .inputs
            .iter()
            .chain(&plan.outputs)
            .chain(plan.dlq.iter())
        {
            let md = self
                .committed
                .fetch_metadata(Some(t), plan.timeout)
                .map_err(kafka("reading topic metadata"))?;
            let n = md
                .topics()
                .iter()
                .find(|x| x.name() == t.as_str() && x.error().is_none())
                .map(|x| x.partitions().len() as i32)
                .ok_or_else(|| Error::Config(format!("topic '{t}' does not exist")))?;
            partitions.insert(t.to_string(), n);
        }
        Ok(partitions)
    }

    /// High watermark and last stable offset of a partition (a read_committed client's high
    /// watermark is the LSO).
    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), Error> {
        let timeout = self.plan.timeout;
        let (_, hw) = leader_moves(|| self.uncommitted.fetch_watermarks(topic, partition, timeout))
            .map_err(kafka("reading high watermarks"))?;
        let (_, lso) = leader_moves(|| self.committed.fetch_watermarks(topic, partition, timeout))
            .map_err(kafka("reading last stable offsets"))?;
        Ok((hw, lso))
    }

    /// Every partition's watermarks at the start.
    fn states(&self, partitions: &BTreeMap<String, i32>) -> Result<Vec<PartitionState>, Error> {
        let mut states = Vec::new();
        for (t, &n) in partitions {
            for p in 0..n {
                let (hw, lso) = self.watermarks(t, p)?;
                states.push(PartitionState {
                    topic: t.clone(),
                    partition: p,
                    high_watermark: hw,
                    last_stable_offset: lso,
                    high_watermark_at_end: hw,
                    last_stable_offset_at_end: lso,
                });
            }
        }
        Ok(states)
    }

    /// The audited range of each input partition, [start, end), within what is stable; and
    /// each one's low watermark.
    fn input_range(
        &self,
        partitions: &BTreeMap<String, i32>,
        states: &[PartitionState],
    ) -> Result<(super::Range, Lows), Error> {
        let plan = self.plan;
        let (mut range, mut lows) = (BTreeMap::new(), BTreeMap::new());
        for t in &plan.inputs {
            for p in 0..partitions[t] {
                let (low, _) = self
                    .uncommitted
                    .fetch_watermarks(t, p, plan.timeout)
                    .map_err(kafka("reading low watermarks"))?;
                let lso = states
                    .iter()
                    .find(|s| &s.topic == t && s.partition == p)
                    .map_or(0, |s| s.last_stable_offset);
                let start = resolve(&self.committed, &plan.from, t, p, low, plan.timeout)?;
                let end = resolve(&self.committed, &plan.to, t, p, lso, plan.timeout)?.min(lso);
                range.insert((t.clone(), p), (start.max(low), end));
                lows.insert((t.clone(), p), low);
            }
        }
        Ok((range, lows))
    }

    /// The output and DLQ records from the oldest input's time on (outputs carry their
    /// input's timestamp), read_committed, and how many more only read_uncommitted sees.
    fn outputs(
        &self,
        partitions: &BTreeMap<String, i32>,
        first_ts: Option<i64>,
    ) -> Result<(Vec<Rec>, Vec<Rec>, usize), Error> {
        let plan = self.plan;
        let (mut outputs, mut dlq, mut aborted) = (Vec::new(), Vec::new(), 0);
        for t in plan.outputs.iter().chain(plan.dlq.iter()) {
            let mut ranges = BTreeMap::new();
            for p in 0..partitions[t] {
                let start = match first_ts {
                    Some(ts) => resolve(&self.committed, &Bound::Time(ts), t, p, 0, plan.timeout)?,
                    None => 0,
                };
                ranges.insert(p, (start, i64::MAX));
            }
            let committed_recs = read_ranges(&self.committed, t, &ranges, plan.timeout)?;
            let visible: HashSet<(i32, i64)> = committed_recs
                .iter()
                .map(|r| (r.partition, r.offset))
                .collect();
            let all = read_ranges(&self.uncommitted, t, &ranges, plan.timeout)?;
            aborted += all
                .iter()
                .filter(|r| !visible.contains(&(r.partition, r.offset)))
                .count();
            if Some(t) == plan.dlq.as_ref() {
                dlq.extend(committed_recs);
            } else {
                outputs.extend(committed_recs);
            }
        }
        Ok((outputs, dlq, aborted))
    }
}

/// The offset a bound means on one partition; `edge` where it does not say.
fn resolve(
    c: &AuditConsumer,
    bound: &Bound,
    topic: &str,
    partition: i32,
    edge: i64,
    timeout: Duration,
) -> Result<i64, Error> {
    match bound {
        Bound::Edge => Ok(edge),
        Bound::Offsets(map) => Ok(map.get(&partition).copied().unwrap_or(edge)),
        Bound::Time(ts) => {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(*ts))
                .map_err(kafka("building a time query"))?;
            let got = c
                .offsets_for_times(tpl, timeout)
                .map_err(kafka("offsets for times"))?;
            let offset = got.elements().first().map(|e| e.offset());
            Ok(match offset {
                Some(Offset::Offset(o)) => o,
                // No record at or after the time: the end of the partition.
                _ => {
                    let (_, high) = c
                        .fetch_watermarks(topic, partition, timeout)
                        .map_err(kafka("reading watermarks"))?;
                    high
                }
            })
        }
    }
}

/// Reads [start, end) of each partition of one topic (end = i64::MAX: to the end the client
/// sees). One topic at a time: librdkafka's end-of-partition event names only the partition.
fn read_ranges(
    c: &AuditConsumer,
    topic: &str,
    ranges: &BTreeMap<i32, (i64, i64)>,
    timeout: Duration,
) -> Result<Vec<Rec>, Error> {
    let mut tpl = TopicPartitionList::new();
    let mut open: HashMap<i32, i64> = HashMap::new();
    for (&p, &(start, end)) in ranges {
        if start < end {
            tpl.add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(kafka("building an assignment"))?;
            open.insert(p, end);
        }
    }
    let mut out = Vec::new();
    if open.is_empty() {
        return Ok(out);
    }
    c.assign(&tpl).map_err(kafka("assigning partitions"))?;
    let mut last_progress = Instant::now();
    while !open.is_empty() {
        if last_progress.elapsed() > timeout {
            let mut left: Vec<&i32> = open.keys().collect();
            left.sort();
            return Err(Error::Startup(format!(
                "no progress reading {topic} partitions {left:?} within {timeout:?} (--timeout)"
            )));
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
                last_progress = Instant::now();
            }
            Some(Err(e)) => return Err(kafka("reading records")(e)),
            Some(Ok(m)) => {
                last_progress = Instant::now();
                let p = m.partition();
                let Some(&end) = open.get(&p) else { continue };
                if m.offset() >= end {
                    open.remove(&p);
                    continue;
                }
                out.push(copy(&m));
                if m.offset() + 1 >= end {
                    open.remove(&p);
                }
            }
        }
    }
    c.unassign().map_err(kafka("unassigning"))?;
    Ok(out)
}

/// Copies a record read (the tests' readers use it too).
pub fn copy(m: &rdkafka::message::BorrowedMessage<'_>) -> Rec {
    Rec::of(&InputRecord {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
        timestamp: m.timestamp().to_millis(),
        key: m.key(),
        value: m.payload(),
        headers: crate::kafka::raw_headers::of(m),
    })
}

#[cfg(test)]
mod leader_tests {
    use super::*;

    #[test]
    fn a_moving_leader_is_waited_for_and_other_errors_are_not() {
        let mut calls = 0;
        let r = leader_moves(|| {
            calls += 1;
            if calls < 3 {
                Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::NotLeaderForPartition,
                ))
            } else {
                Ok(7)
            }
        });
        assert_eq!((r.ok(), calls), (Some(7), 3));
        let mut calls = 0;
        let r: KafkaResult<i32> = leader_moves(|| {
            calls += 1;
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            ))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1);
    }
}

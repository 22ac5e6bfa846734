//! The simulator's Kafka: topics whose records carry the transaction they were written in, a
//! transaction coordinator (epochs, open transactions, their timeout), a group coordinator
//! (members, generations, the assignment, committed offsets), on a clock of its own.
//!
//! It keeps the rules exactly's guarantees rest on, and nothing else:
//! - a producer's epoch fences every older one: `init` aborts what the older left open;
//! - a record and an offset commit join the producer's open transaction; EndTxn commits or
//!   aborts all of it at once, and checks the epoch, never the group's generation;
//! - a transactional offset commit checks the member and its generation (KIP-447);
//! - an offset fetch that requires stable offsets waits while an open transaction holds
//!   offsets for the partition (librdkafka asks for that with `read_committed`);
//! - a `read_committed` reader stops at the first record of an open transaction;
//! - a member not heard from for the session timeout is expelled, and its partitions move;
//!   a member gives up partitions it is told to revoke only once its callback returned;
//! - a transaction open longer than the transaction timeout is aborted, its epoch bumped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::kafka::failure::Code;

use crate::kafka::Tp;
use crate::transform::OwnedRecord;

/// The input topic, the output and dead-letter topics, and the changelog.
pub const INPUT: &str = "in";
/// Where outputs go.
pub const OUTPUT: &str = "out";
/// Where dead-letter copies go.
pub const DLQ: &str = "out.dlq";
/// The dedup's changelog, one partition per input partition.
pub const CHANGELOG: &str = "cl";

/// A record of an output topic or the changelog.
#[derive(Clone, Debug, Default)]
pub struct Entry {
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// The lineage header (`in/partition/offset/index`), on outputs and dead-letter copies.
    pub lineage: Option<String>,
    /// The reason header, on dead-letter copies.
    pub reason: Option<String>,
    /// The value as the reference writes an output (`oracle::canonical`).
    pub canonical: String,
    /// The transaction it was written in (set when it is delivered); `None` for a marker.
    pub txn: Option<usize>,
}

/// How a transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Open,
    Committed,
    Aborted,
}

/// A transaction of one producer epoch.
#[derive(Debug)]
struct Txn {
    id: String,
    started: u64,
    partitions: BTreeSet<(String, i32)>,
    offsets: BTreeMap<Tp, i64>,
    state: Ended,
}

/// A member of the group, as the coordinator knows it.
#[derive(Debug)]
struct Member {
    /// The generation it was last told (-1: none yet).
    generation: i32,
    assigned: BTreeSet<Tp>,
    heard: u64,
    /// Expelled or left: its next poll learns it lost everything.
    gone: bool,
}

/// What a member's poll hears from the coordinator, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// It was expelled (its session expired): these are lost.
    Lost(Vec<Tp>),
    /// Give these up (the rebalance callback commits first), then say [`Model::released`].
    Revoke(Vec<Tp>),
    /// These are now its own.
    Assign(Vec<Tp>),
}

/// A record a producer holds but has not delivered yet.
#[derive(Debug)]
struct Queued {
    topic: String,
    partition: i32,
    /// Its timestamp (`None`: the time of sending).
    timestamp: Option<i64>,
    entry: Entry,
    index: usize,
}

/// One instance's producer: its transactional id, epoch and what it holds.
#[derive(Debug, Default)]
pub struct Client {
    /// Its transactional id.
    pub id: String,
    /// The epoch it got from its last `init`.
    pub epoch: u32,
    queue: VecDeque<Queued>,
    /// Sends refused for what they are (their indexes), not taken yet.
    pub rejected: Vec<usize>,
    /// A delivery of the open transaction failed: it cannot commit.
    pub failed: bool,
    /// A request timed out: no transaction may run on this epoch.
    pub stale: bool,
}

/// How the next EndTxn(commit) of an instance goes wrong, if it is to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndFault {
    /// Refused: the transaction must abort.
    Abortable,
    /// Timed out after it took effect.
    UnknownCommitted,
    /// Timed out before it reached the coordinator.
    UnknownLost,
    /// Took effect; its retry was answered by a newer epoch (a newcomer with the same id).
    FencedAfterCommit,
}

/// The timeouts the coordinators keep, in ms of the model's clock.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A member not heard from for this long is expelled.
    pub session: u64,
    /// A transaction open this long is aborted.
    pub transaction: u64,
}

/// The cluster.
#[derive(Debug)]
pub struct Model {
    /// The clock, in ms.
    pub now: u64,
    /// The input, per partition (not transactional).
    pub input: Vec<Vec<OwnedRecord>>,
    logs: BTreeMap<String, Vec<Vec<Entry>>>,
    txns: Vec<Txn>,
    /// Each transactional id's epoch and open transaction.
    producers: BTreeMap<String, (u32, Option<usize>)>,
    /// Each instance's producer, by instance.
    pub clients: BTreeMap<usize, Client>,
    generation: i32,
    members: BTreeMap<String, Member>,
    /// Who holds each partition now.
    owner: BTreeMap<Tp, String>,
    /// Who is to hold it once it is free.
    target: BTreeMap<Tp, String>,
    /// The group's committed offsets.
    pub committed: BTreeMap<Tp, i64>,
    next_member: u64,
    timeouts: Timeouts,
    /// A transaction committed since the last look.
    pub changed: bool,
    /// The next EndTxn(commit) fault of each instance.
    pub end_faults: BTreeMap<usize, EndFault>,
    /// Sends to refuse (abortable) before one goes through, per instance.
    pub send_faults: BTreeMap<usize, u32>,
    /// What the coordinators did, for the trace.
    pub log: Vec<String>,
    /// How often each thing happened, for the run's coverage.
    pub counts: BTreeMap<&'static str, u64>,
    /// Each instance's member id now.
    pub member_of: BTreeMap<usize, String>,
}

impl Model {
    /// Counts one `what`.
    pub fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// Whether instance `i`'s member was expelled (or left) and has not joined again.
    pub fn expelled(&self, i: usize) -> bool {
        (self.member_of.get(&i)).is_none_or(|id| self.members.get(id).is_none_or(|m| m.gone))
    }

    /// A cluster holding `input` in topic [`INPUT`], and the other topics empty.
    pub fn new(input: Vec<Vec<OwnedRecord>>, timeouts: Timeouts) -> Model {
        let n = input.len();
        let mut logs = BTreeMap::new();
        logs.insert(OUTPUT.to_string(), vec![Vec::new()]);
        logs.insert(DLQ.to_string(), vec![Vec::new()]);
        logs.insert(CHANGELOG.to_string(), vec![Vec::new(); n]);
        Model {
            now: 0,
            input,
            logs,
            txns: Vec::new(),
            producers: BTreeMap::new(),
            clients: BTreeMap::new(),
            generation: 0,
            members: BTreeMap::new(),
            owner: BTreeMap::new(),
            target: BTreeMap::new(),
            committed: BTreeMap::new(),
            next_member: 0,
            timeouts,
            changed: false,
            end_faults: BTreeMap::new(),
            send_faults: BTreeMap::new(),
            log: Vec::new(),
            counts: BTreeMap::new(),
            member_of: BTreeMap::new(),
        }
    }

    /// The input partitions.
    pub fn partitions(&self) -> Vec<Tp> {
        (0..self.input.len())
            .map(|p| (INPUT.to_string(), p as i32))
            .collect()
    }

    // ---- the transaction coordinator ------------------------------------------------------

    /// A new producer for instance `i` with transactional id `id`: a new epoch, which aborts
    /// what the older one left open. What the older one held is gone.
    pub fn init(&mut self, i: usize, id: &str) -> u32 {
        let (epoch, open) = self.producers.entry(id.to_string()).or_default();
        *epoch += 1;
        let (epoch, open) = (*epoch, open.take());
        if let Some(t) = open {
            self.end(t, false);
        }
        self.clients.insert(
            i,
            Client {
                id: id.to_string(),
                epoch,
                ..Client::default()
            },
        );
        epoch
    }

    /// Instance `i` was killed: what its producer held is gone (its transaction stays open).
    pub fn killed(&mut self, i: usize) {
        self.clients.remove(&i);
    }

    /// The open transaction of `id` at `epoch`, begun if none is: or why not.
    fn open(&mut self, id: &str, epoch: u32) -> Result<usize, Code> {
        let now = self.now;
        let (current, open) = self.producers.entry(id.to_string()).or_default();
        if *current != epoch {
            return Err(Code::ProducerFenced);
        }
        if let Some(t) = *open {
            return Ok(t);
        }
        let t = self.txns.len();
        *open = Some(t);
        self.txns.push(Txn {
            id: id.to_string(),
            started: now,
            partitions: BTreeSet::new(),
            offsets: BTreeMap::new(),
            state: Ended::Open,
        });
        Ok(t)
    }

    /// Ends transaction `t`: markers in every partition it wrote, its offsets the group's if
    /// it commits.
    fn end(&mut self, t: usize, commit: bool) {
        let txn = &mut self.txns[t];
        if txn.state != Ended::Open {
            return;
        }
        txn.state = if commit {
            Ended::Committed
        } else {
            Ended::Aborted
        };
        for (topic, p) in &txn.partitions {
            if let Some(log) = self.logs.get_mut(topic) {
                // A marker: of no transaction.
                log[*p as usize].push(Entry::default());
            }
        }
        let what = if commit {
            "transactions committed"
        } else {
            "transactions aborted"
        };
        *self.counts.entry(what).or_default() += 1;
        if commit {
            let offsets = std::mem::take(&mut txn.offsets);
            self.log.push(format!(
                "{} commits {:?} {:?}",
                txn.id, offsets, txn.partitions
            ));
            self.committed.extend(offsets);
            self.changed = true;
        }
        if let Some((_, open)) = self.producers.get_mut(&txn.id)
            && *open == Some(t)
        {
            *open = None;
        }
    }

    /// Instance `i`'s EndTxn: commit (`commit`) or abort its open transaction.
    pub fn end_txn(&mut self, i: usize, commit: bool) -> Result<(), Code> {
        let (id, epoch) = self.client(i)?;
        let (current, open) = self.producers.get(&id).copied().unwrap_or_default();
        if current != epoch {
            return Err(Code::ProducerFenced);
        }
        if let Some(t) = open {
            self.end(t, commit);
        }
        Ok(())
    }

    /// Instance `i`'s transactional id and epoch.
    fn client(&self, i: usize) -> Result<(String, u32), Code> {
        let c = self.clients.get(&i).ok_or(Code::State)?;
        Ok((c.id.clone(), c.epoch))
    }

    /// Another producer with instance `i`'s transactional id initialised: its epoch moves on
    /// (and aborts what is open).
    pub fn newcomer(&mut self, i: usize) {
        if let Ok((id, _)) = self.client(i) {
            let (epoch, open) = self.producers.entry(id).or_default();
            *epoch += 1;
            if let Some(t) = open.take() {
                self.end(t, false);
            }
        }
    }

    /// Instance `i` sends a record: it waits in its producer until delivered.
    pub fn send(
        &mut self,
        i: usize,
        to: (&str, i32),
        timestamp: Option<i64>,
        entry: Entry,
        index: usize,
    ) {
        let (topic, partition) = to;
        if let Some(c) = self.clients.get_mut(&i) {
            c.queue.push_back(Queued {
                topic: topic.to_string(),
                partition,
                timestamp,
                entry,
                index,
            });
        }
    }

    /// Delivers up to `n` of instance `i`'s records: each joins its open transaction, or is
    /// refused for what it is (a record with an odd timestamp, as a topic bounding timestamps
    /// refuses it; the dead-letter topic takes any), or fails (its epoch is fenced).
    pub fn deliver(&mut self, i: usize, n: usize) {
        for _ in 0..n {
            let Some(c) = self.clients.get_mut(&i) else {
                return;
            };
            let Some(q) = c.queue.pop_front() else {
                return;
            };
            let (id, epoch) = (c.id.clone(), c.epoch);
            let poison = q.topic != DLQ && q.timestamp.is_some_and(|t| t % 2 != 0);
            let result = if poison {
                Err(Some(q.index))
            } else {
                self.open(&id, epoch)
                    .map(|t| {
                        self.txns[t]
                            .partitions
                            .insert((q.topic.clone(), q.partition));
                        let mut entry = q.entry;
                        entry.txn = Some(t);
                        if let Some(log) = self.logs.get_mut(&q.topic) {
                            log[q.partition as usize].push(entry);
                        }
                    })
                    .map_err(|_| None)
            };
            if let (Err(refused), Some(c)) = (result, self.clients.get_mut(&i)) {
                c.failed = true;
                c.rejected.extend(refused);
                self.count(match refused {
                    Some(_) => "records refused for what they are",
                    None => "deliveries fenced",
                });
            }
        }
    }

    /// Instance `i`'s records not delivered yet are dropped (an abort purges them).
    pub fn purge(&mut self, i: usize) {
        if let Some(c) = self.clients.get_mut(&i) {
            c.queue.clear();
        }
    }

    /// Instance `i` adds the group's `offsets` to its transaction as member `member` of
    /// `generation`.
    pub fn send_offsets(
        &mut self,
        i: usize,
        member: &str,
        generation: i32,
        offsets: &[(Tp, i64)],
    ) -> Result<(), Code> {
        let (id, epoch) = self.client(i)?;
        let t = self.open(&id, epoch)?;
        let refused = match self.members.get(member) {
            None => Some(Code::UnknownMemberId),
            Some(m) if m.gone => Some(Code::UnknownMemberId),
            Some(_) if generation != self.generation => Some(Code::IllegalGeneration),
            Some(_) => None,
        };
        if let Some(code) = refused {
            self.count("offset commits fenced by the group");
            return Err(code);
        }
        self.txns[t].offsets.extend(offsets.iter().cloned());
        Ok(())
    }

    /// Whether an open transaction holds offsets for `tp` (a stable fetch waits).
    pub fn unstable(&self, tp: &Tp) -> bool {
        self.txns
            .iter()
            .any(|t| t.state == Ended::Open && t.offsets.contains_key(tp))
    }

    /// Whether any transaction is open.
    pub fn any_open(&self) -> bool {
        self.txns.iter().any(|t| t.state == Ended::Open)
    }

    /// The committed records of `topic`'s partition `p`, with their offsets: what a
    /// `read_committed` reader sees once every transaction open now has ended.
    pub fn committed_records(&self, topic: &str, p: i32) -> Vec<(i64, &Entry)> {
        let Some(log) = self.logs.get(topic) else {
            return Vec::new();
        };
        (log[p as usize].iter().enumerate())
            .filter(|(_, e)| {
                e.txn
                    .is_some_and(|t| self.txns[t].state == Ended::Committed)
            })
            .map(|(o, e)| (o as i64, e))
            .collect()
    }

    /// The end of `topic`'s partition `p` (its high watermark).
    pub fn end_offset(&self, topic: &str, p: i32) -> i64 {
        self.logs
            .get(topic)
            .map_or(0, |l| l[p as usize].len() as i64)
    }

    /// `topic`'s partition `p` from `from` for a `read_committed` reader: the committed records,
    /// and whether an open transaction stopped the read short of the end.
    pub fn read(&self, topic: &str, p: i32, from: i64) -> (Vec<(i64, Entry)>, bool) {
        let Some(log) = self.logs.get(topic) else {
            return (Vec::new(), false);
        };
        let mut out = Vec::new();
        for (o, e) in log[p as usize]
            .iter()
            .enumerate()
            .skip(from.max(0) as usize)
        {
            match e.txn.map(|t| self.txns[t].state) {
                None | Some(Ended::Aborted) => {}
                Some(Ended::Open) => return (out, true),
                Some(Ended::Committed) => out.push((o as i64, e.clone())),
            }
        }
        (out, false)
    }

    // ---- the group coordinator ------------------------------------------------------------

    /// Instance `i`'s new member joins: its id. The group rebalances.
    pub fn join(&mut self, i: usize) -> String {
        self.next_member += 1;
        let id = format!("m{}", self.next_member);
        self.member_of.insert(i, id.clone());
        self.members.insert(
            id.clone(),
            Member {
                generation: -1,
                assigned: BTreeSet::new(),
                heard: self.now,
                gone: false,
            },
        );
        self.rebalance();
        id
    }

    /// `member` leaves (a clean stop, or a consumer replaced): its partitions move at once.
    pub fn leave(&mut self, member: &str) {
        if self.members.remove(member).is_some() {
            self.owner.retain(|_, m| m != member);
            self.rebalance();
        }
    }

    /// `member` is alive (its heartbeat).
    pub fn heartbeat(&mut self, member: &str) {
        let now = self.now;
        if let Some(m) = self.members.get_mut(member)
            && !m.gone
        {
            m.heard = now;
        }
    }

    /// `member`'s generation and whether it is still a member.
    pub fn member(&self, member: &str) -> Option<(i32, bool)> {
        self.members.get(member).map(|m| (m.generation, !m.gone))
    }

    /// A new generation: each partition's target is a live member, in turn.
    fn rebalance(&mut self) {
        self.generation += 1;
        let live: Vec<String> = (self.members.iter())
            .filter(|(_, m)| !m.gone)
            .map(|(id, _)| id.clone())
            .collect();
        self.target.clear();
        if live.is_empty() {
            return;
        }
        for (n, tp) in self.partitions().into_iter().enumerate() {
            self.target.insert(tp, live[n % live.len()].clone());
        }
    }

    /// What `member`'s poll hears now: lost partitions if it was expelled; else, once it
    /// learns the generation, the partitions it must give up, and those that are free for it.
    pub fn poll(&mut self, member: &str) -> Vec<Heard> {
        let generation = self.generation;
        let Some(m) = self.members.get_mut(member) else {
            return Vec::new();
        };
        if m.gone {
            let lost: Vec<Tp> = std::mem::take(&mut m.assigned).into_iter().collect();
            self.members.remove(member);
            return if lost.is_empty() {
                Vec::new()
            } else {
                vec![Heard::Lost(lost)]
            };
        }
        let mut heard = Vec::new();
        if m.generation != generation {
            m.generation = generation;
            let revoke: Vec<Tp> = (m.assigned.iter())
                .filter(|tp| self.target.get(*tp).is_none_or(|t| t != member))
                .cloned()
                .collect();
            if !revoke.is_empty() {
                heard.push(Heard::Revoke(revoke));
            }
        }
        let free: Vec<Tp> = (self.target.iter())
            .filter(|(tp, t)| *t == member && !self.owner.contains_key(*tp))
            .map(|(tp, _)| tp.clone())
            .collect();
        if !free.is_empty() {
            for tp in &free {
                self.owner.insert(tp.clone(), member.to_string());
            }
            if let Some(m) = self.members.get_mut(member) {
                m.assigned.extend(free.iter().cloned());
            }
            heard.push(Heard::Assign(free));
        }
        heard
    }

    /// `member`'s rebalance callback returned: `partitions` are free for their new owner.
    pub fn released(&mut self, member: &str, partitions: &[Tp]) {
        if let Some(m) = self.members.get_mut(member) {
            for tp in partitions {
                m.assigned.remove(tp);
            }
        }
        for tp in partitions {
            if self.owner.get(tp).is_some_and(|o| o == member) {
                self.owner.remove(tp);
            }
        }
    }

    /// Time passes, `alive` heartbeating meanwhile: members not heard from are expelled,
    /// transactions open too long aborted.
    pub fn tick(&mut self, ms: u64, alive: &[String]) {
        self.now += ms;
        let now = self.now;
        for id in alive {
            self.heartbeat(id);
        }
        let expired: Vec<String> = (self.members.iter())
            .filter(|(_, m)| !m.gone && now.saturating_sub(m.heard) > self.timeouts.session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            if let Some(m) = self.members.get_mut(id) {
                m.gone = true;
            }
            self.owner.retain(|_, o| o != id);
        }
        if !expired.is_empty() {
            self.count("sessions expired");
            self.rebalance();
        }
        let timed_out: Vec<usize> = (0..self.txns.len())
            .filter(|t| {
                let txn = &self.txns[*t];
                txn.state == Ended::Open && now - txn.started > self.timeouts.transaction
            })
            .collect();
        for t in timed_out {
            self.count("transactions timed out");
            let id = self.txns[t].id.clone();
            self.end(t, false);
            if let Some((epoch, _)) = self.producers.get_mut(&id) {
                *epoch += 1;
            }
        }
    }
}

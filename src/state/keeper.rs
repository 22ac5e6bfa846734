//! Where the stateful stage's state comes from and where it goes, partition by partition: read
//! back at a partition's first record (what the local store holds, then the changelog from
//! the store's mark), the open unit's changes as changelog records for its transaction, and
//! the local store written once the unit committed, its marks moved up at each checkpoint.
//! The transform decides records against [`Seen`] and hands each change here; it never
//! touches the changelog or the store itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::changelog;
use super::restore::{Changelog, Read, Unread};
use super::seen::{Change, Seen};
use super::store::{Batch, Store};
use crate::kafka::Tp;
use crate::metrics::Metrics;

/// How often the local store's marks move up (one request per partition written since): a
/// restart reads at most about this much of the changelog again.
const CHECKPOINT: Duration = Duration::from_secs(10);

/// How long one unit may spend restoring before the restores left wait for the next unit: a
/// restore runs on the loop, and one read takes up to `--transaction-timeout`, so a turn of
/// the loop stays within this plus one read (the consumer's `max.poll.interval.ms` is the
/// transaction timeout plus 15 s).
pub const RESTORE_BUDGET: Duration = Duration::from_secs(5);

/// Why a partition's state is not read back.
#[derive(Debug)]
pub enum Unrestored {
    /// Not now: the unit aborts, and the restore is tried again.
    Later(String),
    /// Its changelog partition does not exist (the input grew): the partition is held.
    Homeless(String),
}

/// Each owned partition's state: in memory ([`Seen`]), in the changelog, on disk.
pub struct Keeper {
    seen: Seen,
    source: Box<dyn Changelog>,
    /// The committed state on disk (`--state-dir`), if any.
    store: Option<Box<dyn Store>>,
    owned: BTreeSet<Tp>,
    /// Owned partitions whose state is not read back yet.
    unrestored: BTreeSet<Tp>,
    /// Unrestored partitions a record asked for (a restore was tried): the ones whose records
    /// wait. An idle partition is restored at its first record, and waits for nothing before.
    waiting: BTreeSet<Tp>,
    /// Unrestored partitions whose last restore stopped midway, and the changelog offset it
    /// got to: everything below is in the committed layer (and the store, marked there).
    resume: BTreeMap<Tp, i64>,
    /// Time spent restoring in the open unit.
    restoring: Duration,
    /// The open unit's changes, in order (partition, change): its changelog records, and what
    /// its commit writes to the store.
    pending: Vec<(i32, Change)>,
    /// How many of `pending` went to the changelog already.
    sent: usize,
    /// Partitions whose store mark is behind their changelog (changes stored since).
    behind: BTreeSet<i32>,
    /// Marks taken for the open unit (`unsent`), stored if it commits.
    marks: Vec<(i32, i64)>,
    checkpointed: Instant,
    /// How often marks are taken.
    checkpoint_every: Duration,
    metrics: Metrics,
}

impl Keeper {
    /// The state `seen` (empty), restored from `source` (and `store`, if any).
    pub fn new(
        seen: Seen,
        source: Box<dyn Changelog>,
        store: Option<Box<dyn Store>>,
        metrics: Metrics,
    ) -> Keeper {
        Keeper {
            seen,
            source,
            store,
            owned: BTreeSet::new(),
            unrestored: BTreeSet::new(),
            waiting: BTreeSet::new(),
            resume: BTreeMap::new(),
            restoring: Duration::ZERO,
            pending: Vec::new(),
            sent: 0,
            behind: BTreeSet::new(),
            marks: Vec::new(),
            checkpointed: Instant::now(),
            checkpoint_every: CHECKPOINT,
            metrics,
        }
    }

    /// The state, to decide records against.
    pub fn seen(&self) -> &Seen {
        &self.seen
    }

    /// The state, to change (through the open unit's layer).
    pub fn seen_mut(&mut self) -> &mut Seen {
        &mut self.seen
    }

    /// `tp`'s state is read back, unless it is already. A partition with no changelog
    /// partition is held (and not counted as restoring: `exactly_state_partitions_held` is).
    pub fn ready(&mut self, tp: &Tp) -> Result<(), Unrestored> {
        if !self.unrestored.contains(tp) {
            return Ok(());
        }
        let restored = self.restore(tp);
        if matches!(restored, Err(Unrestored::Homeless(_))) {
            self.waiting.remove(tp);
            self.restoring_gauge();
        }
        restored
    }

    /// A change the open unit made to partition `p`: its changelog record goes with the unit.
    pub fn changed(&mut self, p: i32, change: Change) {
        self.pending.push((p, change));
    }

    /// Restored at their first record ([`Keeper::ready`]), not now: by then the consumer has
    /// fetched their committed offsets, which waits for a previous owner's transaction that
    /// holds offsets for them to end (KIP-447, `read_committed`), so the changelog's end taken
    /// then is past everything that transaction wrote (the commit sends its offsets only once
    /// every record is acknowledged: `sink::kafka::exactly_once::commit`).
    pub fn assigned(&mut self, partitions: &[Tp]) {
        for tp in partitions {
            self.owned.insert(tp.clone());
            self.unrestored.insert(tp.clone());
        }
    }

    /// `partitions` are no longer owned: everything of them goes. No mark is taken now:
    /// another member may own them already (a loss, or a rebalance heard a turn late); the
    /// store keeps what it has for when they come back.
    pub fn revoked(&mut self, partitions: &[Tp]) {
        for tp in partitions {
            self.seen.revoked(tp);
            self.owned.remove(tp);
            self.unrestored.remove(tp);
            self.waiting.remove(tp);
            self.resume.remove(tp);
            self.behind.remove(&tp.1);
        }
        self.restoring_gauge();
        self.gauges();
    }

    /// The changes of the open unit not sent yet, as (partition, change), `totals` too: the
    /// stream times (and totals) each time, all of them (compaction and a restore keep the
    /// last). The first call of a unit takes the checkpoint's marks.
    pub fn unsent(&mut self, totals: bool) -> &[(i32, Change)] {
        if self.sent == 0 {
            self.checkpoint();
        }
        let times = self.seen.stream_times();
        self.pending
            .extend(times.into_iter().map(|(tp, change)| (tp.1, change)));
        if totals {
            let totals = self.seen.totals();
            self.pending
                .extend(totals.into_iter().map(|(tp, change)| (tp.1, change)));
        }
        let from = self.sent;
        self.sent = self.pending.len();
        &self.pending[from..]
    }

    /// The open unit committed: its changes are the committed state, and go to the local store
    /// with the marks taken for it.
    pub fn committed(&mut self) {
        self.seen.committed();
        self.sent = 0;
        self.restoring = Duration::ZERO;
        if self.store.is_none() {
            self.pending.clear();
            self.gauges();
            return;
        }
        let mut batch = Batch::default();
        let mut touched = BTreeSet::new();
        for (p, change) in self.pending.drain(..) {
            touched.insert(p);
            match change {
                Change::Key { window, key } => batch.keys.push((p, window, key)),
                Change::StreamTime(t) => batch.stream_times.push((p, t)),
                total @ Change::Total { .. } => batch.totals.push((p, total)),
            }
        }
        for tp in self.owned.iter().filter(|tp| touched.contains(&tp.1)) {
            batch.expire.extend(self.expire(tp));
        }
        for (p, end) in self.marks.drain(..) {
            batch.marks.push((p, end));
            self.behind.remove(&p);
        }
        self.behind.extend(touched);
        self.crash_test(&batch);
        self.write(&batch);
        self.gauges();
    }

    /// The open unit is dropped: `known` to be aborted, or of an outcome not known (its
    /// changes may have committed: every owned partition is read back from its changelog).
    pub fn dropped(&mut self, known: bool) {
        self.seen.aborted();
        self.pending.clear();
        self.marks.clear();
        self.sent = 0;
        self.restoring = Duration::ZERO;
        if !known {
            // A restore midway starts over: the state it kept goes below.
            self.resume.clear();
            // No mark may pass the unit's records before the restore reads them.
            for tp in &self.owned {
                self.behind.remove(&tp.1);
            }
            warn!("a commit's outcome is unknown: the dedup state is read back from its changelog");
            self.unrestored.extend(self.owned.iter().cloned());
            for tp in self.owned.clone() {
                self.seen.revoked(&tp);
            }
        }
    }

    /// The gauges of the state in memory.
    pub fn gauges(&self) {
        self.metrics.state_keys.set(self.seen.keys() as i64);
        (self.metrics.state_window_keys_max).set(self.seen.fullest_window() as i64);
        self.metrics
            .state_windows
            .set(self.seen.open_windows() as i64);
    }

    /// Testing only: `--test-crash-before-store` may abort the process here.
    fn crash_test(&self, batch: &Batch) {
        if !(batch.keys.is_empty() && batch.totals.is_empty() && batch.stream_times.is_empty()) {
            crate::switches::crash_point(crate::switches::Crash::BeforeStore);
        }
    }

    /// Reads `tp`'s state back, unless the open unit spent its restore budget already (then
    /// the unit aborts, the loop polls, and the next unit goes on).
    fn restore(&mut self, tp: &Tp) -> Result<(), Unrestored> {
        if self.waiting.insert(tp.clone()) {
            self.restoring_gauge();
        }
        if self.restoring >= RESTORE_BUDGET {
            return Err(Unrestored::Later(format!(
                "restores took {:?} of this unit already; partition {} waits for the next",
                self.restoring, tp.1
            )));
        }
        let started = Instant::now();
        let restored = self.restore_now(tp);
        self.restoring += started.elapsed();
        restored
    }

    /// Reads `tp`'s state back, over whatever was held of it: what the local store holds, then
    /// the changelog from the store's mark (from its beginning without one, or when the mark
    /// is not in it any more); what the changelog added goes to the store with the new mark.
    /// A read that stops midway keeps what it got (in the store too, marked where it got to),
    /// and the next one goes on from there.
    fn restore_now(&mut self, tp: &Tp) -> Result<(), Unrestored> {
        let p = tp.1;
        let started = Instant::now();
        let (from, stored) = match self.resume.remove(tp) {
            Some(at) => (Some(at), 0),
            None => {
                self.seen.revoked(tp);
                self.load(tp)
            }
        };
        let (mut delta, read, skipped, from) = self.read_changelog(tp, from)?;
        self.aged(p, read.written);
        self.seen.restored(tp);
        delta.marks.push((p, read.end));
        delta.expire.extend(self.expire(tp));
        self.write(&delta);
        self.behind.remove(&p);
        self.unrestored.remove(tp);
        self.waiting.remove(tp);
        self.metrics.state_restored_records.inc_by(read.records);
        self.restoring_gauge();
        self.gauges();
        info!(
            topic = %tp.0, partition = p, records = read.records, stored, from = ?from, skipped,
            took = ?started.elapsed(), keys = self.seen.keys(),
            "dedup state restored"
        );
        Ok(())
    }

    /// Reads `tp`'s changelog partition from `from` into the committed layer: what it added
    /// (for the local store), how far it read, the records that were no state change, and
    /// where it read from (the beginning, when the store's mark is not in it any more).
    fn read_changelog(
        &mut self,
        tp: &Tp,
        mut from: Option<i64>,
    ) -> Result<(Batch, Read, u64, Option<i64>), Unrestored> {
        let p = tp.1;
        loop {
            let (mut delta, mut skipped, mut last) = (Batch::default(), 0u64, None);
            let read = self.read_into(tp, from, &mut delta, &mut skipped, &mut last);
            match read {
                Ok(read) => return Ok((delta, read, skipped, from)),
                Err(Unread::OutOfRange(why)) if from.is_some() => {
                    warn!(
                        partition = p,
                        why, "the local store's mark is not in the changelog; reading it all"
                    );
                    self.seen.revoked(tp);
                    if let Some(store) = &mut self.store
                        && let Err(e) = store.wipe(p)
                    {
                        self.store_failed(&e);
                    }
                    from = None;
                }
                Err(Unread::Missing(why)) => return Err(self.homeless(p, &why)),
                Err(e) => {
                    self.metrics.state_restore_failures.inc();
                    // What was read is the changelog's below where it got: kept, and stored
                    // with that mark, so the next read (or a restart) goes on from there.
                    match last.map(|o| o + 1).or(from) {
                        Some(at) => {
                            delta.marks.push((p, at));
                            self.write(&delta);
                            self.resume.insert(tp.clone(), at);
                        }
                        None => self.seen.revoked(tp),
                    }
                    return Err(Unrestored::Later(format!("restoring the dedup state: {e}")));
                }
            }
        }
    }

    /// One read of `tp`'s changelog partition from `from`: each change into the committed
    /// layer and `delta`, the records that are no state change counted in `skipped`, the last
    /// offset read in `last`.
    fn read_into(
        &mut self,
        tp: &Tp,
        from: Option<i64>,
        delta: &mut Batch,
        skipped: &mut u64,
        last: &mut Option<i64>,
    ) -> Result<Read, Unread> {
        let (p, pace, seen) = (tp.1, crate::switches::restore_pace(), &mut self.seen);
        self.source.read(p, from, &mut |offset, k, v| {
            if let Some(pace) = pace {
                std::thread::sleep(pace);
            }
            *last = Some(offset);
            match changelog::decode(k, v) {
                Ok(change) => {
                    match &change {
                        Change::Key { window, key } => delta.keys.push((p, *window, key.clone())),
                        Change::StreamTime(t) => delta.stream_times.push((p, *t)),
                        Change::Total { .. } => delta.totals.push((p, change.clone())),
                    }
                    seen.restore(tp, change)
                }
                Err(why) => {
                    if *skipped == 0 {
                        warn!(
                            partition = p,
                            why, "a changelog record that is no state change; skipped"
                        );
                    }
                    *skipped += 1;
                }
            }
        })
    }

    /// The state of partition `p` read back was last written at `written`: older than the
    /// changelog keeps the keys of a window still open (retention counts from when a record was
    /// written, and an outage keeps a window open that long longer), some may be gone.
    fn aged(&self, p: i32, written: Option<i64>) {
        let Some(written) = written else {
            return;
        };
        let age = (crate::clock::wall_ms() - written).max(0) as f64 / 1000.0;
        self.metrics.state_restored_age.set(age);
        let margin = self.metrics.state_changelog_margin.get();
        if age > margin / 2.0 {
            (self.metrics.state_aged_restore_time).set(crate::clock::wall_ms() as f64 / 1000.0);
        }
        if age > margin {
            warn!(
                partition = p,
                age_s = age,
                margin_s = margin,
                "the state read back was written longer ago than the changelog keeps the keys \
                 of a window still open (--window-max-ahead and a day): keys of windows open \
                 then may be gone, and their records go out again; --state-dir keeps them \
                 across any outage"
            );
        }
    }

    /// Input partition `p` has no changelog partition (the input grew): the changelog grows
    /// to hold it, where the cluster lets it; either way the partition is held for now (a
    /// partition just grown takes a moment to reach the client's metadata).
    fn homeless(&mut self, p: i32, why: &str) -> Unrestored {
        let grown = self.source.grow(usize::try_from(p).unwrap_or(0) + 1);
        Unrestored::Homeless(match grown {
            Ok(()) => format!("{why}; grown, read again shortly"),
            Err(e) => format!("{why}; {e}"),
        })
    }

    /// What the local store holds of `tp`, into the committed layer: the changelog offset to
    /// read on from (`None`: its beginning), and how many keys it held.
    fn load(&mut self, tp: &Tp) -> (Option<i64>, u64) {
        let Some(store) = &mut self.store else {
            return (None, 0);
        };
        let (seen, mut stored) = (&mut self.seen, 0u64);
        let loaded = store.load(tp.1, &mut |change| {
            seen.restore(tp, change);
            stored += 1;
        });
        match loaded {
            Ok(Some(mark)) => {
                if let Some(t) = mark.stream_time {
                    self.seen.restore(tp, Change::StreamTime(t));
                }
                (Some(mark.next), stored)
            }
            Ok(None) => (None, 0),
            Err(e) => {
                self.seen.revoked(tp);
                self.store_failed(&e);
                (None, 0)
            }
        }
    }

    /// The windows of `tp` the store may drop: those starting before the first still open.
    fn expire(&self, tp: &Tp) -> Option<(i32, i64)> {
        let st = self.seen.stream_time(tp)?;
        Some((tp.1, self.seen.windows().first_open(st)?))
    }

    /// Writes `batch` to the local store, if there is one.
    fn write(&mut self, batch: &Batch) {
        if let Some(store) = &mut self.store
            && let Err(e) = store.write(batch)
        {
            self.store_failed(&e);
        }
    }

    /// The local store failed: a mark could now be ahead of what it holds. Every mark goes
    /// (a restore reads the changelog from its beginning) and the store is not used again.
    fn store_failed(&mut self, e: &str) {
        error!(
            error = e,
            "the local state store failed; restores read the changelog from its beginning from now on"
        );
        if let Some(mut store) = self.store.take() {
            for p in self.owned.iter().map(|tp| tp.1) {
                let _ = store.wipe(p);
            }
        }
    }

    /// Takes the marks of the partitions stored since the last checkpoint: their changelog's
    /// end now, inside the open unit and before its own changes are sent. Everything below is
    /// stored already (earlier units', and what the restore read), and nobody else can have
    /// written there: had the partition moved, this unit's commit would be fenced (its
    /// offsets carry the group generation) and the marks never stored. A partition whose
    /// state is not read back yet (an unknown outcome) takes none: its restore sets it.
    fn checkpoint(&mut self) {
        self.marks.clear();
        if self.store.is_none() || self.checkpointed.elapsed() < self.checkpoint_every {
            return;
        }
        self.checkpointed = Instant::now();
        let settled: Vec<i32> = (self.owned.iter())
            .filter(|tp| self.behind.contains(&tp.1) && !self.unrestored.contains(*tp))
            .map(|tp| tp.1)
            .collect();
        for p in settled {
            match self.source.end(p) {
                Ok(end) => self.marks.push((p, end)),
                Err(e) => warn!(
                    partition = p,
                    error = e,
                    "the changelog's end is unknown; the store's mark stays"
                ),
            }
        }
    }

    /// Partitions whose records wait for their restore (not the idle ones not restored yet).
    fn restoring_gauge(&self) {
        self.metrics.state_restoring.set(self.waiting.len() as i64);
    }

    /// Testing only: marks are taken at every unit's first changelog records.
    #[cfg(test)]
    pub fn checkpoint_always(&mut self) {
        self.checkpoint_every = Duration::ZERO;
    }

    /// Testing only: the open unit spent its restore budget.
    #[cfg(test)]
    pub fn budget_spent(&mut self) {
        self.restoring = RESTORE_BUDGET;
    }
}

//! The dedup (`--window`): the first record of each key per window of event time goes
//! on, through `--jq` if given (which sees the window's label as `$window`); later ones are
//! dropped and counted; a record for a window that closed follows `--window-late`.
//!
//! The keys seen are [`Seen`]'s two layers. Each first decision and each partition's stream
//! time are also records to the changelog partition of the record's input partition, written
//! right before the commit ([`Transform::before_commit`]) in the same transaction as the
//! outputs and the offsets. How a unit ended moves the open layer down (and, with
//! `--state-dir`, writes the unit's changes to the local store) or drops it. A partition
//! assigned is restored when its first record comes, before that record is decided (then
//! its previous owner's last transaction has ended: [`Dedup::assigned`]): from the local
//! store, then the changelog from the store's mark (everything, without a store). A record's
//! changes wait for the writer's verdict on it ([`Transform::decided`]). A restore that fails makes
//! the transform unavailable (the unit aborts, the loop backs off, the restore is tried
//! again); a commit whose outcome nobody can tell restores every partition owned (its changes
//! may or may not have committed: only the changelog knows).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::jq::Jq;
use super::{
    Failure, Fate, InputRecord, OutputHeaders, OutputRecord, Reason, Transform, TransformError,
};
use crate::config::{DedupConfig, Emit, Late};
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::state::changelog;
use crate::state::restore::{Changelog, Read, Unread};
use crate::state::seen::{Acc, Adds, Change, Seen, Sum, Verdict, distinct_key};
use crate::state::store::{Batch, Store};
use crate::state::window::Window;

/// How often the local store's marks move up (one request per partition written since): a
/// restart reads at most about this much of the changelog again.
const CHECKPOINT: Duration = Duration::from_secs(10);

/// How long one unit may spend restoring before the restores left wait for the next unit: a
/// restore runs on the loop, and one read takes up to `--transaction-timeout`, so a turn of
/// the loop stays within this plus one read (the consumer's `max.poll.interval.ms` is the
/// transaction timeout plus 15 s).
const RESTORE_BUDGET: Duration = Duration::from_secs(5);

/// The most an aggregate's output takes besides its group (twice, as JSON text): the window's
/// label twice, five numbers, the field names.
const TOTALS_OVERHEAD: usize = 256;

/// What the message of a record refused for an event time too far ahead of this host's clock
/// says: the audit, whose clock is later, takes such a refusal as the pipeline decided it.
pub const AHEAD_OF_CLOCK: &str = "ahead of this host's clock";

/// The windowed aggregates (`--aggregate`), the dedup's other mode.
struct Aggregate {
    count: bool,
    /// The number each record adds to the sum.
    sum: Option<Jq>,
    /// The value each record adds to the distinct count.
    distinct: Option<Jq>,
    emit: Emit,
}

/// What one record changes in the state, held until the writer decided its fate
/// ([`Transform::decided`]): a record that goes to the dead-letter topic instead (its output
/// refused, too large, routed to a topic that keeps refusing) changes nothing.
struct Step {
    tp: Tp,
    /// Its event time: the stream time moves to it.
    t: i64,
    change: Effect,
}

/// A step's change besides the stream time.
enum Effect {
    /// None (a duplicate).
    Nothing,
    /// Its key, first seen in its window.
    Key(Window, Box<[u8]>),
    /// An aggregate's record: what it adds to its group in its window.
    Add {
        window: Window,
        group: Box<[u8]>,
        number: Option<Sum>,
        distinct: Option<Vec<u8>>,
    },
}

/// Why a partition's state is not read back.
enum Unrestored {
    /// Not now: the unit aborts, and the restore is tried again.
    Later(String),
    /// Its changelog partition does not exist (the input grew): the partition is held.
    Homeless(String),
}

/// The dedup in front of the record's transform.
pub struct Dedup {
    key: Option<Jq>,
    time: Option<Jq>,
    /// What the first of each key becomes: the `--jq` program, or the record as it is.
    then: Option<Jq>,
    late: Late,
    /// Aggregates instead of the dedup.
    aggregate: Option<Aggregate>,
    topic: String,
    seen: Seen,
    source: Box<dyn Changelog>,
    /// The committed state on disk (`--state-dir`), if any.
    store: Option<Box<dyn Store>>,
    owned: BTreeSet<Tp>,
    /// The longest key: its changelog record stays within --max-output-bytes.
    max_key: usize,
    /// How far ahead of this host's clock (and of its record's timestamp, with --window-time)
    /// an event time may be (ms).
    max_ahead: i64,
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
    /// What the record last applied changes, once the writer says its outputs went out.
    step: Option<Step>,
    /// The open unit's changes, in order (partition, change): its changelog records, and what
    /// its commit writes to the store.
    pending: Vec<(i32, Change)>,
    /// How many of `pending` went to the changelog already.
    sent: usize,
    /// Partitions whose store mark is behind their changelog (changes stored since).
    behind: BTreeSet<i32>,
    /// Marks taken for the open unit (`before_commit`), stored if it commits.
    marks: Vec<(i32, i64)>,
    checkpointed: Instant,
    /// How often marks are taken.
    checkpoint_every: Duration,
    /// Testing only: commits with changes to store left before the process aborts instead.
    crash_before_store: Option<u64>,
    /// Testing only: how long a restore takes per changelog record.
    restore_pace: Option<Duration>,
    metrics: Metrics,
}

impl Dedup {
    /// The dedup of `config`, restoring from `source` (and `store`, if any); `then`: the
    /// program for the first of each key (compiled already).
    pub fn new(
        config: &DedupConfig,
        [key, time, then, sum, distinct]: [Option<Jq>; 5],
        source: Box<dyn Changelog>,
        store: Option<Box<dyn Store>>,
        metrics: Metrics,
    ) -> Dedup {
        let dedup = Dedup {
            key,
            time,
            then,
            late: config.late,
            aggregate: config.aggregate.as_ref().map(|a| Aggregate {
                count: a.count,
                sum,
                distinct,
                emit: a.emit,
            }),
            topic: config.changelog.clone(),
            seen: Seen::new(config.windows.clone()).capped(config.max_keys),
            source,
            store,
            owned: BTreeSet::new(),
            max_key: config.max_key,
            max_ahead: config.max_ahead,
            unrestored: BTreeSet::new(),
            waiting: BTreeSet::new(),
            resume: BTreeMap::new(),
            restoring: Duration::ZERO,
            step: None,
            pending: Vec::new(),
            sent: 0,
            behind: BTreeSet::new(),
            marks: Vec::new(),
            checkpointed: Instant::now(),
            checkpoint_every: CHECKPOINT,
            crash_before_store: None,
            restore_pace: None,
            metrics,
        };
        let limit = i64::try_from(config.max_keys).unwrap_or(i64::MAX);
        dedup.metrics.state_window_keys_limit.set(limit);
        let margin = config.max_ahead as f64 / 1000.0 + crate::config::dedup::MARGIN.as_secs_f64();
        dedup.metrics.state_changelog_margin.set(margin);
        dedup
    }

    /// Testing only: `--test-crash-before-store` (the process aborts after the `n`th commit
    /// with changes for the local store, before writing them) and `--test-restore-pace`.
    pub fn testing(&mut self, test: &crate::config::TestSwitches) {
        self.crash_before_store = test.crash_before_store;
        self.restore_pace = test.restore_pace;
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
        let (p, pace) = (tp.1, self.restore_pace);
        loop {
            let (seen, mut delta, mut skipped) = (&mut self.seen, Batch::default(), 0u64);
            let mut last = None;
            let read = self.source.read(p, from, &mut |offset, k, v| {
                if let Some(pace) = pace {
                    std::thread::sleep(pace);
                }
                last = Some(offset);
                match changelog::decode(k, v) {
                    Ok(change) => {
                        match &change {
                            Change::Key { window, key } => {
                                delta.keys.push((p, *window, key.clone()))
                            }
                            Change::StreamTime(t) => delta.stream_times.push((p, *t)),
                            Change::Total { .. } => delta.totals.push((p, change.clone())),
                        }
                        seen.restore(tp, change)
                    }
                    Err(why) => {
                        if skipped == 0 {
                            warn!(
                                partition = p,
                                why, "a changelog record that is no state change; skipped"
                            );
                        }
                        skipped += 1;
                    }
                }
            });
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

    fn gauges(&self) {
        self.metrics.state_keys.set(self.seen.keys() as i64);
        (self.metrics.state_window_keys_max).set(self.seen.fullest_window() as i64);
        self.metrics
            .state_windows
            .set(self.seen.open_windows() as i64);
    }

    /// The record's key: the Kafka key, or `--window-key`'s (a string's text, else JSON text).
    fn key_of<'a>(&self, input: &InputRecord<'a>) -> Result<Cow<'a, [u8]>, TransformError> {
        let Some(program) = &self.key else {
            return input.key.map(Cow::Borrowed).ok_or_else(|| {
                bad("no Kafka key to deduplicate by (--window-key reads one from the value)")
            });
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--window-key yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Null) => Err(bad("--window-key yields null")),
            Ok(serde_json::Value::String(s)) => Ok(Cow::Owned(s.into_bytes())),
            _ => Ok(Cow::Owned(json)),
        }
    }

    /// The record's event time in ms: its timestamp, or `--window-time`'s (milliseconds since
    /// the epoch, or an RFC 3339 string).
    fn time_of(&self, input: &InputRecord<'_>) -> Result<i64, TransformError> {
        let Some(program) = &self.time else {
            return input
                .timestamp
                .ok_or_else(|| bad("the record has no timestamp (--window-time reads one)"));
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--window-time yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Number(n)) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.is_finite())
                        .map(|f| f.floor() as i64)
                })
                .ok_or_else(|| bad(format!("--window-time yields {n}, not a time"))),
            Ok(serde_json::Value::String(s)) => s
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_millisecond())
                .map_err(|e| bad(format!("--window-time yields \"{s}\": {e}"))),
            _ => Err(bad(format!(
                "--window-time yields {}, not milliseconds or an RFC 3339 time",
                String::from_utf8_lossy(&json)
            ))),
        }
    }

    /// An event time too far ahead, of the record's own timestamp (with `--window-time`) or of
    /// this host's clock, is the record's fault: one wrong clock must not move the stream time
    /// and make every later record late (the changelog would keep it so across restarts).
    fn not_ahead(&self, input: &InputRecord<'_>, t: i64) -> Result<(), TransformError> {
        let too_far = |from: i64, of: &str| {
            bad(format!(
                "event time {t} ms is {} s {of}, more than --window-max-ahead",
                (t - from) / 1000
            ))
        };
        if let Some(ts) = input.timestamp.filter(|_| self.time.is_some())
            && t > ts.saturating_add(self.max_ahead)
        {
            return Err(too_far(ts, "ahead of the record's timestamp"));
        }
        let now = crate::clock::wall_ms();
        if t > now.saturating_add(self.max_ahead) {
            return Err(too_far(now, AHEAD_OF_CLOCK));
        }
        Ok(())
    }

    /// What the record becomes when it goes on, in `window`.
    fn output<'a>(
        &self,
        input: &InputRecord<'a>,
        window: &Window,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        match &self.then {
            Some(jq) => {
                let label = self.seen.windows().label(window);
                jq.apply_in(input, Some(&label))
            }
            None => Ok(vec![OutputRecord {
                topic: None,
                partition: None,
                key: input.key.map(Cow::Borrowed),
                value: input.value.map(Cow::Borrowed),
                headers: OutputHeaders::Input,
            }]),
        }
    }

    /// `change` as a record to the changelog partition `partition`.
    fn record(&self, partition: i32, change: &Change) -> OutputRecord<'static> {
        let (key, value) = changelog::encode(change);
        OutputRecord {
            topic: Some(self.topic.clone()),
            partition: Some(partition),
            key: Some(Cow::Owned(key)),
            value: Some(Cow::Owned(value)),
            headers: OutputHeaders::Set(Vec::new()),
        }
    }

    /// A record for `group` at event time `t` in `window`, aggregated: its group's new totals
    /// (`updates`) or the totals of every window it closes (`final`) are its outputs. The
    /// state changes only once its outputs went out ([`Effect::Add`]).
    fn aggregate<'a>(
        &mut self,
        input: &InputRecord<'a>,
        tp: &Tp,
        group: &[u8],
        t: i64,
        window: Window,
    ) -> Result<Vec<OutputRecord<'a>>, Failure> {
        let Some(agg) = &self.aggregate else {
            return Ok(Vec::new());
        };
        let number = agg.sum.as_ref().map(|p| number_of(p, input)).transpose()?;
        let value = (agg.distinct.as_ref())
            .map(|p| distinct_of(p, input))
            .transpose()?;
        let escaped = serde_json::to_string(&String::from_utf8_lossy(group)).map_or(0, |g| g.len());
        // --max-output-bytes is the longest key's limit plus its changelog record's 18 bytes.
        let max_output = self.max_key.saturating_add(18);
        if escaped.saturating_mul(2).saturating_add(TOTALS_OVERHEAD) > max_output {
            return Err(bad(format!(
                "a group of {} bytes: its totals would be over --max-output-bytes",
                group.len()
            ))
            .into());
        }
        let distinct = value.flatten().map(|v| distinct_key(group, &v));
        if let Some(k) = distinct.as_ref().filter(|k| k.len() > self.max_key) {
            return Err(bad(format!(
                "a group and distinct value of {} bytes: their changelog record would be over \
                 --max-output-bytes",
                k.len()
            ))
            .into());
        }
        let adds = Adds {
            number: number.flatten(),
            distinct: distinct.as_deref(),
        };
        match self.seen.admit(tp, &window, group, adds) {
            Verdict::Late => {
                self.verdict("late");
                match self.late {
                    Late::Drop => Ok(Vec::new()),
                    // --window-late pass is refused with --aggregate.
                    Late::Dlq | Late::Pass => Err(self.late_record(&window)),
                }
            }
            Verdict::Full => {
                self.verdict("full");
                Err(self.full(&window, input.partition))
            }
            Verdict::First | Verdict::Duplicate => {
                let outputs = if agg.emit == Emit::Final {
                    self.closing(input, tp, t)
                } else {
                    let acc = self.seen.peek(tp, &window, group, adds);
                    self.total_output(input, &window, group, &acc)?
                };
                self.verdict("aggregated");
                let (group, number) = (group.into(), adds.number);
                let change = Effect::Add {
                    window,
                    group,
                    number,
                    distinct,
                };
                self.step = Some(Step {
                    tp: tp.clone(),
                    t,
                    change,
                });
                Ok(outputs)
            }
        }
    }

    /// The totals of every window of `tp` a record at `t` closes, as the records to write. A
    /// window closes whatever its outputs: one the program fails for goes out as the plain
    /// totals with the failure's reason headers (the closing record is not to blame, and would
    /// close it again and again).
    fn closing(&self, input: &InputRecord<'_>, tp: &Tp, t: i64) -> Vec<OutputRecord<'static>> {
        let mut outputs = Vec::new();
        for (w, totals) in self.seen.closing(tp, t) {
            for (g, acc) in totals {
                match self.total_output(input, &w, &g, &acc) {
                    Ok(out) => outputs.extend(out),
                    Err(e) => outputs.push(self.failed_total(&w, &g, &acc, &e)),
                }
            }
        }
        outputs
    }

    /// `group`'s totals `acc` in `window` as the records to write: key
    /// `["<window>", "<group>"]`, value the totals, through `--jq` if given (which sees them
    /// as `.` and the window's label as `$window`).
    fn total_output(
        &self,
        input: &InputRecord<'_>,
        window: &Window,
        group: &[u8],
        acc: &Acc,
    ) -> Result<Vec<OutputRecord<'static>>, TransformError> {
        let (key, value) = self.plain_total(window, group, acc)?;
        let Some(jq) = &self.then else {
            return Ok(vec![OutputRecord {
                topic: None,
                partition: None,
                key: Some(Cow::Owned(key)),
                value: Some(Cow::Owned(value)),
                headers: OutputHeaders::Set(Vec::new()),
            }]);
        };
        let totals = InputRecord {
            key: Some(&key),
            value: Some(&value),
            headers: Vec::new(),
            ..*input
        };
        let label = self.seen.windows().label(window);
        let outputs = jq.apply_in(&totals, Some(&label))?;
        Ok(outputs.into_iter().map(owned).collect())
    }

    /// The totals the program failed for (`final`), as they are, with the failure's reason
    /// and message headers.
    fn failed_total(
        &self,
        window: &Window,
        group: &[u8],
        acc: &Acc,
        e: &TransformError,
    ) -> OutputRecord<'static> {
        warn!(
            reason = e.reason.as_str(),
            error = %e.message,
            "a window's totals the --jq program failed for go out as they are"
        );
        let (key, value) = self.plain_total(window, group, acc).unwrap_or_default();
        let headers = vec![
            (
                super::ERROR_REASON.to_string(),
                Some(e.reason.as_str().into()),
            ),
            (
                super::ERROR_MESSAGE.to_string(),
                Some(e.message.clone().into_bytes()),
            ),
        ];
        OutputRecord {
            topic: None,
            partition: None,
            key: Some(Cow::Owned(key)),
            value: Some(Cow::Owned(value)),
            headers: OutputHeaders::Set(headers),
        }
    }

    /// `group`'s totals `acc` in `window` as JSON key and value.
    fn plain_total(
        &self,
        window: &Window,
        group: &[u8],
        acc: &Acc,
    ) -> Result<(Vec<u8>, Vec<u8>), TransformError> {
        let Some(agg) = &self.aggregate else {
            return Ok(Default::default());
        };
        let label = self.seen.windows().label(window);
        let group = String::from_utf8_lossy(group);
        let mut value = serde_json::Map::new();
        value.insert("window".into(), label.as_str().into());
        value.insert("start".into(), window.start.into());
        value.insert("end".into(), window.end.into());
        value.insert("group".into(), group.as_ref().into());
        if agg.count {
            value.insert("count".into(), acc.count.into());
        }
        if agg.sum.is_some() {
            let sum = match acc.sum {
                Sum::Int(i) => i.into(),
                Sum::Float(f) => {
                    serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, Into::into)
                }
            };
            value.insert("sum".into(), sum);
        }
        if agg.distinct.is_some() {
            value.insert("distinct".into(), acc.distinct.into());
        }
        let key = serde_json::to_vec(&[label.as_str(), group.as_ref()])
            .map_err(|e| bad(format!("the aggregate's key: {e}")))?;
        let value =
            serde_json::to_vec(&value).map_err(|e| bad(format!("the aggregate's value: {e}")))?;
        Ok((key, value))
    }

    fn late_record(&self, window: &Window) -> Failure {
        Failure::BadRecord(TransformError::new(
            Reason::Late,
            format!(
                "its window {} closed before it came (--window-grace)",
                self.seen.windows().label(window)
            ),
        ))
    }

    fn full(&self, window: &Window, partition: i32) -> Failure {
        Failure::BadRecord(TransformError::new(
            Reason::DedupFull,
            format!(
                "its window {} holds --window-max-keys keys already (partition {partition})",
                self.seen.windows().label(window),
            ),
        ))
    }

    fn verdict(&self, verdict: &str) {
        self.metrics
            .dedup_records
            .with_label_values(&[verdict])
            .inc();
    }
}

fn bad(message: impl Into<String>) -> TransformError {
    TransformError::new(Reason::DedupInput, message.into())
}

/// The number `program` (`--aggregate-sum`) yields for the record: `None` for null.
fn number_of(program: &Jq, input: &InputRecord<'_>) -> Result<Option<Sum>, TransformError> {
    let json = program
        .first_json(input)?
        .ok_or_else(|| bad("--aggregate-sum yields nothing"))?;
    match serde_json::from_slice::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Null) => Ok(None),
        Ok(serde_json::Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(Sum::Int(i))),
            (None, Some(f)) if f.is_finite() => Ok(Some(Sum::Float(f))),
            _ => Err(bad(format!(
                "--aggregate-sum yields {n}, not a finite number"
            ))),
        },
        _ => Err(bad(format!(
            "--aggregate-sum yields {}, not a number",
            String::from_utf8_lossy(&json)
        ))),
    }
}

/// The value `program` (`--aggregate-distinct`) yields for the record, as bytes (a string's
/// text, else its JSON text): `None` for null.
fn distinct_of(program: &Jq, input: &InputRecord<'_>) -> Result<Option<Vec<u8>>, TransformError> {
    let json = program
        .first_json(input)?
        .ok_or_else(|| bad("--aggregate-distinct yields nothing"))?;
    match serde_json::from_slice::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Null) => Ok(None),
        Ok(serde_json::Value::String(s)) => Ok(Some(s.into_bytes())),
        _ => Ok(Some(json)),
    }
}

/// `o` with its bytes its own.
fn owned(o: OutputRecord<'_>) -> OutputRecord<'static> {
    OutputRecord {
        topic: o.topic,
        partition: o.partition,
        key: o.key.map(|k| Cow::Owned(k.into_owned())),
        value: o.value.map(|v| Cow::Owned(v.into_owned())),
        headers: o.headers,
    }
}

impl Transform for Dedup {
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        // Nothing of a record whose fate was not told stays (the writer tells every one).
        self.step = None;
        let tp = (input.topic.to_string(), input.partition);
        if self.unrestored.contains(&tp) {
            self.restore(&tp).map_err(|e| match e {
                Unrestored::Later(why) => Failure::Unavailable(why),
                Unrestored::Homeless(why) => {
                    // Held, not restoring: exactly_state_partitions_held counts it.
                    self.waiting.remove(&tp);
                    self.restoring_gauge();
                    Failure::Held(why)
                }
            })?;
        }
        let key = self.key_of(input)?;
        let t = self.time_of(input)?;
        self.not_ahead(input, t)?;
        let window = (self.seen.windows().of(t))
            .ok_or_else(|| bad(format!("event time {t} ms is outside years -9999 to 9999")))?;
        if key.len() > self.max_key {
            return Err(bad(format!(
                "a key of {} bytes: its changelog record would be over --max-output-bytes",
                key.len()
            ))
            .into());
        }
        if self.aggregate.is_some() {
            return self.aggregate(input, &tp, &key, t, window);
        }
        let verdict = self.seen.decide(&tp, &window, &key);
        match verdict {
            Verdict::Duplicate => {
                self.verdict("duplicate");
                // A record dropped moves the stream time (a late one is behind it already).
                self.step = Some(Step {
                    tp,
                    t,
                    change: Effect::Nothing,
                });
                Ok(Vec::new())
            }
            Verdict::Late => {
                self.verdict("late");
                match self.late {
                    Late::Drop => Ok(Vec::new()),
                    Late::Pass => Ok(self.output(input, &window)?),
                    Late::Dlq => Err(self.late_record(&window)),
                }
            }
            Verdict::Full => {
                self.verdict("full");
                Err(self.full(&window, input.partition))
            }
            Verdict::First => {
                self.verdict("first");
                let outputs = self.output(input, &window)?;
                self.step = Some(Step {
                    tp,
                    t,
                    change: Effect::Key(window, key.into()),
                });
                Ok(outputs)
            }
        }
    }

    fn decided(&mut self, fate: Fate) {
        let Some(Step { tp, t, change }) = self.step.take() else {
            return;
        };
        if fate == Fate::Refused {
            return;
        }
        self.seen.advance(&tp, t);
        match change {
            Effect::Nothing => {}
            Effect::Key(window, key) => {
                let change = self.seen.remember(&tp, window, &key);
                self.pending.push((tp.1, change));
            }
            Effect::Add {
                window,
                group,
                number,
                distinct,
            } => {
                let adds = Adds {
                    number,
                    distinct: distinct.as_deref(),
                };
                let (_, change) = self.seen.add(&tp, window, &group, adds);
                self.pending.extend(change.map(|c| (tp.1, c)));
            }
        }
    }

    /// Restored at their first record, not now: by then the consumer has fetched their
    /// committed offsets, which waits for a previous owner's transaction that holds offsets
    /// for them to end (KIP-447, `read_committed`), so the changelog's end taken then is past
    /// everything that transaction wrote (the commit sends its offsets only once every record
    /// is acknowledged: `sink::exactly_once::commit`).
    fn assigned(&mut self, partitions: &[Tp]) {
        for tp in partitions {
            self.owned.insert(tp.clone());
            self.unrestored.insert(tp.clone());
        }
    }

    fn revoked(&mut self, partitions: &[Tp]) {
        // No mark is taken now: another member may own them already (a loss, or a rebalance
        // heard a turn late); the store keeps what it has for when they come back.
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

    fn committed(&mut self) {
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
        if let Some(n) = &mut self.crash_before_store
            && !(batch.keys.is_empty() && batch.totals.is_empty() && batch.stream_times.is_empty())
        {
            *n -= 1;
            if *n == 0 {
                error!("test: crashing after a commit, before its local store write");
                std::process::abort();
            }
        }
        self.write(&batch);
        self.gauges();
    }

    fn dropped(&mut self, known: bool) {
        self.step = None;
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
            // The open unit's changes may have committed: only the changelogs can tell.
            warn!("a commit's outcome is unknown: the dedup state is read back from its changelog");
            self.unrestored.extend(self.owned.iter().cloned());
            for tp in self.owned.clone() {
                self.seen.revoked(&tp);
            }
        }
    }

    fn before_commit(&mut self) -> Vec<OutputRecord<'static>> {
        if self.sent == 0 {
            self.checkpoint();
        }
        let times = self.seen.stream_times();
        self.pending
            .extend(times.into_iter().map(|(tp, change)| (tp.1, change)));
        // Like the stream times, all of them each time: compaction and a restore keep the last.
        if self.aggregate.is_some() {
            let totals = self.seen.totals();
            self.pending
                .extend(totals.into_iter().map(|(tp, change)| (tp.1, change)));
        }
        let out = (self.pending[self.sent..].iter())
            .map(|(p, change)| self.record(*p, change))
            .collect();
        self.sent = self.pending.len();
        out
    }
}

/// The programs of `config` compiled, and the transform of the first of each key (`--jq`, or
/// none: the record as it is). A program that does not compile names its flag.
pub fn programs(
    config: &DedupConfig,
    transform: &crate::config::TransformConfig,
) -> Result<[Option<Jq>; 5], crate::error::Error> {
    let limits = super::Limits::of(transform);
    let aggregate = config.aggregate.as_ref();
    let compile = |flag: &str, code: &Option<String>, envelope: bool| {
        code.as_deref()
            .map(|code| Jq::compile(code, envelope, limits))
            .transpose()
            .map_err(|e| crate::error::Error::Config(format!("{flag}: {e}")))
    };
    let then = match &transform.spec {
        crate::config::TransformSpec::Jq { program, envelope } => {
            compile("--jq", &Some(program.clone()), *envelope)?
        }
        _ => None,
    };
    Ok([
        compile("--window-key", &config.key, false)?,
        compile("--window-time", &config.time, false)?,
        then,
        compile(
            "--aggregate-sum",
            &aggregate.and_then(|a| a.sum.clone()),
            false,
        )?,
        compile(
            "--aggregate-distinct",
            &aggregate.and_then(|a| a.distinct.clone()),
            false,
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::state::restore::{Each, Read};
    use crate::state::store::Redb;
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
        assert_eq!(d.seen.stream_time(&("in".into(), 0)), Some(HOUR));
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
        late.restoring = RESTORE_BUDGET;
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
        d.checkpoint_every = Duration::ZERO;
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
        d.checkpoint_every = Duration::ZERO;
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
    fn totals(
        d: &mut Dedup,
        key: &'static str,
        t: i64,
        value: &'static str,
    ) -> Vec<serde_json::Value> {
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
        d.seen = Seen::new(d.seen.windows().clone()).capped(3);
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
        let a: serde_json::Value =
            serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(a, serde_json::json!({"g": "a", "c": 1, "w": "1970-01-01"}));
        let b: serde_json::Value =
            serde_json::from_slice(out[1].value.as_deref().unwrap()).unwrap();
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
        d.checkpoint_every = Duration::ZERO;
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
}

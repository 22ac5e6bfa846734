//! The database sink: outputs become rows of a PostgreSQL, MySQL or MariaDB table, and the
//! group's offsets live in the same database, moved in the transaction that writes the rows
//! (docs/database.md). What differs between the databases is behind [`db::Session`].
//!
//! A unit's rows wait in memory until its commit, which is one database transaction: the
//! rows, the dead-letter copies, then each partition's offset moved by compare-and-set on (the
//! offset this instance last wrote, its claim's epoch). A partition is claimed when it is
//! assigned ([`Sink::claim`]): its epoch goes up, which fences whoever had it, and the
//! consumer starts at the table's offset. So the table decides, never the Kafka group: an
//! instance that lost a partition without hearing it (paused, partitioned from the broker)
//! finds its compare-and-set changes no row, and rolls back. After the commit the offsets are
//! copied to the Kafka group, for the lag tools.
//!
//! The database tells what a commit did even when its answer is lost: [`Sink::committed`]
//! reads the offsets table, which is what the driver's rewind and its unknown-outcome
//! resolution ask.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::{
    Bounds, Committed, Content, Destination, Failed, Feedback, Group, NotConnected, Record,
    Rejection, Reply, Sink, Starts, Unreadable, Wait,
};
use crate::config::db::DbConfig;
use crate::db::{
    self, Advance, DeadLetter, Failure, Kind, NotOpen, Session, Step, Unwritten, Write,
};
use crate::error::Error;
use crate::events::{AbortReason, DatabaseCommitted, DatabaseFailed, PartitionsFenced, RowRefused};
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::records::Outgoing;
use crate::transform::{Reason, Refuser};

/// The database, refusing rows for what they hold (a constraint, a type).
pub static DATABASE: Refuser = Refuser {
    reason: "rejected_by_database",
    header: crate::headers::ERROR_DATABASE,
    who: "the database",
    refused: "the database refused a record's row; its replay sends the dead-letter copy",
    replaced: "database connection replaced",
    dead_letter: "record to the dead-letter table",
};

/// A partition this instance claimed: the offset it last wrote there, its epoch, and the
/// offset the Kafka group is known to hold (its copy, for the lag tools).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    next: Option<i64>,
    epoch: i64,
    copied: Option<i64>,
}

/// The longest read of what the Kafka group holds, for its copy.
const COPY_READ: Duration = Duration::from_secs(1);

/// An output with `--db-envelope`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(default, borrow)]
    table: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    op: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    row: &'a serde_json::value::RawValue,
}

/// The database sink.
pub struct Database {
    config: DbConfig,
    /// What to open.
    target: db::Target,
    /// The names records are addressed to: rows, and dead-letter copies.
    output: String,
    dlq: String,
    /// `None` until connected, and after the connection was lost.
    db: Option<Box<dyn Session>>,
    /// The rows' tables as the catalog described them at the last connect (an envelope's
    /// row is judged by them as it is sent).
    tables: Vec<db::Described>,
    /// The open unit: its rows in the order sent (with their send's index), each one's table
    /// (an index into the configured tables) and operation, dead-letter copies, and the sends
    /// refused before any reached the database.
    rows: Vec<(usize, String)>,
    ops: Vec<(usize, Write)>,
    copies: Vec<DeadLetter>,
    rejections: Vec<Rejection>,
    /// The partitions claimed, by the offsets table's answer. Behind a lock because reading
    /// the committed offsets (`&self`) refreshes them.
    claims: Mutex<HashMap<Tp, Claim>>,
    /// Deferred constraints are checked at each statement (a COMMIT was refused for them).
    immediate: bool,
    metrics: Arc<Metrics>,
    /// How often, at most, the group's copy of the offsets is checked, and when it was.
    copy_every: Duration,
    copy_checked: std::time::Instant,
}

impl Database {
    /// The open unit's rows, their operations (one each, in step) and dead-letter copies are
    /// dropped; its refusals stay for the driver to learn (it asks after an abort).
    fn clear_unit(&mut self) {
        self.rows.clear();
        self.ops.clear();
        self.copies.clear();
    }

    /// Not connected yet. `output`: the name outputs are addressed to.
    pub fn new(
        config: &DbConfig,
        sink: &crate::config::SinkConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Database, Error> {
        Ok(Database {
            metrics,
            config: config.clone(),
            target: config.target(),
            output: sink.output_topic.clone(),
            copy_every: sink.commit_interval.max(Duration::from_secs(1)),
            copy_checked: std::time::Instant::now(),
            dlq: config.dlq_topic.clone(),
            db: None,
            tables: Vec::new(),
            rows: Vec::new(),
            ops: Vec::new(),
            copies: Vec::new(),
            rejections: Vec::new(),
            claims: Mutex::new(HashMap::new()),
            immediate: false,
        })
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<Tp, Claim>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection, checked: the tables there, the rows' table as the catalog has it.
    fn open(&self) -> Result<Box<dyn Session>, NotConnected> {
        db::open(&self.target).map_err(|NotOpen { step, failure }| {
            if step == Step::Connect && !matches!(failure.kind, Kind::Setup | Kind::Refused) {
                DatabaseFailed {
                    kind: "unreachable",
                    doing: "connecting",
                    code: failure.code.as_deref(),
                    error: &failure,
                }
                .emit(&self.metrics);
            }
            let flag = match step {
                Step::Connect => "--db-url",
                Step::Offsets => "--db-offsets-table",
                Step::Dead => "--db-dlq-table",
                Step::Rows => "--db-table",
            };
            let why = format!("{flag}: {failure}");
            match failure.kind {
                // A password or a database name only a person can mend; at start, it stops
                // exactly; once running, a rotation may be under way.
                Kind::Refused if step == Step::Connect => NotConnected::Refused(why),
                Kind::Refused | Kind::Setup => NotConnected::Exit(Error::Config(why)),
                _ => NotConnected::Retry(why),
            }
        })
    }

    /// Connects again if the connection was lost.
    fn ensure(&mut self) -> Result<(), Failed> {
        if self.db.as_ref().is_some_and(|db| db.usable()) {
            return Ok(());
        }
        self.db = None;
        match self.open() {
            Ok(db) => {
                self.tables = db.tables().to_vec();
                self.db = Some(db);
                Ok(())
            }
            Err(NotConnected::Exit(e)) => Err(Failed::Exit(e)),
            Err(NotConnected::Retry(why) | NotConnected::Refused(why)) => {
                warn!(error = %why, "the database is unreachable");
                Err(Failed::Recreate(AbortReason::DatabaseUnavailable))
            }
        }
    }

    /// The connection (after [`Database::ensure`]).
    fn connected(&self) -> Result<&dyn Session, Failed> {
        self.db
            .as_deref()
            .ok_or(Failed::Recreate(AbortReason::DatabaseUnavailable))
    }

    /// Ends the open transaction, if the connection still stands.
    fn rollback(&mut self) {
        if let Some(db) = &self.db
            && let Err(e) = db.rollback()
            && e.closed
        {
            self.db = None;
        }
    }

    /// What a failed statement of the open transaction asks for, once it is rolled back: a
    /// lost connection a new one; a conflict (class 40) or another failure an abort and
    /// replay; a permission or a table missing, the process to stop.
    fn failed(&mut self, f: Failure, doing: &str) -> Failed {
        if f.closed {
            self.db = None;
        } else {
            self.rollback();
        }
        let (kind, failed) = match f.kind {
            _ if f.closed => ("lost", Failed::Recreate(AbortReason::DatabaseUnavailable)),
            Kind::Setup | Kind::Refused => (
                "setup",
                Failed::Exit(Error::Config(format!("--db-url: {doing}: {f}"))),
            ),
            Kind::Conflict => ("conflict", Failed::Abort(AbortReason::DatabaseConflict)),
            Kind::Data(_) | Kind::Other => ("other", Failed::Abort(AbortReason::DatabaseFailed)),
        };
        let code = f.code.as_deref();
        DatabaseFailed {
            kind,
            doing,
            code,
            error: &f,
        }
        .emit(&self.metrics);
        failed
    }

    /// The moves of `offsets`, by topic, from this instance's claims; `Err`: a partition it
    /// has no claim on.
    fn moves(&self, offsets: &[(Tp, i64)]) -> Result<BTreeMap<String, Vec<Advance>>, Tp> {
        let claims = self.claims();
        let mut moves: BTreeMap<String, Vec<Advance>> = BTreeMap::new();
        for (tp, to) in offsets {
            let claim = claims.get(tp).ok_or_else(|| tp.clone())?;
            moves.entry(tp.0.clone()).or_default().push(Advance {
                partition: tp.1,
                from: claim.next,
                to: *to,
                epoch: claim.epoch,
            });
        }
        Ok(moves)
    }

    /// What output `out` changes: its table and operation (the configured ones, or its
    /// envelope's), and its row; `Err`: why it is no change, the record's fault.
    fn change(&self, out: &Outgoing<'_>) -> Result<((usize, Write), String), &'static str> {
        let value = out.value.as_deref().unwrap_or_default();
        let (table, how, row) = if self.config.envelope {
            let e: Envelope<'_> = serde_json::from_slice(value).map_err(|_| "BAD_ENVELOPE")?;
            let table = match e.table.as_deref() {
                None => 0,
                Some(name) => (self.config.tables.iter())
                    .position(|t| t == name)
                    .ok_or("NOT_A_TABLE")?,
            };
            let how = match e.op.as_deref() {
                None => self.target.write,
                Some(op) => Write::of(op).ok_or("BAD_ENVELOPE")?,
            };
            (table, how, e.row.get().as_bytes())
        } else {
            (0, self.target.write, value)
        };
        if how != Write::Insert && self.tables.get(table).is_some_and(|t| t.key.is_empty()) {
            return Err("NO_PRIMARY_KEY");
        }
        let lineage = match how {
            Write::Delete => None,
            _ => (self.config.lineage_column.as_deref()).map(|c| (c, out.lineage.as_deref())),
        };
        let row = db::row_text(row, lineage).ok_or("NOT_A_JSON_OBJECT")?;
        Ok(((table, how), row))
    }

    /// Brings the Kafka group's copy of the table's offsets up to date, at most once per
    /// `copy_every` (`now`: whenever): what the group holds for the partitions claimed and
    /// still assigned (another owner copies the others) is read back, and whatever it lacks
    /// is sent again; `sent` were sent just now. A commit's copy goes at once, but one that did
    /// not land (a rebalance refuses the old generation's) would leave the group behind for
    /// good once the input stops: kafka-consumer-groups, kafka_exporter, Burrow and KEDA would
    /// show a lag that never clears.
    fn copy_owed(&mut self, group: &dyn Group, now: bool, sent: &[(Tp, i64)]) {
        if !now && self.copy_checked.elapsed() < self.copy_every {
            return;
        }
        self.copy_checked = std::time::Instant::now();
        let assigned = group.assignment().unwrap_or_default();
        let owed: Vec<(Tp, i64)> = (self.claims().iter())
            .filter(|(tp, _)| assigned.contains(tp) && !sent.iter().any(|(s, _)| s == *tp))
            .filter_map(|(tp, c)| {
                let n = c.next?;
                (c.copied != Some(n)).then(|| (tp.clone(), n))
            })
            .collect();
        if owed.is_empty() {
            return;
        }
        let tps: Vec<Tp> = owed.iter().map(|(tp, _)| tp.clone()).collect();
        let held = group.committed(&tps, COPY_READ).unwrap_or_default();
        let mut again = Vec::new();
        for (tp, n) in owed {
            if held.contains(&(tp.clone(), Some(n))) {
                if let Some(c) = self.claims().get_mut(&tp) {
                    c.copied = Some(n);
                }
            } else {
                again.push((tp, n));
            }
        }
        if !again.is_empty()
            && let Err(e) = group.copy_offsets(&again)
        {
            warn!(error = %e, partitions = again.len(), "copying the offsets to the Kafka group failed; it is tried again");
        }
    }

    /// A round trip on a connection idle for half the server's bound on an idle session
    /// (MySQL's `wait_timeout`), so that it stays open; one that does not answer is opened again
    /// before its next use. Between units, and before a unit's transaction: nothing goes to the
    /// database before a commit, and a unit may be open longer than the bound.
    fn keepalive(&mut self) {
        let Some(db) = &self.db else {
            return;
        };
        if let Err(f) = db.keepalive() {
            info!(error = %f, "the database connection did not answer while idle; it is opened again before its next use");
            self.db = None;
        }
    }

    /// The database refused `refused` of the unit's `rows` (each one's table by `ops`): each
    /// is said, with its table and place, and becomes a rejection of the record it came from.
    fn refused(
        &mut self,
        refused: &[(usize, Failure)],
        rows: &[(usize, String)],
        ops: &[(usize, Write)],
    ) {
        for (index, f) in refused {
            let position = rows.iter().position(|(i, _)| i == index);
            let table = (position.and_then(|k| self.config.tables.get(ops[k].0)))
                .map_or("", String::as_str);
            RowRefused {
                table,
                position,
                rows: rows.len(),
                code: f.code.as_deref(),
                error: f,
            }
            .emit(&self.metrics);
        }
        self.rejections
            .extend(refused.iter().map(|(index, f)| Rejection {
                index: *index,
                error: match f.kind {
                    Kind::Data(name) => name,
                    _ => "DATA_EXCEPTION",
                },
                named: true,
                alone: true,
            }));
    }

    /// The open unit's rows, copies and offsets, in one transaction, committed.
    fn write(&mut self, moves: &BTreeMap<String, Vec<Advance>>) -> Result<(), Failed> {
        let (rows, ops, copies) = (
            std::mem::take(&mut self.rows),
            std::mem::take(&mut self.ops),
            std::mem::take(&mut self.copies),
        );
        self.keepalive();
        self.ensure()?;
        let db = self.connected()?;
        let began = std::time::Instant::now();
        // After a COMMIT refused for its data (a deferred constraint), constraints are
        // checked at each statement, so the search for the rows at fault finds the row.
        if let Err(f) = db.begin(self.immediate) {
            return Err(self.failed(f, "beginning"));
        }
        match write_changes(db, &rows, &ops) {
            Ok(()) => {}
            Err(Unwritten::Rows(refused)) => {
                self.refused(&refused, &rows, &ops);
                self.rollback();
                return Err(Failed::Abort(AbortReason::RecordRejected));
            }
            Err(Unwritten::Batch(f)) => return Err(self.failed(f, "writing rows")),
        }
        if let Err(f) = db.write_dead(&copies) {
            return Err(self.failed(f, "writing dead-letter copies"));
        }
        for (topic, moves) in moves {
            match db.advance(topic, moves) {
                Ok(fenced) if fenced.is_empty() => {}
                Ok(fenced) => {
                    // Whose they are now the rewind's read of the table tells: a row of
                    // another epoch is another owner's (the claim goes, the partition is
                    // paused when its records come again), a row of ours moved under a
                    // commit whose answer came late (the claim takes its offset).
                    self.rollback();
                    let partitions = &fenced;
                    PartitionsFenced { topic, partitions }.emit(&self.metrics);
                    return Err(Failed::Abort(AbortReason::PartitionClaimed));
                }
                Err(f) => return Err(self.failed(f, "moving offsets")),
            }
        }
        match db.commit() {
            Ok(()) if crate::switches::lose_db_answer() => {
                warn!("--test-lose-db-commit-answers: the COMMIT's answer is lost");
                self.db = None;
                Err(Failed::unknown())
            }
            Ok(()) => {
                let (rows, took) = (rows.len() as u64, began.elapsed());
                DatabaseCommitted { rows, took }.emit(&self.metrics);
                Ok(())
            }
            Err(f) if f.closed => {
                // The offsets table tells whether it committed.
                let (doing, code) = ("committing", f.code.as_deref());
                let (kind, error) = ("lost", &f);
                DatabaseFailed {
                    kind,
                    doing,
                    code,
                    error,
                }
                .emit(&self.metrics);
                self.db = None;
                Err(Failed::unknown())
            }
            Err(f) if f.is_data() && !self.immediate => {
                warn!(error = %f, "the COMMIT was refused for its data (a deferred constraint); \
                                   checking constraints at each statement from now on");
                self.immediate = true;
                Err(Failed::Abort(AbortReason::DatabaseFailed))
            }
            Err(f) => Err(self.failed(f, "committing")),
        }
    }
}

impl Database {
    /// The unit's rows and `offsets` in one database transaction.
    fn commit_unit(
        &mut self,
        offsets: &[(Tp, i64)],
        group: &dyn Group,
        bounds: &Bounds,
    ) -> Result<(), Failed> {
        if !self.rejections.is_empty() {
            return Err(Failed::Abort(AbortReason::RecordRejected));
        }
        let moves = match self.moves(offsets) {
            Ok(moves) => moves,
            Err(tp) => {
                // The table said another instance claimed it (the claim went when the rewind
                // read it): fenced before any statement.
                let (topic, partitions) = (tp.0.as_str(), &[tp.1][..]);
                PartitionsFenced { topic, partitions }.emit(&self.metrics);
                let _ = group.pause(std::slice::from_ref(&tp));
                return Err(Failed::Abort(AbortReason::PartitionClaimed));
            }
        };
        let written = {
            let _g = bounds.health.in_call("database commit");
            self.write(&moves)
        };
        written?;
        {
            let mut claims = self.claims();
            for (tp, to) in offsets {
                if let Some(c) = claims.get_mut(tp) {
                    c.next = Some(*to);
                }
            }
        }
        crate::switches::crash_point(crate::switches::Crash::AfterDbCommit);
        // For the lag tools; the table is what counts. What did not land goes again.
        if let Err(e) = group.copy_offsets(offsets) {
            warn!(error = %e, "copying the offsets to the Kafka group failed; it is tried again");
        }
        self.copy_owed(group, false, offsets);
        Ok(())
    }
}

impl Sink for Database {
    fn connect(&mut self, _bounds: &Bounds) -> Result<(), NotConnected> {
        self.db = None;
        let db = self.open()?;
        info!(tables = ?self.config.tables, offsets = %self.config.offsets_table, "connected to the database");
        self.tables = db.tables().to_vec();
        self.db = Some(db);
        Ok(())
    }

    fn begin(&mut self, _watch: bool, _bounds: &Bounds) -> Result<(), Failed> {
        // The database transaction is the commit's: nothing stays open between records.
        self.clear_unit();
        self.rejections.clear();
        Ok(())
    }

    fn send(&mut self, record: Record<'_, '_>, _bounds: &Bounds) -> Result<(), Failed> {
        let Record {
            topic,
            out,
            index,
            kind,
            ..
        } = record;
        if let Content::DeadLetter(reason) = kind {
            self.copies.push(dead_letter(out, reason));
            return Ok(());
        }
        if topic != self.output {
            return Err(Failed::Unroutable {
                topic: topic.to_string(),
                error: "NOT_THE_TABLE",
            });
        }
        match self.change(out) {
            Ok((op, row)) => {
                self.ops.push(op);
                self.rows.push((index, row));
            }
            Err(error) => self.rejections.push(Rejection {
                index,
                error,
                named: true,
                alone: true,
            }),
        }
        Ok(())
    }

    /// Nothing is in flight: every row was written or refused as it was sent.
    fn hear(&mut self, _wait: Wait, _bounds: &Bounds) -> Feedback {
        Feedback {
            refused: std::mem::take(&mut self.rejections),
            settled: true,
            ..Feedback::default()
        }
    }

    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, bounds: &Bounds) -> Reply {
        let result = self.commit_unit(offsets, group, bounds);
        Reply {
            result,
            feedback: self.hear(Wait::Now, bounds),
        }
    }

    fn abort(&mut self, _reason: AbortReason, bounds: &Bounds) -> Reply {
        // Nothing is open in the database between commits; a lost connection is replaced
        // here, so the rewind can read the offsets.
        self.clear_unit();
        let result = self.ensure();
        Reply {
            result,
            feedback: self.hear(Wait::Now, bounds),
        }
    }

    fn committed(
        &self,
        _group: &dyn Group,
        partitions: &[Tp],
        _timeout: Duration,
    ) -> Result<Committed, Unreadable> {
        let Some(db) = &self.db else {
            return Err(Unreadable::Retry("not connected to the database".into()));
        };
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            by_topic.entry(t).or_default().push(*p);
        }
        let mut rows = HashMap::new();
        for (topic, ps) in by_topic {
            let read = db.read(topic, &ps);
            let read = read.map_err(|f| Unreadable::Retry(format!("the offsets table: {f}")))?;
            rows.extend(
                read.into_iter()
                    .map(|c| ((topic.to_string(), c.partition), c)),
            );
        }
        // The table is the truth: a claim of ours takes its offset (a commit whose answer was
        // lost may have moved it), a partition claimed by another is not ours any more.
        let mut claims = self.claims();
        claims.retain(|tp, claim| match rows.get(tp) {
            Some(row) if row.epoch == claim.epoch => {
                claim.next = row.next;
                true
            }
            Some(_) => false,
            None => !partitions.contains(tp),
        });
        Ok(partitions
            .iter()
            .map(|tp| (tp.clone(), rows.get(tp).and_then(|c| c.next)))
            .collect())
    }

    fn idle(&mut self, group: &dyn Group, last: bool) {
        self.copy_owed(group, last, &[]);
        self.keepalive();
    }

    fn claim(
        &mut self,
        partitions: &[Tp],
        group: &dyn Group,
        bounds: &Bounds,
    ) -> Result<Starts, Failed> {
        let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            by_topic.entry(t.clone()).or_default().push(*p);
        }
        let mut starts = Vec::new();
        for (topic, ps) in by_topic {
            self.ensure()?;
            let db = self.connected()?;
            let there = match db.read(&topic, &ps) {
                Ok(rows) => rows,
                Err(f) => return Err(self.failed(f, "reading the offsets table")),
            };
            // A row missing is seeded from the group's Kafka offset: a Kafka→Kafka group
            // moves over without replay.
            let missing: Vec<Tp> = (ps.iter())
                .filter(|p| !there.iter().any(|c| c.partition == **p))
                .map(|p| (topic.clone(), *p))
                .collect();
            let seeds = if missing.is_empty() {
                Vec::new()
            } else {
                group.committed(&missing, bounds.timeout()).map_err(|e| {
                    warn!(error = %e, "reading the group's offsets to seed the offsets table");
                    Failed::Abort(AbortReason::DatabaseFailed)
                })?
            };
            let seed = |p: i32| seeds.iter().find(|(tp, _)| tp.1 == p).and_then(|s| s.1);
            let wanted: Vec<(i32, Option<i64>)> = ps.iter().map(|p| (*p, seed(*p))).collect();
            self.ensure()?;
            let db = self.connected()?;
            let claimed = match db.claim(&topic, &wanted) {
                Ok(c) => c,
                Err(f) => return Err(self.failed(f, "claiming partitions")),
            };
            let mut claims = self.claims();
            for c in claimed {
                let tp = (topic.clone(), c.partition);
                claims.insert(
                    tp.clone(),
                    Claim {
                        next: c.next,
                        epoch: c.epoch,
                        copied: None,
                    },
                );
                starts.push((tp, c.next));
            }
        }
        info!(partitions = starts.len(), "claimed in the offsets table");
        Ok(Starts::At(starts))
    }

    /// Their claims go: a claim is this owner's epoch, and the next owner's is newer.
    fn revoked(&mut self, partitions: &[Tp]) {
        let mut claims = self.claims();
        for tp in partitions {
            claims.remove(tp);
        }
    }

    fn exists(&self, name: &str, _timeout: Duration) -> Result<bool, String> {
        Ok(name == self.output || name == self.dlq)
    }

    fn destination(&self) -> Destination {
        Destination {
            refuser: &DATABASE,
            aborted: crate::events::Ended::Aborted,
            max_record_bytes: usize::MAX,
            offsets: crate::sink::OffsetHome::WithOutputs,
        }
    }
}

/// Writes `rows` in the open transaction, in the order sent, each into the table and by the
/// operation of its `ops`: each run of one table and operation one batch (rows of one key
/// in it: the last wins; across runs, later runs after earlier ones). The rows refused, of
/// every run.
fn write_changes(
    db: &dyn Session,
    rows: &[(usize, String)],
    ops: &[(usize, Write)],
) -> Result<(), Unwritten> {
    let mut refused = Vec::new();
    let mut start = 0;
    for run in ops.chunk_by(|a, b| a == b) {
        let (table, how) = run[0];
        let end = start + run.len();
        match db.write_rows(table, how, &rows[start..end]) {
            Ok(()) => {}
            Err(Unwritten::Rows(r)) => refused.extend(r),
            Err(batch) => return Err(batch),
        }
        start = end;
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(Unwritten::Rows(refused))
}

/// Bytes as text PostgreSQL takes: invalid UTF-8 and NUL (which no text or jsonb holds)
/// replaced by U+FFFD.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}")
}

/// The dead-letter copy of `out`, there for `reason`: key and value as they are, the headers
/// in order as `[name, value]` pairs of text.
fn dead_letter(out: &Outgoing<'_>, reason: Reason) -> DeadLetter {
    let headers: Vec<serde_json::Value> = (out.headers_with_lineage())
        .map(|(name, value)| serde_json::json!([text(name), value.map(text)]))
        .collect();
    DeadLetter {
        reason: Some(reason.as_str().to_string()),
        lineage: out.lineage.clone(),
        key: out.key.as_deref().map(<[u8]>::to_vec),
        value: out.value.as_deref().map(<[u8]>::to_vec),
        headers: serde_json::Value::Array(headers).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::failure::ClientError;

    #[test]
    fn dead_letter_headers_keep_their_order_and_lose_only_what_no_text_holds() {
        use crate::headers::ERROR_REASON;
        use std::borrow::Cow::Borrowed;
        let mut headers = crate::headers::Headers::default();
        headers.push(
            Borrowed(ERROR_REASON.as_bytes()),
            Some(Borrowed(b"upstream")),
        );
        headers.push(Borrowed(b"nul"), Some(Borrowed(b"a\0b\xff")));
        headers.push(Borrowed(b"none"), None);
        headers.push(
            Borrowed(ERROR_REASON.as_bytes()),
            Some(Borrowed(b"transform_error")),
        );
        let out = Outgoing {
            topic: None,
            partition: None,
            key: None,
            value: Some(std::borrow::Cow::Borrowed(b"v")),
            headers,
            lineage: None,
        };
        let d = dead_letter(&out, Reason::JqError);
        assert_eq!(d.reason.as_deref(), Some("jq_error"));
        let parsed: serde_json::Value = serde_json::from_str(&d.headers).unwrap();
        assert_eq!(parsed[1], serde_json::json!(["nul", "a\u{FFFD}b\u{FFFD}"]));
        assert_eq!(parsed[2], serde_json::json!(["none", null]));
        assert!(!d.headers.contains("\\u0000"), "{}", d.headers);
    }

    fn sink(lineage: Option<&str>) -> Database {
        let config = DbConfig {
            backend: db::Backend::Postgres,
            url: "postgres://x@127.0.0.1:1/db".into(),
            password: None,
            tables: vec!["rows".into()],
            envelope: false,
            mode: crate::config::db::DbMode::Upsert,
            offsets_table: "exactly_offsets".into(),
            layout: db::Layout::Exactly,
            dlq_table: "rows_dlq".into(),
            lineage_column: lineage.map(str::to_string),
            statement_timeout: Duration::from_secs(1),
            group: "g".into(),
            owner: "a".into(),
            dlq_topic: "rows.dlq".into(),
        };
        let sink = crate::config::SinkConfig {
            guarantee: crate::config::Guarantee::ExactlyOnce,
            output_topic: "rows".into(),
            transactional_id: "t".into(),
            transaction_timeout: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(10),
            commit_interval: Duration::from_millis(100),
            db: None,
        };
        Database::new(&config, &sink, Arc::new(Metrics::new())).unwrap()
    }

    /// A Kafka group whose first `lose` copies never land (a rebalance refused them).
    #[derive(Default)]
    struct Losing {
        lose: std::cell::Cell<u32>,
        held: std::cell::RefCell<HashMap<Tp, i64>>,
        copies: std::cell::Cell<u32>,
    }

    impl Group for Losing {
        fn metadata(&self) -> Option<crate::kafka::member::Generation> {
            None
        }
        fn member(&self) -> Option<crate::kafka::member::Member> {
            None
        }
        fn commit_offsets(&self, _: &[(Tp, i64)]) -> Result<(), ClientError> {
            unreachable!()
        }
        fn copy_offsets(&self, offsets: &[(Tp, i64)]) -> Result<(), ClientError> {
            self.copies.set(self.copies.get() + 1);
            match self.lose.get() {
                0 => self.held.borrow_mut().extend(offsets.iter().cloned()),
                n => self.lose.set(n - 1),
            }
            Ok(())
        }
        fn committed(&self, partitions: &[Tp], _: Duration) -> Result<Committed, ClientError> {
            let held = self.held.borrow();
            Ok((partitions.iter())
                .map(|tp| (tp.clone(), held.get(tp).copied()))
                .collect())
        }
        fn positions(&self) -> Vec<(Tp, i64)> {
            Vec::new()
        }
        fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
            Ok(vec![("in".to_string(), 0)])
        }
        fn seek(&self, _: &[(Tp, i64)], _: Duration) -> Result<(), crate::sink::SeekFailed> {
            Ok(())
        }
        fn pause(&self, _: &[Tp]) -> Result<(), ClientError> {
            Ok(())
        }
        fn resume(&self, _: &[Tp]) -> Result<(), ClientError> {
            Ok(())
        }
    }

    /// The group's copy of the table's offsets reaches them even when a copy is lost and no
    /// unit commits any more (the input stopped): every check reads back what the group holds
    /// and sends what it lacks, until it holds them; then nothing more is sent. A partition no
    /// longer assigned is its new owner's to copy.
    #[test]
    fn a_lost_copy_of_the_offsets_is_sent_again_until_the_group_holds_them() {
        let mut d = sink(None);
        let tp = ("in".to_string(), 0);
        let claim = Claim {
            next: Some(10),
            epoch: 1,
            copied: None,
        };
        d.claims().insert(tp.clone(), claim);
        // A claim of a partition revoked since: its new owner copies it, not this one.
        d.claims().insert(("in".to_string(), 1), claim);
        let group = Losing::default();
        group.lose.set(1);
        d.idle(&group, true);
        assert_eq!(
            group
                .committed(std::slice::from_ref(&tp), COPY_READ)
                .unwrap()[0]
                .1,
            None,
            "lost"
        );
        d.idle(&group, false);
        assert_eq!(group.copies.get(), 1, "not before the next check is due");
        d.idle(&group, true);
        assert_eq!(group.held.borrow().get(&tp), Some(&10));
        d.idle(&group, true);
        assert_eq!(group.copies.get(), 2, "held: nothing sent again");
        assert_eq!(d.claims()[&tp].copied, Some(10));
        assert_eq!(
            group.held.borrow().len(),
            1,
            "nothing of the revoked partition"
        );
    }

    /// A revoke forgets the claims of its partitions (their next owner's epoch is newer; a
    /// commit here would be fenced) and keeps the others'.
    #[test]
    fn a_revoke_forgets_the_claims_of_its_partitions() {
        let mut d = sink(None);
        let claim = Claim {
            next: Some(10),
            epoch: 1,
            copied: None,
        };
        for p in [0, 1] {
            d.claims().insert(("in".to_string(), p), claim);
        }
        d.revoked(&[("in".to_string(), 0)]);
        let left: Vec<Tp> = d.claims().keys().cloned().collect();
        assert_eq!(left, [("in".to_string(), 1)]);
    }

    #[test]
    fn a_row_keeps_every_digit_of_its_numbers_and_takes_its_lineage() {
        let mut db = sink(Some("lineage"));
        let bounds = Bounds::new(Default::default(), Duration::from_secs(1));
        let value = br#"{"id": 123456789012345678901234567890, "amount": 1.10, "lineage": "x"}"#;
        let mut out = Outgoing {
            topic: None,
            partition: None,
            key: None,
            value: Some(std::borrow::Cow::Borrowed(value.as_slice())),
            headers: Default::default(),
            lineage: Some("in/0/7/0".into()),
        };
        let record = |out: &mut Outgoing<'static>, bounds: &Bounds, db: &mut Database| {
            let r = Record {
                topic: "rows",
                out,
                timestamp: None,
                index: 3,
                kind: Content::Output,
            };
            db.send(r, bounds)
        };
        record(&mut out, &bounds, &mut db).unwrap();
        let (index, row) = &db.rows[0];
        assert_eq!(*index, 3);
        assert!(
            row.contains("123456789012345678901234567890") && row.contains("1.10"),
            "{row}"
        );
        let parsed: serde_json::Value = serde_json::from_str(row).unwrap();
        assert_eq!(parsed["lineage"], "in/0/7/0");
        // Not an object: refused, judged alone.
        out.value = Some(std::borrow::Cow::Borrowed(b"[1]".as_slice()));
        record(&mut out, &bounds, &mut db).unwrap();
        assert_eq!(db.rows.len(), 1);
        let refused = db.hear(Wait::Now, &bounds).refused;
        assert_eq!(
            (refused[0].index, refused[0].error, refused[0].alone),
            (3, "NOT_A_JSON_OBJECT", true)
        );
        // Anything addressed elsewhere is no row of this table, the dead-letter topic's name
        // included: a dead letter is told by what it is, wherever it is addressed.
        for (topic, kind) in [("other", Content::Output), ("rows.dlq", Content::Output)] {
            let elsewhere = Record {
                topic,
                out: &mut out,
                timestamp: None,
                index: 4,
                kind,
            };
            let sent = db.send(elsewhere, &bounds);
            assert!(matches!(sent, Err(Failed::Unroutable { .. })), "{topic}");
        }
        let letter = Record {
            topic: "anywhere",
            out: &mut out,
            timestamp: None,
            index: 5,
            kind: Content::DeadLetter(Reason::JqError),
        };
        db.send(letter, &bounds).unwrap();
        let copy = &db.copies[0];
        assert_eq!(copy.reason.as_deref(), Some("jq_error"));
        assert_eq!(copy.lineage.as_deref(), Some("in/0/7/0"));
    }

    #[test]
    fn envelopes_name_their_table_and_operation_and_a_bad_one_is_the_records_fault() {
        let mut db = sink(Some("lineage"));
        db.config.envelope = true;
        db.config.tables = vec!["orders".into(), "lines".into(), "log".into()];
        let table = |key: &[&str]| db::Described {
            columns: vec!["id".into(), "lineage".into()],
            key: key.iter().map(|k| k.to_string()).collect(),
        };
        db.tables = vec![table(&["id"]), table(&["id"]), table(&[])];
        let change = |db: &Database, value: &str| {
            let out = Outgoing {
                topic: None,
                partition: None,
                key: None,
                value: Some(std::borrow::Cow::Owned(value.as_bytes().to_vec())),
                headers: Default::default(),
                lineage: Some("in/0/7/0".into()),
            };
            db.change(&out)
        };
        let (op, row) = change(&db, r#"{"row": {"id": 1}}"#).unwrap();
        assert_eq!(op, (0, Write::Upsert));
        assert!(row.contains(r#""lineage":"in/0/7/0""#), "{row}");
        let (op, row) = change(
            &db,
            r#"{"table": "lines", "op": "delete", "row": {"id": 2}}"#,
        )
        .unwrap();
        assert_eq!((op, row.contains("lineage")), ((1, Write::Delete), false));
        let (op, _) = change(&db, r#"{"table": "log", "op": "insert", "row": {"id": 3}}"#).unwrap();
        assert_eq!(op, (2, Write::Insert));
        for (value, why) in [
            (r#"{"table": "nope", "row": {}}"#, "NOT_A_TABLE"),
            (r#"{"op": "merge", "row": {}}"#, "BAD_ENVELOPE"),
            (r#"{"rows": {}}"#, "BAD_ENVELOPE"),
            (r#"{"row": {}, "extra": 1}"#, "BAD_ENVELOPE"),
            (r#"[1]"#, "BAD_ENVELOPE"),
            (r#"{"row": [1]}"#, "NOT_A_JSON_OBJECT"),
            // A table whose key the server makes: nothing to delete or upsert by.
            (
                r#"{"table": "log", "op": "delete", "row": {"id": 1}}"#,
                "NO_PRIMARY_KEY",
            ),
        ] {
            assert_eq!(change(&db, value).err(), Some(why), "{value}");
        }
    }

    /// A session that records what it was asked to write.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(usize, Write, Vec<usize>)>>);

    impl Session for Recorder {
        fn usable(&self) -> bool {
            true
        }
        fn tables(&self) -> &[db::Described] {
            &[]
        }
        fn begin(&self, _: bool) -> Result<(), Failure> {
            Ok(())
        }
        fn write_rows(
            &self,
            t: usize,
            how: Write,
            rows: &[(usize, String)],
        ) -> Result<(), Unwritten> {
            let indexes = rows.iter().map(|r| r.0).collect();
            self.0.lock().unwrap().push((t, how, indexes));
            // Table 1 refuses row 4.
            match rows.iter().find(|r| t == 1 && r.0 == 4) {
                Some(r) => Err(Unwritten::Rows(vec![(r.0, Failure::client("no".into()))])),
                None => Ok(()),
            }
        }
        fn write_dead(&self, _: &[DeadLetter]) -> Result<(), Failure> {
            Ok(())
        }
        fn advance(&self, _: &str, _: &[Advance]) -> Result<Vec<i32>, Failure> {
            Ok(Vec::new())
        }
        fn commit(&self) -> Result<(), Failure> {
            Ok(())
        }
        fn rollback(&self) -> Result<(), Failure> {
            Ok(())
        }
        fn read(&self, _: &str, _: &[i32]) -> Result<Vec<db::Claimed>, Failure> {
            Ok(Vec::new())
        }
        fn claim(&self, _: &str, _: &[(i32, Option<i64>)]) -> Result<Vec<db::Claimed>, Failure> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn changes_are_written_in_the_order_sent_a_batch_per_run_of_one_table_and_operation() {
        let rows: Vec<(usize, String)> = (0..7).map(|i| (i, "{}".to_string())).collect();
        let (u, d) = (Write::Upsert, Write::Delete);
        let ops = [(0, u), (0, u), (1, u), (1, u), (1, u), (0, d), (0, u)];
        let session = Recorder::default();
        let refused = match write_changes(&session, &rows, &ops) {
            Err(Unwritten::Rows(r)) => r.iter().map(|r| r.0).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        // A refusal in one run does not stop the later ones: every bad row of the unit named.
        assert_eq!(refused, [4]);
        let calls = session.0.into_inner().unwrap();
        assert_eq!(
            calls,
            [
                (0, u, vec![0, 1]),
                (1, u, vec![2, 3, 4]),
                (0, d, vec![5]),
                (0, u, vec![6])
            ]
        );
    }
}

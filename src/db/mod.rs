//! The databases of the database sink (docs/database.md), behind one [`Session`]: a
//! connection with the sink's three tables (the rows', the offsets', the dead letters'), every
//! call bounded on the client side as well as the server's, and every failure classified
//! ([`Kind`]), so the sink tells a deadlock from a bad row from a lost connection without
//! knowing whose codes they are.
//!
//! - [`postgres`]: PostgreSQL (tokio-postgres): SQLSTATEs, rows typed by
//!   `json_populate_recordset`, epochs from a sequence.
//! - [`mysql`]: MySQL and MariaDB (mysql_async): error numbers, rows typed by `JSON_TABLE`
//!   and a strict `INSERT`, epochs from a one-row table; the offsets in exactly's table or in
//!   the Spark recipes' `kafka_offset` ([`Layout`]).
//! - [`kafka_offset`]: that table's one description (its table and column names), which the
//!   offsets tool reads and writes a job's table by too.
//!
//! What both share is here: the offsets' protocol ([`Claimed`], [`Advance`]: a partition is
//! claimed with a new epoch, and its offset moves only by compare-and-set on (the offset its
//! owner last wrote, that epoch)), the dead-letter copy, and the search for the rows at fault
//! in a refused batch (`bisect`).

pub mod kafka_offset;
pub mod mysql;
pub mod postgres;

use std::time::Duration;

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://` (or a libpq key=value string).
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
}

impl Backend {
    /// The database `url` names, by its scheme.
    pub fn of(url: &str) -> Result<Backend, String> {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Backend::Postgres),
            Some("mysql" | "mariadb") => Ok(Backend::Mysql),
            // libpq's key=value form has no scheme.
            None if url.contains('=') => Ok(Backend::Postgres),
            _ => Err(
                "not a database URL (postgres://user@host:port/db or mysql://user@host:port/db)"
                    .into(),
            ),
        }
    }
}

/// How the offsets table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// exactly's own: `(group_id, topic, partition, next_offset, owner_epoch, owner,
    /// updated)`.
    Exactly,
    /// The Spark recipes' `kafka_offset(group_id, topic, partition_id, fromOffset,
    /// untilOffset)` ([`kafka_offset::KafkaOffset`]'s names), the epochs beside it in
    /// `<table>_owner` (a Spark job's `REPLACE INTO` would reset a column added to its
    /// table). MySQL and MariaDB only.
    KafkaOffset,
}

/// How a batch of rows meets the rows already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// A row replaces the one of its primary key; the last of a key in a batch wins.
    Upsert,
    /// A row whose key is taken (in the table or earlier in the batch) is the row's fault.
    Insert,
    /// The rows of the batch's keys go (the rows need only their key's fields).
    Delete,
}

impl Write {
    /// `insert`, `upsert` or `delete`: an envelope's `op`.
    pub fn of(op: &str) -> Option<Write> {
        match op {
            "upsert" => Some(Write::Upsert),
            "insert" => Some(Write::Insert),
            "delete" => Some(Write::Delete),
            _ => None,
        }
    }
}

/// What kind of failure a database call met, as the sink must react.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The row's fault (a constraint, a type, a value too long): its name, for the DLQ
    /// copy's headers (`CHECK_VIOLATION`).
    Data(&'static str),
    /// Another transaction's: a deadlock, a serialization failure, a lock wait too long.
    /// Trying again may succeed.
    Conflict,
    /// The server refused the client: a wrong password, a database that does not exist.
    Refused,
    /// Something the configuration names is missing or may not be used: a table, a column,
    /// a permission. No retry fixes it.
    Setup,
    /// Anything else (a statement past its bound, the server's own trouble).
    Other,
}

/// A database call that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    /// What it means for the sink.
    pub kind: Kind,
    /// The server's code (PostgreSQL's SQLSTATE, MySQL's error number), when it said why.
    pub code: Option<String>,
    /// The connection is gone, or no longer to be trusted (a call past its bound: the server
    /// may still run it): nothing more goes through it; connect again. A COMMIT that failed
    /// so has an unknown outcome (the offsets table tells).
    pub closed: bool,
    /// For people: the server's message and detail, or the client's.
    pub message: String,
}

impl Failure {
    /// A failure of the client's own (kind [`Kind::Other`]).
    pub fn client(message: String) -> Failure {
        Failure {
            kind: Kind::Other,
            code: None,
            closed: false,
            message,
        }
    }

    /// A failure of the setup's (kind [`Kind::Setup`]): a table, a column, a name.
    pub(crate) fn setup(message: String) -> Failure {
        Failure {
            kind: Kind::Setup,
            ..Failure::client(message)
        }
    }

    /// A failure the connection does not survive.
    pub(crate) fn lost(message: String) -> Failure {
        Failure {
            closed: true,
            ..Failure::client(message)
        }
    }

    /// Whether the server refused the statement for the data in it: the row is at fault, not
    /// the database.
    pub fn is_data(&self) -> bool {
        matches!(self.kind, Kind::Data(_))
    }

    /// Whether trying the transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind == Kind::Conflict
    }
}

/// How long the server lets one statement, one lock wait and an idle transaction run, and
/// how long the client waits for any answer (a second longer).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The server's bound on a statement and a lock wait, and the client's wait.
    pub statement: Duration,
    /// The server's bound on an idle open transaction: a zombie's transaction ends.
    pub idle_in_transaction: Duration,
    /// The server's bound on an idle session, where it has no bound on an idle transaction
    /// alone (MySQL's `wait_timeout`, set on MariaDB too, alike): a zombie's connection
    /// closes, and its transaction rolls back. The sink keeps its own connection alive while
    /// it is idle ([`Session::keepalive`]); `None` (a reader): the server's default.
    pub idle_session: Option<Duration>,
}

impl Bounds {
    /// How long the client waits for an answer: the server's bound and a second.
    pub fn client_wait(&self) -> Duration {
        self.statement + Duration::from_secs(1)
    }

    fn check(&self) -> Result<(), Failure> {
        if self.statement.is_zero() || self.idle_in_transaction.is_zero() {
            // 0 is "no bound" to the servers: every call is bounded.
            return Err(Failure::client("a database bound of 0".into()));
        }
        Ok(())
    }
}

/// A partition claimed: where its records start, and the epoch that may move it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The partition.
    pub partition: i32,
    /// Its next offset; `None`: neither the table nor the group had one (start by the
    /// consumer's reset policy).
    pub next: Option<i64>,
    /// The claim's epoch.
    pub epoch: i64,
}

/// A partition's offset to move, in the open transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The partition.
    pub partition: i32,
    /// The offset this owner last wrote (or claimed).
    pub from: Option<i64>,
    /// The next offset now.
    pub to: i64,
    /// The owner's epoch.
    pub epoch: i64,
}

/// What a batch of rows could not write.
#[derive(Debug)]
pub enum Unwritten {
    /// These rows (their indexes) are refused for what they hold; the others are written.
    Rows(Vec<(usize, Failure)>),
    /// The batch is not written (the database's failure, not a row's).
    Batch(Failure),
}

/// One dead-letter copy, a row of the dead-letter table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetter {
    /// Why (a reason name), from the copy's headers.
    pub reason: Option<String>,
    /// The lineage of its input.
    pub lineage: Option<String>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// The headers, a JSON array of `[name, value]` text pairs in order.
    pub headers: String,
}

/// What to open: the database, the tables, and how rows are written.
#[derive(Clone, Debug)]
pub struct Target {
    /// Which database.
    pub backend: Backend,
    /// Its URL, without a password.
    pub url: String,
    /// The password, kept out of the URL.
    pub password: Option<String>,
    /// The server's bounds, and the client's.
    pub bounds: Bounds,
    /// The rows' tables (`table` or `schema.table`), the first the one rows go to unless an
    /// envelope names another.
    pub tables: Vec<String>,
    /// How rows are written unless an envelope says otherwise.
    pub write: Write,
    /// A text column of every rows' table that takes each row's lineage.
    pub lineage_column: Option<String>,
    /// The offsets table, and its layout.
    pub offsets: String,
    /// Its layout.
    pub layout: Layout,
    /// The dead-letter table.
    pub dead: String,
    /// The group whose offsets the table keeps.
    pub group: String,
    /// This instance, as the offsets table names a partition's owner.
    pub owner: String,
}

/// Which table (or the connection) an opening failed at, to name its flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Connecting.
    Connect,
    /// The offsets table.
    Offsets,
    /// The dead-letter table.
    Dead,
    /// The rows' table.
    Rows,
}

/// Why [`open`] did not open.
#[derive(Debug)]
pub struct NotOpen {
    /// Where.
    pub step: Step,
    /// What failed.
    pub failure: Failure,
}

impl NotOpen {
    /// A failure at `step`, as `map_err` takes it.
    pub(crate) fn at(step: Step) -> impl Fn(Failure) -> NotOpen {
        move |failure| NotOpen { step, failure }
    }

    /// A setup's failure (a name refused) at `step`, as `map_err` takes it.
    pub(crate) fn setup(step: Step) -> impl Fn(String) -> NotOpen {
        move |message| NotOpen {
            step,
            failure: Failure::setup(message),
        }
    }
}

/// A connection to the database with the sink's tables, described and checked: what the
/// sink does in a commit's transaction, and around it.
///
/// Calls are synchronous and bounded ([`Bounds`]); a failure with `closed` leaves the
/// session unusable ([`Session::usable`]), and the sink opens another.
pub trait Session: Send {
    /// Whether calls can go through this connection: it is open, and no call ran past its
    /// bound on it.
    fn usable(&self) -> bool;
    /// The rows' tables, as the catalog describes them, in the order of [`Target::tables`].
    fn tables(&self) -> &[Described];
    /// Opens a transaction; `immediate`: deferred constraints are checked at each statement
    /// (a COMMIT was refused for them).
    fn begin(&self, immediate: bool) -> Result<(), Failure>;
    /// Writes `rows` into table `table` (an index into [`Session::tables`]) as `how` says
    /// (each a JSON object's text: field → column, typed by the server from the text as
    /// written; a field missing is NULL, one without a column ignored) with their indexes, in
    /// the open transaction, sorted by key (writers of one table lock its rows in one order).
    /// Rows refused for their data are found and named; the others are written.
    fn write_rows(
        &self,
        table: usize,
        how: Write,
        rows: &[(usize, String)],
    ) -> Result<(), Unwritten>;
    /// Writes dead-letter `copies` in the open transaction.
    fn write_dead(&self, copies: &[DeadLetter]) -> Result<(), Failure>;
    /// Moves the offsets of `topic` in the open transaction, each by compare-and-set on its
    /// old offset and epoch: the partitions that did not move (another owner claimed them
    /// since). With any, the transaction must roll back. A partition twice is refused.
    fn advance(&self, topic: &str, moves: &[Advance]) -> Result<Vec<i32>, Failure>;
    /// Commits the open transaction.
    fn commit(&self) -> Result<(), Failure>;
    /// Between transactions: a round trip if the connection has been idle for half the
    /// server's bound on an idle session ([`Bounds::idle_session`]), so that the server closes
    /// only a connection whose process stopped answering.
    fn keepalive(&self) -> Result<(), Failure> {
        Ok(())
    }
    /// Rolls the open transaction back.
    fn rollback(&self) -> Result<(), Failure>;
    /// What the offsets table holds for `partitions` of `topic`, for the rows there are.
    fn read(&self, topic: &str, partitions: &[i32]) -> Result<Vec<Claimed>, Failure>;
    /// Claims `partitions` of `topic` (each with its seed, the group's Kafka offset, for a
    /// row that is missing) in a transaction of its own: where each starts, and its new
    /// epoch, by partition.
    fn claim(
        &self,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure>;
}

/// Connects to `target`'s database, creates the offsets and dead-letter tables if they are
/// missing, and checks the rows' table: a key for upserts, the lineage column.
pub fn open(target: &Target) -> Result<Box<dyn Session>, NotOpen> {
    target.bounds.check().map_err(|failure| NotOpen {
        step: Step::Connect,
        failure,
    })?;
    let session: Box<dyn Session> = match target.backend {
        Backend::Postgres => Box::new(postgres::Pg::open(target)?),
        Backend::Mysql => Box::new(mysql::My::open(target)?),
    };
    let setup = NotOpen::setup(Step::Rows);
    let (names, tables) = (&target.tables, session.tables());
    if target.write != Write::Insert
        && let Some(first) = tables.first()
        && first.key.is_empty()
    {
        return Err(setup(format!(
            "table {} has no primary key that rows set (none, or one the server generates): \
             rows are upserted by it (or choose --db-mode insert)",
            names[0]
        )));
    }
    if let Some(column) = &target.lineage_column
        && let Some((name, _)) =
            (names.iter().zip(tables)).find(|(_, t)| !t.columns.contains(column))
    {
        return Err(setup(format!("table {name} has no column '{column}'")));
    }
    Ok(session)
}

/// What `exactly audit` reads of a database sink: read only, nothing created.
#[derive(Clone, Debug)]
pub struct ReadTarget {
    /// Which database.
    pub backend: Backend,
    /// Its URL, without a password.
    pub url: String,
    /// The password.
    pub password: Option<String>,
    /// Bounds on every call.
    pub bounds: Bounds,
    /// The rows' table.
    pub rows: String,
    /// Its lineage column.
    pub lineage_column: String,
    /// The dead-letter table.
    pub dead: String,
    /// The offsets table, and its layout.
    pub offsets: (String, Layout),
}

/// A dead-letter copy as the audit reads it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterRead {
    /// The lineage of its input.
    pub lineage: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

/// What a row the replay expects is, against the table. Expected rows go in as JSON objects
/// (their lineage in the lineage column's field), typed by the server as a write would type
/// them, so a value is compared as the column holds it (`1.10` and `1.1` in a numeric are one).
pub trait Reader {
    /// The lineage of every row (one per row: a row twice is there twice); rows without one
    /// are counted apart.
    fn lineages(&self) -> Result<(Vec<String>, usize), Failure>;
    /// Every dead-letter copy.
    fn dead_letters(&self) -> Result<Vec<DeadLetterRead>, Failure>;
    /// The expected rows (by index) whose row of the same lineage differs, with the columns
    /// that do. Rows without a row of their lineage are not among them.
    fn differing(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Vec<String>)>, Failure>;
    /// For each expected row (by index), the lineage of the row at its key (`None`: no row
    /// there, or the table's key is the server's).
    fn holders(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Option<String>)>, Failure>;
    /// What the offsets table holds for `group`'s `partitions` of `topic`: the next offset of
    /// those with a row.
    fn offsets(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>, Failure>;
}

/// Connects to read `target`'s tables: the rows' table must have the lineage column.
pub fn open_reader(target: &ReadTarget) -> Result<Box<dyn Reader>, NotOpen> {
    target.bounds.check().map_err(|failure| NotOpen {
        step: Step::Connect,
        failure,
    })?;
    let (reader, table): (Box<dyn Reader>, Described) = match target.backend {
        Backend::Postgres => {
            let (r, t) = postgres::PgReader::open(target)?;
            (Box::new(r), t)
        }
        Backend::Mysql => {
            let (r, t) = mysql::MyReader::open(target)?;
            (Box::new(r), t)
        }
    };
    if !table.columns.contains(&target.lineage_column) {
        return Err(NotOpen::setup(Step::Rows)(format!(
            "table {} has no column '{}'",
            target.rows, target.lineage_column
        )));
    }
    Ok(reader)
}

/// An output's value as a row: its JSON object's text, every number as written (raw values,
/// not floats), with the lineage column set (to the lineage, or null) if there is one.
/// `None`: the value is no JSON object.
pub fn row_text(value: &[u8], lineage: Option<(&str, Option<&str>)>) -> Option<String> {
    type Row = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;
    let mut row: Row = serde_json::from_slice(value).ok()?;
    if let Some((column, lineage)) = lineage {
        row.insert(
            column.to_string(),
            serde_json::value::to_raw_value(&lineage).ok()?,
        );
    }
    serde_json::to_string(&row).ok()
}

/// Rows per statement of the audit's comparisons.
const COMPARED: usize = 1000;

/// Runs one comparison statement (`batch`: over a JSON array of rows, answering each with
/// its row's 1-based ordinality in the array) on `rows`, in batches: each answer with its
/// row's index.
pub(crate) fn compare<T>(
    rows: &[(usize, String)],
    batch: impl Fn(String) -> Result<Vec<(i64, T)>, Failure>,
) -> Result<Vec<(usize, T)>, Failure> {
    let mut out = Vec::new();
    for some in rows.chunks(COMPARED) {
        let json = format!(
            "[{}]",
            some.iter()
                .map(|r| r.1.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        for (ordinality, answer) in batch(json)? {
            let row = usize::try_from(ordinality - 1)
                .ok()
                .and_then(|i| some.get(i))
                .ok_or_else(|| Failure::client(format!("no row {ordinality} sent")))?;
            out.push((row.0, answer));
        }
    }
    Ok(out)
}

/// Partitions to claim in one order (two instances claiming overlapping partitions cannot
/// deadlock), each once.
pub(crate) fn in_claim_order(partitions: &[(i32, Option<i64>)]) -> Vec<(i32, Option<i64>)> {
    let mut partitions = partitions.to_vec();
    partitions.sort_unstable();
    partitions.dedup_by_key(|(p, _)| *p);
    partitions
}

/// The rows' table as the catalog describes it: the columns a row can set, and the primary
/// key's (empty when the server makes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// Columns, in the table's order.
    pub columns: Vec<String>,
    /// The primary key's columns, in the key's order.
    pub key: Vec<String>,
}

/// `name` as the parts of an SQL name: `schema.table` or `table`, each part letters, digits
/// and `_` (so a name is never SQL, whatever it is quoted with).
pub fn name_parts(name: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = name.split('.').collect();
    let plain = |p: &str| {
        p.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && p.len() <= 63
    };
    if parts.len() > 2 || !parts.iter().all(|p| plain(p)) {
        return Err(format!(
            "'{name}' is not a table name (letters, digits and _, optionally schema.table)"
        ));
    }
    Ok(parts)
}

/// A refused batch's rows written again in halves, each under a savepoint, down to the rows
/// at fault, which go to `refused`: a few statements per bad row (about 2 log n), not one
/// per row of the batch. Halves go in order, so the last of a key still wins. `write` writes
/// some rows; `savepoint` runs one of the savepoint statements.
pub(crate) fn bisect(
    rows: &[&(usize, String)],
    write: &impl Fn(&[&(usize, String)]) -> Result<(), Failure>,
    savepoint: &impl Fn(Savepoint) -> Result<(), Failure>,
    refused: &mut Vec<(usize, Failure)>,
) -> Result<(), Failure> {
    savepoint(Savepoint::Set)?;
    match write(rows) {
        Ok(()) => savepoint(Savepoint::Release),
        Err(e) if !e.is_data() => Err(e),
        Err(e) => {
            savepoint(Savepoint::Undo)?;
            if let [row] = rows {
                refused.push((row.0, e));
                return Ok(());
            }
            let (first, second) = rows.split_at(rows.len() / 2);
            bisect(first, write, savepoint, refused)?;
            bisect(second, write, savepoint, refused)
        }
    }
}

/// The savepoint statements [`bisect`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Savepoint {
    /// Set one.
    Set,
    /// Keep what was written since.
    Release,
    /// Undo what was written since, and release it.
    Undo,
}

/// [`bisect`] over a whole batch: `Ok` when every row is written.
pub(crate) fn write_all(
    rows: &[(usize, String)],
    write: &impl Fn(&[&(usize, String)]) -> Result<(), Failure>,
    savepoint: &impl Fn(Savepoint) -> Result<(), Failure>,
) -> Result<(), Unwritten> {
    if rows.is_empty() {
        return Ok(());
    }
    let all: Vec<&(usize, String)> = rows.iter().collect();
    let mut refused = Vec::new();
    bisect(&all, write, savepoint, &mut refused).map_err(Unwritten::Batch)?;
    if refused.is_empty() {
        return Ok(());
    }
    Err(Unwritten::Rows(refused))
}

/// The partitions of `moves`, refused when one comes twice.
pub(crate) fn partitions_once(moves: &[Advance]) -> Result<Vec<i32>, Failure> {
    let ps: Vec<i32> = moves.iter().map(|m| m.partition).collect();
    let mut sorted = ps.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(Failure::client(format!(
            "a partition twice in one advance: {ps:?}"
        )));
    }
    Ok(ps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn names_are_letters_digits_and_underscores_in_at_most_two_parts() {
        assert_eq!(name_parts("exactly_offsets").unwrap(), ["exactly_offsets"]);
        assert_eq!(name_parts("sink.Offsets_2").unwrap(), ["sink", "Offsets_2"]);
        for bad in [
            "",
            "a.b.c",
            "1abc",
            "a-b",
            "a\"; drop table x; --",
            "a`b",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(name_parts(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_name_their_database_by_scheme() {
        assert_eq!(Backend::of("postgres://u@h/db"), Ok(Backend::Postgres));
        assert_eq!(Backend::of("postgresql://u@h/db"), Ok(Backend::Postgres));
        assert_eq!(
            Backend::of("host=h user=u dbname=db"),
            Ok(Backend::Postgres)
        );
        assert_eq!(Backend::of("mysql://u@h:3306/db"), Ok(Backend::Mysql));
        assert_eq!(Backend::of("MariaDB://u@h/db"), Ok(Backend::Mysql));
        assert!(Backend::of("redis://h").is_err());
        assert!(Backend::of("h:5432").is_err());
    }

    fn bad(name: &'static str) -> Failure {
        Failure {
            kind: Kind::Data(name),
            ..Failure::client("refused".into())
        }
    }

    /// A fake table: a row whose text contains "bad" is refused, the rest written, and the
    /// savepoints undo what they cover.
    struct Fake {
        written: RefCell<Vec<usize>>,
        marks: RefCell<Vec<usize>>,
        statements: RefCell<usize>,
    }

    impl Fake {
        fn write(&self, rows: &[&(usize, String)]) -> Result<(), Failure> {
            *self.statements.borrow_mut() += 1;
            if rows.iter().any(|r| r.1.contains("bad")) {
                return Err(bad("CHECK_VIOLATION"));
            }
            self.written.borrow_mut().extend(rows.iter().map(|r| r.0));
            Ok(())
        }

        fn savepoint(&self, s: Savepoint) -> Result<(), Failure> {
            match s {
                Savepoint::Set => self.marks.borrow_mut().push(self.written.borrow().len()),
                Savepoint::Release => drop(self.marks.borrow_mut().pop()),
                Savepoint::Undo => {
                    let mark = self.marks.borrow_mut().pop().unwrap();
                    self.written.borrow_mut().truncate(mark);
                }
            }
            Ok(())
        }
    }

    #[test]
    fn a_refused_batch_is_written_in_halves_down_to_the_rows_at_fault_in_order() {
        let fake = Fake {
            written: RefCell::default(),
            marks: RefCell::default(),
            statements: RefCell::default(),
        };
        let rows: Vec<(usize, String)> = (0..1000)
            .map(|i| (i, if i == 637 || i == 2 { "bad" } else { "ok" }.into()))
            .collect();
        let got = write_all(&rows, &|r| fake.write(r), &|s| fake.savepoint(s));
        let Err(Unwritten::Rows(refused)) = got else {
            panic!("{got:?}")
        };
        let named: Vec<(usize, Kind)> = refused.iter().map(|(i, f)| (*i, f.kind)).collect();
        assert_eq!(
            named,
            [
                (2, Kind::Data("CHECK_VIOLATION")),
                (637, Kind::Data("CHECK_VIOLATION"))
            ]
        );
        let expected: Vec<usize> = (0..1000).filter(|i| *i != 637 && *i != 2).collect();
        assert_eq!(
            *fake.written.borrow(),
            expected,
            "every other row, in order"
        );
        let statements = *fake.statements.borrow();
        assert!(statements < 50, "{statements} statements for two bad rows");
        // The database's own failure is no row's: the batch fails.
        let other = write_all(&rows[..3], &|_| Err(Failure::client("x".into())), &|_| {
            Ok(())
        });
        assert!(matches!(other, Err(Unwritten::Batch(_))), "{other:?}");
    }

    #[test]
    fn a_row_keeps_every_digit_and_takes_its_lineage() {
        let value = br#"{"id": 123456789012345678901234567890, "amount": 1.10, "lineage": "x"}"#;
        let row = row_text(value, Some(("lineage", Some("in/0/7/0")))).unwrap();
        assert!(
            row.contains("123456789012345678901234567890") && row.contains("1.10"),
            "{row}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&row).unwrap();
        assert_eq!(parsed["lineage"], "in/0/7/0");
        let without = row_text(value, Some(("lineage", None))).unwrap();
        assert!(without.contains(r#""lineage":null"#), "{without}");
        assert_eq!(row_text(b"[1]", None), None);
        assert_eq!(row_text(b"not json", None), None);
    }

    #[test]
    fn a_partition_twice_in_one_advance_is_refused() {
        let m = |partition| Advance {
            partition,
            from: None,
            to: 1,
            epoch: 1,
        };
        assert_eq!(partitions_once(&[m(2), m(0)]).unwrap(), [2, 0]);
        assert!(partitions_once(&[m(0), m(2), m(0)]).is_err());
    }
}

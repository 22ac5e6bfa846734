//! PostgreSQL for the database sink (docs/database.md): one connection on a runtime of its
//! own (the sink's loop is synchronous), every call bounded on the client side as well as the
//! server's, and every failure classified by its SQLSTATE.
//!
//! [`offsets`] is the offsets table: each partition's next offset and its owner's epoch, moved
//! by compare-and-set in the transaction that writes the rows; [`rows`] writes the rows and
//! the dead-letter copies. [`Pg`] is the three as the sink's [`Session`].

pub mod offsets;
pub mod rows;

use std::future::Future;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::{
    Advance, Bounds, Claimed, DeadLetter, DeadLetterRead, Described, Failure, Kind, NotOpen,
    ReadTarget, Reader, Session, Step, Target, Unwritten, Write,
};

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        // Display says only "db error" for a server's error: its message is in the DbError.
        let message = match e.as_db_error() {
            Some(db) => match db.detail() {
                Some(detail) => format!("{}: {detail}", db.message()),
                None => db.message().to_string(),
            },
            None => e.to_string(),
        };
        // A FATAL (or PANIC) error ends the session: the server closes the connection after
        // it (57P01 from pg_terminate_backend), though the client may not have seen it close.
        let fatal = (e.as_db_error()).is_some_and(|db| {
            matches!(
                db.parsed_severity(),
                Some(
                    tokio_postgres::error::Severity::Fatal | tokio_postgres::error::Severity::Panic
                )
            )
        });
        let code = e.code().map(|c| c.code().to_string());
        Failure {
            kind: kind(code.as_deref().unwrap_or_default()),
            code,
            closed: e.is_closed() || fatal,
            message,
        }
    }
}

/// What a SQLSTATE means for the sink: classes 22 (data), 23 (integrity constraints) and 54
/// (a limit, such as an index row too large) are the row's; 40 (serialization failures,
/// deadlocks) a conflict; 28 (authentication) and 3D000 (no such database) a refusal; 42501
/// (permission), 42P01 (no such table) and 42703 (no such column) the setup's.
fn kind(code: &str) -> Kind {
    match code {
        "23505" => Kind::Data("UNIQUE_VIOLATION"),
        "23502" => Kind::Data("NOT_NULL_VIOLATION"),
        "23503" => Kind::Data("FOREIGN_KEY_VIOLATION"),
        "23514" => Kind::Data("CHECK_VIOLATION"),
        "22P02" => Kind::Data("INVALID_TEXT_REPRESENTATION"),
        "22003" => Kind::Data("NUMERIC_VALUE_OUT_OF_RANGE"),
        "22001" => Kind::Data("STRING_DATA_RIGHT_TRUNCATION"),
        "22007" | "22008" => Kind::Data("INVALID_DATETIME"),
        c if c.starts_with("23") => Kind::Data("INTEGRITY_CONSTRAINT_VIOLATION"),
        c if c.starts_with("22") || c.starts_with("54") => Kind::Data("DATA_EXCEPTION"),
        c if c.starts_with("40") => Kind::Conflict,
        c if c.starts_with("28") || c == "3D000" => Kind::Refused,
        "42501" | "42P01" | "42703" => Kind::Setup,
        _ => Kind::Other,
    }
}

/// One connection to PostgreSQL.
pub struct Db {
    /// Always `Some` but in `drop`, which shuts it down without waiting.
    runtime: Option<tokio::runtime::Runtime>,
    client: Client,
    bounds: Bounds,
    /// A call ran past its bound: the connection is not used again.
    poisoned: std::sync::atomic::AtomicBool,
}

impl Db {
    /// Connects to `url` (a libpq URL or key=value string), with `password` if given (kept out
    /// of the URL, so logs never show it).
    pub fn connect(url: &str, password: Option<&str>, bounds: Bounds) -> Result<Db, Failure> {
        bounds.check()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::client(format!("a runtime for PostgreSQL: {e}")))?;
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Failure::client(format!("not a PostgreSQL URL: {e}")))?;
        if let Some(p) = password {
            config.password(p);
        }
        let ms = |d: Duration| d.as_millis().max(1);
        // The URL's own options (a search_path) stay; the bounds come after them, and win.
        let options = format!(
            "{} -c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={} \
             -c client_min_messages=warning",
            config.get_options().unwrap_or_default(),
            ms(bounds.statement),
            ms(bounds.statement),
            ms(bounds.idle_in_transaction),
        );
        if config.get_application_name().is_none() {
            config.application_name("exactly");
        }
        config
            .connect_timeout(bounds.statement)
            .options(options.trim_start());
        // A timer needs the runtime: made inside it.
        let connect = async { tokio::time::timeout(bounds.statement, config.connect(NoTls)).await };
        let (client, connection) = match runtime.block_on(connect) {
            Ok(connected) => connected?,
            Err(_) => {
                return Err(Failure::client(format!(
                    "no connection within {:?}",
                    bounds.statement
                )));
            }
        };
        // The connection's own task: it moves the messages, and ends when the server goes.
        runtime.spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %Failure::from(e), "the PostgreSQL connection ended");
            }
        });
        Ok(Db {
            runtime: Some(runtime),
            client,
            bounds,
            poisoned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs `work` with the client, bounded: the server ends a statement past its bound itself
    /// (`57014`); the client waits a second longer, for a server that does not answer at all,
    /// then cancels the query on the server and fails the call (the client has no query
    /// timeout of its own).
    pub fn call<'s, T, F>(&'s self, work: impl FnOnce(&'s Client) -> F) -> Result<T, Failure>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>> + 's,
    {
        use std::sync::atomic::Ordering;
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Failure::lost(
                "this connection ran past a bound earlier: connect again".into(),
            ));
        }
        let wait = self.bounds.client_wait();
        let work = work(&self.client);
        let Some(runtime) = &self.runtime else {
            return Err(Failure::client("the connection is closing".into()));
        };
        match runtime.block_on(async { tokio::time::timeout(wait, work).await }) {
            Ok(done) => done.map_err(|e| {
                let mut failure = Failure::from(e);
                // A FATAL error (57P01 from pg_terminate_backend, 25P03) ends the connection.
                failure.closed |= self.client.is_closed();
                failure
            }),
            Err(_) => {
                self.poisoned.store(true, Ordering::SeqCst);
                let cancel = self.client.cancel_token();
                let cancelled = runtime.block_on(async {
                    tokio::time::timeout(wait, cancel.cancel_query(NoTls)).await
                });
                let how = match cancelled {
                    Ok(Ok(())) => "cancelled",
                    _ => "could not be cancelled",
                };
                Err(Failure::lost(format!(
                    "no answer within {wait:?}; the query {how}"
                )))
            }
        }
    }

    /// Whether calls can go through this connection: it is open, and no call ran past its
    /// bound on it.
    pub fn usable(&self) -> bool {
        !self.poisoned.load(std::sync::atomic::Ordering::SeqCst) && !self.client.is_closed()
    }

    /// Runs `sql` (statements without parameters, `BEGIN`, `COMMIT`), bounded.
    pub fn batch(&self, sql: &str) -> Result<(), Failure> {
        self.call(|c| c.batch_execute(sql))
    }
}

/// Whether the relation `quoted` (a quoted identifier) exists.
fn exists(db: &Db, quoted: &str) -> Result<bool, Failure> {
    let row = db.call(|c| async move {
        c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&quoted])
            .await
    })?;
    Ok(row.try_get(0)?)
}

impl Drop for Db {
    /// The runtime goes without waiting for its tasks (a DNS lookup in a blocking thread
    /// would hold a plain drop without bound); the connection's task ends with it.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `name` as a PostgreSQL identifier: `schema.table` or `table` ([`super::name_parts`]),
/// each part quoted.
pub fn identifier(name: &str) -> Result<String, String> {
    let parts = super::name_parts(name)?;
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// PostgreSQL as the sink's [`Session`]: one connection, the rows' table as the catalog
/// describes it, the offsets table and the dead-letter table.
pub struct Pg {
    db: Db,
    tables: Vec<rows::Table>,
    described: Vec<Described>,
    offsets: offsets::Offsets,
    dead: rows::DeadLetters,
}

impl Pg {
    /// Connects, creates the offsets and dead-letter tables when missing, describes the
    /// rows' table.
    pub fn open(target: &Target) -> Result<Pg, NotOpen> {
        let (at, setup) = (NotOpen::at, NotOpen::setup);
        let offsets = offsets::Offsets::new(&target.offsets, &target.group, &target.owner)
            .map_err(setup(Step::Offsets))?;
        let dead = rows::DeadLetters::new(&target.dead).map_err(setup(Step::Dead))?;
        let db = Db::connect(&target.url, target.password.as_deref(), target.bounds)
            .map_err(at(Step::Connect))?;
        offsets.create(&db).map_err(at(Step::Offsets))?;
        dead.create(&db).map_err(at(Step::Dead))?;
        let tables = (target.tables.iter())
            .map(|t| rows::Table::describe(&db, t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(at(Step::Rows))?;
        let described = tables.iter().map(rows::Table::described).collect();
        Ok(Pg {
            db,
            tables,
            described,
            offsets,
            dead,
        })
    }
}

impl Session for Pg {
    fn usable(&self) -> bool {
        self.db.usable()
    }

    fn begin(&self, immediate: bool) -> Result<(), Failure> {
        if immediate {
            self.db.batch("BEGIN; SET CONSTRAINTS ALL IMMEDIATE")
        } else {
            self.db.batch("BEGIN")
        }
    }

    fn tables(&self) -> &[Described] {
        &self.described
    }

    fn write_rows(
        &self,
        table: usize,
        how: Write,
        rows: &[(usize, String)],
    ) -> Result<(), Unwritten> {
        match self.tables.get(table) {
            Some(t) => t.write(&self.db, rows, how),
            None => Err(Unwritten::Batch(Failure::client(format!(
                "no table {table}"
            )))),
        }
    }

    fn write_dead(&self, copies: &[DeadLetter]) -> Result<(), Failure> {
        self.dead.write(&self.db, copies)
    }

    fn advance(&self, topic: &str, moves: &[Advance]) -> Result<Vec<i32>, Failure> {
        self.offsets.advance(&self.db, topic, moves)
    }

    fn commit(&self) -> Result<(), Failure> {
        self.db.batch("COMMIT")
    }

    fn rollback(&self) -> Result<(), Failure> {
        self.db.batch("ROLLBACK")
    }

    fn read(&self, topic: &str, partitions: &[i32]) -> Result<Vec<Claimed>, Failure> {
        self.offsets.read(&self.db, topic, partitions)
    }

    fn claim(
        &self,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure> {
        self.offsets.claim(&self.db, topic, partitions)
    }
}

/// PostgreSQL as the audit reads it.
pub struct PgReader {
    db: Db,
    table: rows::Table,
    lineage: String,
    dead: rows::DeadLetters,
    /// The offsets table's name.
    offsets: String,
}

impl PgReader {
    /// Connects and describes the rows' table.
    pub fn open(target: &ReadTarget) -> Result<(PgReader, Described), NotOpen> {
        let at = NotOpen::at;
        let dead = rows::DeadLetters::new(&target.dead).map_err(NotOpen::setup(Step::Dead))?;
        let db = Db::connect(&target.url, target.password.as_deref(), target.bounds)
            .map_err(at(Step::Connect))?;
        let table = rows::Table::describe(&db, &target.rows).map_err(at(Step::Rows))?;
        let described = table.described();
        let reader = PgReader {
            db,
            table,
            lineage: target.lineage_column.clone(),
            dead,
            offsets: target.offsets.0.clone(),
        };
        Ok((reader, described))
    }
}

impl Reader for PgReader {
    fn offsets(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>, Failure> {
        let offsets = offsets::Offsets::new(&self.offsets, group, "").map_err(Failure::client)?;
        let read = offsets.read(&self.db, topic, partitions)?;
        Ok(read.into_iter().map(|c| (c.partition, c.next)).collect())
    }

    fn lineages(&self) -> Result<(Vec<String>, usize), Failure> {
        self.table.lineages(&self.db, &self.lineage)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRead>, Failure> {
        self.dead.read(&self.db)
    }

    fn differing(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Vec<String>)>, Failure> {
        self.table.differing(&self.db, rows, &self.lineage)
    }

    fn holders(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Option<String>)>, Failure> {
        self.table.holders(&self.db, rows, &self.lineage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_quoted_identifiers_and_anything_else_is_refused() {
        assert_eq!(
            identifier("exactly_offsets").unwrap(),
            "\"exactly_offsets\""
        );
        assert_eq!(
            identifier("sink.Offsets_2").unwrap(),
            "\"sink\".\"Offsets_2\""
        );
        assert!(identifier("a\"; drop table x; --").is_err());
    }

    #[test]
    fn sqlstates_say_whose_failures_they_are() {
        assert_eq!(kind("23505"), Kind::Data("UNIQUE_VIOLATION"));
        assert_eq!(kind("23P01"), Kind::Data("INTEGRITY_CONSTRAINT_VIOLATION"));
        assert_eq!(kind("22012"), Kind::Data("DATA_EXCEPTION"));
        assert_eq!(kind("54000"), Kind::Data("DATA_EXCEPTION"));
        assert_eq!(kind("40P01"), Kind::Conflict);
        assert_eq!(kind("40001"), Kind::Conflict);
        assert_eq!(kind("28P01"), Kind::Refused);
        assert_eq!(kind("3D000"), Kind::Refused);
        assert_eq!(kind("42P01"), Kind::Setup);
        assert_eq!(kind("57P01"), Kind::Other);
        assert!(!Failure::client("x".into()).is_data());
    }
}

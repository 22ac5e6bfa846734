//! MySQL and MariaDB for the database sink (docs/database.md): one connection on a runtime of
//! its own, every call bounded on the client side as well as the server's, and every failure
//! classified by its error number (MySQL's SQLSTATEs are too coarse: 1366 and 3819 are both
//! `HY000`).
//!
//! The session is strict (`STRICT_ALL_TABLES`: a value that does not fit its column is an
//! error, never a warning and a 0) and `READ COMMITTED` (little gap locking between writers of
//! one table); the server bounds a lock wait (`innodb_lock_wait_timeout`) and, on MariaDB, a
//! statement (`max_statement_time`) and a zombie's open transaction
//! (`idle_transaction_timeout`); MySQL has no bound on an idle transaction, only on an idle
//! session (`wait_timeout`), which the sink's sessions set on both and keep alive while idle
//! ([`Session::keepalive`]), so that only a zombie's connection (and its transaction) ends.
//! The client has no query timeout of its own: a call past its
//! bound drops the connection and ends it on the server (`KILL CONNECTION`, from a second
//! one), so it is not used again.
//!
//! [`offsets`] is the offsets table (exactly's, or the Spark recipes' `kafka_offset`),
//! [`rows`] the rows' table and the dead-letter table; [`My`] is the three as the sink's
//! [`Session`].

pub mod offsets;
pub mod rows;

use std::sync::Mutex;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::{
    Advance, Bounds, Claimed, DeadLetter, DeadLetterRead, Described, Failure, Kind, NotOpen,
    ReadTarget, Reader, Session, Step, Target, Unwritten, Write,
};

/// Whether `url` is a MySQL URL this build can use, and whether it holds a password.
pub fn check_url(url: &str) -> Result<bool, String> {
    // The crate's message quotes the URL, query parameters and all: not printed.
    let opts = mysql_async::Opts::from_url(url)
        .map_err(|_| "not a MySQL URL (mysql://user@host:port/database)".to_string())?;
    if opts.ssl_opts().is_some() {
        // This build's client has no TLS (mysql_async's minimal-rust): it would panic at
        // connect.
        return Err("TLS (require_ssl) is not supported for MySQL by this build".into());
    }
    if opts.db_name().is_none() {
        return Err("the URL names no database (mysql://user@host:port/database)".into());
    }
    Ok(opts.pass().is_some())
}

impl From<mysql_async::Error> for Failure {
    fn from(e: mysql_async::Error) -> Failure {
        match e {
            mysql_async::Error::Server(s) => Failure {
                kind: kind(s.code),
                code: Some(s.code.to_string()),
                closed: lost(s.code),
                message: s.message,
            },
            // The socket, the protocol or the client: the connection is not to be trusted.
            other => Failure::lost(other.to_string()),
        }
    }
}

/// What a server error number means for the sink.
fn kind(code: u16) -> Kind {
    match code {
        1048 => Kind::Data("NOT_NULL_VIOLATION"),
        1062 => Kind::Data("UNIQUE_VIOLATION"),
        1451 | 1452 => Kind::Data("FOREIGN_KEY_VIOLATION"),
        // MariaDB's CHECK, MySQL's.
        4025 | 3819 => Kind::Data("CHECK_VIOLATION"),
        1366 | 1367 | 1411 => Kind::Data("INVALID_TEXT_REPRESENTATION"),
        1264 | 1690 => Kind::Data("NUMERIC_VALUE_OUT_OF_RANGE"),
        1265 | 1406 => Kind::Data("STRING_DATA_RIGHT_TRUNCATION"),
        1292 => Kind::Data("INVALID_DATETIME"),
        1364 => Kind::Data("NOT_NULL_VIOLATION"),
        // An object or array for a scalar column (JSON_TABLE's ERROR ON ERROR), invalid
        // JSON for a JSON column (MySQL).
        4178 | 3140 => Kind::Data("DATA_EXCEPTION"),
        // A deadlock (the whole transaction rolled back), a lock wait past its bound, a row
        // changed under a consistent read.
        1213 | 1205 | 1020 => Kind::Conflict,
        // A wrong password, no such database.
        1045 | 1049 | 1698 => Kind::Refused,
        // A permission; no such table or column.
        1044 | 1142 | 1143 | 1227 | 1146 | 1054 => Kind::Setup,
        _ => Kind::Other,
    }
}

/// Server errors after which the server has closed the connection: killed (1927), shutting
/// down (1053), an idle transaction ended (4031, MariaDB's idle_transaction_timeout).
fn lost(code: u16) -> bool {
    matches!(code, 1927 | 1053 | 4031)
}

/// `name` as a MySQL identifier: `schema.table` or `table` ([`super::name_parts`]), each part
/// in backticks.
pub fn identifier(name: &str) -> Result<String, String> {
    let parts = super::name_parts(name)?;
    Ok(parts
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join("."))
}

/// A column name (from the catalog: anything) in backticks.
fn column(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `name`'s schema (`None`: the connection's database) and table, for the catalog's tables.
fn schema_and_table(name: &str) -> Result<(Option<String>, String), String> {
    let mut parts = super::name_parts(name)?;
    let table = parts.pop().unwrap_or_default().to_string();
    Ok((parts.pop().map(str::to_string), table))
}

/// One connection to MySQL or MariaDB.
pub struct Conn {
    /// Always `Some` but in `drop`, which shuts it down without waiting.
    runtime: Option<tokio::runtime::Runtime>,
    /// `None` once it failed so that it is not to be trusted.
    conn: Mutex<Option<mysql_async::Conn>>,
    /// How to connect again, for the `KILL` of a call past its bound.
    opts: mysql_async::Opts,
    /// The server's id of this connection.
    id: u32,
    bounds: Bounds,
    /// MariaDB, not MySQL.
    mariadb: bool,
    /// The server's `max_allowed_packet`.
    max_packet: usize,
    /// When the last call ended.
    last: Mutex<std::time::Instant>,
}

impl Conn {
    /// Connects to `url` (`mysql://user@host:port/db`), with `password` if given (kept out of
    /// the URL, so logs never show it), and sets the session up: strict, read committed,
    /// bounded.
    pub fn connect(url: &str, password: Option<&str>, bounds: Bounds) -> Result<Conn, Failure> {
        bounds.check()?;
        check_url(url).map_err(Failure::client)?;
        let parsed = mysql_async::Opts::from_url(url)
            .map_err(|_| Failure::client("not a MySQL URL".into()))?;
        let mut builder = mysql_async::OptsBuilder::from_opts(parsed)
            // An UPDATE that matches a row counts it, changed or not: the compare-and-set
            // tells a fenced partition from one whose offset did not move.
            .client_found_rows(true)
            // The URL's host and port, not a socket found through them.
            .prefer_socket(false)
            .tcp_nodelay(true);
        if let Some(p) = password {
            builder = builder.pass(Some(p));
        }
        let opts: mysql_async::Opts = builder.into();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::client(format!("a runtime for MySQL: {e}")))?;
        let wait = bounds.client_wait();
        let connect = async {
            let mut conn = mysql_async::Conn::new(opts.clone()).await?;
            let version: Option<String> = conn.query_first("SELECT VERSION()").await?;
            let mariadb = version.is_some_and(|v| v.contains("MariaDB"));
            let max_packet: Option<u64> = conn.query_first("SELECT @@max_allowed_packet").await?;
            for sql in session_setup(&bounds, mariadb) {
                conn.query_drop(sql).await?;
            }
            Ok::<_, mysql_async::Error>((conn, mariadb, max_packet))
        };
        let (conn, mariadb, max_packet) =
            match runtime.block_on(async { tokio::time::timeout(wait, connect).await }) {
                Ok(connected) => connected?,
                Err(_) => {
                    return Err(Failure::client(format!("no connection within {wait:?}")));
                }
            };
        let max_packet = max_packet
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(4 << 20);
        Ok(Conn {
            id: conn.id(),
            runtime: Some(runtime),
            conn: Mutex::new(Some(conn)),
            opts,
            bounds,
            mariadb,
            max_packet,
            last: Mutex::new(std::time::Instant::now()),
        })
    }

    /// How long since the last call ended.
    pub fn idle(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Runs `work` with the connection, bounded: the server ends a lock wait (and on MariaDB
    /// a statement) past its bound itself; the client waits a second longer, for a server that
    /// does not answer at all, then drops the connection and ends it on the server.
    pub fn call<T>(
        &self,
        work: impl AsyncFnOnce(&mut mysql_async::Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, Failure> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let Some(conn) = guard.as_mut() else {
            return Err(Failure::lost(
                "this connection failed earlier: connect again".into(),
            ));
        };
        let Some(runtime) = &self.runtime else {
            return Err(Failure::client("the connection is closing".into()));
        };
        let wait = self.bounds.client_wait();
        let done = runtime.block_on(async { tokio::time::timeout(wait, work(conn)).await });
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
        match done {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => {
                let failure = Failure::from(e);
                if failure.closed {
                    *guard = None;
                }
                Err(failure)
            }
            Err(_) => {
                // Mid-call: nothing more can go through it.
                *guard = None;
                drop(guard);
                let how = match self.kill(runtime, wait) {
                    Ok(()) => "ended on the server",
                    Err(_) => "could not be ended on the server",
                };
                Err(Failure::lost(format!(
                    "no answer within {wait:?}; the connection was {how}"
                )))
            }
        }
    }

    /// Ends this connection on the server, from another: its statement stops, its
    /// transaction rolls back (unless it was committing: then nobody knows but the offsets
    /// table).
    fn kill(&self, runtime: &tokio::runtime::Runtime, wait: Duration) -> Result<(), Failure> {
        let id = self.id;
        let kill = async {
            let mut other = mysql_async::Conn::new(self.opts.clone()).await?;
            other.query_drop(format!("KILL CONNECTION {id}")).await?;
            other.disconnect().await
        };
        match runtime.block_on(async { tokio::time::timeout(wait, kill).await }) {
            Ok(done) => done.map_err(Failure::from),
            Err(_) => Err(Failure::client("no answer".into())),
        }
    }

    /// Whether calls can go through this connection.
    pub fn usable(&self) -> bool {
        let guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        guard.is_some()
    }

    /// Runs `sql` (a statement without parameters), bounded.
    pub fn batch(&self, sql: &str) -> Result<(), Failure> {
        self.call(async |c| c.query_drop(sql).await)
    }

    /// Whether the server is MariaDB.
    pub fn mariadb(&self) -> bool {
        self.mariadb
    }

    /// The server's `max_allowed_packet`.
    pub fn max_packet(&self) -> usize {
        self.max_packet
    }
}

impl Drop for Conn {
    /// The runtime goes without waiting for its tasks; the server sees the socket close and
    /// rolls back whatever was open.
    fn drop(&mut self) {
        let conn = self.conn.get_mut().map(Option::take);
        drop(conn);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The session's settings: strict, read committed, and the server's bounds (whole seconds
/// where the server counts in them, at least one).
fn session_setup(bounds: &Bounds, mariadb: bool) -> Vec<String> {
    let seconds = |d: Duration| d.as_secs_f64().ceil().max(1.0) as u64;
    let mut sql = vec![
        "SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ZERO_DATE,\
         NO_ZERO_IN_DATE,NO_ENGINE_SUBSTITUTION'"
            .to_string(),
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_string(),
        format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            seconds(bounds.statement)
        ),
    ];
    if mariadb {
        sql.push(format!(
            "SET SESSION max_statement_time = {:.3}, SESSION idle_transaction_timeout = {}",
            bounds.statement.as_secs_f64(),
            seconds(bounds.idle_in_transaction)
        ));
    } else {
        // MySQL bounds only SELECTs (max_execution_time) and has no idle-transaction bound.
        sql.push(format!(
            "SET SESSION max_execution_time = {}",
            bounds.statement.as_millis().max(1)
        ));
    }
    if let Some(idle) = bounds.idle_session {
        sql.push(format!("SET SESSION wait_timeout = {}", seconds(idle)));
    }
    sql
}

/// Whether the table `name` exists.
fn exists(conn: &Conn, name: &str) -> Result<bool, Failure> {
    let (schema, table) = schema_and_table(name).map_err(Failure::client)?;
    let n: Option<u64> = conn.call(async |c| {
        c.exec_first(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
            (schema.as_deref(), table.as_str()),
        )
        .await
    })?;
    Ok(n.unwrap_or(0) > 0)
}

/// MySQL or MariaDB as the sink's [`Session`]: one connection, the rows' table as the
/// catalog describes it, the offsets table and the dead-letter table.
pub struct My {
    conn: Conn,
    tables: Vec<rows::Table>,
    described: Vec<Described>,
    offsets: offsets::Offsets,
    dead: rows::DeadLetters,
}

impl My {
    /// Connects, creates the offsets and dead-letter tables when missing, describes the
    /// rows' table.
    pub fn open(target: &Target) -> Result<My, NotOpen> {
        let (at, setup) = (NotOpen::at, NotOpen::setup);
        let offsets =
            offsets::Offsets::new(&target.offsets, target.layout, &target.group, &target.owner)
                .map_err(setup(Step::Offsets))?;
        let dead = rows::DeadLetters::new(&target.dead).map_err(setup(Step::Dead))?;
        let conn = Conn::connect(&target.url, target.password.as_deref(), target.bounds)
            .map_err(at(Step::Connect))?;
        offsets.create(&conn).map_err(at(Step::Offsets))?;
        dead.create(&conn).map_err(at(Step::Dead))?;
        let tables = (target.tables.iter())
            .map(|t| rows::Table::describe(&conn, t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(at(Step::Rows))?;
        for (name, table) in target.tables.iter().zip(&tables) {
            if let Some(index) = table.other_unique()
                && target.write == Write::Upsert
            {
                // ON DUPLICATE KEY UPDATE fires on any unique index: a row would replace
                // another key's.
                return Err(setup(Step::Rows)(format!(
                    "table {name} has a unique index besides its primary key ({index}): rows \
                     are upserted by the primary key alone (or choose --db-mode insert)"
                )));
            }
        }
        let described = tables.iter().map(rows::Table::described).collect();
        Ok(My {
            conn,
            tables,
            described,
            offsets,
            dead,
        })
    }
}

impl Session for My {
    fn usable(&self) -> bool {
        self.conn.usable()
    }

    fn begin(&self, _immediate: bool) -> Result<(), Failure> {
        // No deferred constraints: each statement is checked as it runs.
        self.conn.batch("START TRANSACTION")
    }

    fn keepalive(&self) -> Result<(), Failure> {
        match self.conn.bounds.idle_session {
            Some(idle) if self.conn.idle() >= idle / 2 => self.conn.batch("DO 1"),
            _ => Ok(()),
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
            Some(t) => t.write(&self.conn, rows, how),
            None => Err(Unwritten::Batch(Failure::client(format!(
                "no table {table}"
            )))),
        }
    }

    fn write_dead(&self, copies: &[DeadLetter]) -> Result<(), Failure> {
        self.dead.write(&self.conn, copies)
    }

    fn advance(&self, topic: &str, moves: &[Advance]) -> Result<Vec<i32>, Failure> {
        self.offsets.advance(&self.conn, topic, moves)
    }

    fn commit(&self) -> Result<(), Failure> {
        self.conn.batch("COMMIT")
    }

    fn rollback(&self) -> Result<(), Failure> {
        self.conn.batch("ROLLBACK")
    }

    fn read(&self, topic: &str, partitions: &[i32]) -> Result<Vec<Claimed>, Failure> {
        self.offsets.read(&self.conn, topic, partitions)
    }

    fn claim(
        &self,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure> {
        self.offsets.claim(&self.conn, topic, partitions)
    }
}

/// MySQL or MariaDB as the audit reads it.
pub struct MyReader {
    conn: Conn,
    table: rows::Table,
    lineage: String,
    dead: rows::DeadLetters,
    /// The offsets table's name, and its layout.
    offsets: (String, crate::db::Layout),
}

impl MyReader {
    /// Connects and describes the rows' table.
    pub fn open(target: &ReadTarget) -> Result<(MyReader, Described), NotOpen> {
        let at = NotOpen::at;
        let dead = rows::DeadLetters::new(&target.dead).map_err(NotOpen::setup(Step::Dead))?;
        let conn = Conn::connect(&target.url, target.password.as_deref(), target.bounds)
            .map_err(at(Step::Connect))?;
        let table = rows::Table::describe(&conn, &target.rows).map_err(at(Step::Rows))?;
        let described = table.described();
        let reader = MyReader {
            conn,
            table,
            lineage: target.lineage_column.clone(),
            dead,
            offsets: target.offsets.clone(),
        };
        Ok((reader, described))
    }
}

impl Reader for MyReader {
    fn offsets(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>, Failure> {
        let (table, layout) = &self.offsets;
        let offsets = offsets::Offsets::new(table, *layout, group, "").map_err(Failure::client)?;
        let read = offsets.read(&self.conn, topic, partitions)?;
        Ok(read.into_iter().map(|c| (c.partition, c.next)).collect())
    }

    fn lineages(&self) -> Result<(Vec<String>, usize), Failure> {
        self.table.lineages(&self.conn, &self.lineage)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRead>, Failure> {
        self.dead.read(&self.conn)
    }

    fn differing(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Vec<String>)>, Failure> {
        self.table.differing(&self.conn, rows, &self.lineage)
    }

    fn holders(&self, rows: &[(usize, String)]) -> Result<Vec<(usize, Option<String>)>, Failure> {
        self.table.holders(&self.conn, rows, &self.lineage)
    }
}

/// A nullable BIGINT of a row read from the server, refused (not unwrapped) when it is not
/// one.
fn bigint(row: &mut mysql_async::Row, i: usize, what: &str) -> Result<Option<i64>, Failure> {
    match row.take_opt::<Option<i64>, _>(i) {
        Some(Ok(v)) => Ok(v),
        _ => Err(Failure::client(format!("{what}: not a 64-bit integer"))),
    }
}

/// Text of a row read from the server (`None`: NULL).
fn text(row: &mut mysql_async::Row, i: usize, what: &str) -> Result<Option<String>, Failure> {
    match row.take_opt::<Option<String>, _>(i) {
        Some(Ok(v)) => Ok(v),
        _ => Err(Failure::client(format!("{what}: not text"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_numbers_say_whose_failures_they_are() {
        assert_eq!(kind(1062), Kind::Data("UNIQUE_VIOLATION"));
        assert_eq!(kind(4025), Kind::Data("CHECK_VIOLATION"));
        assert_eq!(kind(1366), Kind::Data("INVALID_TEXT_REPRESENTATION"));
        assert_eq!(kind(4178), Kind::Data("DATA_EXCEPTION"));
        assert_eq!(kind(1213), Kind::Conflict);
        assert_eq!(kind(1205), Kind::Conflict);
        assert_eq!(kind(1045), Kind::Refused);
        assert_eq!(kind(1146), Kind::Setup);
        assert_eq!(kind(1969), Kind::Other);
        assert!(lost(1927) && lost(4031) && !lost(1062));
    }

    #[test]
    fn urls_with_tls_or_without_a_database_are_refused_and_a_password_is_seen() {
        assert_eq!(check_url("mysql://u@127.0.0.1:3306/db"), Ok(false));
        assert_eq!(check_url("mysql://u:secret@127.0.0.1:3306/db"), Ok(true));
        let tls = check_url("mysql://u@127.0.0.1:3306/db?require_ssl=true").unwrap_err();
        assert!(tls.contains("TLS"), "{tls}");
        let no_db = check_url("mysql://u@127.0.0.1:3306").unwrap_err();
        assert!(no_db.contains("no database"), "{no_db}");
        assert!(check_url("postgres://u@h/db").is_err());
    }

    #[test]
    fn names_are_quoted_in_backticks() {
        assert_eq!(identifier("sink.offsets").unwrap(), "`sink`.`offsets`");
        assert_eq!(column("we`ird"), "`we``ird`");
        assert_eq!(schema_and_table("t").unwrap(), (None, "t".to_string()));
        assert!(identifier("a`b").is_err());
    }

    #[test]
    fn the_session_is_strict_read_committed_and_bounded_in_whole_seconds() {
        let bounds = Bounds {
            statement: Duration::from_millis(2500),
            idle_in_transaction: Duration::from_millis(200),
            idle_session: None,
        };
        let maria = session_setup(&bounds, true).join("; ");
        assert!(maria.contains("STRICT_ALL_TABLES"), "{maria}");
        assert!(maria.contains("READ COMMITTED"), "{maria}");
        assert!(maria.contains("innodb_lock_wait_timeout = 3"), "{maria}");
        assert!(maria.contains("max_statement_time = 2.500"), "{maria}");
        assert!(maria.contains("idle_transaction_timeout = 1"), "{maria}");
        let mysql = session_setup(&bounds, false).join("; ");
        assert!(mysql.contains("max_execution_time = 2500") && !mysql.contains("idle_"));
        assert!(
            !mysql.contains(" wait_timeout"),
            "a reader's: the server's default"
        );
    }

    /// MySQL has no bound on an idle transaction: the sink's session bounds an idle session
    /// instead (a zombie's connection closes, its transaction rolls back), on MariaDB alike.
    #[test]
    fn the_sinks_session_bounds_an_idle_session_where_the_server_has_nothing_else() {
        let bounds = Bounds {
            statement: Duration::from_millis(2500),
            idle_in_transaction: Duration::from_millis(2500),
            idle_session: Some(Duration::from_millis(2500)),
        };
        for mariadb in [false, true] {
            let sql = session_setup(&bounds, mariadb).join("; ");
            assert!(sql.contains("SET SESSION wait_timeout = 3"), "{sql}");
        }
    }
}

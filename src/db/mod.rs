//! PostgreSQL, for the database sink (docs/database.md): one connection on a runtime of its
//! own (the sink's loop is synchronous), every call bounded on the client side as well as the
//! server's, and every failure with its SQLSTATE, so the sink can tell a deadlock from a bad
//! row from a lost connection.
//!
//! [`offsets`] is the offsets table: each partition's next offset and its owner's epoch, moved
//! by compare-and-set in the transaction that writes the rows; [`rows`] writes the rows.

pub mod offsets;
pub mod rows;

use std::future::Future;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// A PostgreSQL call that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    /// The SQLSTATE, when the server said why (`40P01`: a deadlock).
    pub code: Option<String>,
    /// The connection is gone, or no longer to be trusted (a call past its bound: the server
    /// may still run it, or a late cancel may hit the next one): nothing more goes through
    /// it; connect again. A COMMIT that failed so has an unknown outcome (the offsets table
    /// tells).
    pub closed: bool,
    /// For people: the server's message and detail, or the client's.
    pub message: String,
}

impl Failure {
    pub(crate) fn client(message: String) -> Failure {
        Failure {
            code: None,
            closed: false,
            message,
        }
    }

    /// Whether the server refused the statement for the data in it (classes 22, data, 23,
    /// integrity constraints, and 54, a limit such as an index row too large): the row is at
    /// fault, not the database.
    pub fn is_data(&self) -> bool {
        self.code
            .as_deref()
            .is_some_and(|c| c.starts_with("22") || c.starts_with("23") || c.starts_with("54"))
    }

    /// Whether trying the transaction again may succeed (class 40: serialization failures
    /// and deadlocks).
    pub fn is_retryable(&self) -> bool {
        self.code.as_deref().is_some_and(|c| c.starts_with("40"))
    }
}

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
        Failure {
            code: e.code().map(|c| c.code().to_string()),
            closed: e.is_closed() || fatal,
            message,
        }
    }
}

/// How much longer than the server's bound the client waits.
const CLIENT_MARGIN: Duration = Duration::from_secs(1);

/// How long the server lets one statement, one lock wait and an idle transaction run, and
/// how long the client waits for any answer.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The server's `statement_timeout` and `lock_timeout`, and the client's wait.
    pub statement: Duration,
    /// The server's `idle_in_transaction_session_timeout`: a zombie's open transaction ends.
    pub idle_in_transaction: Duration,
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
        if bounds.statement.is_zero() || bounds.idle_in_transaction.is_zero() {
            // 0 is "no bound" to the server: every call is bounded.
            return Err(Failure::client("a PostgreSQL bound of 0".into()));
        }
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
            return Err(Failure {
                closed: true,
                ..Failure::client("this connection ran past a bound earlier: connect again".into())
            });
        }
        let wait = self.bounds.statement + CLIENT_MARGIN;
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
                Err(Failure {
                    closed: true,
                    ..Failure::client(format!("no answer within {wait:?}; the query {how}"))
                })
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

/// `name` as an SQL identifier: `schema.table` or `table`, each part letters, digits and `_`,
/// quoted (so a name is never SQL).
pub fn identifier(name: &str) -> Result<String, String> {
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
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
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
        for bad in [
            "",
            "a.b.c",
            "1abc",
            "a-b",
            "a\"; drop table x; --",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(identifier(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn failures_say_whose_they_are() {
        let of = |code: &str| Failure {
            code: Some(code.into()),
            closed: false,
            message: String::new(),
        };
        assert!(of("23505").is_data() && of("22P02").is_data() && !of("40P01").is_data());
        assert!(of("40P01").is_retryable() && of("40001").is_retryable());
        assert!(!of("57P01").is_retryable() && !Failure::client("x".into()).is_data());
    }
}

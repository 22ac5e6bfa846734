//! The test databases (`scripts/stores.sh`): a real PostgreSQL 15 and a real MariaDB, reached
//! the same way, so a database-sink test runs against both.

use std::time::Duration;

use exactly::db::{Backend, Bounds};

/// Both databases, for tests that run against each.
pub const BACKENDS: [Backend; 2] = [Backend::Postgres, Backend::Mysql];

/// The test server's URL for `backend` (no password: that is in
/// `EXACTLY_TEST_STORE_PASSWORD`).
pub fn db_url(backend: Backend) -> String {
    let var = match backend {
        Backend::Postgres => "EXACTLY_TEST_POSTGRES_URL",
        Backend::Mysql => "EXACTLY_TEST_MYSQL_URL",
    };
    std::env::var(var).unwrap_or_else(|_| panic!("{var}: run the tests through scripts/test.sh"))
}

/// The test servers' password.
pub fn db_password() -> String {
    std::env::var("EXACTLY_TEST_STORE_PASSWORD").expect("EXACTLY_TEST_STORE_PASSWORD")
}

/// A table name of its own for each test (letters, digits and `_`, short enough for MySQL).
pub fn unique_table(prefix: &str) -> String {
    crate::common::unique(prefix).replace('-', "_")
}

/// A connection to a test database, for a test's own statements.
pub enum Sql {
    Postgres(exactly::db::postgres::Db),
    Mysql(exactly::db::mysql::Conn),
}

impl Sql {
    /// Connects to the test server of `backend`.
    pub fn connect(backend: Backend) -> Sql {
        Sql::connect_to(backend, &db_url(backend)).expect("connected")
    }

    /// Connects to `url`.
    pub fn connect_to(backend: Backend, url: &str) -> Result<Sql, exactly::db::Failure> {
        Sql::connect_with(backend, url, &db_password())
    }

    /// Connects to `url` with `password`.
    pub fn connect_with(
        backend: Backend,
        url: &str,
        password: &str,
    ) -> Result<Sql, exactly::db::Failure> {
        let bounds = Bounds {
            statement: Duration::from_secs(10),
            idle_in_transaction: Duration::from_secs(30),
            idle_session: None,
        };
        Ok(match backend {
            Backend::Postgres => Sql::Postgres(exactly::db::postgres::Db::connect(
                url,
                Some(password),
                bounds,
            )?),
            Backend::Mysql => Sql::Mysql(exactly::db::mysql::Conn::connect(
                url,
                Some(password),
                bounds,
            )?),
        })
    }

    pub fn backend(&self) -> Backend {
        match self {
            Sql::Postgres(_) => Backend::Postgres,
            Sql::Mysql(_) => Backend::Mysql,
        }
    }

    /// `name` quoted for this server.
    pub fn quote(&self, name: &str) -> String {
        match self {
            Sql::Postgres(_) => format!("\"{name}\""),
            Sql::Mysql(_) => format!("`{name}`"),
        }
    }

    /// Runs `sql`, a statement without results.
    pub fn try_batch(&self, sql: &str) -> Result<(), exactly::db::Failure> {
        match self {
            Sql::Postgres(db) => db.batch(sql),
            Sql::Mysql(conn) => conn.batch(sql),
        }
    }

    pub fn batch(&self, sql: &str) {
        self.try_batch(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// The rows `sql` selects, every value as text (`None`: NULL).
    pub fn try_rows(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, exactly::db::Failure> {
        match self {
            Sql::Postgres(db) => {
                let messages = db.call(|c| async move { c.simple_query(sql).await })?;
                Ok(messages
                    .iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                        }
                        _ => None,
                    })
                    .collect())
            }
            Sql::Mysql(conn) => {
                use mysql_async::prelude::Queryable;
                let rows: Vec<mysql_async::Row> = conn.call(async |c| c.query(sql).await)?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| match r.as_ref(i) {
                                None | Some(mysql_async::Value::NULL) => None,
                                Some(mysql_async::Value::Bytes(b)) => {
                                    Some(String::from_utf8_lossy(b).into_owned())
                                }
                                Some(v) => Some(v.as_sql(true).trim_matches('\'').to_string()),
                            })
                            .collect()
                    })
                    .collect())
            }
        }
    }

    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.try_rows(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// The one number `sql` selects (0 for NULL).
    pub fn count(&self, sql: &str) -> i64 {
        let rows = self.rows(sql);
        let value = rows.first().and_then(|r| r.first()).cloned().flatten();
        value.map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("{sql}: {v}")))
    }
}

/// Database servers of a test's own (`scripts/stores.sh` in a temporary directory), stopped
/// when dropped: for a test that restarts them.
pub struct OwnServers {
    dir: tempfile::TempDir,
    /// Their URLs and password, as `scripts/stores.sh start` printed them.
    exports: std::collections::HashMap<String, String>,
}

impl OwnServers {
    pub fn start() -> OwnServers {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(crate::common::repo().join("scripts/stores.sh"))
            .arg("start")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let exports = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OwnServers { dir, exports }
    }

    /// The URL of the server of `backend`.
    pub fn url(&self, backend: Backend) -> String {
        let var = match backend {
            Backend::Postgres => "EXACTLY_TEST_POSTGRES_URL",
            Backend::Mysql => "EXACTLY_TEST_MYSQL_URL",
        };
        self.exports[var].clone()
    }

    pub fn password(&self) -> String {
        self.exports["EXACTLY_TEST_STORE_PASSWORD"].clone()
    }

    /// Stops PostgreSQL and MariaDB, keeps them down for `down`, starts them again, data and
    /// ports kept.
    pub fn restart(&self, down: Duration) {
        let out = std::process::Command::new(crate::common::repo().join("scripts/stores.sh"))
            .arg("restart")
            .arg(self.dir.path())
            .arg(down.as_secs_f64().to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for OwnServers {
    fn drop(&mut self) {
        let _ = std::process::Command::new(crate::common::repo().join("scripts/stores.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// `url` with its port replaced by `port` (`scheme://user@host:PORT/db`).
pub fn with_port(url: &str, port: u16) -> String {
    let (head, tail) = url.split_once("://").expect("a URL");
    let (authority, path) = tail.split_once('/').unwrap_or((tail, ""));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    format!("{head}://{host}:{port}/{path}")
}

/// A TCP proxy in front of a test database, that a test can cut (every connection through it
/// closed, new ones refused) and restore: the database down, for the process that talks to it
/// through the proxy only.
pub struct Proxy {
    pub port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    /// A proxy to the server `url` names.
    pub fn start(url: &str) -> Proxy {
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        let tail = url.split_once("://").expect("a URL").1;
        let authority = tail.split('/').next().unwrap();
        let upstream = authority
            .rsplit_once('@')
            .map_or(authority, |(_, h)| h)
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            down: Default::default(),
            open: Default::default(),
        };
        let (down, open) = (proxy.down.clone(), proxy.open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if down.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    })
                };
                let mut tracked = open.lock().unwrap();
                tracked.push(client.try_clone().unwrap());
                tracked.push(server.try_clone().unwrap());
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        proxy
    }

    /// The database is down: every connection through the proxy closed, new ones refused.
    pub fn cut(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The database is back.
    pub fn restore(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

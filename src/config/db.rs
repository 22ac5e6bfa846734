//! The database sink's options (`--db-*`): outputs become rows of a table, and the offsets
//! live in the same database, moved in the transaction that writes the rows
//! (docs/database.md).

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse_duration;
use crate::db::kafka_offset::KafkaOffset;
use crate::db::{Backend, Layout, ReadTarget, Target, Write};
use crate::error::Error;

/// Options of the database sink.
#[derive(Clone, Debug, Args)]
pub struct DbArgs {
    /// Write outputs as rows of --db-table in this database, with the offsets in the same
    /// transaction, instead of to Kafka: PostgreSQL (postgres://user@host:port/db), MySQL or
    /// MariaDB (mysql://user@host:port/db). The password comes from --db-password-env or
    /// --db-password-file, never the URL.
    #[arg(
        long,
        env = "EXACTLY_DB_URL",
        value_name = "URL",
        requires = "db_table",
        conflicts_with_all = ["envelope", "transactional_id"]
    )]
    pub db_url: Option<String>,

    /// Environment variable that holds the database password.
    #[arg(
        long,
        env = "EXACTLY_DB_PASSWORD_ENV",
        value_name = "VAR",
        conflicts_with = "db_password_file",
        requires = "db_url"
    )]
    pub db_password_env: Option<String>,

    /// File that holds the database password (a mounted secret; one trailing newline is
    /// dropped).
    #[arg(
        long,
        env = "EXACTLY_DB_PASSWORD_FILE",
        value_name = "PATH",
        requires = "db_url"
    )]
    pub db_password_file: Option<std::path::PathBuf>,

    /// The table outputs are written to (`table` or `schema.table`): each output's value is a
    /// JSON object whose fields are its columns (a column missing is NULL). With
    /// --db-envelope, the tables outputs may name, comma-separated, the first the default.
    #[arg(
        long,
        env = "EXACTLY_DB_TABLE",
        value_name = "TABLE",
        value_delimiter = ',',
        requires = "db_url"
    )]
    pub db_table: Vec<String>,

    /// Each output is an envelope {"table", "op", "row"}: the row goes into (or with op
    /// "delete", out of) the table named (one of --db-table; default the first), by op
    /// insert, upsert or delete (default --db-mode); a delete's row needs only its key.
    #[arg(long, env = "EXACTLY_DB_ENVELOPE", requires = "db_url")]
    pub db_envelope: bool,

    /// upsert: a row replaces the one of its primary key. insert: rows are appended; a row
    /// whose key is taken is the record's fault (--on-error).
    #[arg(long, env = "EXACTLY_DB_MODE", value_enum, default_value_t = DbMode::Upsert, requires = "db_url")]
    pub db_mode: DbMode,

    /// The table of the group's offsets (created if missing) [default: exactly_offsets, or
    /// kafka_offset with --db-offsets-layout kafka-offset].
    #[arg(
        long,
        env = "EXACTLY_DB_OFFSETS_TABLE",
        value_name = "TABLE",
        requires = "db_url"
    )]
    pub db_offsets_table: Option<String>,

    /// exactly: exactly's own offsets table. kafka-offset (MySQL and MariaDB): the Spark
    /// recipes' kafka_offset(group_id, topic, partition_id, fromOffset, untilOffset), the
    /// job resuming from untilOffset, so a job that kept its offsets there hands over
    /// without replay; the owners' epochs go in <table>_owner beside it.
    #[arg(long, env = "EXACTLY_DB_OFFSETS_LAYOUT", value_enum, default_value_t = OffsetsLayout::Exactly, requires = "db_url")]
    pub db_offsets_layout: OffsetsLayout,

    /// The table dead-letter copies are written to, in the same transaction (created if
    /// missing) [default: <db-table>_dlq].
    #[arg(
        long,
        env = "EXACTLY_DB_DLQ_TABLE",
        value_name = "TABLE",
        requires = "db_url"
    )]
    pub db_dlq_table: Option<String>,

    /// A text column of --db-table that takes each row's lineage
    /// (<topic>/<partition>/<offset>/<index> of its input).
    #[arg(
        long,
        env = "EXACTLY_DB_LINEAGE_COLUMN",
        value_name = "COLUMN",
        requires = "db_url"
    )]
    pub db_lineage_column: Option<String>,

    /// The server's bound on one statement, one lock wait and an idle transaction
    /// (PostgreSQL's statement_timeout, lock_timeout, idle_in_transaction_session_timeout;
    /// MariaDB's max_statement_time, innodb_lock_wait_timeout, idle_transaction_timeout);
    /// the client waits a second longer, then ends the call on the server.
    #[arg(long, env = "EXACTLY_DB_STATEMENT_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_duration, requires = "db_url")]
    pub db_statement_timeout: Duration,
}

/// How rows are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DbMode {
    /// `INSERT … ON CONFLICT (key) DO UPDATE`: the last row of a key wins.
    Upsert,
    /// `INSERT`: a key taken is the row's fault.
    Insert,
}

/// How the offsets table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OffsetsLayout {
    /// (group_id, topic, partition, next_offset, owner_epoch, owner, updated).
    Exactly,
    /// kafka_offset(group_id, topic, partition_id, fromOffset, untilOffset).
    KafkaOffset,
}

/// The database sink, validated.
#[derive(Clone, Debug)]
pub struct DbConfig {
    /// Which database.
    pub backend: Backend,
    /// Its URL.
    pub url: String,
    /// Password, kept out of the URL.
    pub password: Option<String>,
    /// The rows' tables, the first the default.
    pub tables: Vec<String>,
    /// Each output is an envelope naming its table and operation.
    pub envelope: bool,
    /// How rows are written.
    pub mode: DbMode,
    /// The offsets table.
    pub offsets_table: String,
    /// Its layout.
    pub layout: Layout,
    /// The dead-letter table.
    pub dlq_table: String,
    /// The lineage column, if any.
    pub lineage_column: Option<String>,
    /// statement_timeout and lock_timeout.
    pub statement_timeout: Duration,
    /// The consumer group whose offsets the table keeps.
    pub group: String,
    /// This instance, as the offsets table names a partition's owner.
    pub owner: String,
    /// The name dead-letter copies are addressed to (they go to the --db-dlq-table).
    pub dlq_topic: String,
}

impl DbArgs {
    /// The database sink, if `--db-url` is set, keeping `group`'s offsets as `owner`;
    /// dead-letter copies addressed to `dlq_topic` go to its table.
    pub fn resolve(
        &self,
        group: &str,
        owner: &str,
        dlq_topic: &str,
    ) -> Result<Option<DbConfig>, Error> {
        let Some(url) = &self.db_url else {
            return Ok(None);
        };
        let tables = self.db_table.clone();
        let Some(table) = tables.first().cloned() else {
            return Err(Error::Config("--db-table: required with --db-url".into()));
        };
        if tables.len() > 1 && !self.db_envelope {
            return Err(Error::Config(
                "--db-table: several tables need --db-envelope (outputs name theirs)".into(),
            ));
        }
        let backend = Backend::of(url).map_err(|e| Error::Config(format!("--db-url: {e}")))?;
        let layout = match (self.db_offsets_layout, backend) {
            (OffsetsLayout::Exactly, _) => Layout::Exactly,
            (OffsetsLayout::KafkaOffset, Backend::Mysql) => Layout::KafkaOffset,
            (OffsetsLayout::KafkaOffset, Backend::Postgres) => {
                return Err(Error::Config(
                    "--db-offsets-layout: kafka-offset is the MySQL recipes' table: \
                     MySQL and MariaDB only"
                        .into(),
                ));
            }
        };
        let offsets_table = match (&self.db_offsets_table, layout) {
            (Some(t), _) => t.clone(),
            (None, Layout::Exactly) => "exactly_offsets".into(),
            (None, Layout::KafkaOffset) => KafkaOffset::default().table,
        };
        let dlq_table = self.dlq_table(&table, &tables, &offsets_table)?;
        if let Some(c) = &self.db_lineage_column
            && !crate::db::name_parts(c).is_ok_and(|_| !c.contains('.'))
        {
            return Err(Error::Config(format!(
                "--db-lineage-column: '{c}' is not a column name (letters, digits and _)"
            )));
        }
        check_url(url, backend)?;
        let password = password(&self.db_password_env, &self.db_password_file)?;
        if self.db_statement_timeout < Duration::from_millis(100) {
            return Err(Error::Config(
                "--db-statement-timeout: must be at least 100ms".into(),
            ));
        }
        Ok(Some(DbConfig {
            envelope: self.db_envelope,
            backend,
            url: url.clone(),
            password,
            tables,
            mode: self.db_mode,
            offsets_table,
            layout,
            dlq_table,
            lineage_column: self.db_lineage_column.clone(),
            statement_timeout: self.db_statement_timeout,
            group: group.to_string(),
            owner: owner.to_string(),
            dlq_topic: dlq_topic.to_string(),
        }))
    }

    /// The dead-letter table (`--db-dlq-table`, or the first table's name with `_dlq`), every
    /// table's name checked, none of the three the same.
    fn dlq_table(
        &self,
        table: &str,
        tables: &[String],
        offsets_table: &str,
    ) -> Result<String, Error> {
        let offsets_table = offsets_table.to_string();
        let name = |flag: &str, t: &str| {
            crate::db::name_parts(t)
                .map(|_| ())
                .map_err(|e| Error::Config(format!("{flag}: {e}")))
        };
        for t in tables {
            name("--db-table", t)?;
        }
        name("--db-offsets-table", &offsets_table)?;
        let dlq_table = (self.db_dlq_table.clone()).unwrap_or_else(|| format!("{table}_dlq"));
        name("--db-dlq-table", &dlq_table)?;
        for (flag, other) in [
            ("--db-offsets-table", &offsets_table),
            ("--db-dlq-table", &dlq_table),
        ] {
            if tables.contains(other) {
                return Err(Error::Config(format!(
                    "{flag}: '{other}' is also the --db-table"
                )));
            }
        }
        if offsets_table == dlq_table {
            return Err(Error::Config(format!(
                "--db-dlq-table: '{dlq_table}' is also the --db-offsets-table"
            )));
        }
        Ok(dlq_table)
    }
}

/// Refuses a URL the client cannot parse, one with a password in it, and a MySQL URL this
/// build cannot serve (TLS).
fn check_url(url: &str, backend: Backend) -> Result<(), Error> {
    let password_in_url = match backend {
        Backend::Postgres => {
            let Ok(parsed) = url.parse::<tokio_postgres::Config>() else {
                return Err(Error::Config(
                    "--db-url: not a PostgreSQL URL (postgres://user@host:port/database)".into(),
                ));
            };
            parsed.get_password().is_some()
        }
        Backend::Mysql => {
            crate::db::mysql::check_url(url).map_err(|e| Error::Config(format!("--db-url: {e}")))?
        }
    };
    if password_in_url {
        return Err(Error::Config(
            "--db-url: a password in the URL is refused (logs and process lists show it); \
             use --db-password-env or --db-password-file"
                .into(),
        ));
    }
    Ok(())
}

/// The password from `--db-password-env` or `--db-password-file`, if either is given.
fn password(
    env: &Option<String>,
    file: &Option<std::path::PathBuf>,
) -> Result<Option<String>, Error> {
    Ok(match (env, file) {
        (Some(var), _) => Some(
            std::env::var(var)
                .map_err(|_| Error::Config(format!("--db-password-env: ${var} is not set")))?,
        ),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!("--db-password-file: {}: {e}", path.display()))
            })?;
            Some(text.strip_suffix('\n').unwrap_or(&text).to_string())
        }
        (None, None) => None,
    })
}

/// `exactly audit` over a database sink's table: where its rows and dead-letter copies are.
#[derive(Clone, Debug, Args)]
pub struct AuditDbArgs {
    /// Audit a database sink's table in this database (as `exactly run --db-url`) instead of
    /// output topics: every row matched to its input by its lineage column, values compared by
    /// the database as the columns hold them.
    #[arg(
        long,
        env = "EXACTLY_DB_URL",
        value_name = "URL",
        requires_all = ["db_table", "db_lineage_column"],
        conflicts_with_all = ["output_topics", "dlq_topic"]
    )]
    pub db_url: Option<String>,

    /// Environment variable that holds the database password.
    #[arg(
        long,
        env = "EXACTLY_DB_PASSWORD_ENV",
        value_name = "VAR",
        conflicts_with = "db_password_file",
        requires = "db_url"
    )]
    pub db_password_env: Option<String>,

    /// File that holds the database password.
    #[arg(
        long,
        env = "EXACTLY_DB_PASSWORD_FILE",
        value_name = "PATH",
        requires = "db_url"
    )]
    pub db_password_file: Option<std::path::PathBuf>,

    /// The rows' table (`table` or `schema.table`).
    #[arg(
        long,
        env = "EXACTLY_DB_TABLE",
        value_name = "TABLE",
        requires = "db_url"
    )]
    pub db_table: Option<String>,

    /// Its lineage column (the run's --db-lineage-column): the audit matches rows to inputs
    /// by it.
    #[arg(
        long,
        env = "EXACTLY_DB_LINEAGE_COLUMN",
        value_name = "COLUMN",
        requires = "db_url"
    )]
    pub db_lineage_column: Option<String>,

    /// The dead-letter table [default: <db-table>_dlq].
    #[arg(
        long,
        env = "EXACTLY_DB_DLQ_TABLE",
        value_name = "TABLE",
        requires = "db_url"
    )]
    pub db_dlq_table: Option<String>,

    /// The offsets table (the run's --db-offsets-table): with --group-id, what the group
    /// processed is what the table says, not the Kafka group's copy [default: exactly_offsets,
    /// or kafka_offset with --db-offsets-layout kafka-offset].
    #[arg(
        long,
        env = "EXACTLY_DB_OFFSETS_TABLE",
        value_name = "TABLE",
        requires = "db_url"
    )]
    pub db_offsets_table: Option<String>,

    /// Its layout (the run's --db-offsets-layout).
    #[arg(long, env = "EXACTLY_DB_OFFSETS_LAYOUT", value_enum, default_value_t = OffsetsLayout::Exactly, requires = "db_url")]
    pub db_offsets_layout: OffsetsLayout,
}

impl AuditDbArgs {
    /// What to read, if `--db-url` is set; every call bounded by `timeout`.
    pub fn resolve(&self, timeout: Duration) -> Result<Option<ReadTarget>, Error> {
        let Some(url) = &self.db_url else {
            return Ok(None);
        };
        let backend = Backend::of(url).map_err(|e| Error::Config(format!("--db-url: {e}")))?;
        check_url(url, backend)?;
        let table = self.db_table.clone().unwrap_or_default();
        let dead = (self.db_dlq_table.clone()).unwrap_or_else(|| format!("{table}_dlq"));
        for (flag, name) in [("--db-table", &table), ("--db-dlq-table", &dead)] {
            crate::db::name_parts(name).map_err(|e| Error::Config(format!("{flag}: {e}")))?;
        }
        let lineage_column = self.db_lineage_column.clone().unwrap_or_default();
        if !crate::db::name_parts(&lineage_column).is_ok_and(|_| !lineage_column.contains('.')) {
            return Err(Error::Config(format!(
                "--db-lineage-column: '{lineage_column}' is not a column name (letters, digits and _)"
            )));
        }
        let layout = match self.db_offsets_layout {
            OffsetsLayout::Exactly => Layout::Exactly,
            OffsetsLayout::KafkaOffset => Layout::KafkaOffset,
        };
        let offsets = match (&self.db_offsets_table, layout) {
            (Some(t), _) => t.clone(),
            (None, Layout::Exactly) => "exactly_offsets".into(),
            (None, Layout::KafkaOffset) => KafkaOffset::default().table,
        };
        crate::db::name_parts(&offsets)
            .map_err(|e| Error::Config(format!("--db-offsets-table: {e}")))?;
        Ok(Some(ReadTarget {
            backend,
            url: url.clone(),
            password: password(&self.db_password_env, &self.db_password_file)?,
            bounds: crate::db::Bounds {
                statement: timeout,
                idle_in_transaction: timeout,
                idle_session: None,
            },
            rows: table,
            lineage_column,
            dead,
            offsets: (offsets, layout),
        }))
    }
}

impl DbConfig {
    /// What the sink opens.
    pub fn target(&self) -> Target {
        Target {
            backend: self.backend,
            url: self.url.clone(),
            password: self.password.clone(),
            bounds: crate::db::Bounds {
                statement: self.statement_timeout,
                // A commit's statements run back to back: an open transaction idle for
                // longer is a zombie's (a paused process), whose locks a new owner's claim
                // waits for. MySQL bounds only an idle session: the sink's keeps itself
                // alive, a zombie's does not.
                idle_in_transaction: self.statement_timeout,
                idle_session: Some(self.statement_timeout),
            },
            tables: self.tables.clone(),
            write: match self.mode {
                DbMode::Upsert => Write::Upsert,
                DbMode::Insert => Write::Insert,
            },
            lineage_column: self.lineage_column.clone(),
            offsets: self.offsets_table.clone(),
            layout: self.layout,
            dead: self.dlq_table.clone(),
            group: self.group.clone(),
            owner: self.owner.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: &str) -> DbArgs {
        DbArgs {
            db_url: Some(url.into()),
            db_password_env: None,
            db_password_file: None,
            db_table: vec!["rows".into()],
            db_envelope: false,
            db_mode: DbMode::Upsert,
            db_offsets_table: None,
            db_offsets_layout: OffsetsLayout::Exactly,
            db_dlq_table: None,
            db_lineage_column: None,
            db_statement_timeout: Duration::from_secs(10),
        }
    }

    fn refused(a: &DbArgs) -> String {
        match a.resolve("g", "i-0", "dlq") {
            Err(Error::Config(why)) => why,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn both_databases_are_taken_by_their_urls_and_the_offsets_table_follows_its_layout() {
        let pg = args("postgres://etl@db:5432/shop").resolve("g", "i-0", "dlq");
        let pg = pg.unwrap().unwrap();
        assert_eq!(
            (pg.backend, pg.layout, pg.offsets_table.as_str()),
            (Backend::Postgres, Layout::Exactly, "exactly_offsets")
        );
        let mut my = args("mysql://etl@db:3306/shop");
        my.db_offsets_layout = OffsetsLayout::KafkaOffset;
        let my = my.resolve("g", "i-0", "dlq").unwrap().unwrap();
        assert_eq!(
            (my.backend, my.layout, my.offsets_table.as_str()),
            (Backend::Mysql, Layout::KafkaOffset, "kafka_offset")
        );
        assert_eq!(my.dlq_table, "rows_dlq");
    }

    #[test]
    fn bad_database_settings_are_refused_naming_the_flag() {
        for (url, why) in [
            ("postgres://etl:secret@db/shop", "a password in the URL"),
            ("mysql://etl:secret@db:3306/shop", "a password in the URL"),
            ("mysql://etl@db:3306/shop?require_ssl=true", "TLS"),
            ("mysql://etl@db:3306", "no database"),
            ("redis://db:6379", "not a database URL"),
        ] {
            let e = refused(&args(url));
            assert!(e.starts_with("--db-url: ") && e.contains(why), "{url}: {e}");
        }
        let mut a = args("postgres://etl@db/shop");
        a.db_offsets_layout = OffsetsLayout::KafkaOffset;
        assert!(refused(&a).starts_with("--db-offsets-layout: "));
        let mut a = args("mysql://etl@db:3306/shop");
        a.db_offsets_table = Some("rows".into());
        assert!(refused(&a).starts_with("--db-offsets-table: "));
        let mut a = args("mysql://etl@db:3306/shop");
        a.db_table = vec!["rows`; drop".into()];
        assert!(refused(&a).starts_with("--db-table: "));
    }
}

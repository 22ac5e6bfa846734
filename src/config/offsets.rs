//! `exactly offsets show|import|export`: a group's position, and moving it to and from the
//! stores hand-kept offsets live in (Redis, MySQL, files).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{
    CONSUMER_OWNED, ClientArgs, KeyValue, check_passthrough, check_topic_name, parse_duration,
};
use crate::error::Error;
use crate::kafka::Settings;

/// `exactly offsets`.
#[derive(Debug, Args)]
pub struct OffsetsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: OffsetsCommand,
}

/// The offset commands.
#[derive(Debug, Subcommand)]
pub enum OffsetsCommand {
    /// The group's committed offset, last stable offset, high watermark and lag per partition.
    Show(ShowArgs),
    /// Commit the offsets a store holds (Redis, MySQL, a file) to the group, so that `exactly
    /// run` starts where the old job stopped. Validates first; --dry-run only prints the plan.
    Import(ImportArgs),
    /// Write the group's committed offsets to a store, in its layout (to roll a migration
    /// back).
    Export(ExportArgs),
}

/// The group and topics, on every offset command.
#[derive(Clone, Debug, Args)]
pub struct GroupArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "EXACTLY_BOOTSTRAP_SERVERS", value_name = "HOSTS")]
    pub bootstrap_servers: String,

    /// The consumer group (`exactly run --group-id`).
    #[arg(long, env = "EXACTLY_GROUP_ID", value_name = "GROUP")]
    pub group_id: String,

    /// The group's input topics, comma-separated.
    #[arg(
        long,
        env = "EXACTLY_INPUT_TOPICS",
        value_delimiter = ',',
        required = true,
        value_name = "TOPICS"
    )]
    pub input_topics: Vec<String>,

    /// An extra librdkafka setting for the clients, `k=v`; repeatable.
    ///
    /// The security and network settings `exactly run` has in its --consumer-config go here
    /// too.
    #[arg(long, env = "EXACTLY_CONSUMER_CONFIG", value_name = "K=V", value_parser = KeyValue, value_delimiter = ';', hide_env_values = true)]
    pub consumer_config: Vec<(String, String)>,

    /// Settings for every Kafka client (security, network).
    #[command(flatten)]
    pub client: ClientArgs,

    /// Bound on each call to Kafka or the store.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How to reach a store and how it lays offsets out.
#[derive(Clone, Debug, Args)]
pub struct StoreArgs {
    /// Redis hash key per topic and group; `{topic}` and `{group}` are filled in.
    #[arg(long, value_name = "PATTERN", default_value = "offset:{topic}:{group}")]
    pub redis_key: String,

    /// Redis hash field per partition; `{partition}` and `{group}` are filled in
    /// (`{group}|{partition}`: a hash named by the topic alone, shared by several groups,
    /// whose other groups' fields are left as they are).
    #[arg(long, value_name = "PATTERN", default_value = "{partition}")]
    pub redis_field: String,

    /// MySQL table of offsets.
    #[arg(long, value_name = "NAME", default_value = "kafka_offset")]
    pub mysql_table: String,

    /// Its consumer group column.
    #[arg(long, value_name = "NAME", default_value = "group_id")]
    pub mysql_group_column: String,

    /// Its topic column.
    #[arg(long, value_name = "NAME", default_value = "topic")]
    pub mysql_topic_column: String,

    /// Its partition column.
    #[arg(long, value_name = "NAME", default_value = "partition_id")]
    pub mysql_partition_column: String,

    /// Its column of the next offset to read.
    #[arg(long, value_name = "NAME", default_value = "untilOffset")]
    pub mysql_offset_column: String,

    /// Its column of the last batch's first offset, written with the same value on export;
    /// empty when the table has none.
    #[arg(long, value_name = "NAME", default_value = "fromOffset")]
    pub mysql_from_column: String,

    /// With a directory of offsets files (`file://DIR`), the file of it to read (import:
    /// instead of the newest batch) or to write (export).
    #[arg(long, value_name = "NAME")]
    pub file: Option<String>,

    /// Environment variable that holds the store's password.
    #[arg(long, value_name = "VAR", conflicts_with = "password_file")]
    pub password_env: Option<String>,

    /// File that holds the store's password (a mounted secret; one trailing newline is
    /// dropped).
    #[arg(long, value_name = "PATH")]
    pub password_file: Option<PathBuf>,
}

/// `exactly offsets show`.
#[derive(Clone, Debug, Args)]
pub struct ShowArgs {
    /// The group.
    #[command(flatten)]
    pub group: GroupArgs,
}

/// `exactly offsets import`.
#[derive(Clone, Debug, Args)]
pub struct ImportArgs {
    /// The group.
    #[command(flatten)]
    pub group: GroupArgs,

    /// The store: redis://host:port/db, mysql://user@host:port/db, or file://PATH (JSON or
    /// CSV; a directory: its last file by name).
    #[arg(long, value_name = "URL")]
    pub from: String,

    /// The store's layout and password.
    #[command(flatten)]
    pub store: StoreArgs,

    /// Where a partition the store has no offset for starts; by default that is an error.
    #[arg(long, value_enum, default_value_t = Missing::Error)]
    pub missing: Missing,

    /// Move an offset outside the partition's low and high watermarks to the nearest one,
    /// instead of refusing.
    #[arg(long)]
    pub clamp: bool,

    /// Print the plan (partition, offset now, new offset, lag after) and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `exactly offsets export`.
#[derive(Clone, Debug, Args)]
pub struct ExportArgs {
    /// The group.
    #[command(flatten)]
    pub group: GroupArgs,

    /// The store to write to (the URLs of `import --from`).
    #[arg(long, value_name = "URL")]
    pub to: String,

    /// The store's layout and password.
    #[command(flatten)]
    pub store: StoreArgs,

    /// Print what would be written, and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl GroupArgs {
    /// The group and topics, checked.
    pub fn target(&self) -> Result<Target, Error> {
        for t in &self.input_topics {
            check_topic_name("--input-topics", t)?;
        }
        if self.group_id.trim().is_empty() {
            return Err(Error::Config("--group-id: must not be empty".into()));
        }
        check_passthrough("--consumer-config", &self.consumer_config, CONSUMER_OWNED)?;
        Ok(Target {
            kafka: Settings {
                bootstrap_servers: self.bootstrap_servers.clone(),
                client_id: "exactly-offsets".into(),
                common: self.client.resolve()?,
                consumer: self.consumer_config.clone(),
                producer: Vec::new(),
            },
            group: self.group_id.clone(),
            topics: self.input_topics.clone(),
            timeout: self.timeout,
        })
    }
}

impl StoreArgs {
    /// The store options, the password read from where it is kept.
    pub fn options(&self, target: &Target) -> Result<StoreOptions, Error> {
        let password = match (&self.password_env, &self.password_file) {
            (Some(var), _) => {
                Some(Password(std::env::var(var).map_err(|_| {
                    Error::Config(format!("--password-env: ${var} is not set"))
                })?))
            }
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::Config(format!("--password-file: {}: {e}", path.display()))
                })?;
                Some(Password(
                    text.strip_suffix('\n').unwrap_or(&text).to_string(),
                ))
            }
            (None, None) => None,
        };
        Ok(StoreOptions {
            kafka: target.kafka.clone(),
            timeout: target.timeout,
            redis_key: self.redis_key.clone(),
            redis_field: self.redis_field.clone(),
            file: self.file.clone(),
            mysql: Layout {
                table: self.mysql_table.clone(),
                group: self.mysql_group_column.clone(),
                topic: self.mysql_topic_column.clone(),
                partition: self.mysql_partition_column.clone(),
                offset: self.mysql_offset_column.clone(),
                from: self.mysql_from_column.clone(),
            },
            password,
        })
    }
}

/// The group and topics a command works on.
#[derive(Clone, Debug)]
pub struct Target {
    /// The cluster.
    pub kafka: Settings,
    /// The consumer group (`exactly run --group-id`).
    pub group: String,
    /// Its input topics.
    pub topics: Vec<String>,
    /// Bound on each call.
    pub timeout: Duration,
}

/// Where a partition without an offset in the store starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Missing {
    /// Refuse: every partition must be in the store.
    Error,
    /// The partition's low watermark.
    Earliest,
    /// The partition's high watermark.
    Latest,
}

/// How the hand-kept stores lay their offsets out, and how to reach them.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The Kafka cluster (for `kafka:`).
    pub kafka: Settings,
    /// Bound on each call.
    pub timeout: Duration,
    /// Redis hash key, with `{topic}` and `{group}` filled in.
    pub redis_key: String,
    /// Redis hash field, with `{partition}` and `{group}` filled in.
    pub redis_field: String,
    /// In a directory of offsets files, the one to read.
    pub file: Option<String>,
    /// The MySQL table and its columns.
    pub mysql: Layout,
    /// The store's password (from an environment variable or a file, never the command line).
    pub password: Option<Password>,
}

impl StoreOptions {
    /// Options for the Kafka group alone.
    pub fn kafka(kafka: &Settings, timeout: Duration) -> StoreOptions {
        StoreOptions {
            kafka: kafka.clone(),
            timeout,
            redis_key: String::new(),
            redis_field: String::new(),
            file: None,
            mysql: Layout::default(),
            password: None,
        }
    }
}

/// The MySQL table and its columns: the recipes' `kafka_offset`, each part renamed by its
/// `--mysql-*` option.
pub use crate::db::kafka_offset::KafkaOffset as Layout;

/// Every name of `layout` is a plain identifier (they are written into the SQL, not bound);
/// `Err` names the option of the first that is not.
pub fn check_layout(layout: &Layout) -> Result<(), Error> {
    let Some((part, name)) = layout.not_plain() else {
        return Ok(());
    };
    let flag = match part {
        "table" => "--mysql-table".to_string(),
        part => format!("--mysql-{part}-column"),
    };
    Err(Error::Config(format!(
        "{flag}: '{name}' is not a plain table or column name (a-z A-Z 0-9 _)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_identifiers_are_refused() {
        assert!(check_layout(&Layout::default()).is_ok());
        let l = Layout {
            table: "kafka_offset`; DROP TABLE x; --".into(),
            ..Layout::default()
        };
        assert!(
            check_layout(&l)
                .unwrap_err()
                .to_string()
                .contains("--mysql-table")
        );
        let l = Layout {
            from: String::new(),
            ..Layout::default()
        };
        assert!(check_layout(&l).is_ok(), "no fromOffset column is allowed");
        let l = Layout {
            offset: "until-offset".into(),
            ..Layout::default()
        };
        let e = check_layout(&l).unwrap_err().to_string();
        assert!(e.contains("--mysql-offset-column"), "{e}");
    }
}

/// A password: only [`Password::expose`] gives it out; `{:?}` prints `***`.
#[derive(Clone)]
pub struct Password(pub String);

impl Password {
    /// The password itself, for the store's client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

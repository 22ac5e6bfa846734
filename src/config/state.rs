//! `exactly state show|import`: the dedup's changelog, read for one key, and loaded from the
//! Redis sets the seed's job kept (`dau:<dt>` → device ids).

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::{ClientArgs, check_topic_name, parse_duration};
use crate::error::Error;
use crate::kafka::Settings;

/// `exactly state`.
#[derive(Debug, Args)]
pub struct StateArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: StateCommand,
}

/// The state commands.
#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// The windows a key was seen in, as the changelog holds them (committed records), one
    /// JSON object a line.
    Show(ShowArgs),
    /// Load the seed's Redis sets (`dau:<dt>` → members) into the changelog, each member to
    /// the partition its input records land in, so the first day after the cut-over does not
    /// count a device twice. Run it with the pipeline stopped (a running instance sees the keys
    /// at its next restore).
    Import(ImportArgs),
}

/// The changelog, on every state command.
#[derive(Clone, Debug, Args)]
pub struct ChangelogArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "EXACTLY_BOOTSTRAP_SERVERS", value_name = "HOSTS")]
    pub bootstrap_servers: String,

    /// The changelog topic (`exactly run --state-changelog`, `<group-id>.dedup-changelog` by
    /// default).
    ///
    /// Its partition n holds the keys of the input's partition n.
    #[arg(
        long,
        alias = "dedup-changelog",
        env = "EXACTLY_STATE_CHANGELOG",
        value_name = "TOPIC"
    )]
    pub state_changelog: String,

    /// Settings for every Kafka client (security, network).
    #[command(flatten)]
    pub client: ClientArgs,

    /// Bound on each call to Kafka or Redis.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `exactly state show`.
#[derive(Clone, Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub changelog: ChangelogArgs,

    /// The key (its bytes as text: the Kafka key, or what --window-key yields).
    #[arg(long, value_name = "KEY")]
    pub key: String,
}

/// How the input's producers chose a partition for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Partitioner {
    /// Java clients' default (murmur2, positive, modulo the partition count).
    Murmur2,
    /// librdkafka's default (`consistent_random`: CRC-32 of the key).
    Crc32,
}

/// `exactly state import`.
#[derive(Clone, Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub changelog: ChangelogArgs,

    /// The pipeline's input topic: its partition count places each key.
    #[arg(long, value_name = "TOPIC")]
    pub input_topic: String,

    /// The Redis server holding the sets (`redis://[:password@]host:port/db`).
    #[arg(
        long,
        env = "EXACTLY_REDIS_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// The sets to load: a prefix and `*`, where the rest of the name is the day (`2026-12-02`
    /// or `20261202`).
    #[arg(long, value_name = "PATTERN", default_value = "dau:*")]
    pub redis_pattern: String,

    /// The time zone the days are local to (`exactly run --window-time-zone`).
    #[arg(
        long,
        alias = "dedup-time-zone",
        value_name = "TZ",
        default_value = "UTC"
    )]
    pub window_time_zone: String,

    /// The grace `exactly run` uses (the changelog's retention, when this creates it).
    #[arg(long, alias = "dedup-grace", value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub window_grace: Duration,

    /// How the input's producers partition by key.
    #[arg(long, value_enum, default_value_t = Partitioner::Murmur2)]
    pub partitioner: Partitioner,

    /// Print what would be written, write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl ChangelogArgs {
    /// The client settings and the changelog's name, checked.
    pub fn resolve(&self) -> Result<Settings, Error> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(Error::Config(
                "--bootstrap-servers: must not be empty".into(),
            ));
        }
        check_topic_name("--state-changelog", &self.state_changelog)?;
        Ok(Settings {
            bootstrap_servers: self.bootstrap_servers.clone(),
            client_id: "exactly-state".into(),
            common: self.client.resolve()?,
            consumer: Vec::new(),
            producer: Vec::new(),
        })
    }
}

impl ImportArgs {
    /// The prefix of the sets' names (before the `*`).
    pub fn prefix(&self) -> Result<&str, Error> {
        match self.redis_pattern.strip_suffix('*') {
            Some(p) if !p.contains(['*', '?', '[']) => Ok(p),
            _ => Err(Error::Config(format!(
                "--redis-pattern: '{}' must be a prefix and one trailing * (dau:*)",
                self.redis_pattern
            ))),
        }
    }
}

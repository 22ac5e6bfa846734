//! Command line and environment: every option is a long flag and an `EXACTLY_…` variable.
//!
//! Parsing (clap) catches malformed values; each subcommand's `validate` checks how values fit
//! together and resolves defaults. Both happen before any Kafka client exists, so a bad value
//! fails start-up with a message naming the option and nothing is consumed or produced.
//!
//! - [`run`]: `exactly run` ([`RunArgs`] → [`Config`]);
//! - [`audit`]: `exactly audit` ([`AuditArgs`] → [`AuditConfig`]);
//! - [`transform`]: the transform and its error policy, shared by both (the audit replays it);
//! - here: the command line itself and the parsing both subcommands share.

pub mod audit;
pub mod db;
pub mod dedup;
mod fit;
pub mod offsets;
pub mod run;
pub mod state;
pub mod transform;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::Error;
use crate::kafka::Common;

pub use audit::{AuditArgs, AuditConfig, Bound, Plan};
pub use dedup::{AggregateConfig, DedupArgs, DedupConfig, DedupStateArgs, Emit, Late};
pub use run::{
    CommitPolicy, Config, ErrorPolicy, GroupConfig, Guarantee, Input, RunArgs, SinkConfig,
    TestAborts, TestSwitches,
};
pub use transform::{CallArgs, CallSpec, OnError, TransformArgs, TransformConfig, TransformSpec};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "exactly",
    version,
    about = "Kafka to Kafka through a transform, exactly once"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume, transform and produce, committing outputs and offsets in one transaction.
    Run(Box<RunArgs>),
    /// Check that a pipeline delivered exactly once: replay the transform over a range of the
    /// input and match every output and DLQ record to its input. Exit 0: clean; 1: anomalies;
    /// 2: bad options; 3: the audit could not complete.
    Audit(Box<AuditArgs>),
    /// A group's offsets: show them, import them from the stores other jobs kept by hand
    /// (Redis, MySQL, files), export them back. Exit 0: done; 2: bad options or a validation
    /// error; 3: could not complete.
    Offsets(Box<offsets::OffsetsArgs>),
    /// The dedup's state (`--window`): one key's windows, and the seed's Redis sets
    /// loaded into its changelog. Exit 0: done; 2: bad options; 3: could not complete.
    State(Box<state::StateArgs>),
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// librdkafka keys that exactly sets itself, and the option to use instead.
const CONSUMER_OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "--bootstrap-servers"),
    ("metadata.broker.list", "--bootstrap-servers"),
    ("group.id", "--group-id"),
    ("group.protocol", "--group-protocol"),
    (
        "group.instance.id",
        "--instance-id (--membership dynamic leaves it unset)",
    ),
    (
        "enable.auto.commit",
        "nothing: offsets are committed inside each transaction",
    ),
    (
        "enable.auto.offset.store",
        "nothing: offsets are committed inside each transaction",
    ),
    (
        "isolation.level",
        "nothing: exactly always reads read_committed",
    ),
    ("statistics.interval.ms", "--lag-interval"),
];
const PRODUCER_OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "--bootstrap-servers"),
    ("metadata.broker.list", "--bootstrap-servers"),
    ("transactional.id", "--transactional-id"),
    ("transaction.timeout.ms", "--transaction-timeout"),
    (
        "enable.idempotence",
        "nothing: transactions need the idempotent producer",
    ),
    ("acks", "nothing: transactions need acks=all"),
    (
        "request.required.acks",
        "nothing: transactions need acks=all",
    ),
];

/// librdkafka settings for every Kafka client a subcommand creates: security and network.
#[derive(Clone, Debug, Args)]
pub struct ClientArgs {
    /// A properties file of librdkafka settings for every Kafka client (`key=value` lines and
    /// `#` comments, the way Kafka's tools take them): security settings from a mounted
    /// Kubernetes Secret, say. --kafka-config overrides its keys.
    #[arg(long, env = "EXACTLY_KAFKA_CONFIG_FILE", value_name = "PATH")]
    pub kafka_config_file: Option<PathBuf>,

    /// librdkafka setting for every Kafka client, key=value: security and network
    /// (repeatable; in the environment, separate pairs with ';'). --consumer-config and
    /// --producer-config override it for their clients.
    #[arg(long = "kafka-config", env = "EXACTLY_KAFKA_CONFIG", value_name = "KEY=VALUE", value_delimiter = ';', value_parser = KeyValue, hide_env_values = true)]
    pub kafka_config: Vec<(String, String)>,
}

impl ClientArgs {
    /// The settings for every client: the file's, then --kafka-config's. Each checked like
    /// any passthrough key.
    pub fn resolve(&self) -> Result<Common, Error> {
        let owned = [CONSUMER_OWNED, PRODUCER_OWNED].concat();
        let mut common = Common::default();
        if let Some(path) = &self.kafka_config_file {
            let flag = format!("--kafka-config-file {}", path.display());
            let file = std::fs::File::open(path)
                .map_err(|e| Error::Config(format!("{flag}: cannot read it: {e}")))?;
            // UTF-8, in the file's order (a key given twice: the later wins). Only the line
            // number of an error is shown: a line may hold a secret.
            let mut read = Vec::new();
            let reader = std::io::BufReader::new(file);
            java_properties::PropertiesIter::new_with_encoding(reader, encoding_rs::UTF_8)
                .read_into(|k, v| read.push((k, v)))
                .map_err(|e| {
                    let line = e.line_number().map(|n| format!(" at line {n}"));
                    Error::Config(format!(
                        "{flag}: not a properties file{}",
                        line.unwrap_or_default()
                    ))
                })?;
            check_passthrough(&flag, &read, &owned)?;
            common.file = Some((path.clone(), read));
        }
        check_passthrough("--kafka-config", &self.kafka_config, &owned)?;
        common.flags.clone_from(&self.kafka_config);
        Ok(common)
    }
}

/// A topic name Kafka accepts ([`crate::kafka::valid_topic_name`]), or an error naming `flag`.
fn check_topic_name(flag: &str, name: &str) -> Result<(), Error> {
    if crate::kafka::valid_topic_name(name.as_bytes()) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{flag}: '{name}' is not a valid topic name (1-249 of a-z A-Z 0-9 . _ -)"
        )))
    }
}

/// Refuses keys exactly owns, and asks librdkafka whether each remaining key and value exist.
fn check_passthrough(
    flag: &str,
    pairs: &[(String, String)],
    owned: &[(&str, &str)],
) -> Result<(), Error> {
    for (key, value) in pairs {
        if !plain_key(key) {
            // Not a setting's name: a continuation line of a multi-line value (a PEM key in a
            // properties file), say. Not shown: it may be part of a secret.
            return Err(Error::Config(format!(
                "{flag}: a key is not a setting name (a-z, 0-9, '.', '_', '-'); a PEM \
                 value must be one line (\\n escapes) or a file (ssl.key.location)"
            )));
        }
        if let Some((_, instead)) = owned.iter().find(|(k, _)| *k == key) {
            return Err(Error::Config(format!(
                "{flag}: '{key}' is set by exactly and cannot be overridden; use {instead}"
            )));
        }
        if let Some(said) = crate::kafka::refused_setting(key, value) {
            return Err(Error::Config(format!("{flag}: {key}: {said}")));
        }
    }
    Ok(())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 100ms, 5s, 2m)"))
}

/// A librdkafka setting's name could be this: lower-case letters, digits, `.`, `_`, `-`,
/// starting with a letter (as all of them do; a line of base64 does not).
fn plain_key(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Parses `key=value`. A malformed value is not echoed back, as clap would: it may be a
/// secret (`sasl.password:…` with the wrong separator, say).
#[derive(Clone, Copy, Debug)]
struct KeyValue;

impl clap::builder::TypedValueParser for KeyValue {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<(String, String), clap::Error> {
        match value.to_str().and_then(|s| s.split_once('=')) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => {
                let flag = arg.and_then(|a| a.get_long()).unwrap_or("a setting");
                let message = format!(
                    "--{flag}: a value is not KEY=VALUE (it is not shown: it may hold a secret)\n"
                );
                Err(
                    clap::Error::raw(clap::error::ErrorKind::ValueValidation, message)
                        .with_cmd(cmd),
                )
            }
        }
    }
}

fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

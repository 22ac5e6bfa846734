//! `exactly audit`: the range of input to audit, and the transform to replay over it.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;

use super::{
    CONSUMER_OWNED, CallArgs, ClientArgs, DedupArgs, DedupConfig, DedupStateArgs, KeyValue,
    OnError, TransformArgs, TransformConfig, check_passthrough, check_topic_name, parse_duration,
};
use crate::error::Error;
use crate::kafka::Settings;

/// Options of `exactly audit`.
#[derive(Clone, Debug, Args)]
pub struct AuditArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "EXACTLY_BOOTSTRAP_SERVERS", value_name = "HOSTS")]
    pub bootstrap_servers: String,

    /// Input topics, comma-separated.
    #[arg(
        long,
        env = "EXACTLY_INPUT_TOPICS",
        value_delimiter = ',',
        required = true,
        value_name = "TOPICS"
    )]
    pub input_topics: Vec<String>,

    /// Output topics, comma-separated; the first is the transform's default output (list the
    /// others an --envelope program routes to).
    #[arg(
        long = "output-topic",
        env = "EXACTLY_OUTPUT_TOPIC",
        value_delimiter = ',',
        required_unless_present = "db_url",
        value_name = "TOPICS"
    )]
    pub output_topics: Vec<String>,

    /// Dead-letter topic [default: <first output topic>.dlq; read only with --on-error dlq].
    #[arg(long, env = "EXACTLY_DLQ_TOPIC", value_name = "TOPIC")]
    pub dlq_topic: Option<String>,

    /// The pipeline's consumer group: inputs past its committed offsets are pending, not
    /// judged, and the report says whether the group reached the end of the range.
    #[arg(long, env = "EXACTLY_GROUP_ID", value_name = "GROUP")]
    pub group_id: Option<String>,

    /// The database sink's table, instead of output topics.
    #[command(flatten)]
    pub db: super::db::AuditDbArgs,

    /// The transform, exactly as the pipeline runs it.
    #[command(flatten)]
    pub transform: TransformArgs,

    /// The pipeline's call-out, if it calls an application.
    #[command(flatten)]
    pub call: CallArgs,

    /// The pipeline's dedup, if it runs one: replayed in memory over every input from the
    /// start of each partition (what came before the range decides what is first in it).
    #[command(flatten)]
    pub dedup: DedupArgs,

    /// Call the application again and compare its answers with the outputs (only for an
    /// application that answers the same record the same way). Without it a call-out pipeline
    /// is audited by lineage alone.
    #[arg(long, requires = "call_url")]
    pub replay_call: bool,

    /// Start of the input range: a time (RFC 3339, or milliseconds since the epoch).
    #[arg(long, value_name = "TIME", conflicts_with = "from_offsets")]
    pub from_time: Option<String>,

    /// End of the input range (exclusive): a time (RFC 3339, or milliseconds since the epoch).
    #[arg(long, value_name = "TIME", conflicts_with = "to_offsets")]
    pub to_time: Option<String>,

    /// Start of the input range as offsets per partition, `0=100,1=250` [default: earliest].
    #[arg(long, value_name = "P=OFFSET,…")]
    pub from_offsets: Option<String>,

    /// End of the input range (exclusive) as offsets per partition [default: the last stable
    /// offset when the audit starts].
    #[arg(long, value_name = "P=OFFSET,…")]
    pub to_offsets: Option<String>,

    /// The run's producer message.max.bytes, if it set one: outputs larger than this went to
    /// the DLQ, and the replay must judge them the same way [default: 1000000; a database's
    /// rows have no such limit: not with --db-url].
    #[arg(long, value_name = "BYTES", conflicts_with = "db_url")]
    pub max_message_bytes: Option<usize>,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Bound on each Kafka call and on silence while reading a topic.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Settings for every Kafka client (security, network).
    #[command(flatten)]
    pub client: ClientArgs,

    /// Extra librdkafka consumer setting, key=value (repeatable).
    #[arg(long = "consumer-config", env = "EXACTLY_CONSUMER_CONFIG", value_name = "KEY=VALUE", value_delimiter = ';', value_parser = KeyValue, hide_env_values = true)]
    pub consumer_config: Vec<(String, String)>,
}

/// One end of the audited input range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The start (low watermark) or the end (last stable offset) of each partition.
    Edge,
    /// The first offset at or after a timestamp (ms), per partition.
    Time(i64),
    /// Offsets per partition (applied to every input topic); missing partitions: the edge.
    Offsets(BTreeMap<i32, i64>),
}

/// What to read.
#[derive(Clone, Debug)]
pub struct Plan {
    /// How to reach Kafka, and the extra librdkafka settings (security).
    pub kafka: Settings,
    /// Input topics.
    pub inputs: Vec<String>,
    /// Output topics.
    pub outputs: Vec<String>,
    /// DLQ topic.
    pub dlq: Option<String>,
    /// Group whose committed offsets are checked.
    pub group: Option<String>,
    /// Start of the input range.
    pub from: Bound,
    /// Also read every input before the range, from the start of each partition, for a
    /// stateful replay (the dedup) to see what came first.
    pub earlier: bool,
    /// End of the input range (exclusive).
    pub to: Bound,
    /// Bound on each network call and on reading each topic.
    pub timeout: Duration,
}

/// A validated audit plan, and the transform to replay.
pub struct AuditConfig {
    /// What to read.
    pub plan: Plan,
    /// The transform.
    pub transform: TransformConfig,
    /// The dedup in front of it, if the pipeline runs one.
    pub dedup: Option<DedupConfig>,
    /// What the run did with a record that could not be transformed.
    pub on_error: OnError,
    /// Call the application again (a call-out), rather than account by lineage alone.
    pub replay_call: bool,
    /// JSON output.
    pub json: bool,
    /// The run's producer message.max.bytes.
    pub max_message_bytes: usize,
    /// A database sink's table, read instead of output topics.
    pub db: Option<crate::db::ReadTarget>,
}

impl AuditArgs {
    /// Checks the options and builds the plan.
    pub fn validate(self) -> Result<AuditConfig, Error> {
        for t in &self.input_topics {
            check_topic_name("--input-topics", t)?;
        }
        for t in &self.output_topics {
            check_topic_name("--output-topic", t)?;
        }
        let on_error = self.transform.on_error;
        let transform = self.transform.resolve(Some(self.call))?;
        let mut dedup = self
            .dedup
            .resolve(DedupStateArgs::default(), "exactly-audit")?;
        if let Some(d) = &mut dedup {
            d.fit(&transform);
        }
        if dedup.is_some() && matches!(transform.spec, super::TransformSpec::Call(_)) {
            return Err(Error::Config(
                "--window: not with --call-url (exactly run refuses it too)".into(),
            ));
        }
        let db = self.db.resolve(self.timeout)?;
        let dlq = match (self.dlq_topic, on_error, &db) {
            // The database sink's dead letters are in its table.
            (_, _, Some(_)) => None,
            (Some(d), _, None) => Some(d),
            (None, OnError::Dlq, None) => (self.output_topics.first()).map(|o| format!("{o}.dlq")),
            (None, _, None) => None,
        };
        if let Some(d) = &dlq {
            check_topic_name("--dlq-topic", d)?;
        }
        check_passthrough("--consumer-config", &self.consumer_config, CONSUMER_OWNED)?;
        let bound =
            |flag: &str, time: Option<String>, offsets: Option<String>| match (time, offsets) {
                (Some(t), _) => parse_time(&t)
                    .map(Bound::Time)
                    .map_err(|e| Error::Config(format!("{flag}: {e}"))),
                (None, Some(o)) => parse_offsets(&o)
                    .map(Bound::Offsets)
                    .map_err(|e| Error::Config(format!("{flag}: {e}"))),
                (None, None) => Ok(Bound::Edge),
            };
        let from = bound(
            "--from-time/--from-offsets",
            self.from_time,
            self.from_offsets,
        )?;
        let to = bound("--to-time/--to-offsets", self.to_time, self.to_offsets)?;
        Ok(AuditConfig {
            plan: Plan {
                kafka: Settings {
                    bootstrap_servers: self.bootstrap_servers,
                    client_id: "exactly-audit".into(),
                    common: self.client.resolve()?,
                    consumer: self.consumer_config,
                    producer: Vec::new(),
                },
                inputs: self.input_topics,
                outputs: self.output_topics,
                dlq,
                group: self.group_id,
                from,
                earlier: dedup.is_some(),
                to,
                timeout: self.timeout,
            },
            transform,
            dedup,
            on_error,
            replay_call: self.replay_call,
            json: self.json,
            // Kafka's limit; the database takes rows of any size.
            max_message_bytes: match db {
                Some(_) => usize::MAX,
                None => self.max_message_bytes.unwrap_or(1_000_000),
            },
            db,
        })
    }
}

/// Milliseconds since the epoch, or an RFC 3339 time.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("'{s}' is neither milliseconds nor an RFC 3339 time: {e}"))?;
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis();
    i64::try_from(ms).map_err(|e| e.to_string())
}

/// `0=100,1=250`.
fn parse_offsets(s: &str) -> Result<BTreeMap<i32, i64>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|pair| {
            let (p, o) = pair
                .split_once('=')
                .ok_or_else(|| format!("'{pair}' is not partition=offset"))?;
            let p = p
                .trim()
                .parse()
                .map_err(|_| format!("'{p}' is not a partition"))?;
            let o = o
                .trim()
                .parse()
                .map_err(|_| format!("'{o}' is not an offset"))?;
            Ok((p, o))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command};

    #[test]
    fn audit_options() {
        let args = [
            "exactly",
            "audit",
            "--bootstrap-servers",
            "b:1",
            "--input-topics",
            "in",
            "--output-topic",
            "out,routed",
            "--jq",
            ".",
            "--from-offsets",
            "0=5,1=7",
            "--to-time",
            "2026-01-01T00:00:00Z",
            "--group-id",
            "g",
        ];
        let Command::Audit(a) = Cli::try_parse_from(args).unwrap().command else {
            panic!()
        };
        let c = a.validate().unwrap();
        assert_eq!(c.plan.outputs, ["out", "routed"]);
        assert_eq!(c.plan.dlq.as_deref(), Some("out.dlq"));
        assert_eq!(
            c.plan.from,
            Bound::Offsets([(0, 5), (1, 7)].into_iter().collect())
        );
        assert_eq!(c.plan.to, Bound::Time(1_767_225_600_000));
        for (flag, bad) in [("--from-offsets", "0:5"), ("--to-time", "yesterday")] {
            let args = [
                "exactly",
                "audit",
                "--bootstrap-servers",
                "b:1",
                "--input-topics",
                "in",
                "--output-topic",
                "out",
                flag,
                bad,
            ];
            let Command::Audit(a) = Cli::try_parse_from(args).unwrap().command else {
                panic!()
            };
            let e = a.validate().err().unwrap().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn a_database_table_is_audited_instead_of_output_topics() {
        let base = [
            "exactly",
            "audit",
            "--bootstrap-servers",
            "b:1",
            "--input-topics",
            "in",
            "--jq",
            ".",
        ];
        let db = [
            "--db-url",
            "mysql://etl@db:3306/shop",
            "--db-table",
            "orders",
            "--db-lineage-column",
            "lineage",
        ];
        let args: Vec<&str> = base.iter().chain(&db).copied().collect();
        let Command::Audit(a) = Cli::try_parse_from(args).unwrap().command else {
            panic!()
        };
        let c = a.validate().unwrap();
        // Rows have no size limit of Kafka's: an output of any size was a row.
        assert_eq!(c.max_message_bytes, usize::MAX);
        let mut limited: Vec<&str> = base.iter().chain(&db).copied().collect();
        limited.extend(["--max-message-bytes", "2000"]);
        let e = Cli::try_parse_from(limited).err().unwrap().to_string();
        assert!(e.contains("--max-message-bytes"), "{e}");
        let target = c.db.unwrap();
        assert_eq!(
            (target.rows.as_str(), target.dead.as_str()),
            ("orders", "orders_dlq")
        );
        assert!(c.plan.outputs.is_empty() && c.plan.dlq.is_none());
        // Not with output topics; the lineage column is needed.
        let mut with_topic: Vec<&str> = base.iter().chain(&db).copied().collect();
        with_topic.extend(["--output-topic", "out"]);
        assert!(Cli::try_parse_from(with_topic).is_err());
        let without_lineage: Vec<&str> = base.iter().chain(&db[..4]).copied().collect();
        let e = Cli::try_parse_from(without_lineage)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--db-lineage-column"), "{e}");
    }
}

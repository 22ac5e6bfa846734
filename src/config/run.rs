//! `exactly run`: where records come from and go, the guarantee, and the process around it.

use std::time::Duration;

use clap::Args;

use super::db::{DbArgs, DbConfig};
use super::fit::{
    check_call, check_changelog, check_dedup, check_group_protocol, stuck_call_timeout,
};
use super::{
    CONSUMER_OWNED, CallArgs, ClientArgs, DedupArgs, DedupConfig, DedupStateArgs, KeyValue,
    LogFormat, OnError, PRODUCER_OWNED, TransformArgs, TransformConfig, check_passthrough,
    check_topic_name, parse_duration, parse_log_filter,
};
use crate::error::Error;
use crate::kafka::{GroupProtocol, Settings};
pub use crate::switches::{TestAborts, TestSwitches};

/// Options of `exactly run`.
#[derive(Clone, Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["input_topics", "input_pattern"])))]
pub struct RunArgs {
    /// Kafka bootstrap servers, host:port[,host:port…].
    #[arg(long, env = "EXACTLY_BOOTSTRAP_SERVERS", value_name = "HOSTS")]
    pub bootstrap_servers: String,

    /// Input topics, comma-separated.
    #[arg(
        long,
        env = "EXACTLY_INPUT_TOPICS",
        value_delimiter = ',',
        value_name = "TOPICS"
    )]
    pub input_topics: Vec<String>,

    /// Input topics as a regular expression (instead of --input-topics); new matching topics
    /// are picked up as they appear.
    #[arg(
        long,
        env = "EXACTLY_INPUT_PATTERN",
        value_name = "REGEX",
        conflicts_with = "input_topics"
    )]
    pub input_pattern: Option<String>,

    /// Topic that transformed records are written to (an --envelope program may pick another).
    #[arg(
        long,
        env = "EXACTLY_OUTPUT_TOPIC",
        value_name = "TOPIC",
        required_unless_present = "db_url",
        conflicts_with = "db_url"
    )]
    pub output_topic: Option<String>,

    /// Consumer group; its committed offsets are part of every transaction.
    #[arg(long, env = "EXACTLY_GROUP_ID", value_name = "GROUP")]
    pub group_id: String,

    /// This instance's stable identity [default: $POD_NAME, else the host name]. Must differ
    /// between instances of one group and stay the same across restarts of one instance.
    #[arg(long, env = "EXACTLY_INSTANCE_ID", value_name = "ID")]
    pub instance_id: Option<String>,

    /// Transactional id of the producer [default: <group-id>-<instance-id>]. A restart with the
    /// same id fences the previous incarnation's producer.
    #[arg(long, env = "EXACTLY_TRANSACTIONAL_ID", value_name = "ID")]
    pub transactional_id: Option<String>,

    /// Group membership: static (group.instance.id = the instance id: an instance restarted
    /// after a crash gets its partitions back at once, without a rebalance), dynamic (it waits
    /// for its old member's session timeout), or auto: static with the classic protocol,
    /// dynamic with the consumer protocol, where librdkafka's static member gains nothing after
    /// a crash. docs/operating.md, "Failover".
    #[arg(long, env = "EXACTLY_MEMBERSHIP", value_enum, default_value_t = Membership::Auto)]
    pub membership: Membership,

    /// The same as --membership static (before it became the default).
    #[arg(
        long,
        env = "EXACTLY_STATIC_MEMBERSHIP",
        hide = true,
        conflicts_with = "membership"
    )]
    pub static_membership: bool,

    /// The consumer group protocol: classic, or consumer (KIP-848: the group coordinator
    /// assigns partitions and owns the session timeout and heartbeat interval; Kafka 4.0 and
    /// later). docs/operating.md, "The consumer group protocol".
    #[arg(long, env = "EXACTLY_GROUP_PROTOCOL", value_enum, default_value_t = GroupProtocol::Classic)]
    pub group_protocol: GroupProtocol,

    /// exactly-once: outputs and offsets in one Kafka transaction. at-least-once: an
    /// idempotent producer, offsets committed after every output of a batch is delivered (a
    /// crash or error can duplicate outputs, never lose them); no transactions.
    #[arg(long, env = "EXACTLY_GUARANTEE", value_enum, default_value_t = Guarantee::ExactlyOnce)]
    pub guarantee: Guarantee,

    /// Commit the open transaction this long after it began.
    #[arg(long, env = "EXACTLY_COMMIT_INTERVAL", value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    pub commit_interval: Duration,

    /// Commit once a transaction holds this many input records.
    #[arg(long, env = "EXACTLY_MAX_RECORDS_PER_TXN", value_name = "N", default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_records_per_txn: u64,

    /// Commit once a transaction holds this many bytes of input (keys and values).
    #[arg(long, env = "EXACTLY_MAX_BYTES_PER_TXN", value_name = "BYTES", default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bytes_per_txn: u64,

    /// Transaction timeout (transaction.timeout.ms): the coordinator aborts a transaction open
    /// longer than this. Must be at least twice the commit interval and 5 s longer than it.
    #[arg(long, env = "EXACTLY_TRANSACTION_TIMEOUT", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub transaction_timeout: Duration,

    /// The transform and what to do when it fails.
    #[command(flatten)]
    pub transform: TransformArgs,

    /// The call-out's options.
    #[command(flatten)]
    pub call: CallArgs,

    /// Deduplication by key per window of event time.
    #[command(flatten)]
    pub dedup: DedupArgs,

    /// Where the dedup keeps its state.
    #[command(flatten)]
    pub dedup_state: DedupStateArgs,

    /// The database sink: rows and offsets in one database transaction.
    #[command(flatten)]
    pub db: DbArgs,

    /// Dead-letter topic [default: <output-topic>.dlq].
    #[arg(long, env = "EXACTLY_DLQ_TOPIC", value_name = "TOPIC")]
    pub dlq_topic: Option<String>,

    /// How long an output routed by its record (an envelope's or the application's topic)
    /// may keep being refused, its topic missing or not writable, before the record is the
    /// record's fault (--on-error, reason route_refused). Meanwhile transactions abort and
    /// retry, so a topic created late still gets its records.
    #[arg(long, env = "EXACTLY_ROUTE_TIMEOUT", value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub route_timeout: Duration,

    /// Do not add the exactly.lineage header (source topic/partition/offset/index) to outputs.
    #[arg(long, env = "EXACTLY_NO_LINEAGE")]
    pub no_lineage: bool,

    /// Settings for every Kafka client (security, network).
    #[command(flatten)]
    pub client: ClientArgs,

    /// Extra librdkafka consumer setting, key=value (repeatable; in the environment, separate
    /// pairs with ';').
    #[arg(long = "consumer-config", env = "EXACTLY_CONSUMER_CONFIG", value_name = "KEY=VALUE", value_delimiter = ';', value_parser = KeyValue, hide_env_values = true)]
    pub consumer_config: Vec<(String, String)>,

    /// Extra librdkafka producer setting, key=value (repeatable; in the environment, separate
    /// pairs with ';').
    #[arg(long = "producer-config", env = "EXACTLY_PRODUCER_CONFIG", value_name = "KEY=VALUE", value_delimiter = ';', value_parser = KeyValue, hide_env_values = true)]
    pub producer_config: Vec<(String, String)>,

    /// How long start-up may wait for the broker and the transaction coordinator.
    #[arg(long, env = "EXACTLY_STARTUP_TIMEOUT", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub startup_timeout: Duration,

    /// On SIGTERM/SIGINT: time to commit the open transaction and leave the group before a
    /// hard exit.
    #[arg(long, env = "EXACTLY_SHUTDOWN_GRACE", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// How long the loop may wait inside one librdkafka transactional call before exactly
    /// leaves (exit code 4) so that its restart fences the stuck producer; at least the
    /// transaction timeout + 5s. librdkafka has calls that do not keep their timeout
    /// (docs/how-it-works.md, "Watchdog") [default: the transaction timeout + 30s]
    #[arg(long, env = "EXACTLY_STUCK_CALL_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub stuck_call_timeout: Option<Duration>,

    /// Address of the HTTP endpoints (/metrics, /livez, /readyz), or `off`.
    #[arg(long, env = "EXACTLY_HTTP_ADDR", value_name = "ADDR", default_value = "0.0.0.0:9898", value_parser = parse_http_addr)]
    // Fully qualified: to clap, a plain `Option` means "may be absent"; here it is the value.
    pub http_addr: ::std::option::Option<std::net::SocketAddr>,

    /// How often the lag and unstable-records gauges are refreshed (librdkafka's
    /// statistics.interval.ms on the consumer).
    #[arg(long, env = "EXACTLY_LAG_INTERVAL", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub lag_interval: Duration,

    /// Log format.
    #[arg(long, env = "EXACTLY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log level or tracing filter (e.g. `info`, `exactly=debug,rdkafka=warn`).
    #[arg(long, env = "EXACTLY_LOG_LEVEL", value_name = "FILTER", default_value = "info", value_parser = parse_log_filter)]
    pub log_level: String,

    /// Testing only: abort instead of committing every Nth transaction, through the same path
    /// as an abortable commit error. Used by the test suite to prove aborts are invisible.
    #[arg(long, env = "EXACTLY_TEST_ABORT_EVERY", value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub test_abort_every: Option<u64>,

    /// Testing only: abort instead of committing each transaction with this probability
    /// (0 to 1). Used by the fault-injection suite.
    #[arg(long, env = "EXACTLY_TEST_ABORT_PROBABILITY", value_name = "P", hide = true, conflicts_with = "test_abort_every", value_parser = parse_probability)]
    pub test_abort_probability: Option<f64>,

    /// Testing only: no claim of the instance on this host, so that one host can run two
    /// processes of one instance (the clash they make is what the test is about).
    #[arg(long, env = "EXACTLY_TEST_NO_HOST_CLAIM", hide = true)]
    pub test_no_host_claim: bool,

    /// Testing only: the first N sends fail as a failed produce does (the transaction is
    /// aborted), before the record reaches librdkafka.
    #[arg(long, env = "EXACTLY_TEST_FAIL_SENDS", value_name = "N", hide = true)]
    pub test_fail_sends: Option<u64>,

    /// Testing only: the transform reports itself unavailable (a service it calls is down) for
    /// its first N records.
    #[arg(long, env = "EXACTLY_TEST_UNAVAILABLE", value_name = "N", hide = true)]
    pub test_unavailable: Option<u64>,

    /// Testing only: the process aborts right after its Nth commit with dedup changes (keys,
    /// stream times) to store, before they reach the local store (--state-dir).
    #[arg(long, env = "EXACTLY_TEST_CRASH_BEFORE_STORE", value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub test_crash_before_store: Option<u64>,

    /// Testing only: the database sink aborts the process right after its Nth database
    /// COMMIT, before the offsets are copied to the Kafka group.
    #[arg(long, env = "EXACTLY_TEST_CRASH_AFTER_DB_COMMIT", value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..), requires = "db_url")]
    pub test_crash_after_db_commit: Option<u64>,

    /// Testing only: the database sink drops its connection right after every Nth database
    /// COMMIT succeeded, as if the answer were lost: an unknown outcome the offsets table must
    /// resolve.
    #[arg(long, env = "EXACTLY_TEST_LOSE_DB_COMMIT_ANSWERS", value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..), requires = "db_url")]
    pub test_lose_db_commit_answers: Option<u64>,

    /// Testing only: the dedup's restore takes this long per changelog record read, so a
    /// test can stop it midway.
    #[arg(long, env = "EXACTLY_TEST_RESTORE_PACE", value_name = "DURATION", hide = true, value_parser = parse_duration)]
    pub test_restore_pace: Option<Duration>,
}

/// How the pipeline's consumer is a member of its group (`--membership`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Membership {
    /// Static with the classic protocol, dynamic with the consumer protocol.
    Auto,
    /// `group.instance.id` = the instance id.
    Static,
    /// No `group.instance.id`.
    Dynamic,
}

impl Membership {
    /// Whether the consumer joins as a static member under `protocol`. Under KIP-848,
    /// librdkafka 2.12's static member leaves with epoch -2, which keeps its partitions and
    /// refuses its own restart (UNRELEASED_INSTANCE_ID) until the broker's session timeout:
    /// slower than a dynamic member after a crash, and after a stop for good.
    pub fn is_static(self, protocol: GroupProtocol) -> bool {
        match self {
            Membership::Auto => protocol == GroupProtocol::Classic,
            Membership::Static => true,
            Membership::Dynamic => false,
        }
    }
}

/// The delivery guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Guarantee {
    /// Outputs and offsets commit in one Kafka transaction.
    ExactlyOnce,
    /// Offsets commit after the outputs are delivered; no transactions.
    AtLeastOnce,
}

/// Where the input comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A fixed list of topics.
    Topics(Vec<String>),
    /// A regular expression over topic names.
    Pattern(String),
}

/// Validated configuration of `exactly run`, in the parts each piece of the pipeline is built
/// from.
#[derive(Clone, Debug)]
pub struct Config {
    /// How to reach Kafka, and the user's extra librdkafka settings.
    pub kafka: Settings,
    /// What is read, and the consumer group that reads it.
    pub group: GroupConfig,
    /// Where outputs go, and how they become durable.
    pub sink: SinkConfig,
    /// When the open transaction commits.
    pub commit: CommitPolicy,
    /// The transform.
    pub transform: TransformConfig,
    /// The dedup in front of it, if any.
    pub dedup: Option<DedupConfig>,
    /// What happens to a record that cannot be transformed or written.
    pub errors: ErrorPolicy,
    /// Add the lineage header.
    pub lineage: bool,
    /// Shutdown grace.
    pub shutdown_grace: Duration,
    /// `--stuck-call-timeout`, resolved: how long the loop may be inside one librdkafka call
    /// before the process leaves (exit code 4). Every call is given the transaction timeout,
    /// so one past this has ignored it.
    pub stuck_call_timeout: Duration,
    /// HTTP endpoints address (None: off).
    pub http_addr: Option<std::net::SocketAddr>,
    /// Refresh period of the lag gauges.
    pub lag_interval: Duration,
    /// Testing only: failures on purpose.
    pub test: TestSwitches,
}

/// What is read, and the consumer group that reads it.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Input topics.
    pub input: Input,
    /// Consumer group.
    pub group_id: String,
    /// Stable instance identity.
    pub instance_id: String,
    /// Join as a static member (`--membership`, resolved for the protocol).
    pub static_membership: bool,
    /// `group.protocol`.
    pub protocol: GroupProtocol,
}

impl GroupConfig {
    /// Whether a clean stop unsubscribes before it closes, so that the member leaves: a
    /// classic static member sends no LeaveGroup on close (KIP-345). A dynamic member leaves
    /// on close anyway; a static one under the consumer protocol leaves with epoch -2 either
    /// way, which keeps its partitions until the broker's session expires.
    pub fn unsubscribes_to_leave(&self) -> bool {
        self.static_membership && self.protocol == GroupProtocol::Classic
    }
}

/// Where outputs go, and how they become durable with the offsets.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Transactions, or batches committed after delivery.
    pub guarantee: Guarantee,
    /// Default output topic.
    pub output_topic: String,
    /// Producer transactional id.
    pub transactional_id: String,
    /// transaction.timeout.ms; also the bound of every blocking call.
    pub transaction_timeout: Duration,
    /// How long start-up waits for the sink to connect.
    pub startup_timeout: Duration,
    /// `--commit-interval`: how long a unit stays open.
    pub commit_interval: Duration,
    /// The database sink (`--db-url`), instead of Kafka.
    pub db: Option<DbConfig>,
}

/// When the open transaction commits: whichever bound it reaches first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitPolicy {
    /// This long after it began.
    pub interval: Duration,
    /// This many input records.
    pub max_records: u64,
    /// This many input bytes (keys and values).
    pub max_bytes: u64,
}

impl CommitPolicy {
    /// Whether a transaction open for `age` with `records` and `bytes` must commit now.
    pub fn due(&self, age: Duration, records: u64, bytes: u64) -> bool {
        age >= self.interval || records >= self.max_records || bytes >= self.max_bytes
    }
}

/// What happens to a record that cannot be transformed or written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorPolicy {
    /// DLQ, skip or fail.
    pub on_error: OnError,
    /// Dead-letter topic.
    pub dlq_topic: String,
    /// How long a route chosen by the record may be refused before that is its fault.
    pub route_timeout: Duration,
}

impl Config {
    /// The longest a healthy loop goes without a turn: one transactional call, bounded by the
    /// transaction timeout, plus a margin. `/livez` fails past it, and it is the consumer's
    /// `max.poll.interval.ms` (the group's rebalance timeout).
    pub fn loop_bound(&self) -> Duration {
        self.sink.transaction_timeout + Duration::from_secs(15)
    }
}

impl RunArgs {
    /// Checks how the values fit together and fills in derived defaults.
    pub fn validate(self) -> Result<Config, Error> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(Error::Config(
                "--bootstrap-servers: must not be empty".into(),
            ));
        }
        let group = self.group()?;
        let errors = self.errors()?;
        let commit = self.commit_policy()?;
        let sink = self.sink(&group, &errors)?;
        check_passthrough("--consumer-config", &self.consumer_config, CONSUMER_OWNED)?;
        check_passthrough("--producer-config", &self.producer_config, PRODUCER_OWNED)?;
        let test = self.test_switches();
        let transform = self.transform.resolve(Some(self.call))?;
        let mut dedup = self.dedup.resolve(self.dedup_state, &group.group_id)?;
        if let Some(d) = &mut dedup {
            check_dedup(&group, &sink, &transform)?;
            check_changelog(d, &group, &sink, &errors)?;
            d.fit(&transform);
        }
        check_call(&transform, &sink, &test)?;
        if self.shutdown_grace.is_zero() {
            return Err(Error::Config(
                "--shutdown-grace: must be greater than 0".into(),
            ));
        }
        if self.lag_interval < Duration::from_millis(100)
            || self.lag_interval > Duration::from_secs(3600)
        {
            return Err(Error::Config(
                "--lag-interval: must be between 100ms and 1h".into(),
            ));
        }
        let common = self.client.resolve()?;
        check_group_protocol(&group, &common, &self.consumer_config)?;
        let kafka = Settings {
            bootstrap_servers: self.bootstrap_servers,
            client_id: format!("exactly-{}", group.instance_id),
            common,
            consumer: self.consumer_config,
            producer: self.producer_config,
        };
        if sink.guarantee == Guarantee::ExactlyOnce {
            kafka
                .check_propagation(sink.transaction_timeout, sink.commit_interval)
                .map_err(|e| {
                    let ours = |(k, _): &(String, String)| k == crate::kafka::PROPAGATION_KEY;
                    let flag = if kafka.producer.iter().any(ours) {
                        "--producer-config"
                    } else if self.client.kafka_config.iter().any(ours) {
                        "--kafka-config"
                    } else {
                        "--kafka-config-file"
                    };
                    Error::Config(format!("{flag}: {e}"))
                })?;
        }
        let stuck_call_timeout =
            stuck_call_timeout(self.stuck_call_timeout, sink.transaction_timeout)?;
        Ok(Config {
            kafka,
            group,
            sink,
            commit,
            transform,
            dedup,
            errors,
            lineage: !self.no_lineage,
            shutdown_grace: self.shutdown_grace,
            stuck_call_timeout,
            http_addr: self.http_addr,
            lag_interval: self.lag_interval,
            test,
        })
    }

    /// The input, the group and this instance's identity in it.
    fn group(&self) -> Result<GroupConfig, Error> {
        let input = match &self.input_pattern {
            Some(p) => {
                regex::Regex::new(p)
                    .map_err(|e| Error::Config(format!("--input-pattern: not a regex: {e}")))?;
                Input::Pattern(p.clone())
            }
            None => {
                let topics: Vec<String> = self
                    .input_topics
                    .iter()
                    .map(|t| t.trim().to_string())
                    .collect();
                for t in &topics {
                    check_topic_name("--input-topics", t)?;
                }
                Input::Topics(topics)
            }
        };
        let output = self.output();
        check_topic_name("--output-topic", output)?;
        if let Input::Topics(ts) = &input
            && ts.iter().any(|t| t == output)
            && self.db.db_url.is_none()
        {
            return Err(Error::Config(format!(
                "--output-topic: '{output}' is also an input topic; that would loop forever"
            )));
        }
        if self.group_id.trim().is_empty() {
            return Err(Error::Config("--group-id: must not be empty".into()));
        }
        let instance_id = self.instance_id.clone().unwrap_or_else(default_instance_id);
        if instance_id.trim().is_empty() {
            return Err(Error::Config(
                "--instance-id: must not be empty (and no POD_NAME or host name)".into(),
            ));
        }
        Ok(GroupConfig {
            input,
            group_id: self.group_id.clone(),
            instance_id,
            static_membership: self.static_membership
                || self.membership.is_static(self.group_protocol),
            protocol: self.group_protocol,
        })
    }

    fn errors(&self) -> Result<ErrorPolicy, Error> {
        let dlq_topic = self
            .dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.output()));
        check_topic_name("--dlq-topic", &dlq_topic)?;
        let on_error = self.transform.on_error;
        if on_error == OnError::Dlq && dlq_topic == self.output() {
            return Err(Error::Config(
                "--dlq-topic: must differ from --output-topic".into(),
            ));
        }
        if self.route_timeout.is_zero() {
            return Err(Error::Config(
                "--route-timeout: must be greater than 0".into(),
            ));
        }
        Ok(ErrorPolicy {
            on_error,
            dlq_topic,
            route_timeout: self.route_timeout,
        })
    }

    fn commit_policy(&self) -> Result<CommitPolicy, Error> {
        let (ci, tt) = (self.commit_interval, self.transaction_timeout);
        if ci.is_zero() {
            return Err(Error::Config(
                "--commit-interval: must be greater than 0".into(),
            ));
        }
        if tt < ci * 2 || tt < ci + Duration::from_secs(5) {
            return Err(Error::Config(format!(
                "--transaction-timeout: {} is too close to --commit-interval {}; it must be at \
                 least twice the interval and 5 s longer",
                humantime::format_duration(tt),
                humantime::format_duration(ci)
            )));
        }
        Ok(CommitPolicy {
            interval: ci,
            max_records: self.max_records_per_txn,
            max_bytes: self.max_bytes_per_txn,
        })
    }

    /// Where outputs go: the output topic, or the database sink's table (the name its
    /// records are addressed to).
    fn output(&self) -> &str {
        match (&self.output_topic, self.db.db_table.first()) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => "",
        }
    }

    fn sink(&self, group: &GroupConfig, errors: &ErrorPolicy) -> Result<SinkConfig, Error> {
        let tt = self.transaction_timeout;
        if tt.as_millis() > i32::MAX as u128 {
            return Err(Error::Config("--transaction-timeout: too large".into()));
        }
        if self.startup_timeout.is_zero() {
            return Err(Error::Config(
                "--startup-timeout: must be greater than 0".into(),
            ));
        }
        let transactional_id = self
            .transactional_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", group.group_id, group.instance_id));
        if transactional_id.trim().is_empty() {
            return Err(Error::Config(
                "--transactional-id: must not be empty".into(),
            ));
        }
        Ok(SinkConfig {
            guarantee: self.guarantee,
            output_topic: self.output().to_string(),
            transactional_id,
            transaction_timeout: tt,
            startup_timeout: self.startup_timeout,
            commit_interval: self.commit_interval,
            db: (self.db).resolve(&group.group_id, &group.instance_id, &errors.dlq_topic)?,
        })
    }

    fn test_switches(&self) -> TestSwitches {
        TestSwitches {
            aborts: match (self.test_abort_every, self.test_abort_probability) {
                (Some(n), _) => Some(TestAborts::Every(n)),
                (None, Some(p)) => Some(TestAborts::Probability(p)),
                (None, None) => None,
            },
            fail_sends: self.test_fail_sends.unwrap_or(0),
            no_host_claim: self.test_no_host_claim,
            unavailable: self.test_unavailable.unwrap_or(0),
            crash_before_store: self.test_crash_before_store,
            restore_pace: self.test_restore_pace,
            crash_after_db_commit: self.test_crash_after_db_commit,
            lose_db_commit_answers: self.test_lose_db_commit_answers,
        }
    }
}

/// `$POD_NAME` (Kubernetes), else the host name.
fn default_instance_id() -> String {
    match std::env::var("POD_NAME") {
        Ok(p) if !p.trim().is_empty() => p,
        _ => gethostname::gethostname().to_string_lossy().into_owned(),
    }
}

fn parse_http_addr(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
    if s == "off" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| format!("'{s}' is not host:port or off: {e}"))
}

fn parse_probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("'{s}' is not a probability between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command, TransformSpec};

    const BASE: &[&str] = &[
        "exactly",
        "run",
        "--bootstrap-servers",
        "127.0.0.1:9092",
        "--input-topics",
        "in",
        "--output-topic",
        "out",
        "--group-id",
        "g",
        "--instance-id",
        "i-0",
    ];

    fn parse(extra: &[&str]) -> Result<Config, String> {
        let args: Vec<&str> = BASE.iter().chain(extra).copied().collect();
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        run.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn dedup_resolves_its_window_and_changelog_and_names_the_flag_it_refuses() {
        let c = parse(&["--window", "1d", "--window-time-zone", "Asia/Shanghai"]).unwrap();
        let d = c.dedup.expect("dedup on");
        assert_eq!(d.changelog, "g.dedup-changelog");
        // The window, a day ahead (--window-max-ahead), a day's margin.
        assert_eq!(d.retention, Duration::from_secs(3 * 86_400));
        assert!(parse(&[]).unwrap().dedup.is_none());
        for (extra, flag) in [
            (
                &["--window-key", ".device"][..],
                "--window-key: needs --window",
            ),
            (
                &["--window", "1d", "--window-key", ".d"],
                "--window-key-partitioned",
            ),
            (
                &["--window", "1d", "--window-time-zone", "Mars/Olympus"],
                "--window-time-zone",
            ),
            (&["--window", "0s"], "--window: must be longer than 0"),
            (
                &["--window", "1d", "--guarantee", "at-least-once"],
                "exactly-once",
            ),
            (
                &["--window", "1d", "--input-topics", "a,b"],
                "one --input-topics",
            ),
            (
                &["--window", "1d", "--call-url", "http://127.0.0.1:1"],
                "--call-url",
            ),
            (
                &["--window", "1d", "--state-changelog", "out"],
                "also the --output-topic",
            ),
            (
                &["--window", "1d", "--state-changelog", "in"],
                "also the --input-topics",
            ),
        ] {
            let e = parse(extra).expect_err(&format!("{extra:?} should fail"));
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
    }

    #[test]
    fn the_stages_old_environment_names_are_refused_naming_the_new_ones() {
        use super::super::dedup::renamed_env;
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(renamed_env(names(&["EXACTLY_WINDOW", "PATH"])).is_ok());
        for (old, new) in [
            ("EXACTLY_DEDUP_WINDOW", "renamed EXACTLY_WINDOW;"),
            ("EXACTLY_DEDUP_CHANGELOG", "renamed EXACTLY_STATE_CHANGELOG"),
            (
                "EXACTLY_DEDUP_KEY_PARTITIONED",
                "renamed EXACTLY_WINDOW_KEY_PARTITIONED",
            ),
        ] {
            let e = renamed_env(names(&["HOME", old])).unwrap_err().to_string();
            assert!(e.starts_with(old) && e.contains(new), "{e}");
        }
    }

    #[test]
    fn aggregates_resolve_with_their_programs_and_name_the_flag_they_refuse() {
        let c = parse(&[
            "--window",
            "1h",
            "--aggregate",
            "count,sum",
            "--aggregate-sum",
            ".n",
        ]);
        let d = c.unwrap().dedup.expect("on");
        assert_eq!(d.changelog, "g.aggregate-changelog", "not the dedup's");
        let a = d.aggregate.expect("aggregating");
        assert!(a.count && a.sum.as_deref() == Some(".n") && a.distinct.is_none());
        // The dedup's old names still work.
        let old = parse(&["--dedup-window", "1d", "--dedup-changelog", "c"]).unwrap();
        assert_eq!(old.dedup.map(|d| d.changelog).as_deref(), Some("c"));
        let w = ["--window", "1d"];
        for (extra, flag) in [
            (vec!["--aggregate", "count"], "--aggregate: needs --window"),
            (
                vec!["--aggregate-sum", ".n"],
                "--aggregate-sum: needs --aggregate",
            ),
            (
                [&w[..], &["--aggregate", "sum"]].concat(),
                "needs --aggregate-sum",
            ),
            (
                [
                    &w[..],
                    &["--aggregate", "count", "--aggregate-distinct", ".u"],
                ]
                .concat(),
                "--aggregate-distinct: --aggregate does not list distinct",
            ),
            (
                [&w[..], &["--aggregate", "count", "--window-late", "pass"]].concat(),
                "--window-late",
            ),
            ([&w[..], &["--aggregate", "median"]].concat(), "median"),
            (
                vec!["--aggregate-emit", "final"],
                "--aggregate-emit: needs --aggregate",
            ),
        ] {
            let e = parse(&extra).expect_err(&format!("{extra:?} should fail"));
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
    }

    #[test]
    fn defaults_are_derived() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.sink.transactional_id, "g-i-0");
        assert_eq!(c.errors.dlq_topic, "out.dlq");
        assert_eq!(c.commit.interval, Duration::from_millis(100));
        assert_eq!(c.sink.transaction_timeout, Duration::from_secs(60));
        assert_eq!(c.errors.on_error, OnError::Dlq);
        assert_eq!(c.transform.spec, TransformSpec::Passthrough);
        assert!(c.lineage);
        assert_eq!(c.group.input, Input::Topics(vec!["in".into()]));
        assert_eq!(c.test, TestSwitches::default());
    }

    #[test]
    fn topics_list_and_pattern() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.group.input, Input::Topics(vec!["in".into()]));
        let args = [
            "exactly",
            "run",
            "--bootstrap-servers",
            "b:1",
            "--input-topics",
            "a,b",
            "--output-topic",
            "o",
            "--group-id",
            "g",
            "--instance-id",
            "x",
        ];
        let Command::Run(run) = Cli::try_parse_from(args).unwrap().command else {
            panic!()
        };
        assert_eq!(
            run.validate().unwrap().group.input,
            Input::Topics(vec!["a".into(), "b".into()])
        );
        let args = [
            "exactly",
            "run",
            "--bootstrap-servers",
            "b:1",
            "--input-pattern",
            "^in-.*",
            "--output-topic",
            "o",
            "--group-id",
            "g",
            "--instance-id",
            "x",
        ];
        let Command::Run(run) = Cli::try_parse_from(args).unwrap().command else {
            panic!()
        };
        assert_eq!(
            run.validate().unwrap().group.input,
            Input::Pattern("^in-.*".into())
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--commit-interval", "soon"], "--commit-interval"),
            (&["--commit-interval", "0s"], "--commit-interval"),
            (&["--transaction-timeout", "1s"], "--transaction-timeout"),
            (
                &["--commit-interval", "10s", "--transaction-timeout", "12s"],
                "--transaction-timeout",
            ),
            (&["--max-records-per-txn", "0"], "--max-records-per-txn"),
            (&["--on-error", "ignore"], "--on-error"),
            (&["--dlq-topic", "bad topic"], "--dlq-topic"),
            (&["--consumer-config", "nokey"], "--consumer-config"),
            (
                &["--consumer-config", "enable.auto.commit=true"],
                "--consumer-config",
            ),
            (
                &["--consumer-config", "isolation.level=read_uncommitted"],
                "--consumer-config",
            ),
            (
                &["--producer-config", "transactional.id=x"],
                "--transactional-id",
            ),
            (
                &["--producer-config", "enable.idempotence=false"],
                "--producer-config",
            ),
            (
                &["--producer-config", "no.such.property=1"],
                "--producer-config",
            ),
            (
                &["--producer-config", "linger.ms=banana"],
                "--producer-config",
            ),
            (&["--log-level", "loud=="], "--log-level"),
            (&["--jq-file", "/nonexistent/prog.jq"], "--jq-file"),
            (&["--envelope"], "--jq"),
            (&["--shutdown-grace", "0s"], "--shutdown-grace"),
        ];
        for (extra, flag) in cases {
            let e = parse(extra).expect_err(&format!("{extra:?} should fail"));
            assert!(e.contains(flag), "{extra:?}: '{e}' does not name {flag}");
        }
    }

    #[test]
    fn output_must_not_be_an_input() {
        let args = [
            "exactly",
            "run",
            "--bootstrap-servers",
            "b:1",
            "--input-topics",
            "t",
            "--output-topic",
            "t",
            "--group-id",
            "g",
            "--instance-id",
            "x",
        ];
        let Command::Run(run) = Cli::try_parse_from(args).unwrap().command else {
            panic!()
        };
        let e = run.validate().unwrap_err().to_string();
        assert!(e.contains("--output-topic"), "{e}");
    }

    #[test]
    fn refused_keys_say_what_to_use_instead() {
        let e = parse(&["--consumer-config", "group.id=other"]).unwrap_err();
        assert!(e.contains("use --group-id"), "{e}");
        let e = parse(&["--producer-config", "transaction.timeout.ms=1000"]).unwrap_err();
        assert!(e.contains("use --transaction-timeout"), "{e}");
        let e = parse(&["--consumer-config", "statistics.interval.ms=10"]).unwrap_err();
        assert!(e.contains("use --lag-interval"), "{e}");
        let e = parse(&["--lag-interval", "10ms"]).unwrap_err();
        assert!(e.contains("--lag-interval: must be between"), "{e}");
    }

    #[test]
    fn passthrough_accepts_real_librdkafka_keys() {
        let c = parse(&[
            "--consumer-config",
            "session.timeout.ms=6000",
            "--consumer-config",
            "debug=cgrp,topic",
            "--producer-config",
            "linger.ms=20",
        ])
        .unwrap();
        assert_eq!(c.kafka.consumer[1], ("debug".into(), "cgrp,topic".into()));
        assert_eq!(c.kafka.producer, vec![("linger.ms".into(), "20".into())]);
    }

    /// A properties file in a temp dir, removed when dropped.
    struct PropertiesFile(std::path::PathBuf);

    impl PropertiesFile {
        fn new(text: &str) -> PropertiesFile {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "exactly-config-test-{}-{n}.properties",
                std::process::id()
            ));
            std::fs::write(&path, text).unwrap();
            PropertiesFile(path)
        }

        fn arg(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for PropertiesFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn every_client_gets_the_file_then_the_flags() {
        let file = PropertiesFile::new(
            "# a mounted Secret\nsecurity.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\n\
             sasl.username=exactly\nsasl.password=p\\u00e4ss w=rd\n",
        );
        let c = parse(&[
            "--kafka-config-file",
            file.arg(),
            "--kafka-config",
            "sasl.username=other",
            "--consumer-config",
            "session.timeout.ms=6000",
        ])
        .unwrap();
        assert_eq!(
            c.kafka.common.iter().cloned().collect::<Vec<_>>(),
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "exactly"),
                ("sasl.password", "p\u{e4}ss w=rd"),
                ("sasl.username", "other"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        // The flag comes after the file's key of the same name, so it wins.
        let producer = c.kafka.to_rdkafka(crate::kafka::Role::Idempotent);
        assert_eq!(producer.get("sasl.username"), Some("other"));
        assert_eq!(producer.get("security.protocol"), Some("SASL_SSL"));
    }

    #[test]
    fn a_bad_setting_for_every_client_names_its_source_and_hides_secrets() {
        let e = parse(&["--kafka-config", "group.id=g2"]).unwrap_err();
        assert!(
            e.contains("--kafka-config") && e.contains("use --group-id"),
            "{e}"
        );
        let e = parse(&["--kafka-config", "transactional.id=t"]).unwrap_err();
        assert!(e.contains("use --transactional-id"), "{e}");
        let e = parse(&["--kafka-config-file", "/nonexistent/client.properties"]).unwrap_err();
        assert!(
            e.contains("--kafka-config-file /nonexistent/client.properties"),
            "{e}"
        );
        let file = PropertiesFile::new("sasl.username=a\nsasl.password=\\uZZZZ-s3cret\n");
        let e = parse(&["--kafka-config-file", file.arg()]).unwrap_err();
        assert!(e.contains("not a properties file at line 2"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        // A Java client's JAAS line is no librdkafka key: refused, and not shown.
        let jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required \
                    username=\"u\" password=\"s3cret\";";
        let file = PropertiesFile::new(&format!("sasl.jaas.config={jaas}\n"));
        let e = parse(&["--kafka-config-file", file.arg()]).unwrap_err();
        assert!(e.contains("sasl.jaas.config"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        // A misspelt key's value is a secret all the same.
        let e = parse(&["--kafka-config", "sasl.pasword=s3cret"]).unwrap_err();
        assert!(e.contains("sasl.pasword"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        // A PEM key over several lines: its lines read as keys, and none is shown.
        let file = PropertiesFile::new(
            "ssl.key.pem=-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n\
             -----END PRIVATE KEY-----\n",
        );
        let e = parse(&["--kafka-config-file", file.arg()]).unwrap_err();
        assert!(e.contains("not a setting name"), "{e}");
        assert!(!e.contains("MIIEvQ"), "{e}");
        // A malformed pair is not echoed: it may be a secret with the wrong separator.
        let e = parse(&["--kafka-config", "sasl.password:s3cret"]).unwrap_err();
        assert!(e.contains("--kafka-config") && !e.contains("s3cret"), "{e}");
        let e = parse(&["--consumer-config", "ssl.key.password"]).unwrap_err();
        assert!(e.contains("--consumer-config"), "{e}");
    }

    #[test]
    fn help_never_shows_the_values_of_settings_from_the_environment() {
        // Every option that takes librdkafka settings, on every subcommand (tests/secure.rs
        // runs --help with secrets in the environment; setting variables here would race the
        // other tests, which parse).
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, found: &mut usize) {
            for arg in cmd.get_arguments() {
                let long = arg.get_long().unwrap_or("");
                if long.ends_with("-config") {
                    assert!(
                        arg.is_hide_env_values_set(),
                        "--{long} of {}",
                        cmd.get_name()
                    );
                    *found += 1;
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, found);
            }
        }
        let mut found = 0;
        walk(&Cli::command(), &mut found);
        // run: kafka, consumer, producer; audit: kafka, consumer; offsets ×3: kafka, consumer;
        // state ×2: kafka.
        assert_eq!(found, 13);
    }

    #[test]
    fn jq_and_envelope() {
        let c = parse(&["--jq", ".a", "--envelope"]).unwrap();
        assert_eq!(
            c.transform.spec,
            TransformSpec::Jq {
                program: ".a".into(),
                envelope: true
            }
        );
        let e = parse(&["--jq", ".a", "--jq-file", "x.jq"]).unwrap_err();
        assert!(e.contains("--jq"), "{e}");
    }

    #[test]
    fn transactional_id_override() {
        let c = parse(&["--transactional-id", "fixed"]).unwrap();
        assert_eq!(c.sink.transactional_id, "fixed");
    }

    #[test]
    fn the_stuck_call_timeout_defaults_to_the_transaction_timeout_plus_30s_and_names_its_flag() {
        assert_eq!(
            parse(&[]).unwrap().stuck_call_timeout,
            Duration::from_secs(90)
        );
        let c = parse(&["--transaction-timeout", "6s", "--stuck-call-timeout", "12s"]).unwrap();
        assert_eq!(c.stuck_call_timeout, Duration::from_secs(12));
        let e = parse(&["--transaction-timeout", "6s", "--stuck-call-timeout", "8s"]).unwrap_err();
        assert!(
            e.contains("--stuck-call-timeout") && e.contains("--transaction-timeout"),
            "{e}"
        );
    }

    #[test]
    fn membership_is_static_by_default_with_the_classic_protocol_only() {
        let static_with = |args: &[&str]| parse(args).unwrap().group.static_membership;
        assert!(static_with(&[]));
        assert!(!static_with(&["--group-protocol", "consumer"]));
        assert!(!static_with(&["--membership", "dynamic"]));
        assert!(static_with(&[
            "--membership",
            "static",
            "--group-protocol",
            "consumer"
        ]));
        // The flag from before static became the default still means static.
        assert!(static_with(&[
            "--static-membership",
            "--group-protocol",
            "consumer"
        ]));
        let e = parse(&["--static-membership", "--membership", "dynamic"]).unwrap_err();
        assert!(e.contains("--membership"), "{e}");
    }

    #[test]
    fn a_propagation_wait_longer_than_a_record_may_wait_is_refused_naming_its_flag() {
        let key = "topic.metadata.propagation.max.ms";
        let late = format!("{key}=60000");
        let e = parse(&["--producer-config", &late]).unwrap_err();
        assert!(
            e.starts_with("--producer-config: ") && e.contains(key),
            "{e}"
        );
        let e = parse(&["--kafka-config", &late]).unwrap_err();
        assert!(e.starts_with("--kafka-config: ") && e.contains(key), "{e}");
        // At-least-once has no transaction to outlive; a shorter wait is fine.
        assert!(parse(&["--producer-config", &late, "--guarantee", "at-least-once"]).is_ok());
        assert!(parse(&["--producer-config", &format!("{key}=10000")]).is_ok());
    }

    #[test]
    fn the_consumer_protocol_refuses_what_the_broker_owns_naming_the_flag() {
        let c = parse(&["--group-protocol", "consumer"]).unwrap();
        assert_eq!(c.group.protocol, GroupProtocol::Consumer);
        assert_eq!(parse(&[]).unwrap().group.protocol, GroupProtocol::Classic);
        for (flag, setting) in [
            ("--consumer-config", "session.timeout.ms=6000"),
            ("--kafka-config", "heartbeat.interval.ms=500"),
        ] {
            let e = parse(&["--group-protocol", "consumer", flag, setting]).unwrap_err();
            let key = setting.split('=').next().unwrap_or_default();
            assert!(e.starts_with(&format!("{flag}: {key}")), "{e}");
            assert!(e.contains(&format!("group.consumer.{key}")), "{e}");
        }
        // The classic protocol takes them from the client as before.
        assert!(parse(&["--consumer-config", "session.timeout.ms=6000"]).is_ok());
        // group.protocol itself is the option's.
        let e = parse(&["--consumer-config", "group.protocol=consumer"]).unwrap_err();
        assert!(e.contains("--group-protocol"), "{e}");
    }
}

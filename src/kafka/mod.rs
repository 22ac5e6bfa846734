//! Kafka clients, built in one place: one [`Settings`] object and one [`Role`] per client.
//!
//! Every client exactly creates (the pipeline's consumer and producer, the lag clients, the
//! audit's readers, the offset tools) is created by the [`Client`] [`Settings::client`] gives
//! it, which knows where each setting came from: when librdkafka refuses the settings, the
//! error names the client and the option that holds the key it names ([`NotCreated`]). The
//! settings apply in one order: the role's defaults, then the user's settings for
//! every client (`--kafka-config-file`, then `--kafka-config`: security, network), then the
//! user's settings for the role (`--consumer-config`, `--producer-config`), then the keys the
//! role fixes. A user can change a default (`auto.offset.reset`), never a fixed key
//! (`isolation.level`). Start-up refuses the pipeline's fixed keys with the option to use
//! instead; the few keys only the tools fix (the lag clients' `client.id`, the audit's
//! `enable.partition.eof`) simply win.
//!
//! Secrets: [`is_secret`] is the one rule for which settings are never shown, and
//! [`Settings`]' `Debug` follows it.
//!
//! A leaf: nothing here knows the rest of exactly, and the rest of exactly (but the Kafka sinks,
//! the audit and the offsets tool) knows rust-rdkafka only through here: [`consumer`] (the
//! group's consumer, its rebalances told to an owner), [`failure`] (a failed call, and what it
//! means), [`admin`], [`reader`] and [`ends`] (the changelog's topic, its restore, watermarks).
//! The librdkafka calls rust-rdkafka does not offer live behind small safe wrappers:
//! [`produce`] (through topic handles), [`raw_headers`] (header names as bytes), [`member`]
//! (the group generation an offset commit is fenced by) and [`flush`]; `denial` reads what the
//! cluster says when it says no ([`Refusal`], [`denied`], [`denied_partition`],
//! [`timed_out_txn_request`]).

pub mod admin;
pub mod consumer;
mod denial;
pub mod ends;
pub mod failure;
pub mod member;
pub mod produce;
pub mod raw_headers;
pub mod reader;

pub use denial::{Refusal, denied, denied_partition, timed_out_txn_request};

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::{FromClientConfig, FromClientConfigAndContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// What librdkafka says of `key` = `value`, if it refuses it: its own words, without
/// rust-rdkafka's copy of the key and value. They quote an invalid value, and a secret's is not
/// shown; an unknown key's value is never shown (a misspelt `sasl.pasword` holds a password all
/// the same).
pub fn refused_setting(key: &str, value: &str) -> Option<String> {
    let mut one = ClientConfig::new();
    one.set(key, value);
    let e = one.create_native_config().err()?;
    let mut said = match e {
        KafkaError::ClientConfig(_, desc, _, _) => desc,
        other => other.to_string(),
    };
    if is_secret(key) && !value.is_empty() {
        said = said.replace(value, REDACTED);
    }
    Some(said)
}

/// librdkafka's version.
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

/// How to reach the cluster, and the user's extra librdkafka settings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// `client.id` of the pipeline's clients (the lag clients add `-lag`).
    pub client_id: String,
    /// Settings for every client (security, network).
    pub common: Common,
    /// Extra consumer settings (also used by every reading client).
    pub consumer: Vec<(String, String)>,
    /// Extra producer settings.
    pub producer: Vec<(String, String)>,
}

/// The settings for every client, in the order they apply, kept apart by where they came from
/// so that an error can name the option that holds a bad value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Common {
    /// `--kafka-config-file`: its path, and its settings in its order.
    pub file: Option<(std::path::PathBuf, Vec<(String, String)>)>,
    /// `--kafka-config`'s settings, which override the file's.
    pub flags: Vec<(String, String)>,
}

impl Common {
    /// Only `--kafka-config`'s settings.
    pub fn flags(flags: Vec<(String, String)>) -> Common {
        Common { file: None, flags }
    }

    /// Every setting, in the order they apply: the file's, then the flags'.
    pub fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        let file = self.file.iter().flat_map(|(_, kv)| kv);
        file.chain(&self.flags)
    }
}

/// Whether a setting's value is a secret, by its key: never logged, printed or shown in an
/// error. Kafka's and librdkafka's secret keys all say so in their names
/// (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, `sasl.oauthbearer.client.secret`,
/// `sasl.oauthbearer.config`, `sasl.oauthbearer.assertion.private.key.*`, `sasl.jaas.config`,
/// tokens). A few paths are hidden too (`ssl.key.location`): a path is no secret, but the rule
/// stays one line.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "passphrase",
        "private.key",
        "oauthbearer.config",
        "sasl.jaas.config",
        "ssl.key",
        "token",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// What a setting's value may be shown as.
pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) { REDACTED } else { value }
}

/// What a secret is shown as.
pub const REDACTED: &str = "[redacted]";

/// Settings shown as `key=value` pairs, secrets redacted.
struct Shown<'a>(&'a [(String, String)]);

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| format!("{k}={}", shown(k, v))))
            .finish()
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("client_id", &self.client_id)
            .field(
                "file",
                &self.common.file.as_ref().map(|(p, kv)| (p, Shown(kv))),
            )
            .field("kafka_config", &Shown(&self.common.flags))
            .field("consumer", &Shown(&self.consumer))
            .field("producer", &Shown(&self.producer))
            .finish()
    }
}

/// Kafka's rule for a topic name: 1–249 bytes of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn valid_topic_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != b"."
        && name != b".."
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b))
}

/// The consumer group protocol (`group.protocol`) the pipeline's consumer joins with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupProtocol {
    /// The classic protocol: the members assign partitions (cooperative-sticky here), the
    /// client sets the session timeout and heartbeat interval.
    #[default]
    Classic,
    /// KIP-848's: the group coordinator assigns partitions and sets the session timeout and
    /// heartbeat interval (`group.consumer.*` on the broker); member epochs fence offsets.
    /// Kafka 4.0 and later.
    Consumer,
}

impl GroupProtocol {
    /// librdkafka's value.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }

    /// Consumer settings this protocol takes from the broker instead: librdkafka 2.12 refuses a
    /// user's value when the consumer is created, so start-up refuses it first, naming the flag
    /// and saying where the setting lives.
    pub fn brokers_settings(self) -> &'static [(&'static str, &'static str)] {
        match self {
            GroupProtocol::Classic => &[],
            GroupProtocol::Consumer => &[
                (
                    "session.timeout.ms",
                    "the broker's group.consumer.session.timeout.ms (or the group's \
                     consumer.session.timeout.ms)",
                ),
                (
                    "heartbeat.interval.ms",
                    "the broker's group.consumer.heartbeat.interval.ms (or the group's \
                     consumer.heartbeat.interval.ms)",
                ),
                (
                    "partition.assignment.strategy",
                    "the broker's assignor (group.remote.assignor picks one of them)",
                ),
                (
                    "group.protocol.type",
                    "nothing: the consumer protocol has no type",
                ),
            ],
        }
    }
}

/// Which client, with what only that client needs.
#[derive(Clone, Copy, Debug)]
pub enum Role<'a> {
    /// The pipeline's read_committed, manually committed consumer.
    Pipeline {
        /// Consumer group.
        group: &'a str,
        /// `group.instance.id` (static membership), if any.
        instance: Option<&'a str>,
        /// librdkafka statistics (the lag positions) every this long.
        statistics: Duration,
        /// The longest the loop goes without polling (one transactional call): the default
        /// `max.poll.interval.ms`, which is also the group's rebalance timeout.
        poll_bound: Duration,
        /// `group.protocol`.
        protocol: GroupProtocol,
    },
    /// The transactional producer of exactly-once.
    Transactional {
        /// `transactional.id`.
        id: &'a str,
        /// `transaction.timeout.ms`.
        timeout: Duration,
        /// `--commit-interval`: how long a transaction stays open.
        interval: Duration,
    },
    /// The idempotent producer of at-least-once (no transactions).
    Idempotent,
    /// A client that only asks for end offsets with this isolation (the lag gauges).
    EndOffsets {
        /// `read_committed` (the last stable offset) or `read_uncommitted` (high watermark).
        isolation: Isolation,
    },
    /// The audit's reader of topic ranges.
    AuditReader {
        /// What it reads.
        isolation: Isolation,
    },
    /// The reader of a state changelog (`state::restore`): read_committed, in no group (the
    /// `group.id` librdkafka's assign needs is never joined), never resetting on its own.
    Restore,
    /// An admin client (the changelog topic, created or checked at start).
    Admin,
    /// A reader of a group's committed offsets (the audit, offset stores).
    GroupOffsets {
        /// The group.
        group: &'a str,
    },
}

/// `isolation.level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Only committed transactions.
    ReadCommitted,
    /// Everything, aborted and open transactions too.
    ReadUncommitted,
}

impl Isolation {
    /// librdkafka's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// The longest exactly lets librdkafka wait before it calls a topic missing.
const PROPAGATION: Duration = Duration::from_secs(30);

/// librdkafka's key for that wait.
pub const PROPAGATION_KEY: &str = "topic.metadata.propagation.max.ms";

impl Settings {
    /// How long a record routed to a missing topic may wait for librdkafka to call the topic
    /// missing (`topic.metadata.propagation.max.ms`): it must be refused before it times out
    /// (`message.timeout.ms`, which only replaces the producer, whose next send waits as long
    /// again) and before its transaction does (sent as late as `interval` into it), so that
    /// `sink::routes` sees the refusal.
    pub fn route_wait(&self, timeout: Duration, interval: Duration) -> Duration {
        let within = timeout.saturating_sub(interval);
        // Two names of one setting: the last given wins, as in librdkafka; 0 is no bound.
        let keys = ["message.timeout.ms", "delivery.timeout.ms"];
        let message = user_ms(self.common.iter().chain(&self.producer), &keys).filter(|&ms| ms > 0);
        message.map_or(within, |ms| within.min(Duration::from_millis(ms)))
    }

    /// A `topic.metadata.propagation.max.ms` the user set that leaves a record routed to a
    /// missing topic timing out before it is refused (see [`Settings::route_wait`]).
    pub fn check_propagation(&self, timeout: Duration, interval: Duration) -> Result<(), String> {
        let key = PROPAGATION_KEY;
        let Some(set) = user_ms(self.common.iter().chain(&self.producer), &[key]) else {
            return Ok(());
        };
        let wait = self.route_wait(timeout, interval);
        if u128::from(set) < wait.as_millis() {
            return Ok(());
        }
        Err(format!(
            "{key}: {set} ms leaves a record routed to a missing topic timing out before it is \
             refused; it must be shorter than {} ms (message.timeout.ms, or \
             --transaction-timeout less --commit-interval)",
            wait.as_millis()
        ))
    }

    /// The librdkafka settings of `role`: its defaults, the user's keys, its fixed keys.
    pub fn to_rdkafka(&self, role: Role<'_>) -> ClientConfig {
        self.client(role).config
    }

    /// The client of `role`, ready to create: its settings ([`Settings::to_rdkafka`]) and
    /// where each came from.
    pub fn client(&self, role: Role<'_>) -> Client {
        let (defaults, (user_flag, user), fixed) = self.layers(role);
        let mut client = Client {
            name: role.name(),
            config: ClientConfig::new(),
            origins: BTreeMap::new(),
        };
        for (k, v) in defaults {
            client.set(k, v, Origin::Default(user_flag));
        }
        if let Some((path, kv)) = &self.common.file {
            for (k, v) in kv {
                client.set(k, v, Origin::File(path.clone()));
            }
        }
        for (k, v) in &self.common.flags {
            client.set(k, v, Origin::Flag("--kafka-config"));
        }
        for (k, v) in user {
            client.set(k, v, Origin::Flag(user_flag));
        }
        for (k, v) in fixed {
            client.set(k, v, Origin::Fixed);
        }
        client
    }

    /// The settings of `role` in the three layers that apply in turn: its defaults, the
    /// user's settings for the role (after the common ones) with their option, the keys it
    /// fixes.
    #[allow(clippy::type_complexity)]
    fn layers(
        &self,
        role: Role<'_>,
    ) -> (
        Vec<(&'static str, String)>,
        (&'static str, &[(String, String)]),
        Vec<(&'static str, String)>,
    ) {
        let mut defaults: Vec<(&str, String)> = Vec::new();
        let mut fixed: Vec<(&str, String)> =
            vec![("bootstrap.servers", self.bootstrap_servers.clone())];
        let user = match role {
            Role::Pipeline {
                group,
                instance,
                statistics,
                poll_bound,
                protocol,
            } => {
                if protocol == GroupProtocol::Classic {
                    defaults.push(("partition.assignment.strategy", "cooperative-sticky".into()));
                }
                defaults.extend([
                    ("client.id", self.client_id.clone()),
                    ("auto.offset.reset", "earliest".into()),
                    (
                        "max.poll.interval.ms",
                        max_poll_interval(poll_bound, self.common.iter().chain(&self.consumer)),
                    ),
                ]);
                defaults.extend(PIPELINE_FETCH.map(|(k, v)| (k, v.to_string())));
                fixed.extend([
                    ("group.protocol", protocol.as_str().into()),
                    ("group.id", group.to_string()),
                    ("isolation.level", Isolation::ReadCommitted.as_str().into()),
                    ("enable.auto.commit", "false".into()),
                    ("enable.auto.offset.store", "false".into()),
                    ("statistics.interval.ms", statistics.as_millis().to_string()),
                ]);
                if let Some(id) = instance {
                    fixed.push(("group.instance.id", id.to_string()));
                }
                ("--consumer-config", self.consumer.as_slice())
            }
            Role::Transactional {
                id,
                timeout,
                interval,
            } => {
                defaults.push(("client.id", self.client_id.clone()));
                defaults.extend(PIPELINE_PRODUCE.map(|(k, v)| (k, v.to_string())));
                let propagation = (self.route_wait(timeout, interval) / 2).min(PROPAGATION);
                defaults.push((PROPAGATION_KEY, propagation.as_millis().to_string()));
                fixed.extend(idempotent());
                fixed.extend([
                    ("transactional.id", id.to_string()),
                    ("transaction.timeout.ms", timeout.as_millis().to_string()),
                ]);
                ("--producer-config", self.producer.as_slice())
            }
            Role::Idempotent => {
                defaults.push(("client.id", self.client_id.clone()));
                defaults.extend(PIPELINE_PRODUCE.map(|(k, v)| (k, v.to_string())));
                fixed.extend(idempotent());
                ("--producer-config", self.producer.as_slice())
            }
            Role::EndOffsets { isolation } => {
                fixed.extend([
                    ("client.id", format!("{}-lag", self.client_id)),
                    ("isolation.level", isolation.as_str().into()),
                    ("enable.auto.commit", "false".into()),
                ]);
                ("--consumer-config", self.consumer.as_slice())
            }
            Role::AuditReader { isolation } => {
                fixed.extend([
                    ("group.id", "exactly-audit".into()),
                    ("enable.auto.commit", "false".into()),
                    ("enable.partition.eof", "true".into()),
                    ("isolation.level", isolation.as_str().into()),
                ]);
                ("--consumer-config", self.consumer.as_slice())
            }
            Role::Restore => {
                fixed.extend([
                    ("client.id", format!("{}-restore", self.client_id)),
                    ("group.id", "exactly-restore".into()),
                    ("enable.auto.commit", "false".into()),
                    ("enable.auto.offset.store", "false".into()),
                    ("auto.offset.reset", "error".into()),
                    ("isolation.level", Isolation::ReadCommitted.as_str().into()),
                    // A read ends at the partition's end, often a commit marker, which only a
                    // fetch past it moves the position over: the broker holds such a fetch
                    // this long (500 ms by default, per partition restored).
                    ("fetch.wait.max.ms", "10".into()),
                ]);
                ("--consumer-config", self.consumer.as_slice())
            }
            Role::Admin => {
                fixed.push(("client.id", format!("{}-admin", self.client_id)));
                ("--producer-config", self.producer.as_slice())
            }
            Role::GroupOffsets { group } => {
                fixed.extend([
                    ("group.id", group.to_string()),
                    ("enable.auto.commit", "false".into()),
                    (
                        "isolation.level",
                        Isolation::ReadUncommitted.as_str().into(),
                    ),
                ]);
                ("--consumer-config", self.consumer.as_slice())
            }
        };
        (defaults, user, fixed)
    }
}

impl Role<'_> {
    /// What the client is, in an error.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Pipeline { .. } => "the pipeline's consumer",
            Role::Transactional { .. } => "the transactional producer",
            Role::Idempotent => "the idempotent producer",
            Role::EndOffsets { .. } => "the end-offset reader",
            Role::AuditReader { .. } => "the audit's reader",
            Role::Restore => "the state changelog's reader",
            Role::Admin => "the admin client",
            Role::GroupOffsets { .. } => "the reader of the group's offsets",
        }
    }
}

/// Where a client's setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Origin {
    /// exactly's default for the client, which this option overrides.
    Default(&'static str),
    /// `--kafka-config-file` at this path.
    File(std::path::PathBuf),
    /// This option (`--kafka-config`, `--consumer-config`, `--producer-config`).
    Flag(&'static str),
    /// Fixed by exactly (the flag that sets it was checked at start).
    Fixed,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default(flag) => write!(f, "exactly's default ({flag} overrides it)"),
            Origin::File(path) => write!(f, "--kafka-config-file {}", path.display()),
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Fixed => f.write_str(
                "exactly's own options for this client (--bootstrap-servers, --group-id, \
                 --transactional-id, …)",
            ),
        }
    }
}

/// One client's librdkafka settings, and where each came from: what creates the client, so
/// that a refusal of its settings names the client and the option to fix.
#[derive(Clone)]
pub struct Client {
    name: &'static str,
    config: ClientConfig,
    /// Each key's source (the last that set it).
    origins: BTreeMap<String, Origin>,
}

/// librdkafka refused a client's settings: which client, what librdkafka said (secrets
/// redacted), and the options that hold the keys it named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotCreated(String);

impl std::fmt::Display for NotCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotCreated {}

impl Client {
    /// The value of `key` as this client is configured, if it is set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.config.get(key)
    }

    fn set(&mut self, key: &str, value: impl Into<String>, origin: Origin) {
        self.config.set(key, value);
        self.origins.insert(key.to_string(), origin);
    }

    /// Creates the client.
    pub fn create<T: FromClientConfig>(&self) -> Result<T, NotCreated> {
        self.config.create().map_err(|e| self.not_created(&e))
    }

    /// Creates the client with `context`.
    pub fn create_with_context<C, T>(&self, context: C) -> Result<T, NotCreated>
    where
        C: ClientContext,
        T: FromClientConfigAndContext<C>,
    {
        (self.config.create_with_context(context)).map_err(|e| self.not_created(&e))
    }

    /// `e` from creating the client, as the operator needs it: the client, librdkafka's words
    /// (a secret's value never shown), and where each key they name was set. A message that
    /// names none of the keys set lists the options that set any.
    fn not_created(&self, e: &KafkaError) -> NotCreated {
        let mut said = match e {
            KafkaError::ClientConfig(_, desc, _, _) => desc.clone(),
            KafkaError::ClientCreation(message) => message.clone(),
            other => other.to_string(),
        };
        // The longest first: a secret inside another is not left half shown.
        let mut secrets: Vec<&str> = (self.origins.keys())
            .filter(|k| is_secret(k))
            .filter_map(|k| self.config.get(k).filter(|v| !v.is_empty()))
            .collect();
        secrets.sort_by_key(|v| std::cmp::Reverse(v.len()));
        for value in secrets {
            said = said.replace(value, REDACTED);
        }
        let named: Vec<String> = match e {
            KafkaError::ClientConfig(_, _, key, _) => vec![key.clone()],
            _ => (self.origins.keys())
                .filter(|k| names_key(&said, k))
                .cloned()
                .collect(),
        };
        let blame: Vec<String> = (named.iter())
            .filter_map(|k| self.origins.get(k).map(|o| format!("{k} is from {o}")))
            .collect();
        let blame = if blame.is_empty() {
            // The user's options that set any key, in the order they apply.
            let mut sources: Vec<(u8, String)> = (self.origins.values())
                .filter_map(|origin| match origin {
                    Origin::File(_) => Some((0, origin.to_string())),
                    Origin::Flag("--kafka-config") => Some((1, origin.to_string())),
                    Origin::Flag(_) => Some((2, origin.to_string())),
                    Origin::Default(_) | Origin::Fixed => None,
                })
                .collect();
            sources.sort();
            sources.dedup();
            let sources: Vec<String> = sources.into_iter().map(|(_, s)| s).collect();
            if sources.is_empty() {
                String::new()
            } else {
                format!(" (settings from {})", sources.join(", "))
            }
        } else {
            format!("; {}", blame.join("; "))
        };
        NotCreated(format!("{} cannot be created: {said}{blame}", self.name))
    }
}

/// Whether librdkafka's `message` names the setting `key` (not a longer key it begins).
fn names_key(message: &str, key: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    message.match_indices(key).any(|(at, _)| {
        let before = message[..at].chars().next_back();
        // A key's end: not more of a word, nor a dot and more of a key (a full stop is one).
        let after = message[at + key.len()..]
            .trim_start_matches('.')
            .chars()
            .next();
        !before.is_some_and(|c| word(c) || c == '.') && !after.is_some_and(word)
    })
}

/// What both producers fix: transactions need the idempotent producer and acks from all
/// replicas, and at-least-once keeps both so a retry never duplicates.
fn idempotent() -> [(&'static str, String); 2] {
    [
        ("enable.idempotence", "true".into()),
        ("acks", "all".into()),
    ]
}

/// The pipeline consumer's fetch defaults, chosen by `bench/sweep.sh` (BENCHMARKS.md,
/// "Defaults"). librdkafka pauses fetching a partition for `fetch.queue.backoff.ms` (1 s) once
/// its local queue is past `queued.min.messages`; a loop that drains the queue faster than that
/// then sits idle, which capped ~100 B records at 146k/s with 0.55 of a core busy. At 5 ms the
/// fetcher keeps up: about 3.8× on ~100 B records. The queue's byte bound, 64 MB by default
/// (for all partitions together: they share the consumer queue), is most of the memory exactly
/// holds: at 1 MB peak RSS was 40–67 MB on ~100 B and ~1 KB records, where 4 MB is as fast on
/// ~100 B and faster on ~1 KB records, at about 100 MB. A user's `--consumer-config` overrides
/// both.
const PIPELINE_FETCH: [(&str, &str); 2] = [
    ("fetch.queue.backoff.ms", "5"),
    ("queued.max.messages.kbytes", "1024"),
];

/// The queue default of exactly's producers (the pipeline's sinks and `exactly state`), chosen
/// by `bench/sweep.sh` (BENCHMARKS.md, "Defaults"). A record sent is copied and held, with its
/// lineage header, until its delivery report. On small records, in practice only
/// `queue.buffering.max.messages` (100,000 by default) bounds that. On 5M ~100 B records the
/// peak RSS was 56–83 MB at 100,000 and mostly 54–61 MB at 25,000, with the same throughput on
/// ~100 B, ~1 KB, jq and 1,000 partitions. A full queue makes the send wait on deliveries (the
/// sink polls and sends again); it never drops a record. `--producer-config` overrides it.
const PIPELINE_PRODUCE: [(&str, &str); 1] = [("queue.buffering.max.messages", "25000")];

/// librdkafka's `session.timeout.ms` default.
const SESSION_TIMEOUT_MS: u128 = 45_000;

/// The pipeline consumer's `max.poll.interval.ms`: the loop's own bound (librdkafka's default
/// is 5 minutes), never below the session timeout, which librdkafka requires.
///
/// The group's rebalance timeout is this value too: how long the coordinator waits for members
/// to rejoin. Kafka 4.1's coordinator can keep a member that died with the broker after an
/// unclean restart (its session timeout not armed again when the group loads), and a rejoin
/// then waits the whole rebalance timeout: 5 minutes with librdkafka's default, the loop's
/// bound here (RELIABILITY.md, "A rejoin that waited for a ghost").
fn max_poll_interval<'a>(
    poll_bound: Duration,
    user: impl Iterator<Item = &'a (String, String)>,
) -> String {
    let session = user_ms(user, &["session.timeout.ms"]).map_or(SESSION_TIMEOUT_MS, u128::from);
    poll_bound.as_millis().max(session).to_string()
}

/// The milliseconds the user gave the setting named `keys` (the last time, where given twice).
fn user_ms<'a>(user: impl Iterator<Item = &'a (String, String)>, keys: &[&str]) -> Option<u64> {
    user.filter(|(k, _)| keys.contains(&k.as_str()))
        .last()
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// librdkafka's flush, waiting up to `timeout` for every outstanding delivery.
///
/// rust-rdkafka's `flush` (which its `commit_transaction` calls first) polls the producer's
/// event queue in steps of up to 100 ms, but a `ThreadedProducer`'s own thread takes those
/// events first, so every flush slept up to 100 ms after the last delivery: commits took
/// 65-100 ms and the loop stood still meanwhile (BENCHMARKS.md, "Profile"). With delivery
/// reports as events, librdkafka's flush waits on the count of outstanding messages instead.
pub fn flush<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the handle is alive for the call (borrowed from the producer); rd_kafka_flush is
    // thread-safe.
    let err = unsafe { rdkafka_sys::rd_kafka_flush(producer.client().native_ptr(), ms) };
    if err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::Flush(err.into()))
    }
}

/// A partition: (topic, partition).
pub type Tp = (String, i32);

/// The partitions of `tpl`.
pub fn partitions(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

/// The offset of each partition of `tpl`, `None` where it has none (nothing committed).
pub fn offsets_of(tpl: &TopicPartitionList) -> Vec<(Tp, Option<i64>)> {
    tpl.elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            ((e.topic().to_string(), e.partition()), offset)
        })
        .collect()
}

/// `partitions` as librdkafka's list, without offsets.
pub fn partition_list(partitions: &[Tp]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        tpl.add_partition(topic, *partition);
    }
    tpl
}

/// `offsets` as librdkafka's list.
pub fn offset_list(offsets: &[(Tp, i64)]) -> Result<TopicPartitionList, KafkaError> {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for ((topic, partition), offset) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    Ok(tpl)
}

/// `topic[0,1,2] other[5]`, for logs.
pub fn describe(partitions: &[Tp]) -> String {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (topic, partition) in partitions {
        by_topic.entry(topic).or_default().push(*partition);
    }
    by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{t}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(consumer: &[(&str, &str)], producer: &[(&str, &str)]) -> Settings {
        let own = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Settings {
            bootstrap_servers: "h:1".into(),
            client_id: "exactly-pod-0".into(),
            common: Common::default(),
            consumer: own(consumer),
            producer: own(producer),
        }
    }

    #[test]
    fn every_client_gets_the_common_settings_and_its_role_overrides_them() {
        let mut s = settings(&[("sasl.username", "reader")], &[("linger.ms", "20")]);
        s.common.flags = vec![
            ("security.protocol".into(), "sasl_ssl".into()),
            ("sasl.username".into(), "all".into()),
            ("isolation.level".into(), "read_uncommitted".into()),
            ("session.timeout.ms".into(), "90000".into()),
        ];
        let roles = [
            pipeline(None),
            Role::Transactional {
                id: "t",
                timeout: Duration::from_secs(60),
                interval: Duration::from_secs(1),
            },
            Role::Idempotent,
            Role::EndOffsets {
                isolation: Isolation::ReadCommitted,
            },
            Role::AuditReader {
                isolation: Isolation::ReadUncommitted,
            },
            Role::GroupOffsets { group: "g" },
            Role::Restore,
            Role::Admin,
        ];
        for role in roles {
            let cc = s.to_rdkafka(role);
            assert_eq!(cc.get("security.protocol"), Some("sasl_ssl"), "{role:?}");
        }
        // The role's own keys come after the common ones, the fixed keys after both.
        let consumer = s.to_rdkafka(pipeline(None));
        assert_eq!(consumer.get("sasl.username"), Some("reader"));
        assert_eq!(consumer.get("isolation.level"), Some("read_committed"));
        // The common session timeout counts for the rebalance timeout too.
        assert_eq!(consumer.get("max.poll.interval.ms"), Some("90000"));
        let producer = s.to_rdkafka(Role::Idempotent);
        assert_eq!(producer.get("sasl.username"), Some("all"));
        assert_eq!(producer.get("linger.ms"), Some("20"));
    }

    #[test]
    fn a_client_librdkafka_refuses_is_named_with_the_option_that_holds_the_bad_key() {
        // A key from the properties file: the file is named, with the client.
        let mut s = settings(&[("fetch.max.bytes", "1000")], &[]);
        let path = std::path::PathBuf::from("/etc/exactly/client.properties");
        s.common.file = Some((
            path,
            vec![
                ("security.protocol".into(), "ssl".into()),
                ("ssl.key.location".into(), "/nonexistent/k.pem".into()),
            ],
        ));
        s.common.flags = vec![("socket.timeout.ms".into(), "30000".into())];
        let admin = s.client(Role::Admin);
        let Err(e) = admin.create::<rdkafka::admin::AdminClient<_>>() else {
            panic!("created");
        };
        let e = e.to_string();
        assert!(e.starts_with("the admin client cannot be created: "), "{e}");
        assert!(
            e.contains(
                "ssl.key.location is from --kafka-config-file /etc/exactly/client.properties"
            ),
            "{e}"
        );
        assert!(
            !e.contains("/nonexistent/k.pem"),
            "a secret key's value shown: {e}"
        );
        // A key of the role's own option, under its client's name.
        s.common.file = None;
        let consumer = s.client(pipeline(None));
        let Err(e) = consumer.create::<rdkafka::consumer::BaseConsumer>() else {
            panic!("created");
        };
        let e = e.to_string();
        assert!(
            e.starts_with("the pipeline's consumer cannot be created: "),
            "{e}"
        );
        assert!(
            e.contains("fetch.max.bytes is from --consumer-config"),
            "{e}"
        );
        assert!(!e.contains("socket.timeout.ms"), "{e}");
    }

    #[test]
    fn a_refusal_that_names_no_key_set_lists_the_options_and_never_a_secret() {
        let mut s = settings(&[], &[("sasl.password", "p-secret")]);
        s.common.flags = vec![("sasl.username".into(), "alice".into())];
        let client = s.client(Role::Idempotent);
        let e = KafkaError::ClientCreation("`sasl.mechanism` p-secret is wrong".into());
        let e = client.not_created(&e).to_string();
        assert_eq!(
            e,
            "the idempotent producer cannot be created: `sasl.mechanism` [redacted] is \
             wrong (settings from --kafka-config, --producer-config)"
        );
    }

    #[test]
    fn a_key_is_named_only_whole() {
        assert!(names_key("ssl.key.location failed: x", "ssl.key.location"));
        assert!(names_key(
            "`fetch.max.bytes` must be >= x",
            "fetch.max.bytes"
        ));
        assert!(names_key("set ssl.key.", "ssl.key"));
        assert!(!names_key("ssl.key.location failed", "ssl.key"));
        assert!(!names_key("ssl.key.location failed", "key.location"));
        assert!(!names_key("`fetch.max.bytes2`", "fetch.max.bytes"));
    }

    #[test]
    fn a_transaction_denied_a_permission_is_known_by_librdkafkas_line() {
        assert!(denied(
            "TXNERR",
            "Current transaction failed in state InTransaction: Failed to add partition(s) to \
             transaction on broker TxnCoordinator/1: Broker: Topic authorization failed (after \
             8 ms) (TOPIC_AUTHORIZATION_FAILED)"
        ));
        assert!(!denied(
            "TXNERR",
            "Current transaction failed in state InTransaction: Broker: Not coordinator \
             (NOT_COORDINATOR)"
        ));
        assert!(!denied(
            "ADDPARTS",
            "Broker: Topic authorization failed (TOPIC_AUTHORIZATION_FAILED)"
        ));
    }

    #[test]
    fn secrets_are_known_by_their_keys_and_never_shown() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "ssl.key.location",
            "sasl.oauthbearer.client.secret",
            "sasl.jaas.config",
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "SASL.PASSWORD",
        ] {
            assert!(is_secret(key), "{key}");
        }
        for key in [
            "sasl.username",
            "security.protocol",
            "ssl.ca.location",
            "linger.ms",
        ] {
            assert!(!is_secret(key), "{key}");
        }
        let mut s = settings(&[("ssl.key.password", "k-secret")], &[]);
        s.common.flags = vec![
            ("sasl.username".into(), "alice".into()),
            ("sasl.password".into(), "p-secret".into()),
        ];
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("sasl.username=alice"), "{shown}");
        assert!(shown.contains("sasl.password=[redacted]"), "{shown}");
    }

    fn pipeline(instance: Option<&str>) -> Role<'_> {
        Role::Pipeline {
            group: "g",
            instance,
            statistics: Duration::from_secs(5),
            poll_bound: Duration::from_secs(75),
            protocol: GroupProtocol::Classic,
        }
    }

    #[test]
    fn the_group_protocol_decides_who_assigns() {
        let classic = settings(&[], &[]).to_rdkafka(pipeline(None));
        assert_eq!(classic.get("group.protocol"), Some("classic"));
        assert_eq!(
            classic.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        let role = Role::Pipeline {
            group: "g",
            instance: Some("pod-0"),
            statistics: Duration::from_secs(5),
            poll_bound: Duration::from_secs(75),
            protocol: GroupProtocol::Consumer,
        };
        let consumer = settings(&[], &[]).to_rdkafka(role);
        assert_eq!(consumer.get("group.protocol"), Some("consumer"));
        // The coordinator assigns: a client-side strategy would be refused by librdkafka.
        assert_eq!(consumer.get("partition.assignment.strategy"), None);
        assert_eq!(consumer.get("group.instance.id"), Some("pod-0"));
        assert_eq!(consumer.get("max.poll.interval.ms"), Some("75000"));
    }

    #[test]
    fn the_rebalance_timeout_is_the_loops_bound_not_five_minutes() {
        let cc = settings(&[], &[]).to_rdkafka(pipeline(None));
        assert_eq!(cc.get("max.poll.interval.ms"), Some("75000"));
        // Never below the session timeout (librdkafka refuses that).
        let long_session = settings(&[("session.timeout.ms", "90000")], &[]);
        let cc = long_session.to_rdkafka(pipeline(None));
        assert_eq!(cc.get("max.poll.interval.ms"), Some("90000"));
        let short = Role::Pipeline {
            group: "g",
            instance: None,
            statistics: Duration::from_secs(5),
            poll_bound: Duration::from_secs(25),
            protocol: GroupProtocol::Classic,
        };
        let cc = settings(&[], &[]).to_rdkafka(short);
        assert_eq!(cc.get("max.poll.interval.ms"), Some("45000"));
        let quick = settings(&[("session.timeout.ms", "6000")], &[]);
        assert_eq!(
            quick.to_rdkafka(short).get("max.poll.interval.ms"),
            Some("25000")
        );
        // The user's own value wins.
        let own = settings(&[("max.poll.interval.ms", "300000")], &[]);
        let cc = own.to_rdkafka(pipeline(None));
        assert_eq!(cc.get("max.poll.interval.ms"), Some("300000"));
    }

    #[test]
    fn consumer_reads_committed_and_never_autocommits() {
        let cc = settings(&[], &[]).to_rdkafka(pipeline(None));
        assert_eq!(cc.get("isolation.level"), Some("read_committed"));
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
        assert_eq!(cc.get("group.id"), Some("g"));
        assert_eq!(
            cc.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(cc.get("group.instance.id"), None);
        assert_eq!(cc.get("statistics.interval.ms"), Some("5000"));
        let cc = settings(&[], &[]).to_rdkafka(pipeline(Some("pod-0")));
        assert_eq!(cc.get("group.instance.id"), Some("pod-0"));
    }

    fn transactional(timeout: u64, interval: u64) -> Role<'static> {
        Role::Transactional {
            id: "g-pod-0",
            timeout: Duration::from_secs(timeout),
            interval: Duration::from_secs(interval),
        }
    }

    #[test]
    fn producer_is_transactional() {
        let s = settings(&[], &[]);
        let pc = s.to_rdkafka(transactional(30, 0));
        assert_eq!(pc.get("transactional.id"), Some("g-pod-0"));
        assert_eq!(pc.get("transaction.timeout.ms"), Some("30000"));
        assert_eq!(pc.get("enable.idempotence"), Some("true"));
        let pc = s.to_rdkafka(Role::Idempotent);
        assert_eq!(pc.get("transactional.id"), None);
        assert_eq!(pc.get("transaction.timeout.ms"), None);
        assert_eq!(pc.get("enable.idempotence"), Some("true"));
        assert_eq!(pc.get("acks"), Some("all"));
    }

    #[test]
    fn a_missing_topic_is_called_missing_before_its_record_times_out() {
        let propagation = |s: &Settings, t, ci| {
            let pc = s.to_rdkafka(transactional(t, ci));
            pc.get("topic.metadata.propagation.max.ms")
                .map(str::to_owned)
        };
        let s = settings(&[], &[]);
        assert_eq!(
            propagation(&s, 120, 1).as_deref(),
            Some("30000"),
            "at most 30 s"
        );
        assert_eq!(propagation(&s, 30, 0).as_deref(), Some("15000"));
        // A record sent 5 s into a 10 s transaction has 5 s left.
        assert_eq!(propagation(&s, 10, 5).as_deref(), Some("2500"));
        let timeout = |t| Duration::from_secs(t);
        // A record waits at most message.timeout.ms (or its alias), 0 meaning no bound.
        let short = settings(&[], &[("delivery.timeout.ms", "4000")]);
        assert_eq!(propagation(&short, 60, 0).as_deref(), Some("2000"));
        let unbounded = settings(&[], &[("message.timeout.ms", "0")]);
        assert_eq!(propagation(&unbounded, 10, 0).as_deref(), Some("5000"));
        let last = settings(
            &[],
            &[("message.timeout.ms", "0"), ("delivery.timeout.ms", "4000")],
        );
        assert_eq!(
            propagation(&last, 60, 0).as_deref(),
            Some("2000"),
            "the last wins"
        );
        // The user's value stands unless the record would time out first.
        let fine = settings(&[], &[("topic.metadata.propagation.max.ms", "9999")]);
        assert_eq!(propagation(&fine, 60, 0).as_deref(), Some("9999"));
        assert_eq!(fine.check_propagation(timeout(60), timeout(0)), Ok(()));
        assert_eq!(
            fine.check_propagation(timeout(9), timeout(0))
                .map_err(|_| ()),
            Err(())
        );
        let late = settings(
            &[],
            &[
                ("message.timeout.ms", "5000"),
                ("topic.metadata.propagation.max.ms", "5000"),
            ],
        );
        let e = late.check_propagation(timeout(60), timeout(0)).unwrap_err();
        assert!(
            e.contains("topic.metadata.propagation.max.ms") && e.contains("5000"),
            "{e}"
        );
        assert_eq!(
            settings(&[], &[]).check_propagation(timeout(10), timeout(5)),
            Ok(())
        );
    }

    #[test]
    fn passthrough_is_applied() {
        let s = settings(&[("auto.offset.reset", "latest")], &[("linger.ms", "50")]);
        let cc = s.to_rdkafka(pipeline(None));
        assert_eq!(cc.get("auto.offset.reset"), Some("latest"));
        // Shipped fetch defaults are defaults: the user's value wins.
        assert_eq!(cc.get("fetch.queue.backoff.ms"), Some("5"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("1024"));
        let tuned = settings(&[("queued.max.messages.kbytes", "4096")], &[]);
        let cc = tuned.to_rdkafka(pipeline(None));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("4096"));
        let pc = s.to_rdkafka(Role::Idempotent);
        assert_eq!(pc.get("linger.ms"), Some("50"));
        // The producer's queue default, on both pipeline producers, and the user's value wins.
        assert_eq!(pc.get("queue.buffering.max.messages"), Some("25000"));
        assert_eq!(
            s.to_rdkafka(transactional(60, 1))
                .get("queue.buffering.max.messages"),
            Some("25000")
        );
        let roomy = settings(&[], &[("queue.buffering.max.messages", "100000")]);
        assert_eq!(
            roomy
                .to_rdkafka(transactional(60, 1))
                .get("queue.buffering.max.messages"),
            Some("100000")
        );
        // Producer keys stay off consumers and the other way round.
        assert_eq!(cc.get("linger.ms"), None);
        assert_eq!(cc.get("queue.buffering.max.messages"), None);
        assert_eq!(pc.get("auto.offset.reset"), None);
    }

    #[test]
    fn one_order_for_every_role_defaults_then_user_then_fixed() {
        // Keys start-up would refuse from the user, to see which side wins.
        let s = settings(
            &[
                ("client.id", "mine"),
                ("isolation.level", "read_uncommitted"),
                ("enable.partition.eof", "false"),
                ("security.protocol", "ssl"),
            ],
            &[],
        );
        let cc = s.to_rdkafka(pipeline(None));
        assert_eq!(cc.get("client.id"), Some("mine"), "a default gives way");
        assert_eq!(cc.get("isolation.level"), Some("read_committed"), "fixed");
        for role in [
            Role::EndOffsets {
                isolation: Isolation::ReadUncommitted,
            },
            Role::AuditReader {
                isolation: Isolation::ReadCommitted,
            },
            Role::GroupOffsets { group: "g" },
        ] {
            let c = s.to_rdkafka(role);
            assert_eq!(c.get("security.protocol"), Some("ssl"), "{role:?}");
            assert_eq!(c.get("bootstrap.servers"), Some("h:1"), "{role:?}");
        }
        let end = s.to_rdkafka(Role::EndOffsets {
            isolation: Isolation::ReadUncommitted,
        });
        assert_eq!(end.get("client.id"), Some("exactly-pod-0-lag"));
        assert_eq!(end.get("isolation.level"), Some("read_uncommitted"));
        let audit = s.to_rdkafka(Role::AuditReader {
            isolation: Isolation::ReadCommitted,
        });
        assert_eq!(audit.get("enable.partition.eof"), Some("true"));
        assert_eq!(audit.get("isolation.level"), Some("read_committed"));
    }

    #[test]
    fn a_partition_denied_to_the_transaction_names_its_topic() {
        let line = "[thrd:127.0.0.1:1/1]: 127.0.0.1:1/1: Failed to add partition \"sec-x\" [2] \
                    to transaction: Broker: Topic authorization failed";
        assert_eq!(denied_partition("ADDPARTS", line), Some("sec-x"));
        assert_eq!(denied_partition("TXNERR", line), None);
        let other = "Failed to add partition \"t\" [0] to transaction: Broker: Not leader";
        assert_eq!(denied_partition("ADDPARTS", other), None);
    }

    #[test]
    fn timed_out_transactional_requests_are_told_from_others() {
        for (line, txn) in [
            (
                "Timed out ProduceRequest in flight (after 2001ms, timeout #0)",
                true,
            ),
            (
                "Timed out EndTxnRequest in flight (after 5000ms, timeout #0)",
                true,
            ),
            (
                "Timed out AddPartitionsToTxnRequest in flight (after 1ms, timeout #1)",
                true,
            ),
            (
                "Timed out MetadataRequest in flight (after 1ms, timeout #0)",
                false,
            ),
            (
                "Timed out 1 in-flight, 0 retry-queued, 0 out-queue, 0 partially-sent requests",
                false,
            ),
        ] {
            assert_eq!(timed_out_txn_request("REQTMOUT", line), txn, "{line}");
        }
        assert!(!timed_out_txn_request(
            "FAIL",
            "Timed out ProduceRequest in flight"
        ));
    }

    #[test]
    fn describe_groups_by_topic() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("b", 2);
        tpl.add_partition("a", 1);
        tpl.add_partition("b", 0);
        assert_eq!(describe(&partitions(&tpl)), "a[1] b[0,2]");
    }

    #[test]
    fn offsets_go_to_librdkafka_and_back() {
        let offsets = vec![(("a".to_string(), 1), 7), (("b".to_string(), 0), 0)];
        let tpl = offset_list(&offsets).unwrap();
        let back = offsets_of(&tpl);
        assert_eq!(
            back,
            [
                (("a".to_string(), 1), Some(7)),
                (("b".to_string(), 0), Some(0))
            ]
        );
        let bare = offsets_of(&partition_list(&[("a".to_string(), 1)]));
        assert_eq!(bare, [(("a".to_string(), 1), None)]);
    }
}

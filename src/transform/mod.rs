//! Transforms: one input record to zero or more output records.
//!
//! A transform is a [`Transform`]: `apply` may keep state between records (`&mut self`), and it
//! hears which partitions the instance gains and loses. Its failure says whose fault it is: a
//! [`Failure::BadRecord`] is the record's (the `--on-error` policy: DLQ, skip or fail), a
//! [`Failure::Unavailable`] is the transform's (a service it needs is down: the transaction is
//! aborted and rewound and the record comes again after a back-off; never the DLQ).
//!
//! One file per kind: [`passthrough`] (borrows key and value, copies nothing), [`jq`] (with its
//! JSON reader and writer in `json`). [`new`] is where a kind is registered; [`build`] calls it
//! with the configured limits.
//!
//! [`call`] is the call-out: the application next to exactly answers batches over HTTP. It is
//! no per-record transform (the loop stages records and sends them in batches, see
//! `pipeline::intake`); what a record becomes is [`call::outputs`] of its answer.

pub mod call;
pub mod dedup;
pub mod jq;
mod json;
pub mod passthrough;

use std::borrow::Cow;

use crate::config::{TransformConfig, TransformSpec};
use crate::error::Error;
use crate::kafka::Tp;

pub use jq::Jq;
pub use passthrough::Passthrough;

/// A record transform, run on the loop thread.
pub trait Transform: Send {
    /// Transforms one record. The outputs may borrow from the input.
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure>;

    /// What became of the record `apply` was last asked about, decided by the writer before
    /// any other record is applied: only a record whose outputs went out may leave a trace in
    /// the transform's state; one that went to the dead-letter topic (its outputs refused,
    /// too large, routed to a topic that keeps refusing) or whose unit aborted leaves none.
    fn decided(&mut self, fate: Fate) {
        let _ = fate;
    }

    /// The instance now owns `partitions` too (state for them may be loaded here).
    fn assigned(&mut self, partitions: &[Tp]) {
        let _ = partitions;
    }

    /// The instance no longer owns `partitions` (state for them may be dropped); called after
    /// their last transaction committed or aborted.
    fn revoked(&mut self, partitions: &[Tp]) {
        let _ = partitions;
    }

    /// The unit the records applied since the last settle went into committed: what `apply`
    /// decided for them holds (state kept in the transaction becomes the committed state).
    /// Heard before any later record is applied, and before a revoke.
    fn committed(&mut self) {}

    /// That unit did not commit, and its records come again: what `apply` decided for them
    /// is forgotten. `known` is false when nobody can tell whether it committed (state kept in
    /// the transaction must then be read back from where it is durable).
    fn dropped(&mut self, known: bool) {
        let _ = known;
    }

    /// Records the open unit must carry before it commits, of no input record: a stateful
    /// transform's changes made once per unit (a partition's stream time). Asked right before
    /// every commit of a unit its records went into (a commit that is due, before a revoke, at
    /// shutdown); nothing is counted or given lineage for them.
    fn before_commit(&mut self) -> Vec<OutputRecord<'static>> {
        Vec::new()
    }
}

/// What became of a record the transform applied ([`Transform::decided`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Its outputs (or none, if it had none) went into the open unit.
    Sent,
    /// Nothing of it went out as the transform made it: its dead-letter copy went instead, or
    /// it was skipped, or its unit aborted (it comes again).
    Refused,
}

/// Why `apply` produced nothing to send.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The record's fault: the `--on-error` policy decides (DLQ, skip, fail).
    #[error(transparent)]
    BadRecord(#[from] TransformError),
    /// The transform cannot work right now (a service it calls is down): abort, rewind, back
    /// off, report not ready; the record comes again. Never the DLQ.
    #[error("transform unavailable: {0}")]
    Unavailable(String),
    /// The transform cannot take the record's partition now (its state has no home: the
    /// input grew and the changelog could not): the partition is held, the others go on, and
    /// the record comes again when it is released. Never the DLQ.
    #[error("partition held: {0}")]
    Held(String),
}

/// Builds (and for jq, compiles) the configured transform: one arm per kind.
pub fn build(config: &TransformConfig) -> Result<Box<dyn Transform>, Error> {
    new(&config.spec, Limits::of(config))
}

/// Testing only (`--test-unavailable`): `inner` is unavailable for its first `n` records.
pub fn unavailable_first(inner: Box<dyn Transform>, n: u64) -> Box<dyn Transform> {
    struct Flaky {
        inner: Box<dyn Transform>,
        left: u64,
    }
    impl Transform for Flaky {
        fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
            if self.left > 0 {
                self.left -= 1;
                return Err(Failure::Unavailable("test switch: unavailable".into()));
            }
            self.inner.apply(input)
        }
        fn decided(&mut self, fate: Fate) {
            self.inner.decided(fate);
        }
        fn assigned(&mut self, partitions: &[Tp]) {
            self.inner.assigned(partitions);
        }
        fn revoked(&mut self, partitions: &[Tp]) {
            self.inner.revoked(partitions);
        }
        fn committed(&mut self) {
            self.inner.committed();
        }
        fn dropped(&mut self, known: bool) {
            self.inner.dropped(known);
        }
        fn before_commit(&mut self) -> Vec<OutputRecord<'static>> {
            self.inner.before_commit()
        }
    }
    if n == 0 {
        return inner;
    }
    Box::new(Flaky { inner, left: n })
}

/// [`build`], with the spec and limits apart (tests).
pub fn new(spec: &TransformSpec, limits: Limits) -> Result<Box<dyn Transform>, Error> {
    Ok(match spec {
        TransformSpec::Passthrough => Box::new(Passthrough::new(limits)),
        TransformSpec::Jq { program, envelope } => {
            Box::new(Jq::compile(program, *envelope, limits).map_err(Error::Jq)?)
        }
        // The loop stages the call-out's records for the application (pipeline::intake).
        TransformSpec::Call(_) => {
            return Err(Error::Config(
                "--call-url: the call-out is no per-record transform".into(),
            ));
        }
    })
}

/// One consumed record, borrowed from the consumer's buffer.
#[derive(Clone, Debug)]
pub struct InputRecord<'a> {
    /// Source topic.
    pub topic: &'a str,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
    /// Record timestamp in milliseconds, when it has one.
    pub timestamp: Option<i64>,
    /// Key bytes.
    pub key: Option<&'a [u8]>,
    /// Value bytes; `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    /// Headers in order.
    pub headers: Vec<crate::kafka::raw_headers::Header<'a>>,
}

impl InputRecord<'_> {
    /// Its identity, `topic/partition/offset`: its outputs' lineages without the index (the
    /// call-out's `lineage`). Written without `fmt`: it is on every record's path.
    pub fn lineage(&self) -> String {
        let mut n = itoa::Buffer::new();
        let mut s = String::with_capacity(self.topic.len() + 32);
        s.push_str(self.topic);
        s.push('/');
        s.push_str(n.format(self.partition));
        s.push('/');
        s.push_str(n.format(self.offset));
        s
    }
}

/// A record copied out of the consumer's buffer: what the loop stages while the call-out's
/// batch is out, and what the audit reads (`audit::Rec`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Timestamp (ms).
    pub timestamp: Option<i64>,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Option<Vec<u8>>,
    /// Headers in order, names as bytes.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl OwnedRecord {
    /// Copies a borrowed record.
    pub fn of(input: &InputRecord<'_>) -> OwnedRecord {
        OwnedRecord {
            topic: input.topic.to_string(),
            partition: input.partition,
            offset: input.offset,
            timestamp: input.timestamp,
            key: input.key.map(<[u8]>::to_vec),
            value: input.value.map(<[u8]>::to_vec),
            headers: input
                .headers
                .iter()
                .map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec)))
                .collect(),
        }
    }

    /// The last value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name.as_bytes())
            .and_then(|(_, v)| v.as_deref())
    }

    /// The record, borrowed as the transform and the sink take it.
    pub fn as_input(&self) -> InputRecord<'_> {
        InputRecord {
            topic: &self.topic,
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref()))
                .collect(),
        }
    }

    /// Key and value bytes.
    pub fn bytes(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len)
    }
}

/// Headers of an output record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputHeaders {
    /// The input record's headers.
    Input,
    /// Headers set by the transform.
    Set(Vec<(String, Option<Vec<u8>>)>),
}

/// One record to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRecord<'a> {
    /// Destination; `None` means the configured output topic.
    pub topic: Option<String>,
    /// Partition; `None` for the partitioner's (by key). Only exactly's own outputs set it
    /// (a changelog record goes to its input's partition).
    pub partition: Option<i32>,
    /// Key bytes.
    pub key: Option<Cow<'a, [u8]>>,
    /// Value bytes; `None` writes a tombstone.
    pub value: Option<Cow<'a, [u8]>>,
    /// Headers.
    pub headers: OutputHeaders,
}

/// The header naming why a record is in the DLQ: a [`Reason`] name.
pub const ERROR_REASON: &str = "exactly.error.reason";
/// The header with the error message, for people.
pub const ERROR_MESSAGE: &str = "exactly.error.message";

/// Why a record could not be transformed. A small set, fixed but for the destinations'
/// refusals (each named by its [`Refuser`]): it is a metric label and a DLQ header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The value is not JSON (or is nested too deeply to parse safely).
    NotJson,
    /// The jq program raised an error.
    JqError,
    /// An output exceeds --max-output-bytes (or the producer's message.max.bytes).
    OutputTooLarge,
    /// The program yielded more than --max-outputs-per-record outputs.
    TooManyOutputs,
    /// An --envelope output is not a valid envelope.
    BadEnvelope,
    /// The destination refused an output for what it is (the broker: its size, its bytes, its
    /// timestamp; a database: what its row holds), named by the destination's [`Refuser`].
    Rejected(&'static Refuser),
    /// The application behind --call-url refused the record.
    AppRejected,
    /// An output's topic (an envelope's or the application's) refused it for --route-timeout:
    /// it does not exist, or may not be written.
    RouteRefused,
    /// The dedup cannot place the record: no key, no event time, or a time that is none.
    DedupInput,
    /// The dedup's window for the record had closed (`--window-late dlq`).
    Late,
    /// A new key for a dedup window that holds `--window-max-keys` keys already.
    DedupFull,
}

impl Reason {
    /// Every reason but a destination's refusal (each destination names its own: its
    /// [`Refuser`]), so the DLQ counter starts at 0 for each.
    pub const ALL: [Reason; 10] = [
        Reason::NotJson,
        Reason::JqError,
        Reason::OutputTooLarge,
        Reason::TooManyOutputs,
        Reason::BadEnvelope,
        Reason::AppRejected,
        Reason::RouteRefused,
        Reason::DedupInput,
        Reason::Late,
        Reason::DedupFull,
    ];

    /// Stable name, used in the `exactly.error.reason` header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::NotJson => "not_json",
            Reason::JqError => "jq_error",
            Reason::OutputTooLarge => "output_too_large",
            Reason::TooManyOutputs => "too_many_outputs",
            Reason::BadEnvelope => "bad_envelope",
            Reason::Rejected(by) => by.reason,
            Reason::AppRejected => "app_rejected",
            Reason::RouteRefused => "route_refused",
            Reason::DedupInput => "dedup_input",
            Reason::Late => "late",
            Reason::DedupFull => "dedup_full",
        }
    }
}

/// Longest error message kept, in bytes.
pub const MAX_MESSAGE: usize = 512;

/// A record that cannot be transformed (or written): the reason and a human message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct TransformError {
    /// Machine-readable reason.
    pub reason: Reason,
    /// What went wrong, for the DLQ header and the log.
    pub message: String,
    /// Who refused a copy of the record for what it is, and their name for the error
    /// (Kafka's `MESSAGE_TOO_LARGE`, a database's `CHECK_VIOLATION`), if one did.
    pub refused: Option<(&'static Refuser, &'static str)>,
}

/// Who refuses records for what they are: where outputs go. Each destination says its own
/// (`sink::kafka::BROKER`, `sink::database::DATABASE`); what a refusal is called in a DLQ copy
/// and in the logs comes from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refuser {
    /// The DLQ reason of a record whose output it refused (`rejected_by_broker`), a metric
    /// label: [`Reason::Rejected`]'s name.
    pub reason: &'static str,
    /// The DLQ header that carries its name for the error.
    pub header: &'static str,
    /// Its name in a sentence: `the broker`, `the database`.
    pub who: &'static str,
    /// The log line of a record it refused, whose replay sends the dead-letter copy.
    pub refused: &'static str,
    /// The log line of a new client in place of one that was fenced or broke.
    pub replaced: &'static str,
    /// The log line of a record whose dead-letter copy goes there.
    pub dead_letter: &'static str,
}

impl Refuser {
    /// For the tests of the layers below the sinks (the broker's words).
    #[cfg(test)]
    pub const TEST: Refuser = Refuser {
        reason: "rejected_by_broker",
        header: "exactly.error.broker",
        who: "the broker",
        refused: "the broker rejected a record",
        replaced: "producer recreated",
        dead_letter: "record to the dead-letter topic",
    };
}

impl TransformError {
    /// Builds an error. The message is cut to [`MAX_MESSAGE`] bytes: jq errors quote values,
    /// and the message travels in a DLQ header.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        let mut message = message.into();
        truncate(&mut message, MAX_MESSAGE);
        TransformError {
            reason,
            message,
            refused: None,
        }
    }

    /// `by` refused an output of the record with `error` (its name for the error).
    pub fn rejected(by: &'static Refuser, error: &'static str) -> Self {
        TransformError {
            refused: Some((by, error)),
            ..TransformError::new(
                Reason::Rejected(by),
                format!("{} refused an output of this record: {error}", by.who),
            )
        }
    }
}

/// Limits every transform obeys.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest output (key + value bytes).
    pub max_output_bytes: usize,
    /// Most outputs for one input.
    pub max_outputs: usize,
}

impl Limits {
    /// The configured limits.
    pub fn of(config: &TransformConfig) -> Limits {
        Limits {
            max_output_bytes: config.max_output_bytes,
            max_outputs: config.max_outputs_per_record,
        }
    }
}

/// Cuts `s` to at most `max` bytes on a char boundary, marking the cut with `…`.
pub(crate) fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push('…');
    }
}

pub(crate) fn check_size(size: usize, limits: &Limits) -> Result<(), TransformError> {
    if size > limits.max_output_bytes {
        return Err(TransformError::new(
            Reason::OutputTooLarge,
            format!(
                "output of {size} bytes exceeds --max-output-bytes {}",
                limits.max_output_bytes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record<'a>(value: Option<&'a [u8]>) -> InputRecord<'a> {
        InputRecord {
            topic: "in",
            partition: 2,
            offset: 41,
            timestamp: Some(1_700_000_000_000),
            key: Some(b"k1"),
            value,
            headers: vec![(b"h", Some(b"v")), (b"empty", None)],
        }
    }

    const LIMITS: Limits = Limits {
        max_output_bytes: 100,
        max_outputs: 10,
    };

    #[test]
    fn passthrough_copies_bytes_exactly() {
        let mut t = new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let value: &[u8] = b"\xff\x00not json";
        let out = t.apply(&record(Some(value))).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(out[0].value.as_deref(), Some(value));
        assert_eq!(out[0].headers, OutputHeaders::Input);
        assert_eq!(out[0].topic, None);
        // Borrowed, not copied.
        assert!(matches!(out[0].value, Some(Cow::Borrowed(_))));
    }

    #[test]
    fn passthrough_keeps_tombstones() {
        let mut t = new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let out = t.apply(&record(None)).unwrap();
        assert_eq!(out[0].value, None);
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let e = TransformError::new(Reason::JqError, "é".repeat(1000));
        assert!(e.message.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(e.message.ends_with('…'));
    }

    #[test]
    fn passthrough_enforces_size_limit() {
        let mut t = new(&TransformSpec::Passthrough, LIMITS).unwrap();
        let big = vec![b'x'; 200];
        let Err(Failure::BadRecord(e)) = t.apply(&record(Some(&big))) else {
            panic!("a too large output is the record's fault")
        };
        assert_eq!(e.reason, Reason::OutputTooLarge);
    }
}

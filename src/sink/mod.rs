//! Where outputs go, and how they are made durable together with the group's offsets.
//!
//! A [`Sink`] is the seam, in exactly's own terms: connect, begin a unit of work, send records
//! into it, commit it with the offsets of the inputs it consumed, or abort it; say which records
//! the destination refused for what they are ([`Rejection`]), what the group has committed (where
//! the loop rewinds to after an abort), and whether a destination exists. One file per
//! implementation, each carrying its own state:
//!
//! - [`kafka`]: topics, with the offsets in the consumer group: Kafka transactions
//!   (`exactly_once`, outputs and offsets commit atomically), or an idempotent producer whose
//!   unit's offsets commit once every output is delivered (`at_least_once`: a crash can
//!   duplicate outputs, never lose them).
//! - [`database`]: rows of a PostgreSQL table, and the offsets in the same database
//!   transaction, each partition's moved by compare-and-set on its owner's epoch.
//! - [`faults`]: testing only, failures on purpose in front of either.
//!
//! [`start`] picks the configured one (the only place the guarantee is looked at) and connects
//! it. The [`Driver`] is what the loop holds: the sink and its open [`Unit`], turning each
//! [`Failed`] into an abort or a new client; [`offsets`] decides what a commit sends,
//! [`rejected`] what the replay of a refused record sends instead.
//!
//! Invariants:
//! - a unit is open exactly when at least one input record was consumed since the last
//!   commit or abort (empty transactions are never begun, so never committed);
//! - the offsets sent with a unit are the next offsets of the partitions it consumed (or the
//!   consumer's position past transaction markers), never past a record read but not yet
//!   applied ([`Unapplied`]);
//! - after any abort, recreation or unknown commit outcome, nothing is open and a rewind is
//!   owed; nothing begins until the loop has performed it.

mod bounds;
pub mod database;
mod driver;
pub mod faults;
pub mod kafka;
pub mod ledger;
pub mod offsets;
pub mod rejected;
pub mod routes;
mod unit;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Guarantee, SinkConfig, TestSwitches};
use crate::error::Error;
use crate::events::{AbortReason, Ended};
use crate::health::Health;
use crate::kafka::failure::{Action, ClientError, KafkaCall, classify};
use crate::kafka::{Settings, Tp};
use crate::metrics::Metrics;
use crate::records::Outgoing;
use crate::transform::Refuser;

pub use crate::kafka::consumer::{Committed, Group, SeekFailed, Starts};
pub use bounds::Bounds;
pub use driver::Driver;
pub use offsets::Unapplied;
pub use unit::{Consumed, Unit};

/// Who refuses records for what they are, one per destination: the DLQ reasons a refusal can
/// have (a new destination adds its own).
pub static REFUSERS: &[&Refuser] = &[&kafka::BROKER, &database::DATABASE];

/// A sink: the seam between the loop and where its records go.
///
/// The [`Driver`] calls these in order: `begin`, `send`…, then `commit` or `abort`. A failure
/// says what it needs ([`Failed`]); the driver does what is the same for every sink (rewind,
/// back-off, verdicts on refused records).
pub trait Sink: Send {
    /// (Re)creates the client, fencing earlier incarnations. Called at start and after
    /// [`Failed::Recreate`].
    fn connect(&mut self, bounds: &Bounds) -> Result<(), NotConnected>;
    /// Opens a unit of work. `watch`: until the next `begin`, say which topics took records
    /// ([`Feedback::accepted`]; the evidence that clears a refusing route: `sink::routes`).
    /// [`Failed::Renew`]: the client must be replaced before any unit may begin on it.
    fn begin(&mut self, watch: bool, bounds: &Bounds) -> Result<(), Failed>;
    /// Sends one record inside the open unit.
    fn send(&mut self, record: Record<'_, '_>, bounds: &Bounds) -> Result<(), Failed>;
    /// What the destination said since the last report, waiting as `wait` says first.
    fn hear(&mut self, wait: Wait, bounds: &Bounds) -> Feedback;
    /// Makes the open unit's records and the group's `offsets` (the next offset to read, per
    /// partition) durable.
    ///
    /// Its feedback is what was heard meanwhile: on [`Failed::Denied`], why, and which topic.
    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, bounds: &Bounds) -> Reply;
    /// Ends the open unit without committing it (`reason`: why, for the logs). Its feedback is
    /// what the destination said of the unit's records once it ended.
    fn abort(&mut self, reason: AbortReason, bounds: &Bounds) -> Reply;
    /// What is committed for `partitions` (`None`: nothing yet): where the loop rewinds to.
    /// Kafka sinks commit into the group; a sink that keeps offsets with its outputs reads
    /// them there.
    fn committed(
        &self,
        group: &dyn Group,
        partitions: &[Tp],
        timeout: Duration,
    ) -> Result<Committed, Unreadable> {
        group.committed(partitions, timeout).map_err(|e| {
            if classify(KafkaCall::SendOffsets, &e.facts()) == Action::Exit {
                Unreadable::Exit(Error::kafka("reading committed offsets", e))
            } else {
                Unreadable::Retry(e.to_string())
            }
        })
    }
    /// Partitions were assigned: a sink that keeps the offsets with its outputs claims them
    /// (fencing their previous owner) and says where each starts; the Kafka sinks answer
    /// [`Starts::Group`]. No default: a sink in front of another must pass it on.
    fn claim(
        &mut self,
        partitions: &[Tp],
        group: &dyn Group,
        bounds: &Bounds,
    ) -> Result<Starts, Failed>;
    /// `partitions` are no longer this instance's (revoked, lost, or its consumer replaced):
    /// whatever the sink keeps of them (a claim) goes. Their next owner claims them afresh.
    fn revoked(&mut self, _partitions: &[Tp]) {}
    /// Whether the destination `name` (a topic) exists; an error says why that is unknown.
    fn exists(&self, name: &str, timeout: Duration) -> Result<bool, String>;
    /// What the destination is to the loop: who refuses its records, how an aborted unit
    /// ends there. No default: a sink in front of another must pass it on.
    fn destination(&self) -> Destination;
    /// Nothing is open and nothing was read this turn (`last`: the process is stopping): a
    /// connection that the destination closes when it is idle (MySQL's `wait_timeout`) is
    /// kept alive, so that it closes only one whose process stopped (a zombie's, and its
    /// transaction with it); a sink that keeps its own offsets brings the group's copy of them
    /// up to date (`last`: now, not at its next turn).
    fn idle(&mut self, _group: &dyn Group, _last: bool) {}
}

/// Creates the configured sink (the test switches' in front of it, if any are set) and
/// connects it, retrying until --startup-timeout.
pub fn start(
    kafka_settings: &Settings,
    config: &SinkConfig,
    test: &TestSwitches,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<Driver, Error> {
    let sink: Box<dyn Sink> = match (&config.db, config.guarantee) {
        (Some(db), _) => Box::new(database::Database::new(db, config, metrics.clone())?),
        (None, Guarantee::ExactlyOnce) => Box::new(kafka::ExactlyOnce::new(kafka_settings, config)),
        (None, Guarantee::AtLeastOnce) => Box::new(kafka::AtLeastOnce::new(kafka_settings, config)),
    };
    // Its refusals' counter starts at 0 and the audit knows their reason only if it is listed.
    debug_assert!(REFUSERS.contains(&sink.destination().refuser));
    let sink = faults::wrap(sink, test);
    let bounds = Bounds::new(health, config.transaction_timeout);
    let started = Driver::start(sink, bounds, config.startup_timeout, metrics, shutdown);
    started.map_err(|e| match e {
        Error::Startup(why) if config.db.is_some() => Error::Startup(why),
        Error::Startup(why) => Error::Startup(format!(
            "--bootstrap-servers {}: {why}",
            kafka_settings.bootstrap_servers
        )),
        e => e,
    })
}

/// How a unit ended, once that is known: what a transform that keeps state in the
/// transaction must hear (the driver says it once per unit begun, [`Driver::take_settled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Its commit took effect (returned OK, or an unknown outcome the committed offsets
    /// showed was a commit).
    Committed,
    /// It did not commit: its records come again.
    Dropped,
    /// Nobody can tell any more whether it committed (an unknown outcome before the consumer
    /// was replaced, its partitions were lost or the process stopped, or one the committed
    /// offsets did not answer for): its records come again if it did not.
    Unknown,
}

/// What a commit attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No unit was open.
    Empty,
    /// Committed, with this many input records.
    Committed {
        /// Input records in the unit.
        records: u64,
    },
    /// Aborted (or its outcome was unknown): a rewind is owed.
    Aborted,
}

/// A send that did not go out.
#[derive(Debug)]
pub enum SendError {
    /// The client refuses the record as larger than it takes (the verdict is kept).
    TooLarge,
    /// The unit was aborted because of the error: a rewind is owed.
    Aborted,
    /// Stop the process.
    Fatal(Error),
}

/// Whether `begin` left a unit open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Began {
    /// A unit is open.
    Open,
    /// Nothing is open and a rewind is owed (the client had to be replaced, or an abort
    /// came before): the record comes again after the rewind.
    RewindOwed,
}

/// What a destination is to the loop, beside where its records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Destination {
    /// Who refuses its records for what they are (the DLQ reason and header of a copy, and
    /// what the logs call it).
    pub refuser: &'static Refuser,
    /// How an open unit ends when `abort` succeeds: aborted (a transaction), or dropped (its
    /// outputs left where they are: at least once).
    pub aborted: Ended,
    /// The largest record it takes, as [`Outgoing::size`] counts it (Kafka's producer:
    /// message.max.bytes): a larger output is its record's fault, and a larger dead-letter
    /// copy is cut down. `usize::MAX`: no limit of its own (a database row).
    pub max_record_bytes: usize,
    /// Where its committed offsets live.
    pub offsets: OffsetHome,
}

/// Where a destination's committed offsets live, which says whether an answer below what this
/// process committed is believed (`sink::ledger`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetHome {
    /// In the consumer group (the Kafka sinks): a broker can lose them apart from the outputs
    /// (RELIABILITY.md), so no start or rewind goes below what this process committed, where
    /// the group's answer could be read.
    Group,
    /// With the outputs, in one transaction (a database): they go back only with the outputs,
    /// and what they answer is where to start.
    WithOutputs,
}

/// How long [`Sink::hear`] waits before it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Not at all: what was said so far.
    Now,
    /// Up to this long for the reports of every record sent so far.
    For(Duration),
    /// Until every record sent so far is delivered or failed, within the call's bound.
    Flush,
}

/// What a destination said since its last feedback: the loop learns from it (verdicts on
/// refused records, refusing routes, why a unit was denied).
#[derive(Debug, Default)]
pub struct Feedback {
    /// Records refused for what they are.
    pub refused: Vec<Rejection>,
    /// Destinations that refused records for what *they* are: a topic that does not exist,
    /// or may not be written (the destination, the destination's name for the error).
    pub routes: Vec<(String, &'static str)>,
    /// The topics that took a record, while the unit watches ([`Sink::begin`]).
    pub accepted: Vec<String>,
    /// Why a unit failed for want of a permission, if one did: no retry fixes that, unless
    /// the permission was a route's (whose refusal is in `routes` whenever this is).
    pub denied: Option<String>,
    /// Every record sent so far was delivered or failed when the report was made.
    pub settled: bool,
}

impl Feedback {
    /// `later` heard after this.
    pub fn merge(&mut self, later: Feedback) {
        self.refused.extend(later.refused);
        self.routes.extend(later.routes);
        self.accepted.extend(later.accepted);
        if later.denied.is_some() {
            self.denied = later.denied;
        }
        self.settled = later.settled;
    }
}

/// How a commit or abort went, and what the destination said meanwhile.
#[derive(Debug)]
pub struct Reply {
    /// How it went.
    pub result: Result<(), Failed>,
    /// What was heard.
    pub feedback: Feedback,
}

impl Reply {
    /// `result`, with nothing heard.
    pub fn of(result: Result<(), Failed>) -> Reply {
        Reply {
            result,
            feedback: Feedback::default(),
        }
    }
}

/// Why a sink call did not succeed, as the driver must react.
#[derive(Debug)]
pub enum Failed {
    /// The open unit cannot commit: abort it and rewind.
    Abort(AbortReason),
    /// The client is fenced or broken: replace it (which ends the open unit) and rewind.
    Recreate(AbortReason),
    /// The commit may have taken effect (its answer was lost, or a retry of it was answered
    /// by a newer epoch): end the unit (replace the client if `recreate`, else abort), then
    /// what is committed for its partitions tells how it ended.
    Unknown {
        /// Why: [`AbortReason::CommitOutcomeUnknown`] or [`AbortReason::CommitFenced`].
        reason: AbortReason,
        /// The client cannot abort any more (fenced): replace it.
        recreate: bool,
    },
    /// A record is larger than the client takes: the record's fault.
    TooLarge,
    /// The record's destination refuses it for what the destination is: it does not exist
    /// or may not be written (`kafka::failure::refused_route`).
    Unroutable {
        /// The destination.
        topic: String,
        /// Its name for the error.
        error: &'static str,
    },
    /// A request of this client timed out: a late copy of it could still land in a later
    /// unit (Kafka before KIP-890 fences by epoch only), so no unit may begin on it. Nothing
    /// was open: replace the client, then begin.
    Renew(AbortReason),
    /// The unit failed for want of a permission (this error, which stops the process unless
    /// the feedback says a route was refused it: the route's failure then).
    Denied(Error),
    /// Nothing to do at run time: stop the process.
    Exit(Error),
}

impl Failed {
    /// A commit whose answer was lost: abort, then the committed offsets tell.
    pub fn unknown() -> Failed {
        Failed::Unknown {
            reason: AbortReason::CommitOutcomeUnknown,
            recreate: false,
        }
    }

    /// [`Failed::Exit`] with what exactly was doing.
    pub fn exit(context: &str, source: impl Into<ClientError>) -> Failed {
        Failed::Exit(Error::kafka(context, source))
    }
}

/// Why `connect` did not connect.
#[derive(Debug)]
pub enum NotConnected {
    /// Not now (the destination is unreachable, its coordinator not ready): try again.
    Retry(String),
    /// The destination refused the client (a wrong password, an untrusted certificate):
    /// nothing a retry fixes at start-up; a rotation may be under way once it ran.
    Refused(String),
    /// Nothing to do at run time.
    Exit(Error),
}

/// Why the committed offsets could not be read.
#[derive(Debug)]
pub enum Unreadable {
    /// Not now: try again.
    Retry(String),
    /// Nothing to do at run time.
    Exit(Error),
}

/// A record the destination refused for what it is (its size, its bytes, its timestamp):
/// sending it again, or replaying it, meets the same refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The send's index (its [`Record::index`]).
    pub index: usize,
    /// The destination's name for the error (Kafka's: `MESSAGE_TOO_LARGE`), for the DLQ
    /// copy's headers.
    pub error: &'static str,
    /// The destination named this record itself (Kafka's `INVALID_RECORD`, KIP-467), not only
    /// the batch it travelled in.
    pub named: bool,
    /// The destination judged this record on its own (a database writes a refused batch again
    /// row by row): the refusal is certainly this record's.
    pub alone: bool,
}

/// One record to send: its destination, the record (whose headers the send takes), its
/// timestamp and its index in the open unit (which comes back with a rejection).
pub struct Record<'a, 'b> {
    /// Destination topic.
    pub topic: &'a str,
    /// The record.
    pub out: &'a mut Outgoing<'b>,
    /// The input's timestamp, or `None` for the time of sending.
    pub timestamp: Option<i64>,
    /// Index in the open unit's [`rejected::SentLog`].
    pub index: usize,
    /// What it is: an output, or a dead letter.
    pub kind: Content,
}

/// What a record is to its destination, beside its bytes: a destination that keeps dead
/// letters apart (a table) tells them by this, never by where they are addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// An output of an input, or the transform's own.
    Output,
    /// The dead-letter copy of an input that could not go out, and why.
    DeadLetter(crate::transform::Reason),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::Reason;

    #[test]
    fn every_dead_letter_reason_has_its_own_label_and_starts_at_zero() {
        let names: Vec<&str> = (Reason::ALL.iter().map(|r| r.as_str()))
            .chain(REFUSERS.iter().map(|r| r.reason))
            .collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        let m = Metrics::new();
        crate::events::initialise(&m, REFUSERS);
        let text = m.render();
        for name in names {
            let line = format!("exactly_records_dlq_total{{reason=\"{name}\"}} 0");
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }
}

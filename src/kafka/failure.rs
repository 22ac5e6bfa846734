//! What a failed Kafka call means: one table that turns it into one [`Action`].
//!
//! librdkafka tags transactional errors with three flags (see rust-rdkafka's producer docs,
//! "Errors"): `is_retriable` (call again), `txn_requires_abort` (abort the transaction and
//! rewind) and `is_fatal` (this producer instance is finished). [`classify`] turns a failed call
//! into one [`Action`], from the error code first and those flags second, so that every path
//! of the pipeline reacts to the same error the same way. Outside kafka/ and the Kafka sinks a
//! failed call is a [`ClientError`]: what librdkafka said, and its [`Facts`].

use std::fmt;

use rdkafka::error::KafkaError;

/// A Kafka error code: librdkafka's and the protocol's.
pub use rdkafka::types::RDKafkaErrorCode as Code;

/// A failed Kafka call, as the code outside kafka/ holds it: what librdkafka said (its words
/// in logs and exits) and its [`Facts`].
#[derive(Clone, Debug)]
pub struct ClientError(KafkaError);

impl ClientError {
    /// Its code and librdkafka's flags.
    pub fn facts(&self) -> Facts {
        Facts::of(&self.0)
    }

    /// Its code, when it has one.
    pub fn code(&self) -> Option<Code> {
        self.0.rdkafka_error_code()
    }

    /// Whether it says the topic or the partition does not exist.
    pub fn unknown_partition(&self) -> bool {
        matches!(
            self.code(),
            Some(Code::UnknownPartition | Code::UnknownTopicOrPartition)
        )
    }

    /// An error with a bare code (the simulator's and the fakes' brokers, and errors exactly
    /// builds itself).
    pub fn of(code: Code) -> ClientError {
        ClientError(KafkaError::Global(code))
    }

    /// The flush before a commit failed with `code` (nothing was committed).
    pub fn flush(code: Code) -> ClientError {
        ClientError(KafkaError::Flush(code))
    }
}

impl From<KafkaError> for ClientError {
    fn from(e: KafkaError) -> ClientError {
        ClientError(e)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ClientError {
    /// The wrapped error's own cause: this error says what it says.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// The call that failed; the same code can mean different things for different calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaCall {
    /// `init_transactions`: fences older epochs, completes the previous transaction.
    Init,
    /// `begin_transaction`: local only.
    Begin,
    /// `send` of one output record.
    Produce,
    /// `send_offsets_to_transaction`.
    SendOffsets,
    /// `commit_transaction` (including its flush).
    Commit,
    /// `abort_transaction`.
    Abort,
}

/// What to do about a failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Transient: make the same call again (the caller bounds how often).
    Retry,
    /// The transaction cannot commit: abort it and rewind to the committed offsets.
    Abort,
    /// A commit that may or may not have happened. Never retried blindly: abort if librdkafka
    /// still allows it, else recreate the producer; then rewind to what the broker says is
    /// committed, which is right whichever way the commit went.
    UnknownOutcome,
    /// This producer is fenced or broken: drop it, create a new one (its `init_transactions`
    /// bumps the epoch), rewind.
    RecreateProducer,
    /// Nothing we can do at run time (authorisation, configuration): exit non-zero.
    Exit,
}

/// What we know about an error: its code and librdkafka's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The librdkafka or broker error code, when there is one.
    pub code: Option<Code>,
    /// librdkafka says the call may be retried.
    pub retriable: bool,
    /// librdkafka says the transaction must be aborted.
    pub abortable: bool,
    /// librdkafka says the producer instance is unusable.
    pub fatal: bool,
    /// The error came from the flush that precedes a commit: the commit was never sent.
    pub flush: bool,
}

impl Facts {
    /// Reads code and flags off a [`KafkaError`].
    pub fn of(err: &KafkaError) -> Facts {
        match err {
            KafkaError::Transaction(e) => Facts {
                code: Some(e.code()),
                retriable: e.is_retriable(),
                abortable: e.txn_requires_abort(),
                fatal: e.is_fatal(),
                flush: false,
            },
            other => Facts {
                code: other.rdkafka_error_code(),
                retriable: false,
                abortable: false,
                fatal: false,
                flush: matches!(other, KafkaError::Flush(_)),
            },
        }
    }

    /// Facts for a bare code (tests, and errors we build ourselves).
    pub fn code(code: Code) -> Facts {
        Facts {
            code: Some(code),
            retriable: false,
            abortable: false,
            fatal: false,
            flush: false,
        }
    }
}

/// Codes that no retry, abort or new producer can fix.
const UNRECOVERABLE: &[Code] = &[
    Code::TransactionalIdAuthorizationFailed,
    Code::ClusterAuthorizationFailed,
    Code::TopicAuthorizationFailed,
    Code::GroupAuthorizationFailed,
    Code::SaslAuthenticationFailed,
    Code::Authentication,
    Code::UnsupportedSASLMechanism,
    Code::UnsupportedVersion,
    Code::UnsupportedForMessageFormat,
    Code::InvalidTransactionTimeout,
];

/// Codes that mean a newer producer with our transactional id exists, or ours lost its epoch.
const FENCED: &[Code] = &[
    Code::ProducerFenced,
    Code::InvalidProducerEpoch,
    Code::InvalidProducerIdMapping,
    Code::TransactionCoordinatorFenced,
    Code::Fenced,
    Code::Fatal,
];

/// Codes that are transient whatever the call, even without librdkafka's retriable flag.
const TRANSIENT: &[Code] = &[
    Code::CoordinatorNotAvailable,
    Code::NotCoordinator,
    Code::CoordinatorLoadInProgress,
    Code::ConcurrentTransactions,
    Code::WaitingForCoordinator,
    Code::NetworkException,
    Code::BrokerTransportFailure,
    Code::AllBrokersDown,
    Code::LeaderNotAvailable,
    Code::NotLeaderForPartition,
    Code::NotEnoughReplicas,
    Code::NotEnoughReplicasAfterAppend,
];

/// Codes that say a call timed out.
const TIMEOUT: &[Code] = &[
    Code::OperationTimedOut,
    Code::RequestTimedOut,
    Code::TimedOutQueue,
];

/// Kafka's name for a code that a broker (or librdkafka's own size check) gives a *record* for
/// what it is — its size, its bytes, its timestamp — or `None` for any other code. No retry,
/// abort or new producer changes such a record: the replay sends its dead-letter copy instead
/// (see [`crate::sink::rejected`]). Every other failed delivery is the cluster's or the
/// configuration's, and never dead-letters a record.
pub fn rejected_record(code: Code) -> Option<&'static str> {
    Some(match code {
        // The record, or the batch it was sent in, is over the topic's max.message.bytes.
        Code::MessageSizeTooLarge => "MESSAGE_TOO_LARGE",
        Code::MessageBatchTooLarge => "RECORD_LIST_TOO_LARGE",
        // E.g. no key for a compacted topic.
        Code::InvalidRecord => "INVALID_RECORD",
        Code::InvalidMessage => "CORRUPT_MESSAGE",
        // Outside the topic's message.timestamp.{before,after}.max.ms.
        Code::InvalidTimestamp => "INVALID_TIMESTAMP",
        _ => return None,
    })
}

/// Whether an error says a call (or a request inside it) timed out.
pub fn timed_out(facts: &Facts) -> bool {
    facts
        .code
        .is_some_and(|c| TIMEOUT.contains(&c) || c == Code::MessageTimedOut)
}

/// [`refused_route`]'s name for a destination that may not be written.
pub const TOPIC_DENIED: &str = "TOPIC_AUTHORIZATION_FAILED";

/// Kafka's name for a code that says the *destination* refuses a record for what it is not:
/// the topic does not exist, or may not be written. Not the record's fault at first (the topic
/// may be created, the permission granted); see `sink::routes`.
pub fn refused_route(code: Code) -> Option<&'static str> {
    Some(match code {
        Code::UnknownTopic | Code::UnknownTopicOrPartition | Code::UnknownPartition => {
            "UNKNOWN_TOPIC_OR_PARTITION"
        }
        Code::TopicAuthorizationFailed => TOPIC_DENIED,
        _ => return None,
    })
}

/// Decides what a failed `call` means. The order of the checks is the policy.
pub fn classify(call: KafkaCall, facts: &Facts) -> Action {
    let is = |set: &[Code]| facts.code.is_some_and(|c| set.contains(&c));
    if is(UNRECOVERABLE) {
        return Action::Exit;
    }
    if is(FENCED) || facts.fatal {
        return Action::RecreateProducer;
    }
    if call == KafkaCall::Abort && is(TIMEOUT) {
        // A coordinator that does not answer an abort in a whole transaction timeout is gone
        // for a while: a new producer's init_transactions settles the transaction once it is
        // back, retrying with backoff and honouring shutdown, instead of abort after abort.
        return Action::RecreateProducer;
    }
    if call == KafkaCall::Commit {
        if facts.flush {
            // The flush before EndTxn failed: nothing was committed, abort is safe.
            return Action::Abort;
        }
        if is(TIMEOUT) {
            // librdkafka calls a timed-out commit retriable, but the EndTxn may have reached
            // the coordinator: what was committed is read back from the broker instead.
            return Action::UnknownOutcome;
        }
    }
    if facts.abortable {
        return Action::Abort;
    }
    if facts.retriable || is(TRANSIENT) || is(TIMEOUT) {
        return Action::Retry;
    }
    match call {
        // An abort that fails for an unknown reason leaves the producer in an unknown state.
        KafkaCall::Abort | KafkaCall::Begin | KafkaCall::Init => Action::RecreateProducer,
        KafkaCall::Commit => Action::UnknownOutcome,
        KafkaCall::Produce | KafkaCall::SendOffsets => Action::Abort,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call that reaches the broker.
    const CALLS: [KafkaCall; 5] = [
        KafkaCall::Init,
        KafkaCall::Produce,
        KafkaCall::SendOffsets,
        KafkaCall::Commit,
        KafkaCall::Abort,
    ];

    fn flags(code: Code, retriable: bool, abortable: bool, fatal: bool) -> Facts {
        Facts {
            code: Some(code),
            retriable,
            abortable,
            fatal,
            flush: false,
        }
    }

    #[test]
    fn only_the_records_own_faults_are_rejections() {
        for code in [
            Code::MessageSizeTooLarge,
            Code::MessageBatchTooLarge,
            Code::InvalidRecord,
            Code::InvalidMessage,
            Code::InvalidTimestamp,
        ] {
            assert!(rejected_record(code).is_some(), "{code:?}");
        }
        // A record in a batch that had another invalid record is innocent; purged, unknown
        // topics, authorization and outages are not the record's doing.
        for code in [
            Code::InvalidDifferentRecord,
            Code::PurgeQueue,
            Code::PurgeInflight,
            Code::UnknownTopicOrPartition,
            Code::TopicAuthorizationFailed,
            Code::AllBrokersDown,
            Code::MessageTimedOut,
            Code::State,
        ] {
            assert_eq!(rejected_record(code), None, "{code:?}");
        }
    }

    #[test]
    fn every_unrecoverable_code_exits_for_every_call() {
        for &code in UNRECOVERABLE {
            for call in CALLS {
                // Even when librdkafka also flags them abortable or retriable.
                assert_eq!(
                    classify(call, &flags(code, true, true, false)),
                    Action::Exit,
                    "{code:?}"
                );
            }
        }
    }

    #[test]
    fn fenced_codes_recreate_the_producer() {
        for &code in FENCED {
            for call in CALLS {
                assert_eq!(
                    classify(call, &Facts::code(code)),
                    Action::RecreateProducer,
                    "{code:?}"
                );
            }
        }
        // The fatal flag alone is enough, whatever the code.
        let f = flags(Code::InvalidTransactionalState, false, false, true);
        assert_eq!(classify(KafkaCall::Commit, &f), Action::RecreateProducer);
    }

    #[test]
    fn producer_fenced_wins_over_abortable_flag() {
        let f = flags(Code::ProducerFenced, false, true, false);
        assert_eq!(
            classify(KafkaCall::SendOffsets, &f),
            Action::RecreateProducer
        );
    }

    #[test]
    fn commit_timeout_is_unknown_outcome_not_retry() {
        for &code in TIMEOUT {
            // librdkafka flags a timed-out commit as retriable; we still must not retry blindly.
            let f = flags(code, true, false, false);
            assert_eq!(
                classify(KafkaCall::Commit, &f),
                Action::UnknownOutcome,
                "{code:?}"
            );
        }
    }

    #[test]
    fn timeouts_elsewhere_are_retried() {
        for &code in TIMEOUT {
            assert_eq!(
                classify(KafkaCall::Abort, &Facts::code(code)),
                Action::RecreateProducer
            );
            for call in [KafkaCall::Init, KafkaCall::SendOffsets] {
                assert_eq!(
                    classify(call, &Facts::code(code)),
                    Action::Retry,
                    "{code:?} {call:?}"
                );
            }
        }
    }

    #[test]
    fn failed_flush_before_commit_aborts() {
        let f = Facts {
            flush: true,
            ..Facts::code(Code::OperationTimedOut)
        };
        assert_eq!(classify(KafkaCall::Commit, &f), Action::Abort);
    }

    #[test]
    fn abortable_flag_aborts() {
        // e.g. a delivery failure inside the transaction surfacing at commit.
        let f = flags(Code::MessageTimedOut, false, true, false);
        assert_eq!(classify(KafkaCall::Commit, &f), Action::Abort);
        let f = flags(Code::IllegalGeneration, false, true, false);
        assert_eq!(classify(KafkaCall::SendOffsets, &f), Action::Abort);
        let f = flags(Code::UnknownMemberId, false, true, false);
        assert_eq!(classify(KafkaCall::SendOffsets, &f), Action::Abort);
        let f = flags(Code::UnknownProducerId, false, true, false);
        assert_eq!(classify(KafkaCall::Commit, &f), Action::Abort);
        // Our consumer's static membership was fenced: this transaction cannot commit, and
        // the consumer is replaced by the loop; the producer is fine.
        let f = Facts::code(Code::FencedInstanceId);
        assert_eq!(classify(KafkaCall::SendOffsets, &f), Action::Abort);
    }

    #[test]
    fn transient_codes_retry() {
        for &code in TRANSIENT {
            for call in [
                KafkaCall::Init,
                KafkaCall::SendOffsets,
                KafkaCall::Commit,
                KafkaCall::Abort,
            ] {
                assert_eq!(
                    classify(call, &Facts::code(code)),
                    Action::Retry,
                    "{code:?} {call:?}"
                );
            }
        }
        // librdkafka's flag alone is enough too.
        let f = flags(Code::RebalanceInProgress, true, false, false);
        assert_eq!(classify(KafkaCall::SendOffsets, &f), Action::Retry);
    }

    #[test]
    fn unknown_errors_fall_back_per_call() {
        let f = Facts::code(Code::InvalidTransactionalState);
        assert_eq!(classify(KafkaCall::Commit, &f), Action::UnknownOutcome);
        assert_eq!(classify(KafkaCall::Abort, &f), Action::RecreateProducer);
        assert_eq!(classify(KafkaCall::Begin, &f), Action::RecreateProducer);
        assert_eq!(classify(KafkaCall::Init, &f), Action::RecreateProducer);
        assert_eq!(classify(KafkaCall::Produce, &f), Action::Abort);
        assert_eq!(classify(KafkaCall::SendOffsets, &f), Action::Abort);
        let none = Facts {
            code: None,
            retriable: false,
            abortable: false,
            fatal: false,
            flush: false,
        };
        assert_eq!(classify(KafkaCall::Commit, &none), Action::UnknownOutcome);
    }

    #[test]
    fn facts_read_plain_kafka_errors() {
        let e = KafkaError::Flush(Code::OperationTimedOut);
        let f = Facts::of(&e);
        assert!(f.flush);
        assert_eq!(f.code, Some(Code::OperationTimedOut));
        let e = KafkaError::MessageProduction(Code::QueueFull);
        assert_eq!(Facts::of(&e).code, Some(Code::QueueFull));
        assert!(!Facts::of(&e).flush);
    }
}

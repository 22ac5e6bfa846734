//! Exactly once: a transactional producer. Outputs and the group's offsets commit in one Kafka
//! transaction (`send_offsets_to_transaction` with the group's metadata), so a crash, restart
//! or rebalance can neither lose a record nor duplicate one.

use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use tracing::warn;

use super::producer::{Connection, TrackedProducer};
use crate::config::SinkConfig;
use crate::error::Error;
use crate::events::AbortReason;
use crate::kafka::failure::{Action, ClientError, Code, Facts, KafkaCall, classify};
use crate::kafka::{self, Role, Settings, Tp};
use crate::sink::{
    Bounds, Destination, Failed, Feedback, Group, NotConnected, Record, Reply, Sink, Starts, Wait,
};

/// A transactional producer; its transactional id fences earlier incarnations.
pub struct ExactlyOnce {
    connection: Connection,
    /// Its transactional id.
    id: String,
}

impl ExactlyOnce {
    /// Not connected yet: [`Sink::connect`] creates the producer and initialises transactions.
    pub fn new(kafka: &Settings, c: &SinkConfig) -> ExactlyOnce {
        let role = Role::Transactional {
            id: &c.transactional_id,
            timeout: c.transaction_timeout,
            interval: c.commit_interval,
        };
        ExactlyOnce {
            connection: Connection::new(kafka.client(role), &c.output_topic),
            id: c.transactional_id.clone(),
        }
    }

    fn p(&self) -> &TrackedProducer {
        self.connection.producer()
    }
}

impl Sink for ExactlyOnce {
    fn connect(&mut self, bounds: &Bounds) -> Result<(), NotConnected> {
        // One bound for reaching the cluster and initialising, together; init gets at least
        // a second of it.
        let (began, timeout) = (Instant::now(), bounds.timeout());
        let connected = self
            .connection
            .connect(timeout, "initialising transactions", |p| {
                let _g = bounds.health.in_kafka_call("init_transactions");
                let left = timeout.saturating_sub(began.elapsed());
                p.inner()
                    .init_transactions(left.max(Duration::from_secs(1)))
            });
        connected.map_err(|e| match e {
            NotConnected::Exit(Error::Unrecoverable { source, .. })
                if source.code() == Some(Code::TransactionalIdAuthorizationFailed) =>
            {
                NotConnected::Exit(Error::Denied(denied_id(&self.id)))
            }
            e => e,
        })
    }

    fn begin(&mut self, watch: bool, bounds: &Bounds) -> Result<(), Failed> {
        let p = self.p();
        if p.stale() {
            // A late copy of a timed-out request could land in this unit: a new epoch first.
            return Err(Failed::Renew(AbortReason::RequestTimedOut));
        }
        p.reset();
        p.watch_routes(watch);
        let result = {
            let _g = bounds.health.in_kafka_call("begin_transaction");
            p.inner().begin_transaction()
        };
        result.map_err(|e| {
            if classify(KafkaCall::Begin, &Facts::of(&e)) == Action::Exit {
                return Failed::exit("beginning a transaction", e);
            }
            warn!(error = %e, "begin_transaction failed; recreating the producer");
            Failed::Recreate(AbortReason::BeginFailed)
        })
    }

    fn send(&mut self, record: Record<'_, '_>, bounds: &Bounds) -> Result<(), Failed> {
        self.p().send(record, bounds)
    }

    fn hear(&mut self, wait: Wait, bounds: &Bounds) -> Feedback {
        self.p().hear(wait, bounds, true)
    }

    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, bounds: &Bounds) -> Reply {
        match commit(self.p(), offsets, group, bounds) {
            Err(Failed::Exit(e)) if topic_denied(&e) => {
                // librdkafka's lines say which topic: its log is served by the producer's
                // thread, so the call can return before they are heard.
                let denied = self.p().take_denied(HEAR_DENIAL);
                let mut feedback = self.hear(Wait::Now, bounds);
                feedback.denied = feedback.denied.or(denied);
                Reply {
                    result: Err(Failed::Denied(e)),
                    feedback,
                }
            }
            result => Reply {
                result,
                feedback: self.hear(Wait::Now, bounds),
            },
        }
    }

    fn abort(&mut self, reason: AbortReason, bounds: &Bounds) -> Reply {
        let result = abort(self.p(), reason, bounds);
        // The unit's records are reported failed once it ended.
        let feedback = self.hear(Wait::For(REPORTS_AFTER_ABORT), bounds);
        Reply { result, feedback }
    }

    fn claim(&mut self, _: &[Tp], _: &dyn Group, _: &Bounds) -> Result<Starts, Failed> {
        Ok(Starts::Group)
    }

    fn exists(&self, name: &str, timeout: Duration) -> Result<bool, String> {
        self.p().topic_exists(name, timeout)
    }

    fn destination(&self) -> Destination {
        Destination {
            refuser: &super::BROKER,
            aborted: crate::events::Ended::Aborted,
            max_record_bytes: self.connection.max_record_bytes(),
            offsets: crate::sink::OffsetHome::Group,
        }
    }
}

/// How long a unit that failed for want of a permission waits to hear why (librdkafka's log
/// lines, which its producer thread serves within milliseconds).
const HEAR_DENIAL: Duration = Duration::from_secs(2);

/// How long an abort waits for the reports of the unit's records.
pub const REPORTS_AFTER_ABORT: Duration = Duration::from_secs(1);

/// Whether `e` is the cluster refusing a topic's permission (which a route may have caused).
fn topic_denied(e: &Error) -> bool {
    matches!(e, Error::Unrecoverable { source, .. }
        if source.code() == Some(Code::TopicAuthorizationFailed))
}

/// The cluster refused the transactional id `id`: it, and the grant that lets it be used.
fn denied_id(id: &str) -> String {
    format!(
        "may not use the transactional id '{id}': grant the principal WRITE on \
         transactional-id '{id}' (kafka-acls.sh --add --operation Write --transactional-id \
         '{id}'; a PREFIXED grant on '<group-id>-' covers every instance of a group) \
         (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)"
    )
}

/// The calls of a Kafka transaction that [`commit`] and [`abort`] make, in the order they
/// make them: librdkafka's transactional producer, or the simulator's model of a broker
/// (`crate::sim`), which runs the same orderings.
pub trait Transaction {
    /// Waits until every record sent in the open transaction is acknowledged.
    fn flush(&self, timeout: Duration) -> Result<(), ClientError>;
    /// Adds the group's `offsets` to the transaction, as a commit of `group`'s member now:
    /// fenced by its generation (KIP-447).
    fn send_offsets(
        &self,
        offsets: &[(Tp, i64)],
        group: &dyn Group,
        timeout: Duration,
    ) -> Result<(), ClientError>;
    /// Ends the transaction with a commit (EndTxn).
    fn commit(&self, timeout: Duration) -> Result<(), ClientError>;
    /// Ends it with an abort.
    fn abort(&self, timeout: Duration) -> Result<(), ClientError>;
    /// A request of the producer timed out and may still reach the coordinator later: no
    /// other transaction may run on its epoch (see `Failed::Renew`).
    fn timed_out(&self);
}

impl Transaction for TrackedProducer {
    fn flush(&self, timeout: Duration) -> Result<(), ClientError> {
        Ok(TrackedProducer::flush(self, timeout)?)
    }

    fn send_offsets(
        &self,
        offsets: &[(Tp, i64)],
        group: &dyn Group,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        // A joined member has its group's metadata: both come from the same consumer.
        let gm = group.metadata().ok_or(ClientError::of(Code::State))?;
        let offsets = kafka::offset_list(offsets)?;
        let inner = self.inner();
        Ok(inner.send_offsets_to_transaction(&offsets, &gm.0, timeout)?)
    }

    fn commit(&self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.inner().commit_transaction(timeout)?)
    }

    fn abort(&self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.inner().abort_transaction(timeout)?)
    }

    fn timed_out(&self) {
        TrackedProducer::timed_out(self)
    }
}

/// Commits the open transaction of `t` with the group's `offsets`: every record acknowledged
/// first, then the offsets, then EndTxn.
///
/// Every record first: once the offsets are in the transaction, a new owner's offset fetch
/// waits for it to end (KIP-447), and must then find all of its records on the broker. An owner
/// frozen between the two (a VM pause, SIGSTOP) whose session expired would otherwise deliver
/// its changelog records after the new owner restored the partition without them, and its
/// EndTxn, which no generation fences, would commit them.
pub fn commit(
    t: &impl Transaction,
    offsets: &[(Tp, i64)],
    group: &dyn Group,
    bounds: &Bounds,
) -> Result<(), Failed> {
    // A commit without a generation or member id is not fenced by the group: a member that
    // lost its partitions could commit theirs.
    let member = group.member();
    if !member.as_ref().is_some_and(|m| m.joined()) {
        warn!(?member, "no group membership to commit with; aborting");
        return Err(Failed::Abort(AbortReason::NoGroupMetadata));
    }
    flush(t, bounds)?;
    send_offsets(t, offsets, group, bounds)?;
    end(t, bounds)
}

/// Waits for every record of the transaction. (commit_transaction's own flush goes through
/// rust-rdkafka's slow one: after this, it finds nothing left.) A flush that fails (a whole
/// call timeout without every delivery) ends the transaction here: commit_transaction would
/// wait as long again.
fn flush(t: &impl Transaction, bounds: &Bounds) -> Result<(), Failed> {
    let flushed = {
        let _g = bounds.health.in_kafka_call("flush");
        t.flush(bounds.timeout())
    };
    let Err(e) = flushed else {
        return Ok(());
    };
    stale_if_timed_out(t, &e);
    Err(match classify(KafkaCall::Commit, &e.facts()) {
        Action::Exit => Failed::exit("flushing before the commit", e),
        Action::RecreateProducer => {
            warn!(error = %e, "flush before the commit: producer fenced; recreating it");
            Failed::Recreate(AbortReason::CommitFenced)
        }
        _ => {
            warn!(error = %e, "flush before the commit failed; aborting");
            Failed::Abort(AbortReason::CommitFailed)
        }
    })
}

/// Adds the group's `offsets` to the transaction.
fn send_offsets(
    t: &impl Transaction,
    offsets: &[(Tp, i64)],
    group: &dyn Group,
    bounds: &Bounds,
) -> Result<(), Failed> {
    let sent = bounds.retry(
        KafkaCall::SendOffsets,
        "send_offsets_to_transaction",
        |timeout| t.send_offsets(offsets, group, timeout),
    );
    let Err((action, e)) = sent else {
        return Ok(());
    };
    stale_if_timed_out(t, &e);
    Err(match action {
        Action::Exit => Failed::exit("sending offsets", e),
        Action::RecreateProducer | Action::UnknownOutcome => {
            warn!(error = %e, "send_offsets_to_transaction failed; recreating the producer");
            Failed::Recreate(AbortReason::SendOffsetsFenced)
        }
        Action::Retry | Action::Abort => {
            warn!(error = %e, "send_offsets_to_transaction failed; aborting");
            Failed::Abort(AbortReason::SendOffsetsFailed)
        }
    })
}

/// EndTxn. An answer that does not say it committed says nothing of whether it did, unless
/// the transaction is certainly abortable.
fn end(t: &impl Transaction, bounds: &Bounds) -> Result<(), Failed> {
    let committed = bounds.retry(KafkaCall::Commit, "commit_transaction", |timeout| {
        t.commit(timeout)
    });
    let Err((action, e)) = committed else {
        return Ok(());
    };
    stale_if_timed_out(t, &e);
    Err(match action {
        Action::Exit => Failed::exit("committing", e),
        Action::Abort => {
            warn!(error = %e, "commit_transaction failed; aborting");
            Failed::Abort(AbortReason::CommitFailed)
        }
        Action::RecreateProducer => {
            // librdkafka retries an EndTxn whose answer it did not get: the first may have
            // committed before a newer epoch fenced the retry.
            warn!(error = %e, "commit_transaction: producer fenced, the commit's outcome is \
                               unknown; recreating it, then reading the committed offsets");
            Failed::Unknown {
                reason: AbortReason::CommitFenced,
                recreate: true,
            }
        }
        Action::Retry | Action::UnknownOutcome => {
            // The commit may have happened. Abort if librdkafka still allows it, else a
            // new producer's init_transactions settles it; either way the rewind reads
            // what the broker holds as committed.
            warn!(error = %e, "commit outcome unknown; aborting or recreating, then \
                               rewinding to the broker's committed offsets");
            Failed::Unknown {
                reason: AbortReason::CommitOutcomeUnknown,
                recreate: false,
            }
        }
    })
}

/// Aborts the open transaction of `t`. A failed abort asks for a new producer, whose
/// init_transactions aborts it on the broker.
pub fn abort(t: &impl Transaction, reason: AbortReason, bounds: &Bounds) -> Result<(), Failed> {
    {
        // librdkafka#4849: an abort racing a partition registration that the coordinator
        // refused (CONCURRENT_TRANSACTIONS right after a commit) sends EndTxn for a
        // transaction the coordinator does not have, and INVALID_TXN_STATE is fatal. A
        // record is only delivered once its partition is registered, so waiting for the
        // deliveries first closes the window (queued records were purged already if the
        // transaction failed). Bounded: an unreachable broker is the recreate path's.
        let _g = bounds.health.in_kafka_call("flush");
        let _ = t.flush(bounds.timeout().min(Duration::from_secs(5)));
    }
    let aborted = bounds.retry(KafkaCall::Abort, "abort_transaction", |timeout| {
        t.abort(timeout)
    });
    match aborted {
        Ok(()) => Ok(()),
        Err((Action::Exit, e)) => Err(Failed::exit("aborting", e)),
        Err((_, e)) => {
            warn!(error = %e, reason = reason.as_str(), "abort_transaction failed; recreating the producer");
            Err(Failed::Recreate(reason))
        }
    }
}

/// A transactional call that timed out may still reach the coordinator later: the producer
/// must not run another transaction on its epoch (see `Failed::Renew`).
fn stale_if_timed_out(t: &impl Transaction, e: &ClientError) {
    if crate::kafka::failure::timed_out(&e.facts()) {
        warn!(error = %e, "a transactional request timed out; the producer is replaced before the next transaction");
        t.timed_out();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Guarantee;
    use crate::health::Health;

    /// A transaction that records the calls made of it.
    #[derive(Default)]
    struct Recorded(std::cell::RefCell<Vec<&'static str>>);

    impl Transaction for Recorded {
        fn flush(&self, _: Duration) -> Result<(), ClientError> {
            self.0.borrow_mut().push("flush");
            Ok(())
        }
        fn send_offsets(
            &self,
            _: &[(Tp, i64)],
            _: &dyn Group,
            _: Duration,
        ) -> Result<(), ClientError> {
            self.0.borrow_mut().push("send_offsets");
            Ok(())
        }
        fn commit(&self, _: Duration) -> Result<(), ClientError> {
            self.0.borrow_mut().push("commit");
            Ok(())
        }
        fn abort(&self, _: Duration) -> Result<(), ClientError> {
            self.0.borrow_mut().push("abort");
            Ok(())
        }
        fn timed_out(&self) {}
    }

    /// A member of generation 3: all a commit asks of its group.
    struct Joined;

    impl Group for Joined {
        fn metadata(&self) -> Option<kafka::member::Generation> {
            None
        }
        fn member(&self) -> Option<kafka::member::Member> {
            let id = "m".into();
            Some(kafka::member::Member { generation: 3, id })
        }
        fn commit_offsets(&self, _: &[(Tp, i64)]) -> Result<(), ClientError> {
            unreachable!()
        }
        fn copy_offsets(&self, _: &[(Tp, i64)]) -> Result<(), ClientError> {
            unreachable!()
        }
        fn committed(&self, _: &[Tp], _: Duration) -> Result<crate::sink::Committed, ClientError> {
            unreachable!()
        }
        fn positions(&self) -> Vec<(Tp, i64)> {
            unreachable!()
        }
        fn assignment(&self) -> Result<Vec<Tp>, ClientError> {
            unreachable!()
        }
        fn seek(&self, _: &[(Tp, i64)], _: Duration) -> Result<(), crate::sink::SeekFailed> {
            unreachable!()
        }
        fn pause(&self, _: &[Tp]) -> Result<(), ClientError> {
            unreachable!()
        }
        fn resume(&self, _: &[Tp]) -> Result<(), ClientError> {
            unreachable!()
        }
    }

    /// Every record of the transaction is on the broker before its offsets join it: from then
    /// on a new owner's offset fetch waits for the transaction, and its restore must find
    /// every changelog record of it once it ended (else the simulator finds a record doubled).
    #[test]
    fn a_commit_flushes_every_record_before_it_sends_the_offsets() {
        let t = Recorded::default();
        let bounds = Bounds::new(Arc::new(Health::default()), Duration::from_secs(1));
        let offsets = [(("in".to_string(), 0), 7)];
        commit(&t, &offsets, &Joined, &bounds).expect("committed");
        assert_eq!(*t.0.borrow(), ["flush", "send_offsets", "commit"]);
    }

    #[test]
    fn a_consumer_that_has_not_joined_commits_no_offsets() {
        let (cluster, consumer) = kafka::consumer::unjoined_mock("in");
        // Metadata, but with no generation or member id: not fenced by the group.
        assert!(Group::metadata(&consumer).is_some());
        let kafka = Settings {
            bootstrap_servers: cluster.bootstrap_servers(),
            client_id: "t".into(),
            common: Default::default(),
            consumer: Vec::new(),
            producer: Vec::new(),
        };
        let config = SinkConfig {
            guarantee: Guarantee::ExactlyOnce,
            output_topic: "out".into(),
            transactional_id: "t-unjoined".into(),
            transaction_timeout: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(10),
            commit_interval: Duration::from_millis(100),
            db: None,
        };
        let bounds = Bounds::new(Arc::new(Health::default()), Duration::from_secs(10));
        let mut sink = ExactlyOnce::new(&kafka, &config);
        sink.connect(&bounds).expect("connected");
        sink.begin(false, &bounds).expect("began");
        let offsets = [(("in".to_string(), 0), 1)];
        match sink.commit(&offsets, &consumer, &bounds).result {
            Err(Failed::Abort(AbortReason::NoGroupMetadata)) => {}
            Err(other) => panic!("{other:?}"),
            Ok(()) => panic!("committed offsets without a member"),
        }
        sink.abort(AbortReason::NoGroupMetadata, &bounds)
            .result
            .expect("aborted");
    }
}

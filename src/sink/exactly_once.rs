//! Exactly once: a transactional producer. Outputs and the group's offsets commit in one Kafka
//! transaction (`send_offsets_to_transaction` with the group's metadata), so a crash, restart
//! or rebalance can neither lose a record nor duplicate one.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::warn;

use super::producer::{Connection, KafkaProducer};
use super::{Calls, Failed, Group, Record, Sink};
use crate::config::Config;
use crate::error::{Action, Call, Facts, classify};
use crate::events::AbortReason;
use crate::kafka::{Role, Settings};

/// A transactional producer; its transactional id fences earlier incarnations.
pub struct Transactions {
    connection: Connection,
}

impl Transactions {
    /// Not connected yet: [`Sink::connect`] creates the producer and initialises transactions.
    pub fn new(kafka: &Settings, c: &Config) -> Transactions {
        let role = Role::Transactional {
            id: &c.transactional_id,
            timeout: c.transaction_timeout,
        };
        Transactions {
            connection: Connection::new(kafka.to_rdkafka(role), &c.output_topic),
        }
    }

    fn p(&self) -> &KafkaProducer {
        self.connection.producer()
    }
}

impl Sink for Transactions {
    fn connect(&mut self, calls: &Calls) -> Result<(), KafkaError> {
        // One bound for reaching the cluster and initialising, together; init gets at least
        // a second of it.
        let (began, timeout) = (Instant::now(), calls.timeout());
        self.connection.connect(timeout, |p| {
            let _g = calls.health.in_call("init_transactions");
            let left = timeout.saturating_sub(began.elapsed());
            p.inner()
                .init_transactions(left.max(Duration::from_secs(1)))
        })
    }

    fn refused(&self) -> Option<String> {
        self.connection.refused()
    }

    fn begin(&mut self, calls: &Calls) -> Result<(), Failed> {
        let p = self.p();
        p.reset();
        let result = {
            let _g = calls.health.in_call("begin_transaction");
            p.inner().begin_transaction()
        };
        result.map_err(|e| {
            if classify(Call::Begin, &Facts::of(&e)) == Action::Exit {
                return Failed::exit("beginning a transaction", e);
            }
            warn!(error = %e, "begin_transaction failed; recreating the producer");
            Failed::Recreate(AbortReason::BeginFailed)
        })
    }

    fn send(&mut self, record: Record<'_, '_>, calls: &Calls) -> Result<(), Failed> {
        self.p().send(record, calls)
    }

    fn settle(&mut self, calls: &Calls) -> bool {
        self.p().settle(calls)
    }

    fn take_rejections(&mut self, wait: Duration) -> Vec<(usize, RDKafkaErrorCode)> {
        self.p().take_rejections(wait)
    }

    fn has_rejections(&self) -> bool {
        self.p().has_rejections()
    }

    fn denied(&self) -> Option<String> {
        self.p().denied()
    }

    /// Offsets first, then EndTxn.
    fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &dyn Group,
        calls: &Calls,
    ) -> Result<(), Failed> {
        let Some(gm) = group.metadata() else {
            warn!("no group metadata to commit with; aborting");
            return Err(Failed::Abort(AbortReason::NoGroupMetadata));
        };
        let p = self.p();
        let sent = calls.retry(Call::SendOffsets, "send_offsets_to_transaction", |t| {
            p.inner().send_offsets_to_transaction(offsets, &gm, t)
        });
        if let Err((action, e)) = sent {
            return Err(match action {
                Action::Exit => Failed::exit("sending offsets", e),
                Action::RecreateProducer | Action::UnknownOutcome => {
                    warn!(error = %e, "send_offsets_to_transaction failed; recreating the producer");
                    Failed::Recreate(AbortReason::SendOffsetsFenced)
                }
                Action::Retry | Action::Abort => {
                    warn!(error = %e, "send_offsets_to_transaction failed; aborting");
                    Failed::Abort(AbortReason::SendOffsetsFailed)
                }
            });
        }

        // commit_transaction flushes too, but through rust-rdkafka's slow flush; after this one
        // it finds nothing left. A flush that fails (a whole call timeout without every
        // delivery) ends the transaction here: commit_transaction would wait as long again.
        let flushed = {
            let _g = calls.health.in_call("flush");
            p.flush(calls.timeout())
        };
        if let Err(e) = flushed {
            return Err(match classify(Call::Commit, &Facts::of(&e)) {
                Action::Exit => Failed::exit("flushing before the commit", e),
                Action::RecreateProducer => {
                    warn!(error = %e, "flush before the commit: producer fenced; recreating it");
                    Failed::Recreate(AbortReason::CommitFenced)
                }
                _ => {
                    warn!(error = %e, "flush before the commit failed; aborting");
                    Failed::Abort(AbortReason::CommitFailed)
                }
            });
        }
        let committed = calls.retry(Call::Commit, "commit_transaction", |t| {
            p.inner().commit_transaction(t)
        });
        let Err((action, e)) = committed else {
            return Ok(());
        };
        Err(match action {
            Action::Exit => Failed::exit("committing", e),
            Action::Abort => {
                warn!(error = %e, "commit_transaction failed; aborting");
                Failed::Abort(AbortReason::CommitFailed)
            }
            Action::RecreateProducer => {
                warn!(error = %e, "commit_transaction: producer fenced; recreating it");
                Failed::Recreate(AbortReason::CommitFenced)
            }
            Action::Retry | Action::UnknownOutcome => {
                // The commit may have happened. Abort if librdkafka still allows it, else a
                // new producer's init_transactions settles it; either way the rewind reads
                // what the broker holds as committed.
                warn!(error = %e, "commit outcome unknown; aborting or recreating, then \
                                   rewinding to the broker's committed offsets");
                Failed::Abort(AbortReason::CommitOutcomeUnknown)
            }
        })
    }

    /// A failed abort asks for a new producer, whose init_transactions aborts it on the broker.
    fn abort(&mut self, reason: AbortReason, calls: &Calls) -> Result<(), Failed> {
        let p = self.p();
        {
            // librdkafka#4849: an abort racing a partition registration that the coordinator
            // refused (CONCURRENT_TRANSACTIONS right after a commit) sends EndTxn for a
            // transaction the coordinator does not have, and INVALID_TXN_STATE is fatal. A
            // record is only delivered once its partition is registered, so waiting for the
            // deliveries first closes the window (queued records were purged already if the
            // transaction failed). Bounded: an unreachable broker is the recreate path's.
            let _g = calls.health.in_call("flush");
            let _ = p.flush(calls.timeout().min(Duration::from_secs(5)));
        }
        let aborted = calls.retry(Call::Abort, "abort_transaction", |t| {
            p.inner().abort_transaction(t)
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

    fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, KafkaError> {
        self.p().topic_exists(topic, timeout)
    }
}

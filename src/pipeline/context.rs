//! The pipeline consumer's context: it holds the [`Session`] and hands it every rebalance.
//!
//! librdkafka calls the rebalance callback from inside `poll`, and the callback must commit
//! (or abort) the open unit before partitions move, so the session lives here, where both the
//! loop and the callback reach it. The loop thread is the only caller of `poll`, and it never
//! holds the session across `poll`, so the lock is never contended.

use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use tracing::warn;

use super::session::Session;
use crate::error::Error;
use crate::events::{Assignment, Rebalance as Event, Rebalanced};
use crate::kafka::{describe, partitions};
use crate::lag::Positions;
use crate::metrics::Metrics;
use crate::sink::Starts;

/// The consumer of the pipeline.
pub type PipelineConsumer = BaseConsumer<PipelineContext>;

/// Consumer context: holds the session and hands it every rebalance.
pub struct PipelineContext {
    /// Shared, so a replaced consumer (after a fatal consumer error) keeps the same session,
    /// and with it the same producer.
    session: Arc<Mutex<Session>>,
    /// Where the loop is in each owned partition.
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
}

impl PipelineContext {
    /// Holds `session`; statistics reports go to `positions`.
    pub fn new(
        session: Arc<Mutex<Session>>,
        positions: Arc<Positions>,
        metrics: Arc<Metrics>,
    ) -> Self {
        PipelineContext {
            session,
            positions,
            metrics,
        }
    }

    /// The session. Never hold it across `poll`: the rebalance callback takes it too.
    pub fn session(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientContext for PipelineContext {
    /// librdkafka's statistics, every `--lag-interval`, from inside `poll`: the positions the
    /// lag gauges are measured from.
    fn stats(&self, statistics: Statistics) {
        self.positions.update(&statistics);
    }
}

impl ConsumerContext for PipelineContext {
    /// rust-rdkafka's rebalance, with one step before an assignment: a sink that keeps the
    /// offsets itself claims the partitions, and each starts where it says (set in the list
    /// the consumer is assigned: a seek right after an assignment fails in librdkafka). A
    /// claim that fails assigns nothing: the loop stops with why.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        use RDKafkaRespErr::{
            RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS as ASSIGN,
            RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS as REVOKE,
        };
        let mut claimed = false;
        if err == ASSIGN {
            let Some(starts) = self.session().claim(consumer, &partitions(tpl)) else {
                return;
            };
            let starts = match starts {
                Starts::Group => Vec::new(),
                Starts::At(starts) => starts,
            };
            claimed = !starts.is_empty();
            for ((topic, partition), start) in starts {
                let offset = start.map_or(Offset::Invalid, Offset::Offset);
                if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                    // Started anywhere else, it would repeat or skip records: nothing is
                    // assigned, and the loop stops.
                    let why = format!("setting where claimed {topic}[{partition}] starts: {e}");
                    self.session().fail_later(Error::Store(why));
                    return;
                }
            }
        }
        let rebalance = match err {
            ASSIGN => Rebalance::Assign(tpl),
            REVOKE => Rebalance::Revoke(tpl),
            e => Rebalance::Error(KafkaError::Rebalance(e.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let done = match (err == ASSIGN, cooperative) {
            (true, true) => consumer.incremental_assign(tpl),
            (true, false) => consumer.assign(tpl),
            (false, true) => consumer.incremental_unassign(tpl),
            (false, false) => consumer.unassign(),
        };
        if let Err(e) = done {
            warn!(error = %e, "the consumer did not take the rebalance");
        }
        // A partition paused when another instance claimed it is this one's again.
        if claimed && let Err(e) = consumer.resume(tpl) {
            warn!(error = %e, "cannot resume the claimed partitions");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let lost = consumer.assignment_lost();
                let partitions = partitions(tpl);
                Rebalanced {
                    event: if lost { Event::Lost } else { Event::Revoke },
                    partitions: &describe(&partitions),
                }
                .emit(&self.metrics);
                self.session().revoked(consumer, partitions, lost);
            }
            Rebalance::Assign(tpl) => {
                let partitions = partitions(tpl);
                Rebalanced {
                    event: Event::Assign,
                    partitions: &describe(&partitions),
                }
                .emit(&self.metrics);
                self.session().assigned(partitions);
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !matches!(rebalance, Rebalance::Error(_)) {
            let assignment = consumer.assignment().unwrap_or_default();
            Assignment {
                owned: &describe(&partitions(&assignment)),
                count: assignment.count(),
            }
            .emit(&self.metrics);
        }
    }
}

//! Kafka clients: their settings, and the consumer context that handles rebalances.
//!
//! The transaction driver lives inside the consumer's context, because librdkafka calls the
//! rebalance callback from inside `poll` and that callback must commit (or abort) the open
//! transaction before partitions move. The loop thread is the only caller of `poll`, and it
//! never holds the driver's lock across `poll`, so the lock is never contended.

use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::{info, warn};

use crate::config::{Config, Guarantee};
use crate::lag::Positions;
use crate::txn::{Reason, TxnDriver};

/// The consumer of the pipeline.
pub type PipelineConsumer = BaseConsumer<PipelineContext>;

/// Settings of the read_committed, manually committed consumer.
pub fn consumer_config(c: &Config) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &c.bootstrap_servers)
        .set("group.id", &c.group_id)
        .set("client.id", format!("exactly-{}", c.instance_id))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("auto.offset.reset", "earliest")
        .set(
            "statistics.interval.ms",
            c.lag_interval.as_millis().to_string(),
        );
    if c.static_membership {
        cc.set("group.instance.id", &c.instance_id);
    }
    for (k, v) in &c.consumer_config {
        cc.set(k, v);
    }
    cc
}

/// Settings of the transactional producer.
pub fn producer_config(c: &Config) -> ClientConfig {
    let mut pc = ClientConfig::new();
    pc.set("bootstrap.servers", &c.bootstrap_servers)
        .set("client.id", format!("exactly-{}", c.instance_id))
        .set("enable.idempotence", "true")
        .set("acks", "all");
    if c.guarantee == Guarantee::ExactlyOnce {
        pc.set("transactional.id", &c.transactional_id).set(
            "transaction.timeout.ms",
            c.transaction_timeout.as_millis().to_string(),
        );
    }
    for (k, v) in &c.producer_config {
        pc.set(k, v);
    }
    pc
}

/// `topic[0,1,2] other[5]`, for logs.
pub fn describe(tpl: &TopicPartitionList) -> String {
    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_string())
            .or_default()
            .push(e.partition());
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

/// Consumer context: holds the transaction driver and settles it at every rebalance.
pub struct PipelineContext {
    /// Shared, so a replaced consumer (after a fatal consumer error) keeps the same producer.
    driver: Arc<Mutex<TxnDriver>>,
    /// Where the loop is in each owned partition.
    positions: Arc<Positions>,
}

impl PipelineContext {
    /// Wraps the driver; statistics reports go to `positions`.
    pub fn new(driver: Arc<Mutex<TxnDriver>>, positions: Arc<Positions>) -> Self {
        PipelineContext { driver, positions }
    }

    /// The driver. Never hold this across `poll`: the rebalance callback takes it too.
    pub fn driver(&self) -> MutexGuard<'_, TxnDriver> {
        self.driver.lock().unwrap_or_else(|p| p.into_inner())
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
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let mut driver = self.driver();
                let event = if consumer.assignment_lost() {
                    "lost"
                } else {
                    "revoke"
                };
                driver
                    .metrics()
                    .rebalances
                    .with_label_values(&[event])
                    .inc();
                if consumer.assignment_lost() {
                    // Someone else may already own them: nothing of ours may commit.
                    warn!(partitions = %describe(tpl), "partitions lost; aborting the open transaction");
                    driver.abort_now(Reason::PartitionsLost);
                } else {
                    info!(partitions = %describe(tpl), "partitions revoked; committing first");
                    driver.commit_now(consumer, "rebalance");
                }
            }
            Rebalance::Assign(tpl) => {
                self.driver()
                    .metrics()
                    .rebalances
                    .with_label_values(&["assign"])
                    .inc();
                info!(partitions = %describe(tpl), "partitions assigned");
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !matches!(rebalance, Rebalance::Error(_)) {
            let assignment = consumer.assignment().unwrap_or_default();
            let count = i64::try_from(assignment.count()).unwrap_or(i64::MAX);
            self.driver().metrics().assigned_partitions.set(count);
            info!(owned = %describe(&assignment), "assignment now");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Command};
    use clap::Parser;

    fn config(extra: &[&str]) -> Config {
        let mut args = vec![
            "exactly",
            "run",
            "--bootstrap-servers",
            "h:1",
            "--input-topics",
            "in",
            "--output-topic",
            "out",
            "--group-id",
            "g",
            "--instance-id",
            "pod-0",
        ];
        args.extend_from_slice(extra);
        let Command::Run(run) = Cli::parse_from(args).command else {
            panic!()
        };
        run.validate().unwrap()
    }

    #[test]
    fn consumer_reads_committed_and_never_autocommits() {
        let cc = consumer_config(&config(&[]));
        assert_eq!(cc.get("isolation.level"), Some("read_committed"));
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
        assert_eq!(cc.get("group.id"), Some("g"));
        assert_eq!(
            cc.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(cc.get("group.instance.id"), None);
        let cc = consumer_config(&config(&["--static-membership"]));
        assert_eq!(cc.get("group.instance.id"), Some("pod-0"));
    }

    #[test]
    fn producer_is_transactional() {
        let pc = producer_config(&config(&["--transaction-timeout", "30s"]));
        assert_eq!(pc.get("transactional.id"), Some("g-pod-0"));
        assert_eq!(pc.get("transaction.timeout.ms"), Some("30000"));
        assert_eq!(pc.get("enable.idempotence"), Some("true"));
        let pc = producer_config(&config(&["--guarantee", "at-least-once"]));
        assert_eq!(pc.get("transactional.id"), None);
        assert_eq!(pc.get("transaction.timeout.ms"), None);
        assert_eq!(pc.get("enable.idempotence"), Some("true"));
        assert_eq!(pc.get("acks"), Some("all"));
    }

    #[test]
    fn passthrough_is_applied() {
        let cc = consumer_config(&config(&["--consumer-config", "auto.offset.reset=latest"]));
        assert_eq!(cc.get("auto.offset.reset"), Some("latest"));
        let pc = producer_config(&config(&["--producer-config", "linger.ms=50"]));
        assert_eq!(pc.get("linger.ms"), Some("50"));
    }

    #[test]
    fn describe_groups_by_topic() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("b", 2);
        tpl.add_partition("a", 1);
        tpl.add_partition("b", 0);
        assert_eq!(describe(&tpl), "a[1] b[0,2]");
    }
}

//! The three-broker cluster of the cluster fault scenarios (`scripts/cluster.sh`, run by
//! `scripts/faults.sh cluster`): which broker leads what, which coordinates a transactional id
//! or a group, whether replication has healed, and the broker faults.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

use super::broker::{bootstrap, repo, retry};

/// `transaction.state.log.num.partitions` and `offsets.topic.num.partitions` of the test
/// brokers (scripts/kafka.sh, scripts/cluster.sh).
const COORDINATOR_PARTITIONS: i32 = 10;

/// The cluster the tests run on (`EXACTLY_TEST_CLUSTER`, the run directory of
/// `scripts/cluster.sh`, whose brokers `EXACTLY_TEST_BOOTSTRAP` names).
pub struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    /// The cluster; panics, naming how to run it, when the tests are not on one.
    pub fn required() -> Cluster {
        let dir = std::env::var("EXACTLY_TEST_CLUSTER").expect(
            "this scenario needs the three-broker cluster: run it with scripts/faults.sh cluster",
        );
        let cluster = Cluster { dir: dir.into() };
        // Whatever a scenario that failed left behind: every broker serving, every partition
        // in sync, before the next one starts.
        cluster.script(&["heal"]);
        cluster.wait_replicated(Duration::from_secs(120));
        cluster
    }

    fn script(&self, args: &[&str]) {
        let status = Command::new(repo().join("scripts/cluster.sh"))
            .args(args)
            .env("EXACTLY_CLUSTER_DIR", &self.dir)
            .status()
            .expect("run scripts/cluster.sh");
        assert!(status.success(), "scripts/cluster.sh {args:?} failed");
    }

    /// SIGKILL broker `node` (1–3).
    pub fn kill(&self, node: i32) {
        self.script(&["kill", &node.to_string()]);
    }

    /// SIGTERM broker `node` (a controlled shutdown) and wait for it to exit.
    pub fn stop(&self, node: i32) {
        self.script(&["stop-node", &node.to_string()]);
    }

    /// Starts broker `node` again and waits until it serves.
    pub fn start(&self, node: i32) {
        self.script(&["start-node", &node.to_string()]);
    }

    /// SIGSTOP broker `node`.
    pub fn pause(&self, node: i32) {
        self.script(&["pause", &node.to_string()]);
    }

    /// SIGCONT broker `node`.
    pub fn resume(&self, node: i32) {
        self.script(&["resume", &node.to_string()]);
    }

    /// The leader of `topic`'s `partition` now, as the metadata says.
    pub fn leader(&self, topic: &str, partition: i32) -> i32 {
        let c = client();
        retry(&format!("leader of {topic}[{partition}]"), || {
            let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
            md.topics()
                .first()
                .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
                .map(|p| p.leader())
                .filter(|&l| l >= 0)
                .ok_or(KafkaError::MetadataFetch(
                    rdkafka::types::RDKafkaErrorCode::LeaderNotAvailable,
                ))
        })
    }

    /// The broker that coordinates `transactional_id`'s transactions: the leader of its
    /// `__transaction_state` partition.
    pub fn transaction_coordinator(&self, transactional_id: &str) -> i32 {
        self.leader(
            "__transaction_state",
            coordinator_partition(transactional_id),
        )
    }

    /// The coordinator of `transactional_id` as Kafka's own tool describes it (the check of
    /// [`Cluster::transaction_coordinator`]'s formula).
    pub fn described_transaction_coordinator(&self, transactional_id: &str) -> i32 {
        let out = Command::new(repo().join("scripts/cluster.sh"))
            .args(["tool", "org.apache.kafka.tools.TransactionsCommand"])
            .args(["--bootstrap-server", &bootstrap(), "describe"])
            .args(["--transactional-id", transactional_id])
            .env("EXACTLY_CLUSTER_DIR", &self.dir)
            .output()
            .expect("run kafka-transactions");
        let text = String::from_utf8_lossy(&out.stdout);
        // A header line, then the values: CoordinatorId is the first column.
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let values: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        header
            .iter()
            .position(|h| *h == "CoordinatorId")
            .and_then(|i| values.get(i)?.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "kafka-transactions describe said:\n{text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    }

    /// The broker that coordinates `group`: the leader of its `__consumer_offsets` partition.
    pub fn group_coordinator(&self, group: &str) -> i32 {
        self.leader("__consumer_offsets", coordinator_partition(group))
    }

    /// Partitions (of every topic) with fewer in-sync replicas than replicas.
    pub fn under_replicated(&self) -> usize {
        let c = client();
        let md = retry("metadata", || {
            c.fetch_metadata(None, Duration::from_secs(10))
        });
        md.topics()
            .iter()
            .flat_map(|t| t.partitions())
            .filter(|p| p.isr().len() < p.replicas().len())
            .count()
    }

    /// Waits until no partition is under-replicated (a restarted broker caught up).
    pub fn wait_replicated(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.under_replicated();
            if n == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} partitions still under-replicated after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn client() -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("metadata client")
}

/// Java's `String.hashCode`: 31-fold over the UTF-16 code units, wrapping.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// The coordinator partition of a transactional id or a group: Kafka's
/// `Utils.abs(id.hashCode()) % partitions`, where `Utils.abs` is `Math.abs` with
/// `Integer.MIN_VALUE` taken as 0 (not the sign bit masked: that gave another broker for half
/// the ids, which the check against kafka-transactions caught).
fn coordinator_partition(id: &str) -> i32 {
    let hash = java_hash(id);
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % COORDINATOR_PARTITIONS
}

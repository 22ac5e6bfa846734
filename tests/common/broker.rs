//! Talking to the test broker: its address, unique names, topics, and admin and offset reads
//! (watermarks, committed offsets, transaction stability).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// Starts the project's broker once (idempotent) and returns its bootstrap address.
pub fn bootstrap() -> String {
    static BOOTSTRAP: OnceLock<String> = OnceLock::new();
    BOOTSTRAP
        .get_or_init(|| {
            if let Ok(b) = std::env::var("EXACTLY_TEST_BOOTSTRAP") {
                return b;
            }
            let script = repo().join("scripts/kafka.sh");
            let status = Command::new(&script)
                .arg("start")
                .status()
                .expect("run scripts/kafka.sh");
            assert!(status.success(), "scripts/kafka.sh start failed");
            let out = Command::new(&script)
                .arg("bootstrap")
                .output()
                .expect("bootstrap");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        })
        .clone()
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Creates topics with the given partition counts.
pub fn create_topics(topics: &[(&str, i32)]) {
    let with: Vec<_> = topics.iter().map(|&(t, p)| (t, p, &[][..])).collect();
    create_topics_with(&with);
}

/// Topic settings: (name, value) pairs.
pub type TopicConfig<'a> = &'a [(&'a str, &'a str)];

/// The replication factor of the tests' topics: 1 on the test broker, 3 on the three-broker
/// cluster (`EXACTLY_TEST_REPLICATION`, set by scripts/faults.sh cluster).
pub fn replication() -> i32 {
    std::env::var("EXACTLY_TEST_REPLICATION")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
}

/// Creates topics with the given partition counts and topic configs.
pub fn create_topics_with(topics: &[(&str, i32, TopicConfig<'_>)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(t, p, config)| {
            config.iter().fold(
                NewTopic::new(t, *p, TopicReplication::Fixed(replication())),
                |n, (k, v)| n.set(k, v),
            )
        })
        .collect();
    let results = block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap();
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
    // Metadata reaches every client a moment later; wait until the topics are visible.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (t, p, _) in topics {
        loop {
            let md = admin
                .inner()
                .fetch_metadata(Some(t), Duration::from_secs(5))
                .unwrap();
            let ok = md.topics().iter().any(|x| {
                x.name() == *t && x.error().is_none() && x.partitions().len() == *p as usize
            });
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "topic {t} never appeared");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Grows `topic` to `partitions` partitions, and waits until they are listed.
pub fn add_partitions(topic: &str, partitions: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let grow = rdkafka::admin::NewPartitions::new(topic, partitions);
    let results = block_on(admin.create_partitions([&grow], &AdminOptions::new())).unwrap();
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("grow topic {t}: {e}"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .unwrap();
        let listed = md
            .topics()
            .iter()
            .any(|x| x.name() == topic && x.partitions().len() == partitions);
        if listed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} never grew to {partitions}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The three topics of one pipeline: input, output, DLQ.
pub struct Topics {
    pub input: String,
    pub output: String,
    pub dlq: String,
}

impl Topics {
    pub fn create(name: &str, input_partitions: i32, output_partitions: i32) -> Topics {
        let input = unique(&format!("{name}-in"));
        let output = unique(&format!("{name}-out"));
        let dlq = format!("{output}.dlq");
        create_topics(&[
            (&input, input_partitions),
            (&output, output_partitions),
            (&dlq, 1),
        ]);
        Topics { input, output, dlq }
    }
}

/// Retries a Kafka call for up to a minute: right after a broker restart (fault tests) or on a
/// fresh broker, metadata and coordinators take a moment.
pub fn retry<T>(what: &str, f: impl Fn() -> Result<T, KafkaError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{what}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

pub(super) fn partition_count(c: &BaseConsumer, topic: &str) -> i32 {
    retry(&format!("metadata of {topic}"), || {
        let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        match md
            .topics()
            .first()
            .map(|t| (t.error(), t.partitions().len()))
        {
            Some((None, n)) if n > 0 => Ok(n as i32),
            _ => Err(KafkaError::MetadataFetch(
                rdkafka::types::RDKafkaErrorCode::UnknownTopic,
            )),
        }
    })
}

/// High watermark per partition.
pub fn end_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    (0..partition_count(&c, topic))
        .map(|p| {
            let hw = retry(&format!("watermarks of {topic}[{p}]"), || {
                c.fetch_watermarks(topic, p, Duration::from_secs(10))
            });
            (p, hw.1)
        })
        .collect()
}

/// The group's committed offsets on `topic` (absent partitions: nothing committed).
///
/// Read without `require_stable` (a read_uncommitted client does not ask for it): a
/// read_committed client would wait while a killed producer's transaction still holds
/// pending offsets, until that transaction is aborted.
pub fn committed(group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    let n = end_offsets(topic).len() as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition(topic, p);
    }
    let got = retry(&format!("committed offsets of {group}"), || {
        c.committed_offsets(tpl.clone(), Duration::from_secs(10))
    });
    got.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Sum of committed offsets: how many input offsets the group has consumed.
pub fn committed_total(group: &str, topic: &str) -> i64 {
    committed(group, topic).values().sum()
}

/// (partition, last stable offset, high watermark) of every partition of `topic`.
pub fn stability(topic: &str) -> Vec<(i32, i64, i64)> {
    let rc: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let ru: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    let n = end_offsets(topic).len() as i32;
    (0..n)
        .map(|p| {
            let t = Duration::from_secs(10);
            let lso = retry("last stable offset", || rc.fetch_watermarks(topic, p, t)).1;
            let hw = retry("high watermark", || ru.fetch_watermarks(topic, p, t)).1;
            (p, lso, hw)
        })
        .collect()
}

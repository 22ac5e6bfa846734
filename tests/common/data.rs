//! Test records in and out: inputs and the producers that write them, outputs read back the
//! way a downstream consumer reads them, and the outputs a test expects.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::broker::{bootstrap, partition_count, unique};
use super::checks::wait_stable;

/// Header names, as the product writes them.
#[allow(unused_imports)]
pub use exactly::headers::{
    ERROR_MESSAGE, ERROR_REASON, ERROR_TRUNCATED, LINEAGE, SOURCE_OFFSET, SOURCE_PARTITION,
    SOURCE_TOPIC, parse_lineage,
};

/// An input record to write.
pub struct In {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Names as bytes: producers outside Java write names that are not UTF-8.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// CreateTime in ms; `None`: the time of writing.
    pub timestamp: Option<i64>,
}

impl In {
    pub fn json(partition: i32, key: &str, value: serde_json::Value) -> In {
        In {
            partition,
            key: Some(key.as_bytes().to_vec()),
            value: Some(serde_json::to_vec(&value).unwrap()),
            headers: vec![],
            timestamp: None,
        }
    }

    pub fn raw(partition: i32, key: &str, value: &[u8]) -> In {
        In {
            partition,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.to_vec()),
            headers: vec![],
            timestamp: None,
        }
    }
}

/// An idempotent, non-transactional producer for test input.
pub struct Writer(ThreadedProducer<DefaultProducerContext>);

impl Writer {
    pub fn new() -> Writer {
        Writer(
            ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .set("enable.idempotence", "true")
                .set("linger.ms", "5")
                .create()
                .unwrap(),
        )
    }

    /// A transactional producer, initialised: test input with transaction markers, or with a
    /// transaction held open upstream.
    #[allow(dead_code)]
    pub fn transactional(transactional_id: &str) -> Writer {
        let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("transactional.id", transactional_id)
            // Long enough to hold a transaction open for a whole test.
            .set("transaction.timeout.ms", "300000")
            .set("linger.ms", "5")
            .create()
            .unwrap();
        p.init_transactions(Duration::from_secs(30)).unwrap();
        Writer(p)
    }

    /// The producer, for transaction calls.
    #[allow(dead_code)]
    pub fn producer(&self) -> &ThreadedProducer<DefaultProducerContext> {
        &self.0
    }

    /// Writes records and waits for every delivery.
    pub fn write(&self, topic: &str, records: &[In]) {
        for r in records {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = exactly::kafka::raw_headers::add(headers, k, Some(v));
            }
            let mut rec = BaseRecord::<[u8], [u8]>::to(topic)
                .partition(r.partition)
                .headers(headers);
            if let Some(k) = &r.key {
                rec = rec.key(k);
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v);
            }
            if let Some(ts) = r.timestamp {
                rec = rec.timestamp(ts);
            }
            loop {
                match self.0.send(rec) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(_), back)) => {
                        rec = back;
                        self.0.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => panic!("produce: {e}"),
                }
            }
        }
        self.0
            .flush(Duration::from_secs(120))
            .expect("flush test input");
    }
}

/// Writes records (idempotent producer, no transaction) and waits for every delivery.
pub fn produce(topic: &str, records: &[In]) {
    Writer::new().write(topic, records);
}

/// The jq program most tests run over [`numbered`] inputs, and what it makes of one.
pub const DOUBLE: &str = "{id, doubled: (.n * 2)}";

/// [`DOUBLE`]'s outputs for the input value `v`.
pub fn doubled(v: &serde_json::Value) -> Vec<serde_json::Value> {
    let n = v["n"].as_i64().expect("a numbered input");
    vec![serde_json::json!({"id": v["id"], "doubled": n * 2})]
}

/// JSON inputs `{"id": i, "n": i}` keyed `k<i>`, spread round-robin over `partitions`.
pub fn numbered(count: usize, partitions: i32) -> Vec<In> {
    (0..count)
        .map(|i| {
            In::json(
                i as i32 % partitions,
                &format!("k{i}"),
                serde_json::json!({"id": i, "n": i}),
            )
        })
        .collect()
}

/// A record read back.
#[derive(Clone, Debug)]
pub struct Out {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The record's timestamp in ms.
    pub timestamp: Option<i64>,
}

impl Out {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name.as_bytes())
            .and_then(|(_, v)| v.as_ref().map(|v| String::from_utf8_lossy(v).into_owned()))
    }

    /// (source topic, partition, offset, index) from the lineage header.
    pub fn lineage(&self) -> (String, i32, i64, usize) {
        let raw = self
            .header(LINEAGE)
            .unwrap_or_else(|| panic!("no lineage header: {self:?}"));
        parse_lineage(raw.as_bytes()).expect("lineage parses")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().expect("value")).expect("JSON value")
    }
}

/// Reads every record of `topic` from the beginning to its end as seen by `isolation`
/// (`read_committed` stops at the last stable offset).
pub fn read_all(topic: &str, isolation: &str) -> Vec<Out> {
    if isolation == "read_committed" {
        // A transaction left open by a killed process holds the last stable offset back until
        // the coordinator aborts it (transaction timeout): read the settled state.
        wait_stable(topic, Duration::from_secs(90));
    }
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let partitions = partition_count(&c, topic);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut at_end = vec![false; partitions as usize];
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while at_end.iter().any(|e| !e) {
        assert!(
            Instant::now() < deadline,
            "reading {topic} did not reach the end"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            Some(Ok(m)) => {
                at_end[m.partition() as usize] = false;
                let r = exactly::audit::read::copy(&m);
                out.push(Out {
                    partition: r.partition,
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    headers: r.headers,
                    timestamp: m.timestamp().to_millis(),
                });
            }
        }
    }
    out
}

/// Expected outputs of a per-record function of the input JSON value, keyed by lineage.
/// The input's (partition, offset) is found by reading the input topic back.
pub fn expected_outputs(
    input_topic: &str,
    f: impl Fn(&serde_json::Value) -> Vec<serde_json::Value>,
) -> HashMap<(String, i32, i64, usize), serde_json::Value> {
    let mut expected = HashMap::new();
    for r in read_all(input_topic, "read_committed") {
        let Ok(v) =
            serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap_or(b"null"))
        else {
            continue;
        };
        for (i, out) in f(&v).into_iter().enumerate() {
            expected.insert((input_topic.to_string(), r.partition, r.offset, i), out);
        }
    }
    expected
}

//! Helpers for the integration tests: the real broker, topics, test data, the `exactly`
//! process, and an exactly-once checker that reads outputs the way a downstream consumer does.
//!
//! Every test makes its own topics, group and transactional ids ([`unique`]), so tests run in
//! any order and in parallel against one broker.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// Header names, as the product writes them.
#[allow(unused_imports)]
pub use exactly::headers::{
    ERROR_MESSAGE, ERROR_REASON, ERROR_TRUNCATED, LINEAGE, SOURCE_OFFSET, SOURCE_PARTITION,
    SOURCE_TOPIC, parse_lineage,
};

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
                NewTopic::new(t, *p, TopicReplication::Fixed(1)),
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
                let r = exactly::audit::Rec::from_message(&m);
                out.push(Out {
                    partition: r.partition,
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    headers: r.headers,
                });
            }
        }
    }
    out
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

fn partition_count(c: &BaseConsumer, topic: &str) -> i32 {
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

/// Waits until the group's committed offsets have reached the input's end on every partition
/// (at or past it: a test that must see exactly the end asserts that itself).
pub fn wait_all_committed(group: &str, topic: &str, timeout: Duration) {
    let end = end_offsets(topic);
    let deadline = Instant::now() + timeout;
    loop {
        let c = committed(group, topic);
        if end.iter().all(|(p, e)| c.get(p).is_some_and(|o| o >= e)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed {c:?}, input ends at {end:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until the group has committed at least `n` input offsets; returns how many.
pub fn wait_committed_at_least(group: &str, topic: &str, n: i64, timeout: Duration) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let c = committed_total(group, topic);
        if c >= n {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed only {c} of {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks a read_committed output against the expected outputs, keyed by lineage:
/// every expected output exactly once, nothing else, and per source partition in order on
/// each output partition. Returns the number of records checked.
pub fn assert_exactly_once(
    outputs: &[Out],
    expected: &HashMap<(String, i32, i64, usize), serde_json::Value>,
) -> usize {
    let mut seen: HashMap<(String, i32, i64, usize), usize> = HashMap::new();
    for o in outputs {
        *seen.entry(o.lineage()).or_default() += 1;
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        duplicates.is_empty(),
        "duplicated outputs (lineage, count): {duplicates:?}"
    );
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !seen.contains_key(*k))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "lost outputs (first 5): {missing:?}");
    let unexpected: Vec<_> = seen
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected outputs (first 5): {unexpected:?}"
    );
    for o in outputs {
        let want = &expected[&o.lineage()];
        assert_eq!(&o.json(), want, "wrong value for {:?}", o.lineage());
    }
    // Order: on each output partition, the outputs of one source partition keep its order.
    let mut last: HashMap<(i32, String, i32), (i64, usize)> = HashMap::new();
    let mut sorted: Vec<&Out> = outputs.iter().collect();
    sorted.sort_by_key(|o| (o.partition, o.offset));
    for o in sorted {
        let (t, p, off, idx) = o.lineage();
        if let Some(prev) = last.insert((o.partition, t.clone(), p), (off, idx)) {
            assert!(
                prev < (off, idx),
                "order broken on output partition {}: {prev:?} then {:?}",
                o.partition,
                (off, idx)
            );
        }
    }
    assert_eq!(outputs.len(), expected.len());
    outputs.len()
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

/// A running `exactly` process. Killed (SIGKILL) when dropped.
pub struct Exactly {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub name: String,
}

/// Settings every test run uses: its broker, quick group membership.
pub fn base_args(topics: &Topics, group: &str, instance: &str) -> Vec<String> {
    [
        "run",
        "--bootstrap-servers",
        &bootstrap(),
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--group-id",
        group,
        "--instance-id",
        instance,
        "--log-format",
        "json",
        "--consumer-config",
        "session.timeout.ms=6000",
        "--consumer-config",
        "heartbeat.interval.ms=500",
        "--http-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Exactly {
    pub fn start(args: &[String]) -> Exactly {
        Self::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[String], env: &[(&str, &str)]) -> Exactly {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_exactly"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn exactly");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let name = args
            .iter()
            .position(|a| a == "--instance-id")
            .map(|i| args[i + 1].clone())
            .unwrap_or_default();
        let tag = name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("EXACTLY_TEST_ECHO").is_some() {
                    eprintln!("[{tag}] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Exactly { child, log, name }
    }

    /// The process has exited (a zombie waiting to be reaped counts). Linux only: reads /proc,
    /// because `try_wait` needs `&mut` and the callers only hold `&`.
    pub fn has_exited(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.child.wait().unwrap();
    }

    /// Waits for exit; panics after `timeout`.
    /// SIGTERM, then exit 0 within 15 s (the log in the panic otherwise).
    #[allow(dead_code)]
    pub fn stop_cleanly(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait(Duration::from_secs(15));
        assert_eq!(status.code(), Some(0), "{}", self.log_text());
    }

    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the log reader drain the pipe.
                std::thread::sleep(Duration::from_millis(100));
                return s;
            }
            if Instant::now() >= deadline {
                panic!(
                    "exactly did not exit within {timeout:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn log_text(&self) -> String {
        self.log_lines().join("\n")
    }

    /// JSON log events whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<serde_json::Value> {
        self.log_lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }

    /// The partitions this instance owns after its latest rebalance, as logged.
    pub fn owned(&self) -> Option<String> {
        self.events("assignment now")
            .last()
            .map(|e| e["owned"].as_str().unwrap_or("").to_string())
    }

    /// Waits until `pred` holds for this process's log.
    pub fn wait_log(&self, what: &str, timeout: Duration, pred: impl Fn(&Exactly) -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred(self) {
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exactly {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Number of partitions in a logged assignment like `topic[0,1,2]`.
pub fn count_partitions(owned: &str) -> usize {
    owned
        .split_whitespace()
        .filter_map(|t| t.split_once('['))
        .map(|(_, ps)| {
            ps.trim_end_matches(']')
                .split(',')
                .filter(|p| !p.is_empty())
                .count()
        })
        .sum()
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

/// Waits until no transaction is open on any partition of `topic` (LSO == high watermark).
pub fn wait_stable(topic: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stability(topic);
        if s.iter().all(|(_, lso, hw)| lso == hw) {
            return;
        }
        assert!(Instant::now() < deadline, "{topic} never settled: {s:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `exactly audit --json` and returns (exit code, report).
pub fn audit_json(args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .arg("audit")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "audit printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// Partition numbers in a logged assignment like `topic[0,1,2]`.
pub fn partitions_of(owned: &str) -> Vec<i32> {
    owned
        .split_whitespace()
        .filter_map(|t| t.split_once('['))
        .flat_map(|(_, ps)| {
            ps.trim_end_matches(']')
                .split(',')
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every metric family exactly exports.
#[allow(dead_code)]
pub const METRIC_FAMILIES: &[&str] = &[
    "exactly_records_consumed_total",
    "exactly_records_produced_total",
    "exactly_records_filtered_total",
    "exactly_records_dlq_total",
    "exactly_transactions_total",
    "exactly_transaction_aborts_total",
    "exactly_transaction_commit_duration_seconds",
    "exactly_transaction_records",
    "exactly_open_transaction_age_seconds",
    "exactly_last_commit_timestamp_seconds",
    "exactly_consumer_lag_records",
    "exactly_partition_unstable_records",
    "exactly_partition_last_stable_offset",
    "exactly_end_to_end_latency_seconds",
    "exactly_rebalances_total",
    "exactly_assigned_partitions",
    "exactly_producer_recreations_total",
    "exactly_ready",
    "exactly_build_info",
];

/// A checker that scripts/tools.sh installs (scripts/test.sh puts it on the PATH).
#[allow(dead_code)]
pub fn tool(name: &str) -> Command {
    let probe = Command::new(name).arg("--version").output();
    assert!(
        probe.is_ok(),
        "{name} not found: run the tests through scripts/test.sh, which installs it"
    );
    Command::new(name)
}

/// The address of a running exactly's HTTP endpoints (started with --http-addr 127.0.0.1:0).
#[allow(dead_code)]
pub fn http_addr(ex: &Exactly) -> String {
    let listening = "HTTP endpoints listening (/metrics /livez /readyz)";
    ex.wait_log("the HTTP endpoints", Duration::from_secs(30), |e| {
        !e.events(listening).is_empty()
    });
    ex.events(listening)[0]["addr"]
        .as_str()
        .unwrap()
        .to_string()
}

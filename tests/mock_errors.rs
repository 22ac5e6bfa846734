//! Error paths on librdkafka's mock cluster: errors injected into the transactional requests
//! (InitProducerId, AddPartitionsToTxn, TxnOffsetCommit, EndTxn, Produce) and a coordinator
//! slower than the transaction timeout. The mock cannot show what a read_committed consumer
//! sees (the real-broker tests do that), so only behaviour is asserted: each error class does
//! what `src/error.rs` says — retry and commit, abort and rewind, recreate the producer, never
//! retry a commit whose outcome is unknown — and every input offset ends up committed.

mod common;

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::mocking::{MockCluster, MockCoordinator};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use rdkafka::types::{RDKafkaApiKey as Api, RDKafkaRespErr as Err};

use common::{Exactly, get, http_addr, metric};
use nix::sys::signal::Signal;

/// Collects delivery failures of the test's input writer.
#[derive(Default)]
struct Deliveries(std::sync::Mutex<Vec<String>>);

impl rdkafka::ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &rdkafka::producer::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = r {
            self.0.lock().unwrap().push(e.to_string());
        }
    }
}

struct Mock {
    cluster: MockCluster<'static, DefaultProducerContext>,
    owner: &'static BaseProducer,
    group: String,
    written: i64,
}

const IN: &str = "in";
const OUT: &str = "out";

impl Mock {
    fn new() -> Mock {
        Mock::with_brokers(1)
    }

    /// `n` brokers; every partition led by broker 1.
    fn with_brokers(n: u32) -> Mock {
        // A client with `test.mock.num.brokers` owns the cluster; leaked so the cluster can
        // borrow it for the whole test, and so its raw handle is at hand for the one mock call
        // rdkafka does not wrap (see `delay_next`).
        let owner: &'static BaseProducer = Box::leak(Box::new(
            ClientConfig::new()
                .set("test.mock.num.brokers", n.to_string())
                .create()
                .unwrap(),
        ));
        let cluster = owner.client().mock_cluster().unwrap();
        for t in [IN, OUT, "out.dlq"] {
            cluster.create_topic(t, 2, 1).unwrap();
            for p in 0..2 {
                cluster.partition_leader(t, p, Some(1)).unwrap();
            }
        }
        Mock {
            cluster,
            owner,
            group: common::unique("mock-g"),
            written: 0,
        }
    }

    /// Delays the next `api` request to broker 1 by `rtt` (and answers it without error).
    fn delay_next(&self, api: Api, rtt: Duration) {
        let err = rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
        let rtt_ms = rtt.as_millis() as std::os::raw::c_int;
        // SAFETY: the handle belongs to `owner`, alive for the whole process (leaked); the
        // variadic tail is `cnt` pairs of (error code, rtt in ms), as librdkafka documents.
        let result = unsafe {
            let cluster =
                rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
            rdkafka_sys::rd_kafka_mock_broker_push_request_error_rtts(
                cluster, 1, api as i16, 1, err, rtt_ms,
            )
        };
        assert_eq!(result, err);
    }

    fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Writes `n` input records and checks that they arrived (delivery reports are not
    /// checked by flush).
    fn write(&mut self, n: i64) {
        let p: ThreadedProducer<Deliveries> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create_with_context(Deliveries::default())
            .unwrap();
        for i in self.written..self.written + n {
            let v = format!(r#"{{"n":{i}}}"#);
            p.send(
                BaseRecord::<str, str>::to(IN)
                    .partition((i % 2) as i32)
                    .key("k")
                    .payload(&v),
            )
            .unwrap();
        }
        p.flush(Duration::from_secs(30)).unwrap();
        let failed = p.context().0.lock().unwrap().clone();
        assert!(failed.is_empty(), "test input not delivered: {failed:?}");
        self.written += n;
        let ends: i64 = (0..2)
            .map(|part| {
                p.client()
                    .fetch_watermarks(IN, part, Duration::from_secs(10))
                    .unwrap()
                    .1
            })
            .sum();
        assert_eq!(ends, self.written, "the mock did not take the test input");
    }

    fn start(&self, extra: &[&str]) -> Exactly {
        let b = self.bootstrap();
        let mut args: Vec<String> = [
            "run",
            "--bootstrap-servers",
            &b,
            "--input-topics",
            IN,
            "--output-topic",
            OUT,
            "--group-id",
            &self.group,
            "--instance-id",
            "mock-0",
            "--log-format",
            "json",
            "--jq",
            "{m: .n}",
            "--max-records-per-txn",
            "10",
            "--http-addr",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        // exactly's commit events are debug level; EXACTLY_MOCK_DEBUG=eos,msg adds librdkafka's.
        let debug = std::env::var("EXACTLY_MOCK_DEBUG").ok();
        let level = if debug.is_some() {
            "debug"
        } else {
            "debug,librdkafka=info"
        };
        args.extend(["--log-level".to_string(), level.to_string()]);
        if let Some(d) = debug {
            args.extend(["--producer-config".into(), format!("debug={d}")]);
        }
        Exactly::start(&args)
    }

    /// Waits until exactly's committed transactions hold every written record. The mock
    /// accepts TxnOffsetCommit but does not expose the offsets to OffsetFetch, so the count
    /// comes from exactly's own "transaction committed" events (debug level): each input
    /// record is in exactly one committed transaction, whatever was aborted on the way.
    fn wait_all_committed(&self, ex: &Exactly, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let committed = committed_records(ex);
            assert!(
                committed <= self.written,
                "{committed} > {}: a record committed twice",
                self.written
            );
            if committed == self.written {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "committed {committed} of {}; log:\n{}",
                self.written,
                ex.log_text()
            );
            assert!(!ex.has_exited(), "exactly exited; log:\n{}", ex.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn committed_records(ex: &Exactly) -> i64 {
    ex.log_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "transaction committed")
        .filter_map(|v| v["records"].as_i64())
        .sum()
}

/// Messages of the JSON log events, in order.
fn messages(ex: &Exactly) -> Vec<String> {
    ex.log_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["message"].as_str().map(String::from))
        .collect()
}

fn count(ex: &Exactly, message: &str) -> usize {
    messages(ex)
        .iter()
        .filter(|m| m.starts_with(message))
        .count()
}

#[test]
fn retriable_coordinator_errors_are_retried_and_commits_succeed() {
    let mut m = Mock::new();
    let retriable = [
        Err::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        Err::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        Err::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
    ];
    // At start-up.
    m.cluster.request_errors(Api::InitProducerId, &retriable);
    m.write(20);
    let ex = m.start(&[]);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    // In the middle of the stream, on every transactional request.
    for api in [
        Api::AddPartitionsToTxn,
        Api::AddOffsetsToTxn,
        Api::TxnOffsetCommit,
        Api::EndTxn,
    ] {
        m.cluster.request_errors(api, &retriable);
        m.write(20);
        m.wait_all_committed(&ex, Duration::from_secs(60));
    }
    assert_eq!(count(&ex, "transaction aborted"), 0, "{}", ex.log_text());
    assert_eq!(count(&ex, "producer recreated"), 0, "{}", ex.log_text());
}

#[test]
fn unknown_producer_id_on_produce_aborts_and_rewinds() {
    let mut m = Mock::new();
    m.write(10);
    let ex = m.start(&["--transaction-timeout", "10s"]);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    // The mock's error stack is shared by every client: pause exactly while the test's own
    // producer writes, so that the injected error meets exactly's next Produce.
    ex.signal(Signal::SIGSTOP);
    m.write(20);
    m.cluster
        .request_errors(Api::Produce, &[Err::RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID]);
    ex.signal(Signal::SIGCONT);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    let log = messages(&ex);
    let abort = log.iter().position(|m| m == "transaction aborted");
    assert!(abort.is_some(), "no abort: {log:#?}");
    assert!(
        log[abort.unwrap()..]
            .iter()
            .any(|m| m == "rewound to the committed offsets"),
        "{log:#?}"
    );
}

#[test]
fn a_fenced_producer_is_recreated() {
    let mut m = Mock::new();
    m.write(10);
    let ex = m.start(&[]);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    m.cluster
        .request_errors(Api::EndTxn, &[Err::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
    m.write(20);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    assert!(count(&ex, "producer recreated") >= 1, "{}", ex.log_text());
    assert!(
        count(&ex, "rewound to the committed offsets") >= 1,
        "{}",
        ex.log_text()
    );
    // Also on AddPartitionsToTxn, with the older epoch error.
    m.cluster.request_errors(
        Api::AddPartitionsToTxn,
        &[Err::RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH],
    );
    m.write(20);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    assert!(
        count(&ex, "producer recreated") + count(&ex, "transaction aborted") >= 2,
        "{}",
        ex.log_text()
    );
}

#[test]
fn a_commit_slower_than_its_timeout_is_never_retried_blindly() {
    let mut m = Mock::new();
    m.write(10);
    // The shortest allowed transaction timeout bounds each transactional call.
    let ex = m.start(&["--transaction-timeout", "6s"]);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    // The next EndTxn takes longer than the call timeout: the commit may or may not happen.
    // exactly pauses while the test's own producer writes.
    ex.signal(Signal::SIGSTOP);
    m.write(10);
    m.delay_next(Api::EndTxn, Duration::from_secs(8));
    ex.signal(Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&ex, "commit outcome unknown") == 0 {
        assert!(Instant::now() < deadline, "{}", ex.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // It goes on: later records are committed.
    let before = committed_records(&ex);
    m.write(10);
    let deadline = Instant::now() + Duration::from_secs(120);
    while committed_records(&ex) < before + 10 {
        assert!(Instant::now() < deadline, "{}", ex.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = messages(&ex);
    let unknown = log
        .iter()
        .position(|m| m.starts_with("commit outcome unknown"))
        .unwrap();
    // Not retried: what follows is an abort or a new producer, then a rewind.
    let after = &log[unknown..];
    assert!(
        !after.iter().any(|m| m == "commit_transaction: retrying"),
        "{log:#?}"
    );
    assert!(
        after
            .iter()
            .any(|m| m == "producer recreated" || m == "transaction aborted"),
        "{log:#?}"
    );
    assert!(
        after
            .iter()
            .any(|m| m == "rewound to the committed offsets"),
        "{log:#?}"
    );
    // The EndTxn may still land: no transaction runs on that producer's epoch any more.
    let recreated = after.iter().position(|m| m == "producer recreated");
    let next_commit = after.iter().position(|m| m == "transaction committed");
    assert!(
        recreated.is_some_and(|r| next_commit.is_none_or(|c| r < c)),
        "{log:#?}"
    );
}

#[test]
fn a_timed_out_produce_request_means_a_new_producer_before_the_next_transaction() {
    let mut m = Mock::new();
    m.write(10);
    let ex = m.start(&[
        "--transaction-timeout",
        "10s",
        "--producer-config",
        "socket.timeout.ms=1500",
    ]);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    ex.signal(Signal::SIGSTOP);
    m.write(10);
    // exactly's next produce request is answered after its request timeout.
    m.delay_next(Api::Produce, Duration::from_secs(4));
    ex.signal(Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&ex, "librdkafka: REQTMOUT") == 0 {
        assert!(Instant::now() < deadline, "{}", ex.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The next transaction, when records come.
    m.write(10);
    while !ex
        .events("producer recreated")
        .iter()
        .any(|e| e["reason"] == "request_timed_out")
    {
        assert!(Instant::now() < deadline, "{}", ex.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    m.wait_all_committed(&ex, Duration::from_secs(60));
    let log = messages(&ex);
    let timed_out = log
        .iter()
        .position(|m| m.contains("REQTMOUT") && m.contains("ProduceRequest"))
        .expect("librdkafka's request timeout");
    let recreated = timed_out
        + log[timed_out..]
            .iter()
            .position(|m| m == "producer recreated")
            .unwrap();
    // At most the transaction the request was of ends on that producer; none begins.
    let ended = log[timed_out..recreated]
        .iter()
        .filter(|m| *m == "transaction committed" || *m == "transaction aborted")
        .count();
    assert!(ended <= 1, "{log:#?}");
}

/// A group coordinator that is gone for good when the transaction commits its offsets: the
/// coordinator of the group on broker 2, down (and seen down by exactly) before the records
/// come. librdkafka's `send_offsets_to_transaction` waits for it past its timeout (#5456: the
/// coordinator request's timeout is never checked), so exactly leaves with exit code 4 once the
/// call is past `--stuck-call-timeout` (12 s here; by default the transaction timeout + 30 s);
/// a restart fences the stuck producer. While it waits, the log says on what and
/// `exactly_kafka_call_waiting_seconds` for how long. Watched failing with the bound at
/// 3,000 s: the call was still inside librdkafka 120 s later.
///
/// The broker goes down before the records are written, and the test waits for exactly's
/// client to see it: an earlier version stopped exactly with SIGSTOP around the broker's fall,
/// and on a loaded machine librdkafka sometimes wrote the offsets' request on the old
/// connection before it read the close. That request timed out in 6 s, as it should, and no
/// call was stuck, so the test waited for an exit that was never due.
#[test]
fn a_call_that_never_returns_ends_the_process_and_a_restart_resumes() {
    let mut m = Mock::with_brokers(2);
    m.cluster
        .coordinator(MockCoordinator::Group(m.group.clone()), 2)
        .unwrap();
    // The transactions' coordinator stays up (with it down too, no call is stuck: exactly
    // waits for it between calls, reconnecting).
    let transactional_id = format!("{}-mock-0", m.group);
    m.cluster
        .coordinator(MockCoordinator::Transaction(transactional_id), 1)
        .unwrap();
    m.write(10);
    let bound = ["--transaction-timeout", "6s", "--stuck-call-timeout", "12s"];
    let mut ex = m.start(&bound);
    m.wait_all_committed(&ex, Duration::from_secs(60));
    let addr = http_addr(&ex);
    m.cluster.broker_down(2).unwrap();
    // Idle, exactly's group coordinator connection sees the broker go, and so do both clients'
    // connections to broker 2. (The session timeout, 45 s, keeps the assignment meanwhile;
    // the inputs' leaders are on broker 1.) A TxnOffsetCommit sent on a connection not yet
    // seen closed is in flight, and librdkafka times that out (socket.timeout.ms): only one
    // waiting for the coordinator to come back never returns (librdkafka#5456). CI saw the
    // first once.
    let deadline = Instant::now() + Duration::from_secs(30);
    let down = |m: &String| m.contains("Disconnected") || m.contains("Connection refused");
    let mut coordinator_down: Option<Instant> = None;
    loop {
        let log = messages(&ex);
        if log
            .iter()
            .any(|m| m.contains("GroupCoordinator") && down(m))
        {
            coordinator_down.get_or_insert_with(Instant::now);
        }
        let broker = (log.iter())
            .filter(|m| m.contains("/2: ") && !m.contains("GroupCoordinator") && down(m))
            .count();
        // Both broker connections logged closed, or 10 s after the coordinator's (not every
        // close is logged).
        if coordinator_down.is_some_and(|at| broker >= 2 || at.elapsed() > Duration::from_secs(10))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{}", ex.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    m.write(10);
    let t0 = Instant::now();
    // While it waits: the gauge counts the seconds inside the call, the log says on what.
    let waiting = "waiting on the transaction coordinator, then the group coordinator in \
                   send_offsets_to_transaction";
    let mut seen = 0.0f64;
    while !ex.has_exited() && t0.elapsed() < Duration::from_secs(60) {
        if let Some((200, text)) = get(&addr, "/metrics") {
            seen = seen.max(metric(&text, "exactly_kafka_call_waiting_seconds", &[]));
            assert_eq!(
                metric(&text, "exactly_stuck_call_timeout_seconds", &[]),
                12.0
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let status = ex.wait(Duration::from_secs(120));
    let waited = t0.elapsed();
    eprintln!("left after {waited:?}; the gauge showed up to {seen}s inside the call");
    assert_eq!(status.code(), Some(4), "{}", ex.log_text());
    let log = messages(&ex);
    assert!(
        log.iter().any(|m| m.contains(waiting)),
        "no '{waiting}' line: {log:#?}"
    );
    assert!(
        log.iter()
            .any(|m| m.contains("stuck in send_offsets_to_transaction")
                && m.contains("past --stuck-call-timeout 12s")),
        "{log:#?}"
    );
    assert!(seen >= 5.0, "the waiting gauge showed at most {seen}s");
    // The operator's bound (12 s, checked every second), not the default (6 s + 30 s).
    assert!(
        waited >= Duration::from_secs(12) && waited < Duration::from_secs(20),
        "left after {waited:?}"
    );
    // The restart, once the coordinator is back, fences the stuck producer and commits. (The
    // mock does not serve committed offsets back, so the restart reads from the start: what
    // is committed once is the cluster scenarios' to show, tests/faults.rs.)
    m.cluster.broker_up(2).unwrap();
    let again = m.start(&["--transaction-timeout", "6s"]);
    m.wait_all_committed(&again, Duration::from_secs(90));
}

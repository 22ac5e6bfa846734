//! The librdkafka producer both Kafka sinks send through: delivery reports, the rejections
//! among them, a send that waits while the local queue is full, and the flush.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use tracing::{debug, error, info, warn};

use crate::events::AbortReason;
use crate::kafka::failure::{Action, Facts, KafkaCall, classify, refused_route, rejected_record};
use crate::kafka::{Client, NotCreated, Refusal};
use crate::sink::{Bounds, Failed, Feedback, NotConnected, Record, Rejection, Wait};

/// A Kafka sink's producer: its settings, and the producer once connected.
pub struct Connection {
    client: Client,
    /// The topic whose metadata shows the cluster answers (the output topic, which the sink
    /// writes to anyway).
    probe: String,
    producer: Option<TrackedProducer>,
    /// Why the cluster refused the last producer before it answered, if it did.
    refused: Option<String>,
}

impl Connection {
    /// Not connected yet.
    pub fn new(client: Client, probe: &str) -> Connection {
        Connection {
            client,
            probe: probe.to_string(),
            producer: None,
            refused: None,
        }
    }

    /// The producer's message.max.bytes (librdkafka's default unless set): the largest record
    /// it takes.
    pub fn max_record_bytes(&self) -> usize {
        (self.client.get("message.max.bytes"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000)
    }

    /// A new producer, which replaces the old one once the cluster accepted it and `init`
    /// (`context`) succeeded; the old one stays if anything fails. Waits up to `timeout` for
    /// the cluster, and gives up at once if it refuses the producer.
    pub fn connect(
        &mut self,
        timeout: Duration,
        context: &str,
        init: impl FnOnce(&TrackedProducer) -> Result<(), KafkaError>,
    ) -> Result<(), NotConnected> {
        self.refused = None;
        let refusal = Arc::new(Refusal::default());
        // At start-up a client librdkafka refuses is a bad option; later the same settings
        // were taken before, and a file they name may be mid-rotation: retry.
        let producer = TrackedProducer::create(&self.client, refusal.clone()).map_err(|e| {
            if self.producer.is_none() {
                NotConnected::Exit(e.into())
            } else {
                NotConnected::Retry(e.to_string())
            }
        })?;
        if let Err(e) = producer.reach_cluster(&self.probe, timeout, &refusal) {
            self.refused = refusal.get();
            return Err(self.not_connected("reaching the cluster", e));
        }
        init(&producer).map_err(|e| self.not_connected(context, e))?;
        self.producer = Some(producer);
        Ok(())
    }

    /// What a failed [`Connection::connect`] means, doing `context`: a refusal (the cluster
    /// refused the producer before it ever answered: a wrong password, an untrusted
    /// certificate), an error no retry fixes, or one to retry.
    fn not_connected(&self, context: &str, e: KafkaError) -> NotConnected {
        if let Some(reason) = &self.refused {
            return NotConnected::Refused(reason.clone());
        }
        if classify(KafkaCall::Init, &Facts::of(&e)) == Action::Exit {
            return NotConnected::Exit(crate::error::Error::kafka(context, e));
        }
        NotConnected::Retry(format!("{context}: {e}"))
    }

    /// The producer.
    pub fn producer(&self) -> &TrackedProducer {
        self.producer
            .as_ref()
            .expect("the driver connects the sink before it uses it")
    }
}

/// A producer whose delivery reports are counted and whose rejections are kept; it sends
/// through topic handles ([`crate::kafka::produce`]).
pub struct TrackedProducer(crate::kafka::produce::HandleProducer<DeliveryContext>);

/// Producer callbacks. In a transaction a failed delivery also makes the commit fail with an
/// abortable error; without one (at-least-once) the sink counts failures itself and does not
/// commit offsets past a batch that had any. Deliveries the broker rejected for what the record
/// is are kept by their opaque, the record's index in the driver's `SentLog`.
pub struct DeliveryContext {
    /// Where the client's refusals go.
    refusal: Arc<Refusal>,
    /// librdkafka's line about a transaction that failed for want of a permission.
    denial: Mutex<Option<String>>,
    /// Records sent and not yet reported.
    pending: AtomicU64,
    /// Failed deliveries since the batch began.
    failed: AtomicU64,
    /// Each delivery rejected for the record's own fault.
    rejections: Mutex<Vec<Rejection>>,
    /// A request of this producer's transactions timed out (see `Failed::Renew`).
    stale: AtomicBool,
    /// Destinations that refused records for what they are (a [`Feedback`]'s `routes`).
    routes: Mutex<Vec<(String, &'static str)>>,
    /// Keep the topics deliveries reach (`Sink::begin`'s `watch`).
    watching: AtomicBool,
    /// The topics deliveries reached while watching.
    accepted: Mutex<Vec<String>>,
}

impl ClientContext for DeliveryContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.refusal.note(&error, reason);
        // As rust-rdkafka's default callback logs it, under its target.
        error!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
    }

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if crate::kafka::denied(facility, message) {
            *self.denial.lock().unwrap_or_else(|p| p.into_inner()) = Some(message.to_string());
        }
        if crate::kafka::timed_out_txn_request(facility, message) {
            self.stale.store(true, Ordering::SeqCst);
        }
        if let Some(topic) = crate::kafka::denied_partition(facility, message) {
            let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
            routes.push((topic.to_string(), crate::kafka::failure::TOPIC_DENIED));
        }
        // As rust-rdkafka's default callback logs them, under its target.
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                error!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Warning => {
                warn!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Debug => {
                debug!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        if let (Ok(message), true) = (result, self.watching.load(Ordering::Relaxed)) {
            let mut accepted = self.accepted.lock().unwrap_or_else(|p| p.into_inner());
            if !accepted.iter().any(|t| t == message.topic()) {
                accepted.push(message.topic().to_string());
            }
        }
        if let Err((e, message)) = result {
            debug!(error = %e, "delivery failed; the batch will not commit");
            self.failed.fetch_add(1, Ordering::SeqCst);
            let code = e.rdkafka_error_code();
            if code.is_some_and(timed_out) {
                self.stale.store(true, Ordering::SeqCst);
            }
            if let Some(error) = code.and_then(refused_route) {
                let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
                routes.push((message.topic().to_string(), error));
            }
            if let Some(error) = code.and_then(rejected_record) {
                let named = code == Some(RDKafkaErrorCode::InvalidRecord);
                self.rejections
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Rejection {
                        index,
                        error,
                        named,
                        alone: false,
                    });
            }
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TrackedProducer {
    /// A producer of `client` (not yet transactional: see `init_transactions`).
    pub fn create(client: &Client, refusal: Arc<Refusal>) -> Result<TrackedProducer, NotCreated> {
        let context = DeliveryContext {
            refusal,
            denial: Mutex::default(),
            pending: AtomicU64::default(),
            failed: AtomicU64::default(),
            rejections: Mutex::default(),
            stale: AtomicBool::new(false),
            routes: Mutex::default(),
            watching: AtomicBool::new(false),
            accepted: Mutex::default(),
        };
        let inner: ThreadedProducer<DeliveryContext> = client.create_with_context(context)?;
        Ok(TrackedProducer(crate::kafka::produce::HandleProducer::new(
            inner,
        )))
    }

    /// Waits until the cluster answers (a metadata request), up to `timeout`; returns at once
    /// when it refuses this client, instead of waiting out the timeout while librdkafka
    /// reconnects (the caller asks [`Connection::not_connected`] why).
    fn reach_cluster(
        &self,
        probe: &str,
        timeout: Duration,
        refusal: &Refusal,
    ) -> Result<(), KafkaError> {
        let deadline = Instant::now() + timeout;
        loop {
            if refusal.get().is_some() {
                return Err(KafkaError::Global(RDKafkaErrorCode::Authentication));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // A metadata answer means connected and authenticated, even one that says the
            // topic may not be described.
            match self
                .inner()
                .client()
                .fetch_metadata(Some(probe), left.min(Duration::from_millis(500)))
            {
                Ok(_) => return Ok(()),
                Err(e) if left.is_zero() => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// The rust-rdkafka producer, for its transactional calls.
    pub fn inner(&self) -> &ThreadedProducer<DeliveryContext> {
        self.0.inner()
    }

    /// A new batch: failures of earlier ones are settled, and reports of an earlier
    /// transaction that came after it was settled name nothing here.
    pub fn reset(&self) {
        self.take_rejections(Duration::ZERO);
        self.inner().context().failed.store(0, Ordering::SeqCst);
    }

    /// Failed deliveries since the batch began.
    pub fn failed(&self) -> u64 {
        self.inner().context().failed.load(Ordering::SeqCst)
    }

    /// Sends one record, waiting while the local queue is full.
    pub fn send(&self, r: Record<'_, '_>, bounds: &Bounds) -> Result<(), Failed> {
        // A dead letter is a record like any other on a topic: its headers say what it is.
        let Record {
            topic,
            out,
            timestamp,
            index,
            kind: _,
        } = r;
        let count = out.headers.len() + 1;
        let mut headers = crate::kafka::raw_headers::owned(count, out.headers_with_lineage());
        let mut refreshed = false;
        loop {
            let record = crate::kafka::produce::Message {
                topic,
                partition: out.partition,
                key: out.key.as_deref(),
                value: out.value.as_deref(),
                timestamp,
                headers,
                opaque: index,
            };
            match self.0.send(record) {
                Ok(()) => {
                    self.inner()
                        .context()
                        .pending
                        .fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                Err((RDKafkaErrorCode::QueueFull, back)) => {
                    headers = back;
                    bounds.health.beat();
                    self.inner().poll(Duration::from_millis(10));
                }
                // librdkafka's own check: the record's fault, like a broker's rejection.
                Err((RDKafkaErrorCode::MessageSizeTooLarge, _)) => {
                    return Err(Failed::TooLarge);
                }
                // A partition named beyond what this producer knows: the topic may have grown
                // since (a changelog grown with the input). Its metadata is read once again.
                Err((RDKafkaErrorCode::UnknownPartition, back)) if !refreshed => {
                    headers = back;
                    refreshed = true;
                    let _ = self.topic_exists(topic, bounds.timeout().min(Duration::from_secs(5)));
                }
                Err((code, _)) => {
                    if let Some(error) = refused_route(code) {
                        let topic = topic.to_string();
                        return Err(Failed::Unroutable { topic, error });
                    }
                    let e = KafkaError::MessageProduction(code);
                    return Err(match classify(KafkaCall::Produce, &Facts::of(&e)) {
                        Action::Exit => Failed::exit("producing", e),
                        Action::RecreateProducer => {
                            warn!(error = %e, "produce failed; recreating the producer");
                            Failed::Recreate(AbortReason::ProduceFenced)
                        }
                        _ => {
                            warn!(error = %e, "produce failed; aborting the transaction");
                            Failed::Abort(AbortReason::ProduceFailed)
                        }
                    });
                }
            }
        }
    }

    /// librdkafka's flush (see [`crate::kafka::flush`]).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        crate::kafka::flush(self.inner(), timeout)
    }

    /// Flushes, then waits for the delivery callbacks of everything sent (they run on the
    /// producer's thread, after librdkafka is done with a record). Whether all came.
    pub fn settle(&self, bounds: &Bounds) -> bool {
        let _g = bounds.health.in_call("flush");
        if let Err(e) = self.flush(bounds.timeout()) {
            debug!(error = %e, "flush around a record sent alone");
        }
        self.wait_for_reports(bounds.timeout())
    }

    /// Waits up to `bound` for the delivery callbacks of everything sent. Whether all came.
    pub fn wait_for_reports(&self, bound: Duration) -> bool {
        let ctx = self.inner().context();
        let until = Instant::now() + bound;
        while ctx.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        ctx.pending.load(Ordering::SeqCst) == 0
    }

    /// Waits up to `wait` for outstanding reports, then takes every rejection so far.
    pub fn take_rejections(&self, wait: Duration) -> Vec<Rejection> {
        self.wait_for_reports(wait);
        let ctx = self.inner().context();
        std::mem::take(&mut *ctx.rejections.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request of this producer's transactions timed out (see `Failed::Renew`).
    pub fn stale(&self) -> bool {
        self.inner().context().stale.load(Ordering::SeqCst)
    }

    /// A transactional call of this producer timed out.
    pub fn timed_out(&self) {
        self.inner().context().stale.store(true, Ordering::SeqCst);
    }

    /// Keeps the topics deliveries reach from now on (`on`), forgetting those kept so far (see
    /// `Sink::watch_routes`).
    pub fn watch_routes(&self, on: bool) {
        let ctx = self.inner().context();
        ctx.watching.store(on, Ordering::Relaxed);
        ctx.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The topics deliveries reached since the last take, while watching.
    pub fn take_accepted_routes(&self) -> Vec<String> {
        let ctx = self.inner().context();
        std::mem::take(&mut *ctx.accepted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Why a transaction of this producer failed for want of a permission since the last take,
    /// if one did, waiting up to `wait` for librdkafka's line: rust-rdkafka forwards the log
    /// to the main queue, which the producer's thread serves, so a call can return the error
    /// before the lines that explain it are heard.
    pub fn take_denied(&self, wait: Duration) -> Option<String> {
        let ctx = self.inner().context();
        let until = Instant::now() + wait;
        loop {
            let denial = ctx.denial.lock().unwrap_or_else(|p| p.into_inner()).take();
            if denial.is_some() || Instant::now() >= until {
                return denial;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// What the producer heard since the last report, waiting as `wait` says first (`Wait::Flush`
    /// within `bounds`). `denial`: a transactional producer's, whose units can be denied.
    pub fn hear(&self, wait: Wait, bounds: &Bounds, denial: bool) -> Feedback {
        let settled = match wait {
            Wait::Now => self.wait_for_reports(Duration::ZERO),
            Wait::For(bound) => self.wait_for_reports(bound),
            Wait::Flush => self.settle(bounds),
        };
        // A route's refusal is logged before the unit's denial (librdkafka's ADDPARTS line,
        // then TXNERR): taking the denial first and the routes after never sees it alone.
        let denied = denial.then(|| self.take_denied(Duration::ZERO)).flatten();
        let ctx = self.inner().context();
        Feedback {
            denied,
            routes: std::mem::take(&mut *ctx.routes.lock().unwrap_or_else(|p| p.into_inner())),
            refused: self.take_rejections(Duration::ZERO),
            accepted: self.take_accepted_routes(),
            settled,
        }
    }

    /// Whether `topic` exists, as the cluster's metadata says. A topic we may not describe
    /// is an error (Kafka does not say whether it exists then).
    pub fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, String> {
        let md = self
            .inner()
            .client()
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| format!("reading metadata of '{topic}': {e}"))?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(false);
        };
        match t.error().map(RDKafkaErrorCode::from) {
            None => Ok(true),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Err(format!(
                "reading metadata of '{topic}': {}",
                KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed)
            )),
            Some(_) => Ok(false),
        }
    }
}

/// Whether `code` says a request or a record timed out.
fn timed_out(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::TimedOutQueue
    )
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use rdkafka::mocking::MockCluster;

    use super::*;
    use crate::records::Outgoing;

    #[test]
    fn the_topics_deliveries_reach_are_kept_only_while_watching() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        for t in ["a", "b"] {
            cluster.create_topic(t, 1, 1).expect("topic");
        }
        let settings = crate::kafka::Settings {
            bootstrap_servers: cluster.bootstrap_servers(),
            ..Default::default()
        };
        let client = settings.client(crate::kafka::Role::Idempotent);
        let p = TrackedProducer::create(&client, Arc::default()).expect("producer");
        let bounds = Bounds::new(Arc::default(), Duration::from_secs(10));
        let send = |topic: &str| {
            let mut out = Outgoing {
                topic: None,
                partition: None,
                key: None,
                value: Some(Cow::Borrowed(&b"v"[..])),
                headers: Default::default(),
                lineage: None,
            };
            let record = Record {
                topic,
                out: &mut out,
                timestamp: None,
                index: 0,
                kind: crate::sink::Content::Output,
            };
            p.send(record, &bounds).expect("sent");
        };
        let reported = |p: &TrackedProducer| {
            assert!(p.wait_for_reports(Duration::from_secs(10)), "reports");
            let mut got = p.take_accepted_routes();
            got.sort();
            got
        };
        send("a");
        assert!(reported(&p).is_empty(), "not watching");
        p.watch_routes(true);
        for t in ["a", "b", "a"] {
            send(t);
        }
        assert_eq!(reported(&p), ["a", "b"]);
        assert!(reported(&p).is_empty(), "taken");
        send("b");
        assert!(p.wait_for_reports(Duration::from_secs(10)));
        // A new unit forgets what the last one reached.
        p.watch_routes(true);
        assert!(reported(&p).is_empty());
        p.watch_routes(false);
        send("a");
        assert!(reported(&p).is_empty(), "watching stopped");
    }
}

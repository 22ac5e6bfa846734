//! The consume-transform-produce loop.
//!
//! One thread runs it, because librdkafka's consumer poll and transaction calls block. Each
//! turn: poll one record (rebalance callbacks run inside poll and settle the open
//! transaction); rewind first if an abort left one pending; transform the record; send its
//! outputs (or its DLQ record) inside the open transaction; count its offset; commit when the
//! interval, record or byte bound is reached. On shutdown: commit, then leave the group.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{Config, Input, OnError};
use crate::error::{Action, Call, Error, Facts, classify, rejected_record};
use crate::health::Health;
use crate::kafka::{self, PipelineConsumer, PipelineContext};
use crate::lag::Positions;
use crate::metrics::{Metrics, RecordCounters};
use crate::raw_headers;
use crate::records::{self, Outgoing};
use crate::rejected::{Form, Source, Verdict};
use crate::transform::{InputRecord, Transform, TransformError};
use crate::txn::{Consumed, Outcome, Reason, SendError, Tp, TxnDriver};

/// Longest single poll: bounds how late a commit or a shutdown is noticed.
const MAX_POLL: Duration = Duration::from_millis(100);

/// Runs the pipeline until `shutdown` is cancelled (Ok) or an unrecoverable error (Err).
pub fn run(
    config: &Config,
    transform: Transform,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    positions: Arc<Positions>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let driver = TxnDriver::start(config, health.clone(), metrics, shutdown.clone())?;
    let max_message_bytes = check_topics(&driver, config)?;
    let driver = Arc::new(Mutex::new(driver));
    info!(
        transactional_id = %config.transactional_id,
        group = %config.group_id,
        output = %config.output_topic,
        "exactly running"
    );
    let mut transform = Some(transform);
    let mut replacements = 0u32;
    loop {
        let consumer = subscribe(config, driver.clone(), positions.clone())?;
        health.set_ready(true);
        let mut pipeline = Pipeline {
            config,
            transform: transform.take().expect("the transform is handed back"),
            consumer: &consumer,
            max_message_bytes,
            counters: RecordCounters::default(),
        };
        let result = pipeline.run_loop(&health, &shutdown);
        health.set_ready(false);
        let result = match result {
            Err(Error::ConsumerFenced(e)) if !shutdown.is_cancelled() => {
                // librdkafka's consumer is finished; the producer is not. Abort what the old
                // consumer read (its generation can no longer commit) and join again.
                consumer
                    .context()
                    .driver()
                    .abort_now(Reason::ConsumerFenced);
                transform = Some(pipeline.transform);
                close(consumer, Instant::now() + Duration::from_secs(5), false);
                replacements += 1;
                let pause = Duration::from_secs(u64::from(replacements.min(10)));
                error!(error = %e, ?pause, "consumer fenced; replacing it");
                std::thread::sleep(pause);
                continue;
            }
            other => other,
        };
        // Everything after the signal must fit in the grace, with a margin for the exit.
        let close_by = Instant::now() + config.shutdown_grace.saturating_sub(MAX_POLL * 5);
        let result = result.and_then(|()| pipeline.finish(&shutdown));
        if result.is_err() {
            // Nothing of an unfinished transaction may become visible.
            consumer
                .context()
                .driver()
                .abort_now(Reason::ShutdownOnError);
        }
        drop(pipeline);
        close_bounded(consumer, close_by);
        info!("exactly stopped");
        return result;
    }
}

/// Closes the consumer: it leaves the group (unless static), so its partitions move at once;
/// the revoke callback finds no open transaction. librdkafka's close can wait on an
/// unresponsive coordinator, and Drop would wait without bound: past `deadline` (or when a
/// broken consumer cannot start closing) it is left as it is, and the group notices the
/// session timeout instead.
///
/// On the way out (`exiting`), a closed consumer is not dropped either: rust-rdkafka's Drop
/// closes it a second time and logs that as an error, and the process ends next anyway.
fn close(consumer: PipelineConsumer, deadline: Instant, exiting: bool) {
    if consumer.close_queue().is_ok() {
        while !consumer.closed() && Instant::now() < deadline {
            consumer.poll(MAX_POLL);
        }
    }
    if !consumer.closed() {
        warn!("the consumer did not close in time; the group will time it out");
        // Dropping it would block until it closes.
        std::mem::forget(consumer);
    } else if exiting {
        std::mem::forget(consumer);
    } else {
        drop(consumer);
    }
}

/// The final close, bounded by `deadline` even when one librdkafka call inside it blocks (a
/// CI storm run once saw the close stop inside the revoke callback for the whole grace, after
/// the final commit had settled everything): it runs on a thread of its own, which the
/// process's exit ends if it is still waiting. Leaving the group is a courtesy; the group
/// times a member out anyway.
fn close_bounded(consumer: PipelineConsumer, deadline: Instant) {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("exactly-close".into())
        .spawn(move || {
            close(consumer, deadline, true);
            let _ = tx.send(());
        });
    match spawned {
        Ok(_) => {
            let left = deadline.saturating_duration_since(Instant::now()) + MAX_POLL;
            if rx.recv_timeout(left).is_err() {
                warn!("the consumer did not close in time; the group will time it out");
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot start the close thread; the group will time the consumer out")
        }
    }
}

/// A consumer whose context shares `driver`, subscribed to the input.
fn subscribe(
    config: &Config,
    driver: Arc<Mutex<TxnDriver>>,
    positions: Arc<Positions>,
) -> Result<PipelineConsumer, Error> {
    let consumer: PipelineConsumer = kafka::consumer_config(config)
        .create_with_context(PipelineContext::new(driver, positions))
        .map_err(|e| Error::Config(format!("--consumer-config: {e}")))?;
    match &config.input {
        Input::Topics(ts) => {
            let ts: Vec<&str> = ts.iter().map(String::as_str).collect();
            consumer.subscribe(&ts)
        }
        // librdkafka treats a subscription starting with ^ as a regex.
        Input::Pattern(p) => {
            let p = if p.starts_with('^') {
                p.clone()
            } else {
                format!("^{p}")
            };
            consumer.subscribe(&[&p])
        }
    }
    .map_err(|e| Error::Config(format!("subscribing to the input: {e}")))?;
    Ok(consumer)
}

struct Pipeline<'c> {
    config: &'c Config,
    transform: Transform,
    consumer: &'c PipelineConsumer,
    /// The producer's message.max.bytes: larger outputs are transform errors, not aborts.
    max_message_bytes: usize,
    counters: RecordCounters,
}

impl Pipeline<'_> {
    fn run_loop(&mut self, health: &Health, shutdown: &CancellationToken) -> Result<(), Error> {
        let c = self.config;
        while !shutdown.is_cancelled() {
            health.beat();
            {
                let driver = self.consumer.context().driver();
                driver
                    .metrics()
                    .open_transaction_age
                    .set(driver.open_age().as_secs_f64());
            }
            let wait = self.driver_due_in().unwrap_or(MAX_POLL).min(MAX_POLL);
            let polled = self.consumer.poll(wait);
            {
                let mut driver = self.consumer.context().driver();
                if let Some(e) = driver.take_fatal() {
                    return Err(e);
                }
            }
            let at = match &polled {
                Some(Ok(msg)) => Some((msg.topic(), msg.partition(), msg.offset())),
                _ => None,
            };
            if self.rewind_if_pending(at, health, shutdown)? {
                continue;
            }
            match polled {
                None => {}
                Some(Ok(msg)) => self.process(&msg)?,
                Some(Err(e)) => self.consumer_error(e)?,
            }
            let mut driver = self.consumer.context().driver();
            if driver.advance_due(self.consumer, c.commit_interval) && driver.begin()? {
                // Only control records since the last commit: an offsets-only transaction.
                driver.commit(self.consumer)?;
            }
            if driver.should_commit(
                c.commit_interval,
                c.max_records_per_txn,
                c.max_bytes_per_txn,
            ) {
                let outcome = driver.commit(self.consumer)?;
                if let Outcome::Committed { records } = outcome {
                    debug!(records, "transaction committed");
                }
                drop(driver);
                self.rewind_if_pending(None, health, shutdown)?;
            }
        }
        Ok(())
    }

    /// Commits what is open, within the shutdown grace.
    fn finish(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        debug_assert!(shutdown.is_cancelled());
        let deadline = Instant::now() + self.config.shutdown_grace.saturating_sub(MAX_POLL * 10);
        let mut driver = self.consumer.context().driver();
        driver.set_deadline(deadline);
        match driver.commit(self.consumer)? {
            Outcome::Committed { records } => info!(records, "final transaction committed"),
            Outcome::Aborted => {
                warn!("final transaction aborted; its records are read again next time")
            }
            Outcome::Empty => {}
        }
        Ok(())
    }

    fn driver_due_in(&self) -> Option<Duration> {
        self.consumer
            .context()
            .driver()
            .due_in(self.config.commit_interval)
    }

    fn process(&mut self, msg: &BorrowedMessage<'_>) -> Result<(), Error> {
        let input = input_record(msg);
        let bytes = (input.key.map_or(0, <[u8]>::len) + input.value.map_or(0, <[u8]>::len)) as u64;
        let mut driver = self.consumer.context().driver();
        if !driver.begin()? {
            // The producer was replaced; the record comes again after the rewind.
            driver.rewind_also(input.topic, input.partition, input.offset);
            return Ok(());
        }
        let (p, o) = (input.partition, input.offset);
        let verdict = driver.verdicts().get(input.topic, p, o);
        let max = self.max_message_bytes;
        let result = records::outputs(&self.transform, &input, self.config.lineage, max);
        let sent = match (verdict, result) {
            (None, Ok(outputs)) => self.send_outputs(&mut driver, &input, outputs, false),
            (None, Err(err)) => {
                self.bad_record(&mut driver, &input, err, Form::DeadLetter, false)?
            }
            (Some(Verdict::Suspect { .. }), Ok(outputs)) => {
                // Rejected in a batch with others: each output goes alone, to find out.
                let sent = self.send_outputs(&mut driver, &input, outputs, true);
                if sent.is_ok() {
                    driver.cleared(input.topic, p, o);
                }
                sent
            }
            (Some(Verdict::Suspect { .. }), Err(err)) => {
                let sent = self.bad_record(&mut driver, &input, err, Form::DeadLetter, true)?;
                if sent.is_ok() {
                    driver.cleared(input.topic, p, o);
                }
                sent
            }
            (Some(Verdict::Rejected { code, copy, alone }), result) => {
                let broker = rejected_record(code).unwrap_or("UNKNOWN");
                let err = match result {
                    Err(mut e) => {
                        e.broker = Some(broker);
                        e
                    }
                    Ok(_) => TransformError::rejected(broker),
                };
                let next = copy.next().unwrap_or_else(|| {
                    // Not the record's fault: the dead-letter topic refuses even reason
                    // headers. The copy is rejected again, and the aborts back off (the
                    // rejection teaches nothing new).
                    error!(
                        topic = input.topic, partition = p, offset = o, error = broker,
                        dlq = %self.config.dlq_topic,
                        "the dead-letter topic rejected even the minimal copy of a record; \
                         retrying with backoff: check that topic's settings"
                    );
                    Form::Minimal
                });
                self.bad_record(&mut driver, &input, err, next, alone)?
            }
        };
        match sent {
            Ok(()) => {
                driver.consumed(Consumed {
                    topic: input.topic,
                    partition: input.partition,
                    offset: input.offset,
                    bytes,
                    timestamp: input.timestamp,
                });
                Ok(())
            }
            // Rewound before the next record.
            Err(SendError::Aborted) => {
                driver.rewind_also(input.topic, p, o);
                Ok(())
            }
            Err(SendError::Fatal(e)) => Err(e),
            Err(SendError::TooLarge) => {
                // librdkafka refused a record the size check let through. The driver holds
                // the verdict; the replay sends the next smaller copy.
                if self.config.on_error == OnError::Fail {
                    driver.abort(Reason::RecordFailed)?;
                    return Err(Error::RecordFailed(format!(
                        "record {}/{p}/{o}: the producer refused an output (or its DLQ copy) \
                         as larger than its message.max.bytes",
                        input.topic
                    )));
                }
                driver.abort(Reason::OutputTooLarge)?;
                driver.rewind_also(input.topic, p, o);
                Ok(())
            }
        }
    }

    /// Sends the outputs of one input; `alone`: each in a batch of its own, waited for.
    fn send_outputs(
        &mut self,
        driver: &mut TxnDriver,
        input: &InputRecord<'_>,
        outputs: Vec<Outgoing<'_>>,
        alone: bool,
    ) -> Result<(), SendError> {
        if outputs.is_empty() {
            driver.filtered();
        }
        let source = source(input, Form::Output);
        for mut o in outputs {
            let routed = o.topic.take();
            let topic = routed.as_deref().unwrap_or(&self.config.output_topic);
            driver.send(base_record(topic, &mut o, input.timestamp), source, alone)?;
            self.counters.produced(driver.metrics(), topic).inc();
        }
        Ok(())
    }

    /// A record that cannot go out as it is: the error policy decides. `copy` is what the
    /// dead-letter topic gets: the dead-letter copy, or the minimal one when that was
    /// rejected; `alone`: sent in a batch of its own (a suspect).
    fn bad_record(
        &mut self,
        driver: &mut TxnDriver,
        input: &InputRecord<'_>,
        err: TransformError,
        copy: Form,
        alone: bool,
    ) -> Result<Result<(), SendError>, Error> {
        let (topic, partition, offset) = (input.topic, input.partition, input.offset);
        match self.config.on_error {
            OnError::Dlq => {
                warn!(
                    topic, partition, offset, reason = err.reason.as_str(), error = %err.message,
                    copy = ?copy, "record to the dead-letter topic"
                );
                let lineage = self.config.lineage;
                let (mut d, timestamp) = match copy {
                    Form::Minimal => {
                        let why = "its dead-letter copy was rejected by the broker";
                        let max = self.max_message_bytes;
                        (records::minimal(input, &err, lineage, why, max), None)
                    }
                    _ => (
                        records::dead_letter(input, &err, lineage, self.max_message_bytes),
                        input.timestamp,
                    ),
                };
                driver.dead_lettered(err.reason);
                let rec = base_record(&self.config.dlq_topic, &mut d, timestamp);
                Ok(driver.send(rec, source(input, copy), alone))
            }
            OnError::Skip => {
                warn!(
                    topic, partition, offset, reason = err.reason.as_str(), error = %err.message,
                    "record skipped"
                );
                Ok(Ok(()))
            }
            OnError::Fail => {
                driver.abort(Reason::RecordFailed)?;
                Err(Error::RecordFailed(format!(
                    "record {topic}/{partition}/{offset} cannot be transformed: {err}"
                )))
            }
        }
    }

    fn consumer_error(&self, e: KafkaError) -> Result<(), Error> {
        let facts = Facts::of(&e);
        match e {
            KafkaError::PartitionEOF(_) => Ok(()),
            // A fatal consumer error means this consumer instance is done, most often a static
            // member fenced by its own rejoin after a session timeout (librdkafka#3437). The
            // pipeline replaces it; anything unrecoverable (authorization) still exits.
            KafkaError::MessageConsumptionFatal(_)
                if classify(Call::Produce, &facts) != Action::Exit =>
            {
                Err(Error::ConsumerFenced(e))
            }
            KafkaError::MessageConsumptionFatal(_) => Err(Error::Unrecoverable {
                context: "consuming".into(),
                source: e,
            }),
            _ if classify(Call::Produce, &facts) == Action::Exit => Err(Error::Unrecoverable {
                context: "consuming".into(),
                source: e,
            }),
            _ => {
                warn!(error = %e, "consumer error");
                Ok(())
            }
        }
    }

    /// Seeks every owned partition back to its committed offset, if an abort asked for it.
    /// Returns whether it rewound.
    /// `polled`: a record polled this turn, which a pending rewind must bring back too (it is
    /// from before the rewind point), even from a partition without a committed offset.
    fn rewind_if_pending(
        &self,
        polled: Option<(&str, i32, i64)>,
        health: &Health,
        shutdown: &CancellationToken,
    ) -> Result<bool, Error> {
        let firsts = {
            let mut driver = self.consumer.context().driver();
            if let Some((topic, partition, offset)) = polled {
                driver.rewind_also(topic, partition, offset);
            }
            driver.take_rewind()
        };
        let Some(firsts) = firsts else {
            return Ok(false);
        };
        let timeout = self.config.transaction_timeout;
        rewind(self.consumer, &firsts, timeout, health, shutdown)?;
        let failures = self.consumer.context().driver().failures_in_a_row();
        if failures > 1 {
            // Aborts in a row (a broker outage, a poison output): do not spin.
            let pause = Duration::from_millis(100 * u64::from(failures.min(50)));
            std::thread::sleep(pause.min(Duration::from_secs(5)));
        }
        Ok(true)
    }
}

/// Seeks each assigned partition to its committed offset (the broker's word, read after the
/// aborted or unknown transaction was settled). A partition with no committed offset goes back
/// to where the aborted transaction first read it. Reading the committed offsets is retried
/// for up to `timeout`, then the consumer is replaced (a new one starts from the committed
/// offsets); a shutdown stops it at once (nothing is open, the loop ends next).
fn rewind(
    consumer: &PipelineConsumer,
    firsts: &HashMap<Tp, i64>,
    timeout: Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let assignment = consumer.assignment().map_err(|e| Error::Unrecoverable {
        context: "reading the assignment".into(),
        source: e,
    })?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let mut backoff = Duration::from_millis(100);
    let give_up = Instant::now() + timeout;
    let committed = loop {
        health.beat();
        let result = {
            let _g = health.in_call("committed offsets");
            consumer.committed_offsets(assignment.clone(), timeout)
        };
        match result {
            Ok(c) => break c,
            Err(e) => {
                if classify(Call::SendOffsets, &Facts::of(&e)) == Action::Exit {
                    return Err(Error::Unrecoverable {
                        context: "reading committed offsets".into(),
                        source: e,
                    });
                }
                if shutdown.is_cancelled() {
                    return Ok(());
                }
                if Instant::now() >= give_up {
                    warn!(error = %e, "committed offsets unreadable; replacing the consumer");
                    return Err(Error::ConsumerFenced(e));
                }
                warn!(error = %e, "reading committed offsets failed; retrying");
                std::thread::sleep(backoff.min(give_up.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    };
    let mut seek = TopicPartitionList::new();
    for e in committed.elements() {
        let target = match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => firsts.get(&(e.topic().to_string(), e.partition())).copied(),
        };
        if let Some(o) = target {
            let _ = seek.add_partition_offset(e.topic(), e.partition(), Offset::Offset(o));
        }
    }
    if seek.count() == 0 {
        return Ok(());
    }
    let result = consumer
        .seek_partitions(seek, timeout)
        .map_err(|e| Error::Unrecoverable {
            context: "rewinding to the committed offsets".into(),
            source: e,
        })?;
    for e in result.elements() {
        if let Err(err) = e.error() {
            // A partition that cannot be rewound must not be read on from where it stands:
            // its aborted records would be skipped. This consumer is being fenced or
            // rebalanced away; a new one starts from the committed offsets.
            warn!(topic = e.topic(), partition = e.partition(), error = %err, "seek failed");
            return Err(Error::ConsumerFenced(err));
        }
    }
    info!(partitions = %kafka::describe(&result), "rewound to the committed offsets");
    Ok(())
}

/// A librdkafka record of an [`Outgoing`] (whose headers it takes), with `timestamp` (the
/// input's, or librdkafka's time of sending when `None`).
fn base_record<'a>(
    topic: &'a str,
    o: &'a mut Outgoing<'_>,
    timestamp: Option<i64>,
) -> BaseRecord<'a, [u8], [u8], usize> {
    let headers = std::mem::take(&mut o.headers);
    let o: &'a Outgoing<'_> = o;
    let mut rec = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, 0).headers(headers);
    if let Some(k) = o.key.as_deref() {
        rec = rec.key(k);
    }
    if let Some(v) = o.value.as_deref() {
        rec = rec.payload(v);
    }
    if let Some(ts) = timestamp {
        rec = rec.timestamp(ts);
    }
    rec
}

/// Where a record sent for `input` came from.
fn source<'a>(input: &InputRecord<'a>, copy: Form) -> Source<'a> {
    Source {
        topic: input.topic,
        partition: input.partition,
        offset: input.offset,
        copy,
    }
}

/// Borrows a consumed message as an [`InputRecord`].
fn input_record<'a>(msg: &'a BorrowedMessage<'a>) -> InputRecord<'a> {
    let headers = raw_headers::of(msg);
    InputRecord {
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp: msg.timestamp().to_millis(),
        key: msg.key(),
        value: msg.payload(),
        headers,
    }
}

/// The output (and DLQ) topics must exist; returns the producer's message.max.bytes.
fn check_topics(driver: &TxnDriver, config: &Config) -> Result<usize, Error> {
    let mut needed = vec![("--output-topic", config.output_topic.as_str())];
    if config.on_error == OnError::Dlq {
        needed.push(("--dlq-topic", config.dlq_topic.as_str()));
    }
    let client = driver.producer().client();
    for (flag, topic) in needed {
        let md = client
            .fetch_metadata(Some(topic), config.startup_timeout)
            .map_err(|e| Error::Startup(format!("{flag}: reading metadata of '{topic}': {e}")))?;
        let missing = md
            .topics()
            .iter()
            .all(|t| t.name() != topic || t.error().is_some());
        if missing {
            return Err(Error::Config(format!(
                "{flag}: topic '{topic}' does not exist; create it first{}",
                if flag == "--dlq-topic" {
                    " (or choose --dlq-topic / --on-error)"
                } else {
                    ""
                }
            )));
        }
    }
    let max = kafka::producer_config(config)
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    Ok(max)
}

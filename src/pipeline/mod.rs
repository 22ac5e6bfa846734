//! The consume-transform-produce loop.
//!
//! One thread runs it, because librdkafka's consumer poll and transaction calls block. Each
//! turn: poll one record (rebalance callbacks run inside poll and settle the open
//! transaction, see [`context`]); rewind first if an abort left one pending ([`rewind`]);
//! transform the record; send its outputs (or its DLQ record) through the sink inside the open
//! transaction; count its offset; commit when the interval, record or byte bound is reached.
//! On shutdown: commit, then leave the group. With the call-out, records are staged and sent
//! to the application in batches, and each is applied when its batch's answer is back
//! ([`stage`]).

pub mod context;
mod rewind;
mod stage;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, Input, OnError, TransformSpec};
use crate::error::{Action, Call, Error, Facts, classify, rejected_record};
use crate::events::{self, AbortReason, BadRecord, CallAnswered, Occasion, TransformUnavailable};
use crate::health::Health;
use crate::kafka::{Role, raw_headers};
use crate::lag::Positions;
use crate::metrics::{Metrics, RecordCounters};
use crate::records::{self, Outgoing};
use crate::sink::rejected::{Form, Source, Verdict};
use crate::sink::{self, Began, Consumed, Driver, Outcome, SendError};
use crate::transform::{Failure, InputRecord, Transform, TransformError};
pub use context::{Change, PipelineConsumer, PipelineContext};
use stage::{Answered, Stage};

/// Why the loop over one consumer ended early.
enum Interrupt {
    /// This consumer is finished (fenced, or it cannot rewind): a new one starts from the
    /// committed offsets, with the same producer.
    ReplaceConsumer(KafkaError),
    /// Stop the process.
    Fail(Error),
}

impl From<Error> for Interrupt {
    fn from(e: Error) -> Interrupt {
        Interrupt::Fail(e)
    }
}

/// Longest single poll: bounds how late a commit or a shutdown is noticed.
const MAX_POLL: Duration = Duration::from_millis(100);

/// Runs the pipeline until `shutdown` is cancelled (Ok) or an unrecoverable error (Err).
pub fn run(
    config: &Config,
    transform: Box<dyn Transform>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    positions: Arc<Positions>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let driver = sink::start(config, health.clone(), metrics.clone(), shutdown.clone())?;
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
        let consumer = subscribe(config, driver.clone(), positions.clone(), metrics.clone())?;
        // A new consumer starts from the committed offsets: nothing is staged.
        consumer.context().driver().set_staged(Vec::new());
        health.set_ready(true);
        let mut pipeline = Pipeline {
            config,
            transform: transform.take().expect("the transform is handed back"),
            consumer: &consumer,
            metrics: &metrics,
            health: &health,
            shutdown: &shutdown,
            max_message_bytes,
            counters: RecordCounters::default(),
            unavailable: false,
            stage: match &config.transform.spec {
                TransformSpec::Call(spec) => Some(Stage::new(spec.clone())),
                _ => None,
            },
        };
        let result = pipeline.run_loop();
        health.set_ready(false);
        let result = match result {
            Err(Interrupt::ReplaceConsumer(e)) if !shutdown.is_cancelled() => {
                // librdkafka's consumer is finished; the producer is not. Abort what the old
                // consumer read (its generation can no longer commit) and join again.
                consumer
                    .context()
                    .driver()
                    .abort_now(AbortReason::ConsumerFenced);
                // The new consumer assigns again: the transform loses these first.
                pipeline.hand_over_changes();
                let owned = consumer.assignment().unwrap_or_default();
                pipeline.transform.revoked(&context::partitions(&owned));
                transform = Some(pipeline.transform);
                close(consumer, Instant::now() + Duration::from_secs(5), false);
                replacements += 1;
                let pause = Duration::from_secs(u64::from(replacements.min(10)));
                error!(error = %e, ?pause, "consumer fenced; replacing it");
                std::thread::sleep(pause);
                continue;
            }
            // Shutting down with a finished consumer: nothing of the open transaction commits.
            Err(Interrupt::ReplaceConsumer(source)) => Err(Error::Unrecoverable {
                context: "consumer fenced while shutting down".into(),
                source,
            }),
            Err(Interrupt::Fail(e)) => Err(e),
            Ok(()) => Ok(()),
        };
        // Everything after the signal must fit in the grace, with a margin for the exit.
        let close_by = Instant::now() + config.shutdown_grace.saturating_sub(MAX_POLL * 5);
        let result = result.and_then(|()| pipeline.finish(&shutdown));
        if result.is_err() {
            // Nothing of an unfinished transaction may become visible.
            consumer
                .context()
                .driver()
                .abort_now(AbortReason::ShutdownOnError);
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
    driver: Arc<Mutex<Driver>>,
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
) -> Result<PipelineConsumer, Error> {
    let role = Role::Pipeline {
        group: &config.group_id,
        instance: config
            .static_membership
            .then_some(config.instance_id.as_str()),
        statistics: config.lag_interval,
        poll_bound: config.loop_bound(),
    };
    let consumer: PipelineConsumer = config
        .kafka
        .to_rdkafka(role)
        .create_with_context(PipelineContext::new(driver, positions, metrics))
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
    transform: Box<dyn Transform>,
    consumer: &'c PipelineConsumer,
    metrics: &'c Metrics,
    health: &'c Health,
    shutdown: &'c CancellationToken,
    /// The producer's message.max.bytes: larger outputs are transform errors, not aborts.
    max_message_bytes: usize,
    counters: RecordCounters,
    /// The transform said it cannot work: not ready until a record goes through again.
    unavailable: bool,
    /// The call-out's records read but not yet applied; `None` for other transforms.
    stage: Option<Stage>,
}

impl Pipeline<'_> {
    fn run_loop(&mut self) -> Result<(), Interrupt> {
        let (c, shutdown) = (self.config, self.shutdown);
        while !shutdown.is_cancelled() {
            self.health.beat();
            let due_in = {
                let driver = self.consumer.context().driver();
                self.metrics
                    .open_transaction_age
                    .set(driver.open_age().as_secs_f64());
                driver.due_in(c.commit_interval)
            };
            let wait = due_in.unwrap_or(MAX_POLL).min(MAX_POLL);
            let (wait, full) = match &self.stage {
                Some(stage) => (stage.poll_wait(wait), stage.full()),
                None => (wait, false),
            };
            // A full stage reads nothing more until an answer (or the back-off) makes room.
            let polled = if full { None } else { self.consumer.poll(wait) };
            if let Some(e) = self.consumer.context().driver().take_fatal() {
                return Err(e.into());
            }
            self.hand_over_changes();
            let at = match &polled {
                Some(Ok(msg)) => Some((msg.topic(), msg.partition(), msg.offset())),
                _ => None,
            };
            if self.rewind_if_pending(at, shutdown)? {
                continue;
            }
            match polled {
                None => {}
                Some(Ok(msg)) => {
                    let input = input_record(&msg);
                    match &mut self.stage {
                        Some(stage) => {
                            stage.push(&input);
                            let driver = &mut self.consumer.context().driver();
                            driver.staged_also(input.topic, input.partition, input.offset);
                        }
                        None => self.process(&input)?,
                    }
                }
                Some(Err(e)) => self.consumer_error(e)?,
            }
            if self.stage.is_some() {
                self.pump(if full { MAX_POLL } else { Duration::ZERO }, false)?;
            }
            let mut driver = self.consumer.context().driver();
            if driver.advance_due(self.consumer, c.commit_interval)
                && driver.begin()? == Began::Open
            {
                // Only control records since the last commit: an offsets-only transaction.
                driver.commit(self.consumer)?;
            }
            if driver.should_commit(
                c.commit_interval,
                c.max_records_per_txn,
                c.max_bytes_per_txn,
            ) {
                if let Outcome::Committed { records } = driver.commit(self.consumer)? {
                    events::committed(records, Occasion::Bound);
                }
                drop(driver);
                self.rewind_if_pending(None, shutdown)?;
            }
        }
        Ok(())
    }

    /// Tells the transform which partitions the rebalances since the last turn moved; the
    /// stage drops what it holds of revoked ones.
    fn hand_over_changes(&mut self) {
        for change in self.consumer.context().take_changes() {
            match change {
                Change::Assigned(ps) => self.transform.assigned(&ps),
                Change::Revoked(ps) => {
                    if let Some(stage) = &mut self.stage {
                        stage.revoke(&ps);
                        self.consumer.context().driver().set_staged(stage.firsts());
                    }
                    self.transform.revoked(&ps)
                }
            }
        }
    }

    /// The call-out's turn: sends the open batch when it is due (`flush`: whatever it holds),
    /// and applies every answer that is back, oldest call first; waits up to `wait` for the
    /// oldest (or for the back-off to pass, when no call is out).
    fn pump(&mut self, mut wait: Duration, flush: bool) -> Result<(), Error> {
        loop {
            let (Some(stage), Some(call)) = (&mut self.stage, self.transform.as_call()) else {
                return Ok(());
            };
            stage.send_due(call, flush);
            let answered = stage.next_answer(wait);
            self.metrics.calls_in_flight.set(stage.in_flight() as i64);
            let Some(answered) = answered else {
                return Ok(());
            };
            wait = Duration::ZERO;
            self.apply(answered)?;
            if self.consumer.context().driver().rewind_pending() {
                return Ok(());
            }
        }
    }

    /// Applies one call's answers, record by record, as the transform's outputs; a failed call
    /// makes the application unavailable.
    fn apply(&mut self, answered: Answered) -> Result<(), Error> {
        let Answered { records, called } = answered;
        let outcome = called.answers.as_ref().err().map_or("ok", |e| e.outcome());
        CallAnswered {
            outcome,
            took: called.took,
            records: records.len(),
        }
        .emit(self.metrics);
        let answers = match called.answers {
            Ok(answers) => answers,
            Err(e) => return self.call_failed(&e.to_string(), &records),
        };
        if let Some(stage) = &mut self.stage {
            stage.succeeded();
        }
        let mut left = records
            .iter()
            .zip(answers)
            .filter(|(r, _)| !r.dropped)
            .peekable();
        while let Some((staged, answer)) =
            left.next_if(|_| !self.consumer.context().driver().rewind_pending())
        {
            let input = staged.record.as_input();
            if let Some(call) = self.transform.as_call() {
                call.prepare(&input, answer);
            }
            self.process(&input)?;
        }
        let mut driver = self.consumer.context().driver();
        // An abort on the way: the rest of this call's records come again with the rewind.
        for (s, _) in left {
            driver.rewind_also(&s.record.topic, s.record.partition, s.record.offset);
        }
        if let Some(stage) = &self.stage {
            driver.set_staged(stage.firsts());
        }
        Ok(())
    }

    /// A call failed: the application is unavailable. Commit what the earlier answers put in
    /// the open transaction (none of this call's records is in it), rewind (this call's
    /// `records`; the rewind takes everything staged after them too), report not ready, and
    /// call again only after a back-off.
    fn call_failed(&mut self, why: &str, records: &[stage::Staged]) -> Result<(), Error> {
        let pause = self.stage.as_mut().map_or(Duration::ZERO, Stage::failed);
        TransformUnavailable {
            why: &format!("{why}; calling again in {pause:?}"),
        }
        .emit();
        self.unavailable = true;
        self.health.set_ready(false);
        let mut driver = self.consumer.context().driver();
        if let Outcome::Committed { records } = driver.commit(self.consumer)? {
            events::committed(records, Occasion::Bound);
        }
        driver.rewind_from(&stage::firsts(records.iter()));
        Ok(())
    }

    /// Commits what is open, within the shutdown grace. The call-out's staged records first,
    /// as far as their answers come back within half of it: the rest is the commit's (what
    /// stays staged is read again next time).
    fn finish(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        debug_assert!(shutdown.is_cancelled());
        let now = Instant::now();
        let deadline = now + self.config.shutdown_grace.saturating_sub(MAX_POLL * 10);
        self.consumer.context().driver().set_deadline(deadline);
        let answers_by = now + deadline.saturating_duration_since(now) / 2;
        while self.stage.as_ref().is_some_and(|s| !s.is_empty())
            && Instant::now() < answers_by
            && !self.consumer.context().driver().rewind_pending()
        {
            self.health.beat();
            self.pump(MAX_POLL, true)?;
        }
        let mut driver = self.consumer.context().driver();
        match driver.commit(self.consumer)? {
            Outcome::Committed { records } => events::committed(records, Occasion::Shutdown),
            Outcome::Aborted => {
                warn!("final transaction aborted; its records are read again next time")
            }
            Outcome::Empty => {}
        }
        Ok(())
    }

    fn process(&mut self, input: &InputRecord<'_>) -> Result<(), Error> {
        let bytes = (input.key.map_or(0, <[u8]>::len) + input.value.map_or(0, <[u8]>::len)) as u64;
        let mut driver = self.consumer.context().driver();
        if driver.begin()? == Began::Replaced {
            // The producer was replaced; the record comes again after the rewind.
            driver.rewind_also(input.topic, input.partition, input.offset);
            return Ok(());
        }
        let (p, o) = (input.partition, input.offset);
        let verdict = driver.verdicts().get(input.topic, p, o);
        let max = self.max_message_bytes;
        let result =
            match records::outputs(self.transform.as_mut(), input, self.config.lineage, max) {
                Ok(outputs) => Ok(outputs),
                Err(Failure::BadRecord(e)) => Err(e),
                Err(Failure::Unavailable(why)) => {
                    return self.transform_unavailable(&mut driver, input, &why);
                }
            };
        if self.unavailable {
            self.unavailable = false;
            // Not ready again from the moment shutdown began.
            self.health.set_ready(!self.shutdown.is_cancelled());
        }
        let sent = match (verdict, result) {
            (None, Ok(outputs)) => self.send_outputs(&mut driver, input, outputs, false),
            (None, Err(err)) => {
                self.bad_record(&mut driver, input, err, Form::DeadLetter, false)?
            }
            (Some(Verdict::Suspect { .. }), Ok(outputs)) => {
                // Rejected in a batch with others: each output goes alone, to find out.
                let sent = self.send_outputs(&mut driver, input, outputs, true);
                if sent.is_ok() {
                    driver.cleared(input.topic, p, o);
                }
                sent
            }
            (Some(Verdict::Suspect { .. }), Err(err)) => {
                let sent = self.bad_record(&mut driver, input, err, Form::DeadLetter, true)?;
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
                self.bad_record(&mut driver, input, err, next, alone)?
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
                if self.config.transform.on_error == OnError::Fail {
                    driver.abort(AbortReason::RecordFailed)?;
                    return Err(Error::RecordFailed(format!(
                        "record {}/{p}/{o}: the producer refused an output (or its DLQ copy) \
                         as larger than its message.max.bytes",
                        input.topic
                    )));
                }
                driver.abort(AbortReason::OutputTooLarge)?;
                driver.rewind_also(input.topic, p, o);
                Ok(())
            }
        }
    }

    /// The transform cannot work right now: abort, rewind (the record comes again), back off
    /// (the rewind pauses longer with each abort in a row), and report not ready meanwhile.
    fn transform_unavailable(
        &mut self,
        driver: &mut Driver,
        input: &InputRecord<'_>,
        why: &str,
    ) -> Result<(), Error> {
        TransformUnavailable { why }.emit();
        self.unavailable = true;
        self.health.set_ready(false);
        driver.abort(AbortReason::TransformUnavailable)?;
        driver.rewind_also(input.topic, input.partition, input.offset);
        Ok(())
    }

    /// Sends the outputs of one input; `alone`: each in a batch of its own, waited for.
    fn send_outputs(
        &mut self,
        driver: &mut Driver,
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
            driver.send(topic, &mut o, input.timestamp, source, alone)?;
            self.counters.produced(self.metrics, topic).inc();
        }
        Ok(())
    }

    /// A record that cannot go out as it is: the error policy decides. `copy` is what the
    /// dead-letter topic gets: the dead-letter copy, or the minimal one when that was
    /// rejected; `alone`: sent in a batch of its own (a suspect).
    fn bad_record(
        &mut self,
        driver: &mut Driver,
        input: &InputRecord<'_>,
        err: TransformError,
        copy: Form,
        alone: bool,
    ) -> Result<Result<(), SendError>, Error> {
        let (topic, partition, offset) = (input.topic, input.partition, input.offset);
        let event = BadRecord {
            topic,
            partition,
            offset,
            error: &err,
            dead_letter: Some(&copy),
        };
        match self.config.transform.on_error {
            OnError::Dlq => {
                event.emit();
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
                let dlq = &self.config.dlq_topic;
                Ok(driver.send(dlq, &mut d, timestamp, source(input, copy), alone))
            }
            OnError::Skip => {
                BadRecord {
                    dead_letter: None,
                    ..event
                }
                .emit();
                Ok(Ok(()))
            }
            OnError::Fail => {
                driver.abort(AbortReason::RecordFailed)?;
                Err(Error::RecordFailed(format!(
                    "record {topic}/{partition}/{offset} cannot be transformed: {err}"
                )))
            }
        }
    }

    fn consumer_error(&self, e: KafkaError) -> Result<(), Interrupt> {
        let facts = Facts::of(&e);
        match e {
            KafkaError::PartitionEOF(_) => Ok(()),
            // A fatal consumer error means this consumer instance is done, most often a static
            // member fenced by its own rejoin after a session timeout (librdkafka#3437). The
            // pipeline replaces it; anything unrecoverable (authorization) still exits.
            KafkaError::MessageConsumptionFatal(_)
                if classify(Call::Produce, &facts) != Action::Exit =>
            {
                Err(Interrupt::ReplaceConsumer(e))
            }
            KafkaError::MessageConsumptionFatal(_) => Err(unrecoverable("consuming", e)),
            _ if classify(Call::Produce, &facts) == Action::Exit => {
                Err(unrecoverable("consuming", e))
            }
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
        &mut self,
        polled: Option<(&str, i32, i64)>,
        shutdown: &CancellationToken,
    ) -> Result<bool, Interrupt> {
        let firsts = {
            let mut driver = self.consumer.context().driver();
            if let Some((topic, partition, offset)) = polled {
                driver.rewind_also(topic, partition, offset);
            }
            // Staged records were read past the rewind point too.
            if driver.rewind_pending()
                && let Some(stage) = &mut self.stage
            {
                for ((topic, partition), offset) in stage.clear() {
                    driver.rewind_also(&topic, partition, offset);
                }
                driver.set_staged(Vec::new());
            }
            driver.take_rewind()
        };
        let Some(firsts) = firsts else {
            return Ok(false);
        };
        let timeout = self.config.transaction_timeout;
        rewind::rewind(self.consumer, &firsts, timeout, self.health, shutdown)?;
        let failures = self.consumer.context().driver().failures_in_a_row();
        if failures > 1 {
            // Aborts in a row (a broker outage, a poison output): do not spin.
            let pause = Duration::from_millis(100 * u64::from(failures.min(50)));
            std::thread::sleep(pause.min(Duration::from_secs(5)));
        }
        Ok(true)
    }
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
fn check_topics(driver: &Driver, config: &Config) -> Result<usize, Error> {
    let mut needed = vec![("--output-topic", config.output_topic.as_str())];
    if config.transform.on_error == OnError::Dlq {
        needed.push(("--dlq-topic", config.dlq_topic.as_str()));
    }
    for (flag, topic) in needed {
        let exists = driver
            .topic_exists(topic, config.startup_timeout)
            .map_err(|e| Error::Startup(format!("{flag}: reading metadata of '{topic}': {e}")))?;
        if !exists {
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
    let max = config
        .kafka
        .to_rdkafka(Role::Idempotent)
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    Ok(max)
}

fn unrecoverable(context: &str, source: KafkaError) -> Interrupt {
    Interrupt::Fail(Error::Unrecoverable {
        context: context.into(),
        source,
    })
}

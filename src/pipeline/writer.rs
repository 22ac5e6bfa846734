//! The record path: what one input becomes (its outputs, or its dead-letter copy) written into
//! the open unit, and the input counted there.
//!
//! Both intakes end here: a record read by the direct intake with its transform's result, a
//! staged record with its application's answer. Whatever happens, the record ends in exactly
//! one of two places: counted in the open unit (its outputs or DLQ copy sent), or behind an
//! abort that owes a rewind (it is read again). The error policy (`--on-error`) decides what a
//! bad record becomes; the verdicts on records the destination refused decide what their
//! replay sends instead.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::config::{ErrorPolicy, OnError};
use crate::error::Error;
use crate::events::{AbortReason, BadRecord, TransformUnavailable};
use crate::health::Health;
use crate::metrics::{Metrics, RecordCounters};
use crate::records::{self, Outgoing};
use crate::sink::rejected::{Form, Source, Verdict};
use crate::sink::routes::Routes;
use crate::sink::{Began, Consumed, Content, Driver, SendError};
use crate::transform::{Failure, Fate, InputRecord, OutputRecord, Reason, Refuser, TransformError};

/// What the record path must know.
pub struct Policy {
    /// Where outputs go unless routed elsewhere.
    pub output_topic: String,
    /// What happens to a bad record.
    pub errors: ErrorPolicy,
    /// Add the lineage header.
    pub lineage: bool,
    /// The producer's message.max.bytes: larger outputs are bad records, not aborts.
    pub max_message_bytes: usize,
    /// Who refuses outputs for what they are: the broker, or the database.
    pub refuser: &'static Refuser,
}

/// Writes records into the sink's open unit.
pub struct Writer {
    /// The sink and its open unit.
    pub driver: Driver,
    policy: Policy,
    counters: RecordCounters,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    /// The transform said it cannot work: not ready until a record goes through again.
    unavailable: bool,
}

impl Writer {
    /// Writes through `driver`.
    pub fn new(
        driver: Driver,
        policy: Policy,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        shutdown: CancellationToken,
    ) -> Writer {
        let mut driver = driver;
        // The output and dead-letter topics are no routes.
        driver.set_routes(Routes::new(
            policy.errors.route_timeout,
            &policy.output_topic,
            &policy.errors.dlq_topic,
        ));
        Writer {
            driver,
            policy,
            counters: RecordCounters::default(),
            metrics,
            health,
            shutdown,
            unavailable: false,
        }
    }

    /// Writes `input` as `outputs` makes it, once a unit is open (`outputs` is not asked when
    /// none can be: the record comes again after the rewind). What became of it: only
    /// [`Fate::Sent`] lets the transform keep what it decided for it.
    pub fn write<'a>(
        &mut self,
        input: &InputRecord<'a>,
        outputs: impl FnOnce() -> Result<Vec<OutputRecord<'a>>, Failure>,
    ) -> Result<Fate, Error> {
        if self.driver.begin()? == Began::RewindOwed {
            return Ok(Fate::Refused);
        }
        let verdict = self
            .driver
            .verdict(input.topic, input.partition, input.offset);
        let (lineage, max) = (self.policy.lineage, self.policy.max_message_bytes);
        let result = match records::outputs(input, outputs(), lineage, max) {
            Ok(outputs) => Ok(outputs),
            Err(Failure::BadRecord(e)) => Err(e),
            Err(Failure::Unavailable(why)) => {
                self.unavailable(&why)?;
                return Ok(Fate::Refused);
            }
            // Its partition is held (the session pauses it): nothing of it goes, it is not
            // counted, and it comes again.
            Err(Failure::Held(_)) => return Ok(Fate::Refused),
        };
        let verdict = verdict.and_then(|v| self.still_holds(v, &result));
        let result = result.and_then(|outputs| self.routable(outputs));
        // Its outputs go out, unless a verdict sends its dead-letter copy instead.
        let goes = result.is_ok() && !matches!(verdict, Some(Verdict::Rejected { .. }));
        if self.unavailable {
            self.unavailable = false;
            // Not ready again from the moment shutdown began.
            self.health.set_ready(!self.shutdown.is_cancelled());
        }
        let sent = match verdict {
            None => match result {
                Ok(outputs) => self.send_outputs(input, outputs, false),
                Err(err) => self.bad_record(input, err, Form::DeadLetter, false)?,
            },
            Some(Verdict::Suspect { .. }) => {
                // Refused in a batch with others: each output goes alone, to find out.
                let sent = match result {
                    Ok(outputs) => self.send_outputs(input, outputs, true),
                    Err(err) => self.bad_record(input, err, Form::DeadLetter, true)?,
                };
                if sent.is_ok() {
                    self.driver
                        .cleared(input.topic, input.partition, input.offset);
                }
                sent
            }
            Some(Verdict::Rejected { error, copy, alone }) => {
                self.rejected(input, result, error, copy, alone)?
            }
        };
        let fate = if goes && sent.is_ok() {
            Fate::Sent
        } else {
            Fate::Refused
        };
        self.count(input, sent)?;
        Ok(fate)
    }

    /// Sends records of the open unit's own, of no input (what the transform must write
    /// before the commit): nothing is counted, no lineage. Nothing is open: nothing to send
    /// (no record of the transform's went into a unit).
    pub fn write_own(&mut self, outputs: Vec<OutputRecord<'static>>) -> Result<(), Error> {
        if self.driver.unit().is_none() {
            return Ok(());
        }
        for o in outputs {
            let mut o = records::own(o);
            let routed = o.topic.take();
            let topic = routed.as_deref().unwrap_or(&self.policy.output_topic);
            let source = Source {
                topic,
                partition: o.partition.unwrap_or(-1),
                offset: -1,
                copy: Form::Output,
                fingerprint: o.fingerprint(topic),
            };
            match (self.driver).send(topic, &mut o, None, (source, Content::Output), false) {
                Ok(()) => self.counters.produced(&self.metrics, topic).inc(),
                Err(SendError::Aborted) => return Ok(()),
                Err(SendError::Fatal(e)) => return Err(e),
                Err(SendError::TooLarge) => return self.driver.abort(AbortReason::OutputTooLarge),
            }
        }
        Ok(())
    }

    /// A verdict on refused outputs holds for the same outputs only: an application that
    /// answers differently now (it need not be deterministic) is judged afresh.
    fn still_holds(
        &self,
        (verdict, fingerprint): (Verdict, u64),
        result: &Result<Vec<Outgoing<'_>>, TransformError>,
    ) -> Option<Verdict> {
        let Ok(outputs) = result else {
            return Some(verdict);
        };
        let same = outputs.iter().any(|o| {
            let topic = o.topic.as_deref().unwrap_or(&self.policy.output_topic);
            o.fingerprint(topic) == fingerprint
        });
        (verdict.copy() != Form::Output || same).then_some(verdict)
    }

    /// Outputs routed to a topic that refused them for longer than `--route-timeout` make
    /// their record a bad one (`sink::routes`).
    fn routable<'a>(
        &mut self,
        outputs: Vec<Outgoing<'a>>,
    ) -> Result<Vec<Outgoing<'a>>, TransformError> {
        for o in &outputs {
            if let Some(why) = o.topic.as_deref().and_then(|t| self.driver.unroutable(t)) {
                return Err(TransformError::new(Reason::RouteRefused, why));
            }
        }
        Ok(outputs)
    }

    /// Counts `input` into the open unit once everything of it was sent.
    fn count(&mut self, input: &InputRecord<'_>, sent: Result<(), SendError>) -> Result<(), Error> {
        let (topic, partition, offset) = (input.topic, input.partition, input.offset);
        match sent {
            Ok(()) => {
                let bytes = input.key.map_or(0, <[u8]>::len) + input.value.map_or(0, <[u8]>::len);
                self.driver.consumed(Consumed {
                    topic,
                    partition,
                    offset,
                    bytes: bytes as u64,
                    timestamp: input.timestamp,
                });
                Ok(())
            }
            // The unit was aborted: the rewind reads the record again.
            Err(SendError::Aborted) => Ok(()),
            Err(SendError::Fatal(e)) => Err(e),
            Err(SendError::TooLarge) => {
                // librdkafka refused a record the size check let through. The driver holds
                // the verdict; the replay sends the next smaller copy.
                if self.policy.errors.on_error == OnError::Fail {
                    self.driver.abort(AbortReason::RecordFailed)?;
                    return Err(Error::RecordFailed(format!(
                        "record {topic}/{partition}/{offset}: the producer refused an output \
                         (or its DLQ copy) as larger than its message.max.bytes"
                    )));
                }
                self.driver.abort(AbortReason::OutputTooLarge)
            }
        }
    }

    /// An input whose `copy` the destination refused for what it is (`error`): the replay
    /// sends the next smaller copy.
    fn rejected(
        &mut self,
        input: &InputRecord<'_>,
        result: Result<Vec<Outgoing<'_>>, TransformError>,
        error: &'static str,
        copy: Form,
        alone: bool,
    ) -> Result<Result<(), SendError>, Error> {
        let err = match result {
            Err(mut e) => {
                e.refused = Some((self.policy.refuser, error));
                e
            }
            Ok(_) => TransformError::rejected(self.policy.refuser, error),
        };
        let next = copy.next().unwrap_or_else(|| {
            // Not the record's fault: the dead-letter topic refuses even reason headers. The
            // copy is refused again, and the aborts back off (the refusal teaches nothing new).
            error!(
                topic = input.topic, partition = input.partition, offset = input.offset,
                error, dlq = %self.policy.errors.dlq_topic,
                "the dead-letter topic rejected even the minimal copy of a record; \
                 retrying with backoff: check that topic's settings"
            );
            Form::Minimal
        });
        self.bad_record(input, err, next, alone)
    }

    /// The transform cannot work right now: abort (the record comes again after the rewind,
    /// which backs off with each abort in a row), and report not ready meanwhile.
    fn unavailable(&mut self, why: &str) -> Result<(), Error> {
        TransformUnavailable { why }.emit();
        self.not_ready();
        self.driver.abort(AbortReason::TransformUnavailable)
    }

    /// Not ready until a record goes through again.
    pub fn not_ready(&mut self) {
        self.unavailable = true;
        self.health.set_ready(false);
    }

    /// Sends the outputs of one input; `alone`: each in a batch of its own, waited for.
    fn send_outputs(
        &mut self,
        input: &InputRecord<'_>,
        outputs: Vec<Outgoing<'_>>,
        alone: bool,
    ) -> Result<(), SendError> {
        if outputs.is_empty() {
            self.driver.filtered();
        }
        let source = source(input, Form::Output);
        for mut o in outputs {
            let routed = o.topic.take();
            let topic = routed.as_deref().unwrap_or(&self.policy.output_topic);
            let source = Source {
                fingerprint: o.fingerprint(topic),
                ..source
            };
            self.driver.send(
                topic,
                &mut o,
                input.timestamp,
                (source, Content::Output),
                alone,
            )?;
            self.counters.produced(&self.metrics, topic).inc();
        }
        Ok(())
    }

    /// A record that cannot go out as it is: the error policy decides. `copy` is what the
    /// dead-letter topic gets: the dead-letter copy, or the minimal one when that was
    /// refused; `alone`: sent in a batch of its own (a suspect).
    fn bad_record(
        &mut self,
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
            to: self.policy.refuser,
        };
        match self.policy.errors.on_error {
            OnError::Dlq => {
                event.emit();
                let (lineage, max) = (self.policy.lineage, self.policy.max_message_bytes);
                let (mut d, timestamp) = match copy {
                    Form::Minimal => {
                        let why = "its dead-letter copy was rejected by the broker";
                        (records::minimal(input, &err, lineage, why, max), None)
                    }
                    _ => (
                        records::dead_letter(input, &err, lineage, max),
                        input.timestamp,
                    ),
                };
                self.driver.dead_lettered(err.reason);
                let dlq = &self.policy.errors.dlq_topic;
                let source = source(input, copy);
                let kind = Content::DeadLetter(err.reason);
                Ok(self
                    .driver
                    .send(dlq, &mut d, timestamp, (source, kind), alone))
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
                self.driver.abort(AbortReason::RecordFailed)?;
                Err(Error::RecordFailed(format!(
                    "record {topic}/{partition}/{offset} cannot be transformed: {err}"
                )))
            }
        }
    }
}

/// Where a record sent for `input` came from.
fn source<'a>(input: &InputRecord<'a>, copy: Form) -> Source<'a> {
    Source {
        topic: input.topic,
        partition: input.partition,
        offset: input.offset,
        copy,
        fingerprint: 0,
    }
}

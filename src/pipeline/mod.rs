//! The consume-transform-produce loop.
//!
//! One thread runs it, because librdkafka's consumer poll and transaction calls block. Each
//! turn polls one record (rebalance callbacks run inside `poll` and settle the open unit, see
//! [`context`]), then hands it to the [`Session`], the one owner of the loop's state, which
//! applies it (or stages it for the call-out), and commits when the interval, record or byte
//! bound is reached. On shutdown: commit, then leave the group.
//!
//! - [`session`]: a turn, a rebalance, the final commit; what the loop and the callback share.
//! - [`intake`]: how a record comes to be applied: directly, or staged for the call-out
//!   ([`stage`]) until its batch's answer is back.
//! - [`writer`]: the record path, one input's outputs (or its DLQ copy) into the open unit.
//! - [`rewind`]: where every partition goes back to after an abort.
//! - [`identity`]: one process per instance on a host (exit code 5 for a second one).

pub mod context;
pub mod held;
pub mod identity;
pub mod intake;
pub mod rewind;
pub mod session;
pub mod stage;
pub mod writer;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::backoff::Backoff;
use crate::config::{Config, Input, OnError};
use crate::error::Error;
use crate::health::Health;
use crate::kafka::failure::{Action, Facts, KafkaCall, classify};
use crate::kafka::{Role, member, raw_headers};
use crate::lag::Positions;
use crate::metrics::Metrics;
use crate::sink::{self, Driver};
use crate::transform::InputRecord;
pub use context::{PipelineConsumer, PipelineContext};
pub use intake::{Change, Intake};
pub use session::Session;
use writer::{Policy, Writer};

/// Why the loop over one consumer ended early.
#[derive(Debug)]
pub enum Interrupt {
    /// This consumer is finished (fenced, or it cannot rewind): a new one starts from the
    /// committed offsets, with the same producer.
    ReplaceConsumer(String),
    /// A consumer joined with this one's `group.instance.id` (KIP-345): a consumer to replace,
    /// unless it happened twice within [`YIELD_WITHIN`].
    InstanceFenced(String),
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

/// The session of the loop: the sink's driver started, the writer's policy checked against
/// the output topics.
fn session(
    config: &Config,
    intake: Intake,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    positions: Arc<Positions>,
    shutdown: CancellationToken,
) -> Result<Arc<Mutex<Session>>, Error> {
    let (kafka, test) = (&config.kafka, &config.test);
    let driver = sink::start(
        kafka,
        &config.sink,
        test,
        health.clone(),
        metrics.clone(),
        shutdown.clone(),
    )?;
    check_topics(&driver, config)?;
    let destination = driver.destination();
    let policy = Policy {
        output_topic: config.sink.output_topic.clone(),
        errors: config.errors.clone(),
        lineage: config.lineage,
        max_message_bytes: destination.max_record_bytes,
        refuser: destination.refuser,
    };
    let writer = Writer::new(
        driver,
        policy,
        metrics.clone(),
        health.clone(),
        shutdown.clone(),
    );
    let session = Session::new(session::Parts {
        writer,
        intake,
        commit: config.commit,
        positions: positions.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        shutdown: shutdown.clone(),
    });
    Ok(Arc::new(Mutex::new(session)))
}

/// Runs the pipeline until `shutdown` is cancelled (Ok) or an unrecoverable error (Err).
pub fn run(
    config: &Config,
    intake: Intake,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    positions: Arc<Positions>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let session = session(
        config,
        intake,
        health.clone(),
        metrics.clone(),
        positions.clone(),
        shutdown.clone(),
    )?;
    info!(
        transactional_id = %config.sink.transactional_id,
        group = %config.group.group_id,
        instance_id = %config.group.instance_id,
        static_membership = config.group.static_membership,
        output = %config.sink.output_topic,
        "exactly running"
    );
    let mut replacements = 0u32;
    let mut fenced_at: Option<Instant> = None;
    loop {
        let consumer = subscribe(config, session.clone(), positions.clone(), metrics.clone())?;
        let commits = consumer.context().session().commits();
        health.set_ready(true);
        let result = run_loop(&consumer, &health, &shutdown);
        health.set_ready(false);
        // Fenced by its instance id: again this soon after the last time, it yields.
        let mut again = None;
        if let Err(Interrupt::InstanceFenced(_)) = &result {
            again = fenced_at
                .map(|at| at.elapsed())
                .filter(|t| *t < YIELD_WITHIN);
            fenced_at = Some(Instant::now());
        }
        let result = match (result, again) {
            (Err(Interrupt::InstanceFenced(why)), Some(apart)) => {
                Err(Error::InstanceClash(clash(config, &why, apart)))
            }
            (Err(Interrupt::ReplaceConsumer(why) | Interrupt::InstanceFenced(why)), _)
                if !shutdown.is_cancelled() =>
            {
                let progressed = consumer.context().session().commits() > commits;
                replacements = replacements_after(replacements, progressed);
                replace(consumer, &why, replacements);
                continue;
            }
            // Shutting down with a finished consumer: nothing of the open unit commits.
            (Err(Interrupt::ReplaceConsumer(why) | Interrupt::InstanceFenced(why)), _) => Err(
                Error::Stopped(format!("consumer fenced while shutting down: {why}")),
            ),
            (Err(Interrupt::Fail(e)), _) => Err(e),
            (Ok(()), _) => Ok(()),
        };
        let leave = config.group.unsubscribes_to_leave();
        return stop(consumer, result, config.shutdown_grace, leave);
    }
}

/// Two processes of one instance (static members with one `group.instance.id`) fence each
/// other's consumer in turn: each join fences the other, whose replacement fences this one
/// again, seconds apart (a heartbeat, a rejoin). A process whose consumer is fenced a second
/// time this soon after the first yields (exit 5), and the other runs on. librdkafka also
/// fences a lone member by its own rejoin (after a session timeout, librdkafka#3437, or a
/// broker restart): once, which only replaces the consumer.
pub const YIELD_WITHIN: Duration = Duration::from_secs(30);

/// The error of a process that yields, fenced `apart` after the previous time.
fn clash(config: &Config, why: &str, apart: Duration) -> String {
    let group = &config.group;
    format!(
        "another process runs instance '{}' of group '{}' (on another host: this host's claim \
         held): it fenced this process's consumer again {:.1}s after the last time ({why}); \
         leaving it the instance. Give each process its own --instance-id",
        group.instance_id,
        group.group_id,
        apart.as_secs_f64()
    )
}

/// Consumers replaced in a row, counting this one: a consumer that committed something before
/// it was finished was progress, and the pauses start again from the first.
fn replacements_after(replacements: u32, progressed: bool) -> u32 {
    if progressed { 1 } else { replacements + 1 }
}

/// librdkafka's consumer is finished (`why`); the producer is not. The session drops what the
/// old consumer read, and a new one joins after a pause that grows with `replacements`.
fn replace(consumer: PipelineConsumer, why: &str, replacements: u32) {
    consumer.context().session().replaced(&consumer);
    close(
        consumer,
        Instant::now() + Duration::from_secs(5),
        false,
        false,
    );
    let pause = Backoff::CONSUMER.after(replacements);
    error!(error = %why, ?pause, "consumer fenced; replacing it");
    crate::clock::pause(pause);
}

/// The loop ended with `result`: commit what is open (or abandon it on an error), then leave
/// the group, all within `grace`. A classic static member (`leave_static`) leaves only after a
/// clean stop: after an error (exit 1, 3 or 4) its restart should find its place kept; a stop
/// for good then costs its partitions the session timeout.
fn stop(
    consumer: PipelineConsumer,
    result: Result<(), Error>,
    grace: Duration,
    leave_static: bool,
) -> Result<(), Error> {
    // Everything after the signal must fit in the grace, with a margin for the exit.
    let close_by = Instant::now() + grace.saturating_sub(MAX_POLL * 5);
    let result = result.and_then(|()| {
        let mut session = consumer.context().session();
        session.finish(&consumer, grace)
    });
    if result.is_err() {
        consumer.context().session().abandon();
    }
    close_bounded(consumer, close_by, leave_static && result.is_ok());
    info!("exactly stopped");
    result
}

/// Polls and hands each turn to the session, until shutdown or an interrupt.
fn run_loop(
    consumer: &PipelineConsumer,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Interrupt> {
    let mut next = consumer.context().session().next_poll();
    while !shutdown.is_cancelled() {
        health.beat();
        let polled = if next.read {
            consumer.poll(next.wait)
        } else {
            None
        };
        let mut session = consumer.context().session();
        if let Some(e) = session.take_fatal() {
            return Err(e.into());
        }
        let message = match polled {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                let fatal = consumer.client().fatal_error().map(|(code, _)| code);
                consumer_error(e, fatal)?;
                None
            }
        };
        let record = message.as_ref().map(input_record);
        next = session.turn(record.as_ref(), consumer)?;
    }
    Ok(())
}

/// Makes a classic static member leave its group, as a dynamic one does when it closes, so its
/// partitions move at once instead of after its session timeout: on close, a static member
/// sends no LeaveGroup (KIP-345), but after an unsubscribe it does. The revoke callback finds
/// nothing open (the session finished). librdkafka clears the member id when it gives the
/// membership up, then sends the LeaveGroup if it knows a coordinator (else the group times the
/// member out); the close that follows waits for its answer.
fn leave_group(consumer: &PipelineConsumer, deadline: Instant) {
    consumer.unsubscribe();
    let left = || member::of(consumer.client()).is_none_or(|m| m.id.is_empty());
    while !left() && Instant::now() < deadline {
        // Nothing polled now is processed: the subscription is gone and the session finished.
        let _ = consumer.poll(MAX_POLL);
    }
    if !left() {
        warn!("the consumer did not leave its group in time; the group will time it out");
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
///
/// A classic static member leaves first when `leave` (see [`leave_group`]).
fn close(consumer: PipelineConsumer, deadline: Instant, exiting: bool, leave: bool) {
    if leave {
        leave_group(&consumer, deadline);
    }
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

/// The final close, bounded by `deadline` even when one librdkafka call inside it blocks (the
/// revoke callback's, say): it runs on a thread of its own, which the process's exit ends if
/// it is still waiting. Leaving the group is a courtesy; the group times a member out anyway.
fn close_bounded(consumer: PipelineConsumer, deadline: Instant, leave: bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("exactly-close".into())
        .spawn(move || {
            close(consumer, deadline, true, leave);
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

/// A consumer whose context shares `session`, subscribed to the input.
fn subscribe(
    config: &Config,
    session: Arc<Mutex<Session>>,
    positions: Arc<Positions>,
    metrics: Arc<Metrics>,
) -> Result<PipelineConsumer, Error> {
    let group = &config.group;
    let role = Role::Pipeline {
        group: &group.group_id,
        instance: group
            .static_membership
            .then_some(group.instance_id.as_str()),
        statistics: config.lag_interval,
        poll_bound: config.loop_bound(),
        protocol: group.protocol,
    };
    let context = PipelineContext::new(session, positions, metrics);
    let consumer: PipelineConsumer = config.kafka.client(role).create_with_context(context)?;
    match &group.input {
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

/// What a consumer error means: nothing (end of a partition), a warning, a consumer to
/// replace, or the end. `fatal`: the code of the consumer's fatal error, if it has one.
fn consumer_error(e: KafkaError, fatal: Option<RDKafkaErrorCode>) -> Result<(), Interrupt> {
    let facts = Facts::of(&e);
    let exit = classify(KafkaCall::Produce, &facts) == Action::Exit;
    match e {
        KafkaError::PartitionEOF(_) => Ok(()),
        KafkaError::MessageConsumptionFatal(_)
            if fatal == Some(RDKafkaErrorCode::FencedInstanceId) =>
        {
            Err(Interrupt::InstanceFenced(e.to_string()))
        }
        // A fatal consumer error means this consumer instance is done. Fenced by its
        // group.instance.id (by its own rejoin after a session timeout, librdkafka#3437, or by
        // another process of the instance): the loop decides, see YIELD_WITHIN. Otherwise the
        // pipeline replaces it; anything unrecoverable (authorization) still exits.
        KafkaError::MessageConsumptionFatal(_) if !exit => {
            Err(Interrupt::ReplaceConsumer(e.to_string()))
        }
        _ if exit || matches!(e, KafkaError::MessageConsumptionFatal(_)) => {
            Err(Interrupt::Fail(Error::kafka("consuming", e)))
        }
        _ => {
            warn!(error = %e, "consumer error");
            Ok(())
        }
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

/// The output (and DLQ) topics must exist.
fn check_topics(driver: &Driver, config: &Config) -> Result<(), Error> {
    let mut needed = vec![("--output-topic", config.sink.output_topic.as_str())];
    if config.errors.on_error == OnError::Dlq {
        needed.push(("--dlq-topic", config.errors.dlq_topic.as_str()));
    }
    for (flag, topic) in needed {
        let exists = driver
            .exists(topic, config.sink.startup_timeout)
            .map_err(|e| Error::Startup(format!("{flag}: {e}")))?;
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
    Ok(())
}

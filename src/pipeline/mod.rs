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

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::backoff::Backoff;
use crate::config::{Config, Input, OnError};
use crate::error::Error;
use crate::health::Health;
use crate::kafka::Role;
use crate::kafka::consumer::{Fault, Received};
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
        let commits = consumer.owner().session().commits();
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
                let progressed = consumer.owner().session().commits() > commits;
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
    consumer.owner().session().replaced(&consumer);
    consumer.close(Instant::now() + Duration::from_secs(5), false, false);
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
        let mut session = consumer.owner().session();
        session.finish(&consumer, grace)
    });
    if result.is_err() {
        consumer.owner().session().abandon();
    }
    consumer.close_bounded(close_by, leave_static && result.is_ok());
    info!("exactly stopped");
    result
}

/// Polls and hands each turn to the session, until shutdown or an interrupt.
fn run_loop(
    consumer: &PipelineConsumer,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Interrupt> {
    let mut next = consumer.owner().session().next_poll();
    while !shutdown.is_cancelled() {
        health.beat();
        let polled = if next.read {
            consumer.poll(next.wait)
        } else {
            Ok(None)
        };
        let mut session = consumer.owner().session();
        if let Some(e) = session.take_fatal() {
            return Err(e.into());
        }
        let message = polled.map_err(interrupt)?;
        let record = message.as_ref().map(input_record);
        next = session.turn(record.as_ref(), consumer)?;
    }
    Ok(())
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
    let consumer = PipelineConsumer::create(&config.kafka.client(role), context)?;
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

/// What the loop does when its consumer cannot go on.
fn interrupt(fault: Fault) -> Interrupt {
    match fault {
        Fault::InstanceFenced(why) => Interrupt::InstanceFenced(why),
        Fault::Finished(why) => Interrupt::ReplaceConsumer(why),
        Fault::Exit(e) => Interrupt::Fail(Error::kafka("consuming", e)),
    }
}

/// Borrows a consumed message as an [`InputRecord`].
fn input_record<'a>(msg: &'a Received<'a>) -> InputRecord<'a> {
    InputRecord {
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp: msg.timestamp(),
        key: msg.key(),
        value: msg.value(),
        headers: msg.headers(),
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

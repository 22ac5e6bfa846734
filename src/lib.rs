//! exactly: Kafka topics to Kafka topics through a transform, exactly once.
//!
//! Output records and the consumer group's offsets are written in one Kafka transaction, so a
//! crash, restart or rebalance can neither lose a record (offsets committed before outputs) nor
//! duplicate one (outputs written before offsets).
//!
//! # Layout
//!
//! Imports run one way, from the leaves up; a module imports only from its own layer and those
//! below (`scripts/modgraph.py` checks it in CI, and that every module is in a layer; and
//! `scripts/sizes.py` that no file passes 800 lines nor function 80, tests apart):
//! `error`, `kafka`, `metrics`, `health`, `backoff`, `clock`, `db`, `http`, `lag`, `switches` →
//! `state`, `config`, `telemetry` → `transform`, `offsets`, `state_command` →
//! `headers`, `records`, `events` → `sink`, `audit` → `pipeline` → `sim` (testing only) → here.
//!
//! Only `kafka`, `sink/kafka`, `audit` and `offsets` name rust-rdkafka (`scripts/modgraph.py`
//! checks that too): everywhere else, Kafka is spoken of in exactly's own types.
//!
//! - [`config`]: the command line and `EXACTLY_…` environment, one file per subcommand,
//!   validated before anything runs; `exactly run`'s [`config::Config`] comes in the parts each
//!   piece is built from (group, sink, commit policy, error policy, test switches).
//! - [`pipeline`]: the loop, and (`pipeline::identity`) the claim that keeps a second process
//!   of one instance on a host from starting (exit code 5). A record is **read** by `poll` in `pipeline::run_loop` and handed
//!   to the [`pipeline::Session`], the one owner of the loop's state, whose `turn` **applies**
//!   it through the [`pipeline::Intake`] (the transform, or the call-out's stage, where records
//!   wait for the application's answer), **writes** its outputs or DLQ copy through
//!   `pipeline::writer` into the sink's open unit, and **commits** the unit with its offsets
//!   when it is due. The consumer's owner ([`pipeline::context`]), told of each rebalance from
//!   inside `poll`, reaches the same session to commit (or abort) before partitions move; [`pipeline::rewind`] is where every
//!   partition goes back to after an abort; [`pipeline::held`] pauses the partitions the
//!   transform cannot take now (the dedup's state has no home: the input grew). `pipeline/tests.rs`
//!   runs these orderings over the fakes of `pipeline/fake.rs`, without a broker.
//! - [`sink`]: where outputs go and how they become durable with the offsets: the
//!   [`sink::Sink`] seam in exactly's own terms (connect, begin, send, commit with offsets,
//!   abort, each answered with what the destination said: refused records, refusing routes;
//!   what is committed, partitions claimed), one file per destination ([`sink::kafka`]:
//!   transactions, or delivery-confirmed units at least once; [`sink::database`]: rows of a
//!   PostgreSQL, MySQL or MariaDB table with the offsets in the same database transaction,
//!   each partition claimed when assigned), the [`sink::Driver`] that turns a sink's failures
//!   into aborts and new clients and says when a rewind is owed, [`sink::ledger`] (each owned
//!   partition's offsets in one home: the first read since it was assigned and what the last
//!   commit sent, forgotten in one call on a revoke; the lag's floors are published from it;
//!   and what this process last committed in every partition it owned, kept beyond a revoke:
//!   where the offsets are the group's and its answer could be read, no start or rewind goes
//!   below it),
//!   [`sink::offsets`] (what a commit sends: past transaction markers, never past a record not
//!   yet applied), [`sink::rejected`] (what the replay of a record the broker refused sends
//!   instead), [`sink::routes`] (when a topic routed by the record that keeps refusing it
//!   becomes the record's fault) and [`sink::faults`] (testing only: failures on purpose).
//! - [`transform`]: the [`transform::Transform`] lifecycle (apply, what the writer made of the
//!   record, partitions assigned and revoked, how each unit its records went into ended; a bad
//!   record is not an unavailable transform, nor a held partition), one file per kind: passthrough,
//!   jq (jaq; programs of an enrichment's shape run straight over jaq's values, without its
//!   interpreter: `transform::jq::direct`), the stateful stage in its two modes (the dedup:
//!   the first record per key per window; the aggregates, `--aggregate`: count, sum and
//!   distinct per group per window), over [`state`]; and [`transform::call`], the call-out's wire format, its
//!   [`transform::call::Application`] seam and HTTP client, and the pure function from a
//!   record and its answer to outputs.
//! - [`state`]: state kept exactly once: windows of event time in a time zone, the keys seen
//!   per window and the groups' totals in two layers (the committed cache of the changelog,
//!   the open unit's), the changelog's record format, its topic (created or checked at start),
//!   its restore, the local store, and [`state::keeper`], which keeps each owned partition's
//!   state: read back at its first record, the open unit's changes, the store's checkpoints.
//!   The transform that uses it is [`transform::dedup`] (`--window`), built with the others in
//!   [`pipeline::Intake::build`].
//! - [`records`]: what goes out for one input (outputs with headers, or its DLQ copy), checked
//!   against the producer's size limit; shared by the pipeline and the audit's replay.
//! - [`headers`]: the lineage header on every output and the reason headers on DLQ records.
//! - [`kafka`]: a leaf: every client's librdkafka settings from one [`kafka::Settings`] and a
//!   [`kafka::Role`] (security settings for all of them, the one rule for what is a secret,
//!   [`kafka::Client`]: creates one, naming it and the option that holds a key librdkafka
//!   refuses, [`kafka::Refusal`]: the cluster refusing a client); [`kafka::Tp`], a partition; the
//!   librdkafka calls rust-rdkafka lacks, behind safe wrappers (producing through topic
//!   handles, header names as bytes, flush); [`kafka::failure`]: a failed call as the code
//!   outside kafka/ holds it ([`kafka::failure::ClientError`]) and [`kafka::failure::classify`],
//!   the one table that says what it means (retry, abort and rewind, unknown outcome,
//!   recreate, exit); [`kafka::consumer`]: the group's consumer in exactly's terms (polled
//!   records, faults, closing within a deadline; rebalances told to its
//!   [`kafka::consumer::Owner`]; the [`kafka::consumer::Group`] the sinks and the rewind use);
//!   the changelog's clients: [`kafka::admin`] (topics listed, created, described, grown),
//!   [`kafka::reader`] (one partition read in no group), [`kafka::ends`] (watermarks).
//! - [`error`]: the errors that stop a command.
//! - [`switches`] (testing only): the `--test-*` failures that act inside a product's work
//!   (a crash at a named step, a lost commit answer), installed once at start.
//! - [`backoff`]: every pause after failures in a row, one named schedule each; [`clock`]: the
//!   loop's pauses and the age of its open unit, which the simulator keeps on its own clock.
//! - `sim` (testing only): a deterministic simulator of the core. Two or three instances,
//!   each the real session over a model of the broker (transactions, epochs, the group's
//!   generations, the changelog), one seeded schedule of turns, deliveries, kill -9, freezes
//!   (inside a commit too), fences and unknown outcomes, and the invariants checked after every
//!   commit against a reference worked out apart; a failing seed replays.
//! - [`events`]: what happens to the pipeline (aborted, committed, rebalanced, producer
//!   recreated, record dead-lettered…), each a type whose `emit` logs and counts it.
//! - [`metrics`]: the Prometheus registry and typed handles; [`http`]: `/metrics`, `/livez`,
//!   `/readyz`; [`health`]: heartbeat of the loop and the watchdog that reports a stuck call;
//!   [`lag`]: lag and unstable records against the last stable offset.
//! - [`telemetry`]: logging (text or JSON).
//! - [`offsets`]: where a group's offsets are kept, one file per store (the Kafka group,
//!   Redis, MySQL, files), and `exactly offsets show|import|export`, which moves a position
//!   between them; the audit reads the group's committed offsets through it.
//! - [`db`]: the databases of [`sink::database`] (docs/database.md) behind one
//!   [`db::Session`]: a bounded connection whose failures are classified by kind (not one
//!   server's codes), the offsets table each partition's offset moves in by compare-and-set on
//!   its owner's epoch, the rows' table and the dead-letter table; `db::postgres`,
//!   `db::mysql` (MySQL, MariaDB, and the Spark recipes' `kafka_offset`); and
//!   [`db::Reader`], what `exactly audit` reads of a table.
//! - [`state_command`]: `exactly state show|import`: one key's windows in the dedup's
//!   changelog, and the seed's Redis sets (`dau:<dt>`) loaded into it for the cut-over.
//! - [`audit`]: `exactly audit`, which replays the transform (or the application's answers)
//!   over a range of the input and matches every output to its input (lost, duplicated,
//!   unexpected, order, hanging transactions), in topics or in a database sink's table.
//!
//! [`run`] ties them together; `main.rs` only parses, installs signal handling and dispatches.

pub mod audit;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod db;
pub mod error;
pub mod events;
pub mod headers;
pub mod health;
pub mod http;
pub mod kafka;
pub mod lag;
pub mod metrics;
pub mod offsets;
pub mod pipeline;
pub mod records;
#[cfg(test)]
mod sim;
pub mod sink;
pub mod state;
pub mod state_command;
pub mod switches;
pub mod telemetry;
pub mod transform;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Error;
use crate::health::Health;
use crate::metrics::Metrics;

/// Not ready from the moment shutdown starts, while the loop still commits and leaves.
async fn not_ready_from(shutdown: CancellationToken, health: Arc<Health>) {
    shutdown.cancelled().await;
    health.set_ready(false);
}

/// How long before the end of the shutdown grace a librdkafka call the loop is still inside
/// counts as stuck: in time to say so and exit 4 before `main` gives up (exit 3).
const GRACE_MARGIN: Duration = Duration::from_millis(500);

/// The call the loop is stuck in, if it is inside a librdkafka call when the shutdown grace
/// (begun when `shutdown` is cancelled) is all but over; else never.
async fn stuck_at_grace(
    health: Arc<Health>,
    shutdown: CancellationToken,
    grace: Duration,
) -> Option<String> {
    shutdown.cancelled().await;
    tokio::time::sleep(grace.saturating_sub(GRACE_MARGIN)).await;
    health.stuck_at_grace()
}

/// Stack of the loop thread: jq programs and JSON values recurse.
const LOOP_STACK: usize = 64 << 20;

/// Runs the pipeline until `shutdown` is cancelled or an unrecoverable error occurs.
///
/// The loop runs on a thread of its own, since librdkafka's calls block; the async side only
/// watches it. Cancelling `shutdown` makes the loop commit what is open and leave the group.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    switches::install(&config.test);
    // Before any client: a second process of this instance would fence this one's (exit 5).
    let _claim = if config.test.no_host_claim {
        None
    } else {
        let (group, kafka) = (&config.group, &config.kafka);
        pipeline::identity::claim_on_host(
            &kafka.bootstrap_servers,
            &group.group_id,
            &group.instance_id,
        )?
    };
    // Compiled before any client exists: a bad program fails start-up with jaq's message.
    let runtime = tokio::runtime::Handle::current();
    let metrics = Arc::new(Metrics::new());
    let intake = pipeline::Intake::build(&config, runtime, &metrics, &shutdown).await?;
    let health = Arc::new(Health::timed(metrics.blocking_call_duration.clone()));
    let stop_watching = CancellationToken::new();
    let bound = config.loop_bound();
    metrics
        .stuck_call_timeout
        .set(config.stuck_call_timeout.as_secs_f64());
    let mut watchdog = tokio::spawn(health.clone().watch(
        bound,
        config.stuck_call_timeout,
        metrics.clone(),
        stop_watching.clone(),
    ));

    tokio::spawn(not_ready_from(shutdown.clone(), health.clone()));
    events::initialise(&metrics, sink::REFUSERS);
    if let Some(addr) = config.http_addr {
        let bound = http::serve(
            addr,
            metrics.clone(),
            health.clone(),
            bound,
            stop_watching.clone(),
        )
        .await
        .map_err(|e| Error::Startup(format!("--http-addr {addr}: {e}")))?;
        tracing::info!(addr = %bound, "HTTP endpoints listening (/metrics /livez /readyz)");
    }

    let positions = Arc::new(lag::Positions::default());
    lag::spawn(
        &config.kafka,
        config.lag_interval,
        positions.clone(),
        metrics.clone(),
        stop_watching.clone(),
    )?;

    let at_grace = stuck_at_grace(health.clone(), shutdown.clone(), config.shutdown_grace);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let loop_health = health.clone();
    std::thread::Builder::new()
        .name("exactly-loop".into())
        .stack_size(LOOP_STACK)
        .spawn(move || {
            let result = pipeline::run(&config, intake, loop_health, metrics, positions, shutdown);
            let _ = tx.send(result);
        })
        .map_err(|e| Error::Startup(format!("cannot start the loop thread: {e}")))?;
    let result = tokio::select! {
        // A loop that has ended wins a tie with the watchdog.
        biased;
        r = rx => r.unwrap_or_else(|_| Err(Error::Startup("the loop thread panicked".into()))),
        // The loop thread stays inside its call; the process ends without it.
        Ok(Some(stuck)) = &mut watchdog => Err(Error::Stuck(stuck)),
        Some(stuck) = at_grace => Err(Error::Stuck(stuck)),
    };
    stop_watching.cancel();
    result
}

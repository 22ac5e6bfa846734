//! exactly: Kafka topics to Kafka topics through a transform, exactly once.
//!
//! Output records and the consumer group's offsets are written in one Kafka transaction, so a
//! crash, restart or rebalance can neither lose a record (offsets committed before outputs) nor
//! duplicate one (outputs written before offsets).
//!
//! # Layout
//!
//! - [`config`]: the command line and `EXACTLY_…` environment, validated before anything runs.
//! - [`pipeline`]: the loop. A record is **read** by `poll` in `Pipeline::run_loop`,
//!   **transformed** in `Pipeline::process`, **written** through [`txn::TxnDriver::send`], and
//!   **committed** with its offsets by [`txn::TxnDriver::commit`].
//! - [`txn`]: the transaction driver: begin, send, send offsets (the consumer's position when
//!   it is past transaction markers), commit, abort, recreate the producer, and the rewind an
//!   abort leaves pending.
//! - [`error`]: error types, and [`error::classify`], the one table that says what a failed
//!   Kafka call means (retry, abort and rewind, unknown outcome, recreate, exit).
//! - [`kafka`]: client settings, and the consumer context whose rebalance callback commits or
//!   aborts before partitions move.
//! - [`transform`]: pure record → records functions: passthrough and jq (jaq).
//! - [`records`]: what goes out for one input (outputs with headers, or its DLQ copy), checked
//!   against the producer's size limit; shared by the pipeline and the audit's replay.
//! - [`headers`]: the lineage header on every output and the reason headers on DLQ records;
//!   [`raw_headers`]: header names as bytes (librdkafka's calls behind a safe wrapper).
//! - [`rejected`]: records the broker rejects for what they are: which input each rejected
//!   delivery came from, and what its replay sends instead (its DLQ copy).
//! - [`health`]: heartbeat of the loop and the watchdog that reports a stuck call.
//! - [`metrics`]: the Prometheus registry and typed handles; [`http`]: `/metrics`, `/livez`,
//!   `/readyz`; [`lag`]: lag and unstable records against the last stable offset.
//! - [`telemetry`]: logging (text or JSON).
//! - [`audit`]: `exactly audit`, which replays the transform over a range of the input and
//!   matches every output to its input (lost, duplicated, unexpected, order, hanging
//!   transactions).
//!
//! [`run`] ties them together; `main.rs` only parses, installs signal handling and calls it.

pub mod audit;
pub mod config;
pub mod error;
pub mod headers;
pub mod health;
pub mod http;
pub mod kafka;
pub mod lag;
pub mod metrics;
pub mod pipeline;
pub mod raw_headers;
pub mod records;
pub mod rejected;
pub mod telemetry;
pub mod transform;
pub mod txn;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Error;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::transform::{Limits, Transform};

/// Stack of the loop thread: jq programs and JSON values recurse.
const LOOP_STACK: usize = 64 << 20;

/// Runs an audit: reads the history, replays the transform, returns the report.
pub fn audit(config: config::AuditConfig) -> Result<audit::Report, Error> {
    let t = &config.transform;
    let limits = Limits {
        max_output_bytes: t.max_output_bytes,
        max_outputs: t.max_outputs_per_record,
    };
    let transform = Transform::new(&t.spec, limits)?;
    let history = audit::read::collect(&config.plan)?;
    Ok(audit::analyze(
        &history,
        &transform,
        t.on_error,
        &config.plan.outputs[0],
        config.max_message_bytes,
    ))
}

/// Runs the pipeline until `shutdown` is cancelled or an unrecoverable error occurs.
///
/// The loop runs on a thread of its own, since librdkafka's calls block; the async side only
/// watches it. Cancelling `shutdown` makes the loop commit what is open and leave the group.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let limits = Limits {
        max_output_bytes: config.max_output_bytes,
        max_outputs: config.max_outputs_per_record,
    };
    // Compiled before any client exists: a bad program fails start-up with jaq's message.
    let transform = Transform::new(&config.transform, limits)?;
    let health = Arc::new(Health::default());
    let stop_watching = CancellationToken::new();
    // The longest a healthy loop blocks is one transactional call, bounded by the timeout.
    let bound = config.transaction_timeout + Duration::from_secs(15);
    tokio::spawn(health.clone().watch(bound, stop_watching.clone()));

    // Not ready from the moment shutdown starts, while the loop still commits and leaves.
    let (h, s) = (health.clone(), shutdown.clone());
    tokio::spawn(async move {
        s.cancelled().await;
        h.set_ready(false);
    });
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = config.http_addr {
        let bound = http::serve(
            addr,
            metrics.clone(),
            health.clone(),
            bound,
            stop_watching.clone(),
        )
        .await
        .map_err(|e| Error::Config(format!("--http-addr {addr}: {e}")))?;
        tracing::info!(addr = %bound, "HTTP endpoints listening (/metrics /livez /readyz)");
    }

    let positions = Arc::new(lag::Positions::default());
    lag::spawn(
        &config,
        positions.clone(),
        metrics.clone(),
        stop_watching.clone(),
    )?;

    let (tx, rx) = tokio::sync::oneshot::channel();
    let loop_health = health.clone();
    std::thread::Builder::new()
        .name("exactly-loop".into())
        .stack_size(LOOP_STACK)
        .spawn(move || {
            let result = pipeline::run(
                &config,
                transform,
                loop_health,
                metrics,
                positions,
                shutdown,
            );
            let _ = tx.send(result);
        })
        .map_err(|e| Error::Startup(format!("cannot start the loop thread: {e}")))?;
    let result = rx
        .await
        .unwrap_or_else(|_| Err(Error::Startup("the loop thread panicked".into())));
    stop_watching.cancel();
    result
}

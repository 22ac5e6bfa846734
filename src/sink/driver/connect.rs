//! Connecting the sink: at start-up, until --startup-timeout, and again after a client was
//! fenced or broke, backing off while that repeats.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{Driver, State};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::events::{AbortReason, Ended, ProducerRecreated};
use crate::metrics::Metrics;
use crate::sink::ledger::Ledger;
use crate::sink::offsets::CommitOffsets;
use crate::sink::rejected::Rejections;
use crate::sink::routes::Routes;
use crate::sink::{Bounds, Feedback, NotConnected, Settled, Sink, Wait};

/// How long the reports of an old client's last records are waited for before it is replaced.
const LAST_REPORTS: Duration = Duration::from_secs(1);

impl Driver {
    /// Connects `sink`, retrying until `startup_timeout` has passed.
    pub fn start(
        mut sink: Box<dyn Sink>,
        bounds: Bounds,
        startup_timeout: Duration,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<Driver, Error> {
        let deadline = Instant::now() + startup_timeout;
        let (mut last, mut attempts) = (None, 0);
        while Instant::now() < deadline && !shutdown.is_cancelled() {
            let left = deadline.saturating_duration_since(Instant::now());
            match sink.connect(&bounds.with_timeout(left)) {
                Ok(()) => {
                    return Ok(Driver {
                        sink,
                        bounds,
                        state: State::Idle,
                        ledger: Ledger::default(),
                        offsets: CommitOffsets::default(),
                        rejections: Rejections::default(),
                        failures: 0,
                        commits: 0,
                        unresolved: None,
                        settled: Vec::new(),
                        routes: Routes::default(),
                        heard: Feedback::default(),
                        fatal: None,
                        metrics,
                        shutdown,
                    });
                }
                Err(NotConnected::Refused(reason)) => return Err(Error::Refused(reason)),
                Err(NotConnected::Exit(e)) => return Err(e),
                Err(NotConnected::Retry(why)) => {
                    warn!(error = %why, "the sink did not connect; retrying");
                    attempts += 1;
                    crate::clock::pause(Backoff::STARTUP.after(attempts).min(left));
                    last = Some(why);
                }
            }
        }
        Err(Error::Startup(format!(
            "could not connect within {} (--startup-timeout){}",
            humantime::format_duration(startup_timeout),
            last.map(|e| format!(": {e}")).unwrap_or_default()
        )))
    }

    pub(super) fn fail_recreate(&mut self, reason: AbortReason) -> Result<(), Error> {
        if let State::Open(unit) = std::mem::replace(&mut self.state, State::RewindOwed) {
            // The new producer's init_transactions aborts it, unless its commit's outcome is
            // unknown: then what is committed tells.
            if !self.keep_unresolved(*unit) {
                self.settled.push(Settled::Dropped);
            }
            // Counted like any other abort (an unknown outcome once it is known).
            self.aborted_event(reason, Ended::Replaced);
        }
        self.failures += 1;
        self.recreate(reason)
    }

    /// Replaces the client: a new transactional producer's init_transactions bumps the epoch
    /// (fencing the old one) and completes whatever the old one left open. Backs off while
    /// failures repeat. A rewind is owed afterwards.
    pub(super) fn recreate(&mut self, reason: AbortReason) -> Result<(), Error> {
        // What was open is settled already (`fail_recreate`, `abort_with`); `begin` opened none.
        debug_assert!(!matches!(self.state, State::Open(_)));
        self.state = State::RewindOwed;
        // The old producer's reports die with it.
        self.hear(Wait::For(LAST_REPORTS));
        self.learn(false);
        self.reconnect(reason)
    }

    /// A new client in place of the old, between units: nothing is open, nothing owed.
    pub(super) fn renew(&mut self, reason: AbortReason) -> Result<(), Error> {
        debug_assert!(matches!(self.state, State::Idle));
        self.hear(Wait::For(LAST_REPORTS));
        self.learn(false);
        self.reconnect(reason)
    }

    /// Connects a new client until it works, backing off while failures repeat. Not ready
    /// while it fails (the destination is down: `ExactlyNotReady` fires), and alive: waiting
    /// out an outage is no stuck loop, and a restart would not end it.
    fn reconnect(&mut self, reason: AbortReason) -> Result<(), Error> {
        let mut attempt = 0u32;
        let health = self.bounds.health.clone();
        let was_ready = health.is_ready();
        loop {
            health.beat();
            if self.shutdown.is_cancelled() {
                // Nothing is open any more; the coordinator aborts what the old producer left,
                // or the next start fences it. Waiting for the broker would outlast the grace.
                return Err(Error::Stopped(format!(
                    "shutting down before the producer could be recreated ({}); the open \
                     transaction is left to the coordinator to abort",
                    reason.as_str()
                )));
            }
            let pause = Backoff::PRODUCER.after(self.failures.saturating_add(attempt));
            if !pause.is_zero() {
                info!(backoff = ?pause, reason = reason.as_str(), "waiting before reconnecting the sink");
                crate::clock::pause(pause);
            }
            match self.sink.connect(&self.bounds) {
                Ok(()) => {
                    let to = self.refuser();
                    ProducerRecreated { reason, to }.emit(&self.metrics);
                    if was_ready && !self.shutdown.is_cancelled() {
                        health.set_ready(true);
                    }
                    return Ok(());
                }
                Err(NotConnected::Exit(e)) => return Err(e),
                // The cluster took these settings before: a refusal now (credentials
                // rotated, a certificate renewed on one broker) may pass; keep backing off.
                Err(NotConnected::Retry(why) | NotConnected::Refused(why)) => {
                    error!(error = %why, reason = reason.as_str(), "could not reconnect the sink (a new producer, or a database connection); retrying");
                    health.set_ready(false);
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }
}

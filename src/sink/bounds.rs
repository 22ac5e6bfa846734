//! The bounds every blocking call of a sink runs within, and the watchdog that names it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use crate::backoff::Backoff;
use crate::health::Health;
use crate::kafka::failure::{Action, ClientError, KafkaCall, classify};

/// Bounded retries of one retriable call before it counts as a failure of its class.
const MAX_RETRIES: u32 = 5;

/// How long each blocking call may take, and who watches it.
pub struct Bounds {
    /// Heartbeat and the name of the call in progress.
    pub health: Arc<Health>,
    /// Every call is bounded by this (the transaction timeout).
    call_timeout: Duration,
    /// The shutdown grace, once shutdown began.
    deadline: Option<Instant>,
}

impl Bounds {
    /// Each call bounded by `call_timeout`, watched through `health`.
    pub fn new(health: Arc<Health>, call_timeout: Duration) -> Bounds {
        Bounds {
            health,
            call_timeout,
            deadline: None,
        }
    }

    /// The same, with each call bounded by `call_timeout` instead.
    pub fn with_timeout(&self, call_timeout: Duration) -> Bounds {
        Bounds {
            health: self.health.clone(),
            call_timeout: call_timeout.min(self.call_timeout),
            deadline: self.deadline,
        }
    }

    /// Bounds every later call by `deadline` too (the shutdown grace).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// The bound of the next call: the call timeout, or less once a deadline is near.
    pub fn timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self
                .call_timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => self.call_timeout,
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Calls `f` (named `name` to the watchdog) until it succeeds, or fails with anything but
    /// a retriable error of `call`, or has been retried [`MAX_RETRIES`] times, or the deadline
    /// passed. The error comes back with what it means.
    pub fn retry<T, E: Into<ClientError>>(
        &self,
        call: KafkaCall,
        name: &'static str,
        mut f: impl FnMut(Duration) -> Result<T, E>,
    ) -> Result<T, (Action, ClientError)> {
        let mut tries = 0;
        loop {
            let result = {
                let _g = self.health.in_kafka_call(name);
                f(self.timeout())
            };
            let e: ClientError = match result {
                Ok(v) => return Ok(v),
                Err(e) => e.into(),
            };
            match classify(call, &e.facts()) {
                Action::Retry if tries < MAX_RETRIES && !self.past_deadline() => {
                    tries += 1;
                    debug!(error = %e, tries, "{name}: retrying");
                    Backoff::KAFKA_CALL.wait(tries);
                }
                action => return Err((action, e)),
            }
        }
    }
}

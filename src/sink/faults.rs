//! Testing only: a sink in front of the real one that fails on purpose (`--test-abort-every`,
//! `--test-abort-probability`, `--test-fail-sends`). Its failures are the ones a real sink
//! reports, so they take the driver's real paths: an abortable commit, a failed send.

use std::time::Duration;

use tracing::{info, warn};

use super::{Bounds, Failed, Feedback, Group, NotConnected, Record, Reply, Sink, Wait};
use crate::config::{TestAborts, TestSwitches};
use crate::events::AbortReason;
use crate::kafka::Tp;

/// `sink`, behind the switches in `test` if any is set.
pub fn wrap(sink: Box<dyn Sink>, test: &TestSwitches) -> Box<dyn Sink> {
    if test.aborts.is_none() && test.fail_sends == 0 {
        return sink;
    }
    Box::new(Faults {
        inner: sink,
        aborts: test.aborts,
        fail_sends: test.fail_sends,
        attempts: 0,
        rng: seed(),
    })
}

struct Faults {
    inner: Box<dyn Sink>,
    aborts: Option<TestAborts>,
    /// Sends left to fail.
    fail_sends: u64,
    /// Commits attempted.
    attempts: u64,
    rng: u64,
}

impl Faults {
    fn abort_this_one(&mut self) -> bool {
        self.attempts += 1;
        match self.aborts {
            None => false,
            Some(TestAborts::Every(n)) => self.attempts.is_multiple_of(n),
            Some(TestAborts::Probability(p)) => {
                // xorshift64: test-only randomness without a dependency.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                ((self.rng >> 11) as f64 / (1u64 << 53) as f64) < p
            }
        }
    }
}

impl Sink for Faults {
    fn connect(&mut self, bounds: &Bounds) -> Result<(), NotConnected> {
        self.inner.connect(bounds)
    }

    fn begin(&mut self, watch: bool, bounds: &Bounds) -> Result<(), Failed> {
        self.inner.begin(watch, bounds)
    }

    fn send(&mut self, record: Record<'_, '_>, bounds: &Bounds) -> Result<(), Failed> {
        if self.fail_sends > 0 {
            self.fail_sends -= 1;
            warn!("test switch: failing this send");
            return Err(Failed::Abort(AbortReason::ProduceFailed));
        }
        self.inner.send(record, bounds)
    }

    fn hear(&mut self, wait: Wait, bounds: &Bounds) -> Feedback {
        self.inner.hear(wait, bounds)
    }

    fn commit(&mut self, offsets: &[(Tp, i64)], group: &dyn Group, bounds: &Bounds) -> Reply {
        if self.abort_this_one() {
            info!("test switch: aborting this transaction instead of committing it");
            return Reply::of(Err(Failed::Abort(AbortReason::TestInjected)));
        }
        self.inner.commit(offsets, group, bounds)
    }

    fn abort(&mut self, reason: AbortReason, bounds: &Bounds) -> Reply {
        self.inner.abort(reason, bounds)
    }

    fn committed(
        &self,
        group: &dyn Group,
        partitions: &[Tp],
        timeout: Duration,
    ) -> Result<super::Committed, super::Unreadable> {
        self.inner.committed(group, partitions, timeout)
    }

    fn claim(
        &mut self,
        partitions: &[Tp],
        group: &dyn Group,
        bounds: &Bounds,
    ) -> Result<super::Starts, Failed> {
        self.inner.claim(partitions, group, bounds)
    }

    fn revoked(&mut self, partitions: &[Tp]) {
        self.inner.revoked(partitions)
    }

    fn exists(&self, name: &str, timeout: Duration) -> Result<bool, String> {
        self.inner.exists(name, timeout)
    }

    fn idle(&mut self, group: &dyn Group, last: bool) {
        self.inner.idle(group, last)
    }

    fn destination(&self) -> super::Destination {
        self.inner.destination()
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

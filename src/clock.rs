//! The loop's time: how long it pauses, and how old its open unit is. Both go through here, so
//! that the simulator (`crate::sim`, testing only) can keep them on its own clock: a pause is
//! counted there instead of slept, and the time the simulator passes is added to `now`.

use std::time::{Duration, Instant};

/// Sleeps for `d`.
pub fn pause(d: Duration) {
    if d.is_zero() {
        return;
    }
    #[cfg(test)]
    if simulated::paused(d) {
        return;
    }
    std::thread::sleep(d);
}

/// The wall clock, in ms since the Unix epoch: what an event time is held to.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Now, for the ages of units (when one is due to commit).
pub fn now() -> Instant {
    #[cfg(test)]
    return Instant::now() + simulated::passed();
    #[cfg(not(test))]
    Instant::now()
}

/// The simulator's clock, on the threads that ask for it.
#[cfg(test)]
pub mod simulated {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        /// Pauses added up since the last take; `None`: this thread sleeps for real.
        static PAUSED: Cell<Option<Duration>> = const { Cell::new(None) };
        /// The simulated time passed so far.
        static PASSED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// From now on this thread's pauses are added up instead of slept, and its clock starts
    /// from the real one again.
    pub fn start() {
        PAUSED.with(|p| p.set(Some(Duration::ZERO)));
        PASSED.with(|p| p.set(Duration::ZERO));
    }

    /// The pauses added up since the last take.
    pub fn take() -> Duration {
        PAUSED.with(|p| match p.get() {
            Some(d) => {
                p.set(Some(Duration::ZERO));
                d
            }
            None => Duration::ZERO,
        })
    }

    /// `d` of simulated time passes.
    pub fn pass(d: Duration) {
        PASSED.with(|p| p.set(p.get().saturating_add(d)));
    }

    /// The simulated time passed so far.
    pub(super) fn passed() -> Duration {
        PASSED.with(Cell::get)
    }

    /// Whether `d` was added up (this thread's pauses are simulated).
    pub(super) fn paused(d: Duration) -> bool {
        PAUSED.with(|p| match p.get() {
            Some(sum) => {
                p.set(Some(sum.saturating_add(d)));
                true
            }
            None => false,
        })
    }
}

//! How long to wait after failures in a row: one [`Backoff`] type, one named schedule per kind
//! of failure, so every pause in the program is read from this table.

use std::time::Duration;

/// A doubling back-off: no pause for the first `free` failures in a row, then `first`,
/// doubling with each further failure, up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    free: u32,
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// Replacing a fenced or broken producer: the first at once (a fence is no outage), then
    /// 100 ms doubling to 10 s while replacements fail or repeat.
    pub const PRODUCER: Backoff =
        Backoff::new(1, Duration::from_millis(100), Duration::from_secs(10));
    /// Reading again after aborts in a row (a broker outage, an output the broker keeps
    /// refusing): the first at once, then 100 ms doubling to 5 s, so the loop does not spin.
    pub const ABORTS: Backoff = Backoff::new(1, Duration::from_millis(100), Duration::from_secs(5));
    /// Calling the application again after failed calls: 100 ms doubling to 5 s.
    pub const APPLICATION: Backoff =
        Backoff::new(0, Duration::from_millis(100), Duration::from_secs(5));
    /// Reading the committed offsets again for a rewind: 100 ms doubling to 5 s.
    pub const READ_COMMITTED: Backoff =
        Backoff::new(0, Duration::from_millis(100), Duration::from_secs(5));
    /// A retriable Kafka call made again within one step (a coordinator moving): 50 ms
    /// doubling to 250 ms.
    pub const KAFKA_CALL: Backoff =
        Backoff::new(0, Duration::from_millis(50), Duration::from_millis(250));
    /// A new consumer joining after the last one was finished (fenced): 1 s doubling to 10 s.
    pub const CONSUMER: Backoff = Backoff::new(0, Duration::from_secs(1), Duration::from_secs(10));
    /// The audit reading a watermark again while a partition's leader moves: every 300 ms.
    pub const LEADER_MOVES: Backoff =
        Backoff::new(0, Duration::from_millis(300), Duration::from_millis(300));
    /// Trying a held partition again (its state has no home yet): 1 s doubling to 30 s.
    pub const HELD: Backoff = Backoff::new(0, Duration::from_secs(1), Duration::from_secs(30));
    /// Connecting the sink at start-up: every 500 ms until --startup-timeout.
    pub const STARTUP: Backoff =
        Backoff::new(0, Duration::from_millis(500), Duration::from_millis(500));

    const fn new(free: u32, first: Duration, max: Duration) -> Backoff {
        Backoff { free, first, max }
    }

    /// Pauses for [`Backoff::after`] `failures` ([`crate::clock::pause`]).
    pub fn wait(self, failures: u32) {
        crate::clock::pause(self.after(failures));
    }

    /// The pause after `failures` failures in a row.
    pub fn after(self, failures: u32) -> Duration {
        if failures <= self.free {
            return Duration::ZERO;
        }
        let doublings = (failures - self.free - 1).min(16);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn each_schedule_starts_doubles_and_caps() {
        let p = Backoff::PRODUCER;
        assert_eq!(
            [0, 1, 2, 3, 8].map(|n| p.after(n)),
            [0, 0, 100, 200, 6400].map(MS)
        );
        assert_eq!(p.after(10), Duration::from_secs(10));
        assert_eq!(p.after(u32::MAX), Duration::from_secs(10));
        let a = Backoff::APPLICATION;
        assert_eq!(
            [1, 2, 6, 7].map(|n| a.after(n)),
            [100, 200, 3200, 5000].map(MS)
        );
        assert_eq!(a.after(100), Duration::from_secs(5));
        let k = Backoff::KAFKA_CALL;
        assert_eq!(
            [1, 2, 3, 4, 5].map(|n| k.after(n)),
            [50, 100, 200, 250, 250].map(MS)
        );
        let c = Backoff::CONSUMER;
        assert_eq!([1, 2, 4, 5].map(|n| c.after(n).as_secs()), [1, 2, 8, 10]);
        assert_eq!(Backoff::ABORTS.after(1), Duration::ZERO);
        assert_eq!(Backoff::ABORTS.after(2), MS(100));
        assert_eq!(Backoff::STARTUP.after(1), Backoff::STARTUP.after(9));
    }
}

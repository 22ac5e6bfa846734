//! Testing only: the failures that the `--test-*` switches of the process ask for in the
//! middle of a product's work, in one place. They are installed once, at start
//! ([`install`]); the product asks at named points ([`crash_point`], [`lose_db_answer`],
//! [`restore_pace`]) and keeps nothing of them in its own types. A process that installed
//! no switch (every unit test, every real run) gets no failure. The switches around a product
//! (a sink failing on purpose, an unavailable transform, no host claim) wrap it where it is
//! built: `sink::faults`, `transform::unavailable_first`, `run`.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tracing::{error, warn};

/// Testing only: transactions to abort instead of committing, through the same path as an
/// abortable commit error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TestAborts {
    /// Every Nth commit.
    Every(u64),
    /// Each commit with this probability.
    Probability(f64),
}

/// Testing only: failures on purpose, through the same paths as real ones. None by default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TestSwitches {
    /// Transactions to abort instead of committing.
    pub aborts: Option<TestAborts>,
    /// Sends that fail before reaching librdkafka.
    pub fail_sends: u64,
    /// No claim of the instance on the host (two processes of one instance on one host).
    pub no_host_claim: bool,
    /// Records the transform refuses as unavailable first.
    pub unavailable: u64,
    /// The commit after which the dedup crashes before its local store write.
    pub crash_before_store: Option<u64>,
    /// How long the dedup's restore takes per changelog record.
    pub restore_pace: Option<Duration>,
    /// The database commit after which the process aborts, before the group copy.
    pub crash_after_db_commit: Option<u64>,
    /// Every Nth database commit's answer is lost (the connection dropped after it).
    pub lose_db_commit_answers: Option<u64>,
}

/// What was installed, and how far each count has got.
struct Installed {
    crash_after_db_commit: Option<u64>,
    crash_before_store: Option<u64>,
    lose_db_commit_answers: Option<u64>,
    restore_pace: Option<Duration>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    db_commits: u64,
    store_writes: u64,
    db_answers: u64,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Installs the switches of `test` for the rest of the process (the first call wins).
pub fn install(test: &TestSwitches) {
    let _ = INSTALLED.set(Installed::new(test));
}

/// Where a switch may end the process with `abort` (a kill -9 at a chosen step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// After a database commit, before the group's copy of its offsets
    /// (`--test-crash-after-db-commit N`: the Nth).
    AfterDbCommit,
    /// After a commit with changes for the local store, before writing them
    /// (`--test-crash-before-store N`: the Nth).
    BeforeStore,
}

/// The product passed `at`: the process aborts if a switch says this is the time.
pub fn crash_point(at: Crash) {
    if !INSTALLED.get().is_some_and(|i| i.crash_due(at)) {
        return;
    }
    match at {
        Crash::AfterDbCommit => {
            warn!("--test-crash-after-db-commit: aborting after the database commit")
        }
        Crash::BeforeStore => error!("test: crashing after a commit, before its local store write"),
    }
    std::process::abort();
}

/// Whether this database commit's answer is lost (`--test-lose-db-commit-answers N`: every
/// Nth): the commit took effect, and the sink hears that the connection dropped.
pub fn lose_db_answer() -> bool {
    INSTALLED.get().is_some_and(Installed::answer_lost)
}

impl Installed {
    fn new(test: &TestSwitches) -> Installed {
        Installed {
            crash_after_db_commit: test.crash_after_db_commit,
            crash_before_store: test.crash_before_store,
            lose_db_commit_answers: test.lose_db_commit_answers,
            restore_pace: test.restore_pace,
            counts: Mutex::default(),
        }
    }

    /// Counts one pass of `at`: whether it is the one to crash at (the Nth).
    fn crash_due(&self, at: Crash) -> bool {
        let due = match at {
            Crash::AfterDbCommit => self.crash_after_db_commit,
            Crash::BeforeStore => self.crash_before_store,
        };
        let Some(due) = due else { return false };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = match at {
            Crash::AfterDbCommit => &mut counts.db_commits,
            Crash::BeforeStore => &mut counts.store_writes,
        };
        *count += 1;
        *count == due
    }

    /// Counts one commit answer: whether it is lost (every Nth).
    fn answer_lost(&self) -> bool {
        let Some(every) = self.lose_db_commit_answers else {
            return false;
        };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.db_answers += 1;
        counts.db_answers.is_multiple_of(every)
    }
}

/// How long a restore takes per changelog record (`--test-restore-pace`), if it is slowed.
pub fn restore_pace() -> Option<Duration> {
    INSTALLED.get()?.restore_pace
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Nth pass is the one (counted apart per point), and a point whose switch is not set
    /// counts nothing; every Nth answer is lost. (On an `Installed` of the test's own: the
    /// process's stays empty.)
    #[test]
    fn each_switch_fires_at_its_nth_pass() {
        let i = Installed::new(&TestSwitches {
            crash_after_db_commit: Some(3),
            lose_db_commit_answers: Some(2),
            ..TestSwitches::default()
        });
        let fired: Vec<bool> = (0..4).map(|_| i.crash_due(Crash::AfterDbCommit)).collect();
        assert_eq!(fired, [false, false, true, false]);
        assert!(!(0..5).any(|_| i.crash_due(Crash::BeforeStore)));
        let lost: Vec<bool> = (0..4).map(|_| i.answer_lost()).collect();
        assert_eq!(lost, [false, true, false, true]);
        let none = Installed::new(&TestSwitches::default());
        assert!(!none.crash_due(Crash::AfterDbCommit) && !none.answer_lost());
        assert!(INSTALLED.get().is_none());
    }
}

//! The simulator's schedules: a run of seeds in CI, a seed replayed on demand.

/// How many schedules a run takes, from which seed: `EXACTLY_SIM_SEEDS` (default 2000) from
/// `EXACTLY_SIM_FROM` (default 0); `EXACTLY_SIM_SEED` replays one.
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("EXACTLY_SIM_SEED") {
        return seed..seed + 1;
    }
    let from = var("EXACTLY_SIM_FROM").unwrap_or(0);
    from..from + var("EXACTLY_SIM_SEEDS").unwrap_or(2000)
}

/// Names the seed of a schedule that panicked.
struct Seed(u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "sim: seed {} failed; replay it with EXACTLY_SIM_SEED={} cargo test --lib sim::",
                self.0, self.0
            );
        }
    }
}

/// What a run of many seeds must have done at least once: else the schedules no longer reach
/// what they are for.
const COVERED: [&str; 20] = [
    "transactions committed",
    "transactions aborted",
    "transactions timed out",
    "sessions expired",
    "kill -9",
    "clean stops",
    "frozen between turns",
    "frozen in flush",
    "frozen in send_offsets",
    "frozen in commit_transaction",
    "woke in a call after its session expired",
    "commits of an owner whose session expired",
    "offset commits fenced by the group",
    "deliveries fenced",
    "records refused for what they are",
    "commits refused (abortable)",
    "commits unknown, committed",
    "commits unknown, lost",
    "commits fenced after they took effect",
    "fetches waiting for a transaction's offsets",
];

/// Runs every `n`th seed from the `k`th of [`seeds`]: what happened, by what.
fn run_seeds(k: u64, n: u64) -> std::collections::BTreeMap<&'static str, u64> {
    let mut seen = std::collections::BTreeMap::new();
    for seed in seeds().filter(|s| s % n == k) {
        let _named = Seed(seed);
        for (what, count) in super::run(seed) {
            *seen.entry(what).or_default() += count;
        }
    }
    seen
}

/// The schedules, in two halves on two threads (the test harness runs them side by side);
/// the second also checks what both did.
#[test]
fn every_schedule_keeps_every_record_exactly_once_even_seeds() {
    run_seeds(0, 2);
}

#[test]
fn every_schedule_keeps_every_record_exactly_once_odd_seeds() {
    let seen = run_seeds(1, 2);
    let seeds = seeds();
    let table: Vec<String> = seen.iter().map(|(k, v)| format!("{v:>8}  {k}")).collect();
    eprintln!("sim: odd seeds of {seeds:?}\n{}", table.join("\n"));
    if seeds.end - seeds.start >= 100 {
        let missing: Vec<&&str> = COVERED.iter().filter(|k| !seen.contains_key(**k)).collect();
        assert!(missing.is_empty(), "never happened: {missing:?}");
    }
}

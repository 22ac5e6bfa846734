//! The simulator's schedules: a run of seeds in CI, a seed replayed on demand.

/// How many schedules a run takes, from which seed: `EXACTLY_SIM_SEEDS` (default 300) from
/// `EXACTLY_SIM_FROM` (default 0); `EXACTLY_SIM_SEED` replays one.
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("EXACTLY_SIM_SEED") {
        return seed..seed + 1;
    }
    let from = var("EXACTLY_SIM_FROM").unwrap_or(0);
    from..from + var("EXACTLY_SIM_SEEDS").unwrap_or(300)
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

#[test]
fn every_schedule_keeps_every_record_exactly_once() {
    for seed in seeds() {
        let _named = Seed(seed);
        super::run(seed);
    }
}

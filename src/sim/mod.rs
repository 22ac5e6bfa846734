//! A deterministic simulator of the core (testing only), after FoundationDB's simulation and
//! TigerBeetle's VOPR: two or three exactly instances, each the real [`Session`] with its
//! writer, driver, rewind and dedup, share a model of a Kafka cluster ([`model`]), and one
//! seeded random number generator schedules everything that happens: loop turns, deliveries
//! of produced records, time passing (sessions expire, transactions time out), kill -9 and
//! restarts, clean stops, processes frozen between turns or in the middle of a commit (the
//! others run on meanwhile: the frozen one wakes after its session expired), commits that fail,
//! whose outcome is unknown, or that took effect and are answered "fenced", sends that fail,
//! records the broker refuses. After every step that committed something, the committed
//! outputs, dead-letter copies, offsets and changelog are checked against a reference worked
//! out apart from exactly ([`oracle`]); at the end every fault heals and the input must be
//! committed to its end. A failing seed is printed and replays exactly
//! (`EXACTLY_SIM_SEED=<seed> cargo test --lib sim::`).
//!
//! [`Session`]: crate::pipeline::Session

mod instance;
mod model;
mod oracle;
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::CommitPolicy;
use crate::pipeline::Interrupt;
use crate::transform::OwnedRecord;
use instance::Instance;
use model::{EndFault, Model, Timeouts};
use oracle::{Mode, Reference, WINDOW_MS};

/// The session timeout and the transaction timeout of the model, in ms.
const TIMEOUTS: Timeouts = Timeouts {
    session: 1_000,
    transaction: 6_000,
};

/// Everything one schedule shares: the model, the random choices, the instances.
pub struct Shared {
    model: Mutex<Model>,
    rng: Mutex<StdRng>,
    /// Each instance, while it is alive; locked while it takes a step (a step of another one
    /// from inside it, while it is frozen, finds it locked and leaves it alone).
    slots: Vec<Mutex<Option<Instance>>>,
    /// Instances frozen between turns, until a time of the model's clock.
    frozen: Mutex<BTreeMap<usize, u64>>,
    commit: CommitPolicy,
    metrics: Arc<crate::metrics::Metrics>,
    /// What the instances run.
    pub mode: Mode,
    reference: Reference,
    /// The last steps, for the report of a failure.
    trace: Mutex<VecDeque<String>>,
    /// How deep the freezes inside calls are nested.
    depth: Mutex<u32>,
    /// Faults are injected (false once the schedule heals).
    faults: Mutex<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The model. Never held across a call into an instance.
    pub fn model(&self) -> MutexGuard<'_, Model> {
        lock(&self.model)
    }

    fn chance(&self, p: f64) -> bool {
        lock(&self.rng).random_bool(p)
    }

    fn pick(&self, n: usize) -> usize {
        lock(&self.rng).random_range(0..n)
    }

    fn note(&self, what: String) {
        let now = self.model().now;
        let mut t = lock(&self.trace);
        if t.len() == 300 {
            t.pop_front();
        }
        t.push_back(format!("{now:>6} ms  {what}"));
    }

    fn faults(&self) -> bool {
        *lock(&self.faults)
    }

    /// Counts one `what`, for the run's coverage.
    pub fn count(&self, what: &'static str) {
        self.model().count(what);
    }
}

/// A point inside instance `i`'s transaction call `phase`: the process may freeze here. The
/// others run on (its session expires, its partitions move) until it wakes, within its
/// transaction timeout or not.
pub fn hook(shared: &Arc<Shared>, i: usize, phase: &str) {
    if !shared.faults() || *lock(&shared.depth) > 0 || !shared.chance(0.04) {
        return;
    }
    let ms = 1_000 + shared.pick(7_000) as u64;
    shared.note(format!("#{i} frozen in {phase} for {ms} ms"));
    shared.count(match phase {
        "flush" => "frozen in flush",
        "send_offsets" => "frozen in send_offsets",
        _ => "frozen in commit_transaction",
    });
    *lock(&shared.depth) += 1;
    let until = shared.model().now + ms;
    while shared.model().now < until {
        step(shared, Some(i));
    }
    *lock(&shared.depth) -= 1;
    shared.note(format!("#{i} wakes in {phase}"));
    if shared.model().expelled(i) {
        shared.count("woke in a call after its session expired");
    }
}

/// Takes one random step, never instance `not` (frozen inside a call).
fn step(shared: &Arc<Shared>, not: Option<usize>) {
    let n = shared.slots.len();
    let i = shared.pick(n);
    let faults = shared.faults();
    let roll = shared.pick(1000);
    match roll {
        0..550 => turn(shared, i, not),
        550..700 if !frozen(shared, i) => {
            let k = 1 + shared.pick(4);
            shared.model().deliver(i, k);
        }
        700..900 => tick(shared, 1 + shared.pick(150) as u64),
        900..910 if faults && Some(i) != not => kill(shared, i),
        910..960 if Some(i) != not => start(shared, i),
        960..970 if faults && Some(i) != not => freeze(shared, i),
        970..973 if faults && Some(i) != not => stop(shared, i),
        973..1000 if faults => arm(shared, i),
        _ => tick(shared, 10),
    }
    // The pauses the step took (back-offs) pass on the model's clock too.
    tick(shared, crate::clock::simulated::take().as_millis() as u64);
    check(shared);
}

/// Whether instance `i` is frozen, between turns or inside a call (its slot held up the
/// stack).
fn frozen(shared: &Arc<Shared>, i: usize) -> bool {
    lock(&shared.frozen).contains_key(&i) || shared.slots[i].try_lock().is_err()
}

/// Time passes; instances neither frozen nor dead heartbeat meanwhile (librdkafka's thread
/// does, whatever the loop is doing).
fn tick(shared: &Arc<Shared>, ms: u64) {
    if ms == 0 {
        return;
    }
    let now = shared.model().now + ms;
    lock(&shared.frozen).retain(|_, until| *until > now);
    let mut alive = Vec::new();
    for (i, slot) in shared.slots.iter().enumerate() {
        if lock(&shared.frozen).contains_key(&i) {
            continue;
        }
        // Held up the stack: frozen inside a call.
        let Ok(slot) = slot.try_lock() else {
            continue;
        };
        if let Some(instance) = slot.as_ref() {
            alive.push(instance.group.member_id());
        }
    }
    shared.model().tick(ms, &alive);
    crate::clock::simulated::pass(std::time::Duration::from_millis(ms));
}

/// One loop turn of instance `i`, unless it is dead, frozen, or `not`.
fn turn(shared: &Arc<Shared>, i: usize, not: Option<usize>) {
    if Some(i) == not || lock(&shared.frozen).contains_key(&i) {
        return;
    }
    let Ok(mut slot) = shared.slots[i].try_lock() else {
        return;
    };
    let Some(instance) = slot.as_mut() else {
        return;
    };
    match instance.turn() {
        Ok(_) => {}
        Err(Interrupt::ReplaceConsumer(why) | Interrupt::InstanceFenced(why)) => {
            shared.note(format!("#{i} replaces its consumer: {why}"));
            shared.count("consumers replaced");
            instance.replace_consumer();
        }
        Err(Interrupt::Fail(e)) => panic!("instance {i} stopped: {e}"),
    }
}

/// Instance `i` is killed (-9): its producer's records are gone, its transaction stays open.
fn kill(shared: &Arc<Shared>, i: usize) {
    let Ok(mut slot) = shared.slots[i].try_lock() else {
        return;
    };
    if slot.take().is_some() {
        shared.note(format!("#{i} killed"));
        shared.count("kill -9");
        shared.model().killed(i);
        lock(&shared.frozen).remove(&i);
    }
}

/// Instance `i` starts, if it is not running.
fn start(shared: &Arc<Shared>, i: usize) {
    let Ok(mut slot) = shared.slots[i].try_lock() else {
        return;
    };
    if slot.is_none() {
        shared.note(format!("#{i} starts"));
        *slot = Some(Instance::start(shared, i, shared.commit, shared.mode));
    }
}

/// Instance `i` stops cleanly (SIGTERM).
fn stop(shared: &Arc<Shared>, i: usize) {
    if lock(&shared.frozen).contains_key(&i) {
        return;
    }
    let Ok(mut slot) = shared.slots[i].try_lock() else {
        return;
    };
    if let Some(instance) = slot.take() {
        shared.note(format!("#{i} stops"));
        shared.count("clean stops");
        if let Err(e) = instance.stop() {
            shared.note(format!("#{i} stopped with {e}"));
        }
        shared.model().killed(i);
    }
}

/// Instance `i` is frozen between turns (SIGSTOP) for a while.
fn freeze(shared: &Arc<Shared>, i: usize) {
    let ms = 500 + shared.pick(8_000) as u64;
    let until = shared.model().now + ms;
    shared.note(format!("#{i} frozen between turns for {ms} ms"));
    shared.count("frozen between turns");
    lock(&shared.frozen).insert(i, until);
}

/// Instance `i`'s next commit or send goes wrong.
fn arm(shared: &Arc<Shared>, i: usize) {
    let fault = match shared.pick(5) {
        0 => Some(EndFault::Abortable),
        1 => Some(EndFault::UnknownCommitted),
        2 => Some(EndFault::UnknownLost),
        3 => Some(EndFault::FencedAfterCommit),
        _ => None,
    };
    shared.note(format!("#{i} armed: {fault:?} (else a failed send)"));
    let mut m = shared.model();
    match fault {
        Some(f) => {
            m.end_faults.insert(i, f);
        }
        None => *m.send_faults.entry(i).or_default() += 1,
    }
}

/// After a step that committed something: the invariants.
fn check(shared: &Arc<Shared>) {
    let mut m = shared.model();
    let said = std::mem::take(&mut m.log);
    drop(m);
    for line in said {
        shared.note(line);
    }
    let mut m = shared.model();
    if !m.changed {
        return;
    }
    m.changed = false;
    if let Err(e) = shared.reference.check(&m) {
        let input = shared.reference.show(&m);
        drop(m);
        fail(shared, &format!("{e}\nthe input:\n{input}"));
    }
}

fn fail(shared: &Arc<Shared>, why: &str) -> ! {
    let trace: Vec<String> = lock(&shared.trace).iter().cloned().collect();
    panic!("{why}\nthe last steps:\n{}", trace.join("\n"));
}

/// One schedule's shape, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Records per input partition.
    pub input: Vec<Vec<OwnedRecord>>,
    /// What the instances run.
    pub mode: Mode,
    /// Instances.
    pub instances: usize,
    /// Records a unit commits at.
    pub per_unit: u64,
    /// The commit interval, in ms of the model's clock.
    pub interval: u64,
    /// Random steps before the faults heal.
    pub steps: usize,
}

impl Plan {
    /// The plan of `seed`: the dedup, the updates or the final totals; 2 or 3 partitions of 10
    /// to 30 records, keys of six devices, their times moving on (an hour's windows close), now
    /// and then a late one or one whose outputs the broker refuses (an odd timestamp).
    pub fn of(rng: &mut StdRng) -> Plan {
        let mode = [Mode::Dedup, Mode::Updates, Mode::Final][rng.random_range(0..3)];
        let partitions = rng.random_range(2..=3);
        let input = (0..partitions).map(|p| records(rng, p)).collect();
        Plan {
            input,
            mode,
            instances: rng.random_range(2..=3),
            per_unit: rng.random_range(1..=8),
            interval: rng.random_range(50..1_000),
            steps: rng.random_range(200..600),
        }
    }
}

/// Partition `p`'s records.
fn records(rng: &mut StdRng, p: i32) -> Vec<OwnedRecord> {
    let (mut t, n) = (1_700_000_000_000i64, rng.random_range(10..=30));
    let mut records = Vec::new();
    for o in 0..n {
        t += rng.random_range(0..20) * 60_000;
        let mut at = t;
        if rng.random_bool(0.05) {
            at -= rng.random_range(1..3) * WINDOW_MS;
        }
        if rng.random_bool(0.05) {
            at += 1;
        }
        let value = serde_json::json!({"n": rng.random_range(1..10), "id": format!("{p}/{o}")});
        records.push(OwnedRecord {
            topic: model::INPUT.into(),
            partition: p,
            offset: o,
            timestamp: Some(at),
            key: Some(format!("dev-{}", rng.random_range(0..6)).into_bytes()),
            value: Some(value.to_string().into_bytes()),
            headers: Vec::new(),
        });
    }
    records
}

/// Runs the schedule of `seed`; panics, with the last steps, at the first broken invariant.
/// How often each thing happened.
pub fn run(seed: u64) -> BTreeMap<&'static str, u64> {
    crate::clock::simulated::start();
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan::of(&mut rng);
    let commit = CommitPolicy {
        interval: std::time::Duration::from_millis(plan.interval),
        max_records: plan.per_unit,
        max_bytes: u64::MAX,
    };
    let shared = Arc::new(Shared {
        model: Mutex::new(Model::new(plan.input.clone(), TIMEOUTS)),
        rng: Mutex::new(rng),
        slots: (0..plan.instances).map(|_| Mutex::new(None)).collect(),
        frozen: Mutex::default(),
        commit,
        metrics: Arc::default(),
        mode: plan.mode,
        reference: Reference::of(&plan.input, plan.mode),
        trace: Mutex::default(),
        depth: Mutex::new(0),
        faults: Mutex::new(true),
    });
    for i in 0..plan.instances {
        start(&shared, i);
    }
    for _ in 0..plan.steps {
        step(&shared, None);
    }
    heal(&shared);
    // Committed offsets never go back in the model: an answer held to what an instance
    // committed would be a hold that moved a start.
    if shared.metrics.committed_offsets_went_back.get() > 0 {
        fail(
            &shared,
            "a committed offset was answered below what an instance committed",
        );
    }
    // The instances hold the shared state: drop them to free it.
    for slot in &shared.slots {
        lock(slot).take();
    }
    std::mem::take(&mut shared.model().counts)
}

/// Every fault heals: each instance runs (none frozen), and the input must be committed to its
/// end, after a clean stop of every instance at the latest.
fn heal(shared: &Arc<Shared>) {
    *lock(&shared.faults) = false;
    lock(&shared.frozen).clear();
    shared.note("healed".into());
    let n = shared.slots.len();
    for round in 0..20 {
        for i in 0..n {
            start(shared, i);
        }
        for _ in 0..400 {
            for i in 0..n {
                shared.model().deliver(i, usize::MAX);
                turn(shared, i, None);
            }
            tick(
                shared,
                50 + crate::clock::simulated::take().as_millis() as u64,
            );
            check(shared);
        }
        for i in 0..n {
            stop(shared, i);
        }
        check(shared);
        let m = shared.model();
        if shared.reference.done(&m) && !m.any_open() {
            return;
        }
        drop(m);
        shared.note(format!("not done after round {round}"));
    }
    let m = shared.model();
    let why = format!("the input was not committed to its end: {:?}", m.committed);
    drop(m);
    fail(shared, &why);
}

//! Fault injection against the real broker, proven by `exactly audit`.
//!
//! Each scenario runs the same workload — JSON records with sequence ids, 1% poison (half not
//! JSON, half a jq runtime error), on 6 input partitions, through a jq program that fans some
//! records out to two outputs, into 3 output partitions — while a generator writes the input
//! at a steady rate and faults are injected. It passes when the audit finds 0 lost, 0
//! duplicated, 0 unexpected, order held, and the group's lag is 0 with the last stable offset
//! equal to the high watermark on every output partition within 60 s of the last fault. The
//! call-out scenario (f-app) runs the same workload through an application that answers like
//! the jq program, and kills the application. The storm adds hostile records: one in 500 with
//! a timestamp ten days ahead, which the output topic (bounded to a day) rejects, so it must
//! reach the DLQ as `rejected_by_broker`; one in 500 with a header name that is not UTF-8.
//!
//! Profiles (`EXACTLY_FAULT_PROFILE`): `reduced` (default, in CI: every fault kind at least
//! once, about 3,000 records a scenario) and `full` (`scripts/faults.sh`: 100,000 records a
//! scenario). With `EXACTLY_FAULT_REPORT=path` each scenario appends one JSON line of figures.
//! Scenarios run one at a time: one of them restarts the broker.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

static SERIAL: Mutex<()> = Mutex::new(());

const PROGRAM: &str = "if .fan then ({seq, v: (.n + 1)}, {seq, v: (.n + 1), copy: true}) \
                       else {seq, v: (.n + 1)} end";

#[derive(Clone, Copy, Debug)]
struct Profile {
    name: &'static str,
    records: usize,
    per_second: usize,
    kills: usize,
    terms: usize,
    membership_changes: usize,
    change_every: (u64, u64),
    broker_kills: usize,
    /// Hostile records too (the storm): a far-future timestamp the output topic refuses
    /// every 500 records, a header name that is not UTF-8 every 500.
    hostile: bool,
    /// Through a windowed stage (the f-dedup and f-aggregate scenarios): 600 devices, three
    /// windows of an hour.
    stage: Stage,
}

/// The windowed stage a scenario runs through, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    None,
    /// The first record per (hour, device), each instance with a local store.
    Dedup,
    /// The count and the sum of `n` per (hour, device), as updates, each instance with a
    /// local store.
    Aggregate,
}

fn profile() -> Profile {
    match std::env::var("EXACTLY_FAULT_PROFILE").as_deref() {
        Ok("full") => Profile {
            name: "full",
            records: 100_000,
            per_second: 600,
            kills: 10,
            terms: 3,
            membership_changes: 10,
            change_every: (10_000, 20_000),
            broker_kills: 2,
            hostile: false,
            stage: Stage::None,
        },
        _ => Profile {
            name: "reduced",
            records: 3_000,
            per_second: 150,
            kills: 2,
            terms: 1,
            membership_changes: 4,
            change_every: (2_000, 4_000),
            broker_kills: 1,
            hostile: false,
            stage: Stage::None,
        },
    }
}

fn record(i: usize, profile: Profile) -> In {
    let (hostile, p) = (profile.hostile, (i % 6) as i32);
    let key = format!("k{i}");
    let mut value = match i % 100 {
        73 => json!({"seq": i, "n": "x"}),
        _ => json!({"seq": i, "n": i, "fan": i.is_multiple_of(10)}),
    };
    if profile.stage != Stage::None {
        value["dev"] = json!(device(i));
        value["at"] = json!(dedup_start() + at(i, profile.records));
    }
    let mut r = match i % 100 {
        37 => In::raw(p, &key, format!("not json {i}").as_bytes()),
        _ => In::json(p, &key, value),
    };
    if hostile && rejected(i) {
        // Ten days ahead: the output topic takes a day at most, the broker rejects it.
        r.timestamp = Some(now_ms() + 10 * 86_400_000);
    }
    if hostile && i % 500 == 251 {
        r.headers
            .push((b"\xff\xfe binary name".to_vec(), b"v".to_vec()));
    }
    r
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

const HOUR: i64 = 3_600_000;
/// The dedup scenario's first window: the hour the run started in (its event times stay
/// within --window-max-ahead of the records' timestamps).
fn dedup_start() -> i64 {
    static START: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *START.get_or_init(|| now_ms() / HOUR * HOUR)
}
/// Its dedup, as `exactly run` and the audit take it: per device (in the value, and in the
/// input partition of its records) per hour of the `at` field.
const DEDUP: [&str; 7] = [
    "--window",
    "1h",
    "--window-key",
    ".dev",
    "--window-key-partitioned",
    "--window-time",
    ".at",
];

/// The aggregate of the f-aggregate scenario: per device per hour as for the dedup, the records
/// and the sum of their `n`, each record giving its group's new totals.
const AGGREGATE: [&str; 11] = [
    "--window",
    "1h",
    "--window-key",
    ".dev",
    "--window-key-partitioned",
    "--window-time",
    ".at",
    "--aggregate",
    "count,sum",
    "--aggregate-sum",
    ".n",
];

/// What the aggregate scenario's totals must be, worked out apart from exactly: per (hour,
/// device), the records taken and the sum of their `n` (the record's number). A record that is
/// not JSON, or whose `n` is a string, is a bad record and counts nowhere; so is one whose
/// output the broker refuses (`hostile`: its timestamp).
fn aggregate_expected(records: usize, hostile: bool) -> BTreeMap<(i64, usize), (u64, i64)> {
    let mut totals = BTreeMap::new();
    let taken = |i: &usize| i % 100 != 37 && i % 100 != 73 && !(hostile && rejected(*i));
    for i in (0..records).filter(taken) {
        let t: &mut (u64, i64) = totals.entry((window(i, records), device(i))).or_default();
        t.0 += 1;
        t.1 += i as i64;
    }
    totals
}

/// Record `i`'s device: 600 of them, each in the partition of its records (i % 6), each for 7
/// records in a row of its partition, so its records land on every i % 100 (the poison ones
/// among them: a record the program fails for is sometimes a device's first, sometimes not).
fn device(i: usize) -> usize {
    6 * ((i / 42) % 100) + i % 6
}

/// Record `i`'s event time after the first window's start: three hours over the run, moving
/// with every record (so every unit moves its partitions' stream times).
fn at(i: usize, records: usize) -> i64 {
    i as i64 * 3 * HOUR / records as i64
}

/// Record `i`'s hour, of three.
fn window(i: usize, records: usize) -> i64 {
    at(i, records) / HOUR
}

/// What the dedup scenario must deliver, worked out apart from exactly: (outputs, DLQ
/// records, inputs dropped as later ones of their (hour, device)). The first record of each
/// goes through PROGRAM; one that is not JSON is a bad record; one PROGRAM fails for (n is a
/// string) is a bad record that leaves its device unseen, so the next one is the first.
fn dedup_expected(records: usize) -> (usize, usize, usize) {
    let mut seen = std::collections::HashSet::new();
    let (mut outputs, mut dlq, mut dropped) = (0, 0, 0);
    for i in 0..records {
        if i % 100 == 37 {
            dlq += 1;
        } else if seen.contains(&(window(i, records), device(i))) {
            dropped += 1;
        } else if i % 100 == 73 {
            dlq += 1;
        } else {
            seen.insert((window(i, records), device(i)));
            outputs += if i.is_multiple_of(10) { 2 } else { 1 };
        }
    }
    (outputs, dlq, dropped)
}

/// The records of a hostile run whose outputs the broker rejects.
fn rejected(i: usize) -> bool {
    i % 500 == 250
}

/// Writes the workload at a steady rate; returns when all is written.
fn generator(topic: String, profile: Profile) -> JoinHandle<Instant> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let writer = Writer::new();
        let batch = (profile.per_second / 10).max(1);
        let mut i = 0;
        while i < profile.records {
            let n = batch.min(profile.records - i);
            let records: Vec<In> = (i..i + n).map(|i| record(i, profile)).collect();
            writer.write(&topic, &records);
            i += n;
            let due = start + Duration::from_secs_f64(i as f64 / profile.per_second as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        Instant::now()
    })
}

struct Fault {
    kind: &'static str,
    recovery: Duration,
}

/// One scenario: topics, generator, instances, faults.
struct Run {
    name: String,
    profile: Profile,
    topics: Topics,
    group: String,
    extra: Vec<String>,
    live: Vec<Option<Exactly>>,
    retired: Vec<Exactly>,
    generator: Option<JoinHandle<Instant>>,
    faults: Vec<Fault>,
    last_fault: Option<Instant>,
    started: Instant,
    /// The instances' local stores (`--state-dir <dir>/<i>`), for a dedup run.
    state: Option<tempfile::TempDir>,
    /// Instances that left stuck in a client call (exit 4) and were restarted.
    stuck_exits: usize,
}

impl Run {
    fn new(name: &str, instances: usize, extra: &[&str]) -> Run {
        Self::scaled(name, instances, extra, 1, (false, Stage::None))
    }

    /// A run whose input is `scale` times the profile's (and lasts that much longer), with
    /// hostile records or not, through the dedup (each instance with a local store) or not.
    fn scaled(
        name: &str,
        instances: usize,
        extra: &[&str],
        scale: usize,
        (hostile, stage): (bool, Stage),
    ) -> Run {
        let mut profile = profile();
        profile.records *= scale;
        profile.hostile = hostile;
        profile.stage = stage;
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        match stage {
            Stage::None => {}
            Stage::Dedup => extra.extend(DEDUP.iter().map(|s| s.to_string())),
            Stage::Aggregate => extra.extend(AGGREGATE.iter().map(|s| s.to_string())),
        }
        let topics = if hostile {
            // The output topic bounds timestamps to a day either way; input and DLQ do not.
            let output = unique(&format!("{name}-out"));
            let topics = Topics {
                input: unique(&format!("{name}-in")),
                dlq: format!("{output}.dlq"),
                output,
            };
            let unbounded: TopicConfig<'_> = &[
                ("message.timestamp.after.max.ms", "9223372036854775807"),
                ("message.timestamp.before.max.ms", "9223372036854775807"),
            ];
            let day: TopicConfig<'_> = &[
                ("message.timestamp.after.max.ms", "86400000"),
                ("message.timestamp.before.max.ms", "86400000"),
            ];
            create_topics_with(&[
                (&topics.input, 6, unbounded),
                (&topics.output, 3, day),
                (&topics.dlq, 1, unbounded),
            ]);
            topics
        } else {
            Topics::create(name, 6, 3)
        };
        let group = unique(&format!("{name}-g"));
        let generator = Some(generator(topics.input.clone(), profile));
        let mut run = Run {
            name: name.to_string(),
            profile,
            topics,
            group,
            extra,
            live: (0..instances).map(|_| None).collect(),
            retired: Vec::new(),
            generator,
            faults: Vec::new(),
            last_fault: None,
            started: Instant::now(),
            stuck_exits: 0,
            state: (stage != Stage::None).then(|| tempfile::tempdir().expect("state directory")),
        };
        for i in 0..instances {
            run.start(i);
        }
        run
    }

    fn total(&self) -> i64 {
        self.profile.records as i64
    }

    fn start(&mut self, i: usize) {
        self.start_with(i, &[]);
    }

    /// Starts instance `i` with `more` arguments than the run's.
    fn start_with(&mut self, i: usize, more: &[&str]) {
        let mut args = base_args(&self.topics, &self.group, &format!("{}-{i}", self.name));
        // The aggregate's outputs are its totals, as they are.
        if !self.extra.iter().any(|a| a == "--call-url") && self.profile.stage != Stage::Aggregate {
            args.extend(["--jq".to_string(), PROGRAM.to_string()]);
        }
        if !self.extra.iter().any(|a| a == "--transaction-timeout") {
            // Short, so a killed instance's open transaction is aborted soon.
            args.extend(["--transaction-timeout".to_string(), "10s".to_string()]);
        }
        args.extend(self.extra.iter().cloned());
        if let Some(dir) = self.state_dir(i) {
            args.extend(["--state-dir".to_string(), dir.display().to_string()]);
        }
        args.extend(more.iter().map(|s| s.to_string()));
        assert!(self.live[i].is_none());
        self.live[i] = Some(Exactly::start(&args));
    }

    /// Instance `i`'s local store directory, in a dedup run.
    fn state_dir(&self, i: usize) -> Option<std::path::PathBuf> {
        Some(self.state.as_ref()?.path().join(i.to_string()))
    }

    /// Kills instance `i` with kill -9 and starts it again.
    fn restart_killed(&mut self, i: usize) {
        self.kill9(i);
        self.start(i);
    }

    /// Kills instance `i` with kill -9, deletes its local store and starts it again.
    fn restart_without_store(&mut self, i: usize) {
        self.kill9(i);
        std::fs::remove_dir_all(self.state_dir(i).unwrap()).unwrap();
        self.start(i);
    }

    /// Starts every instance not running (after the last fault).
    fn start_stopped(&mut self) {
        for i in 0..self.live.len() {
            if self.live[i].is_none() {
                self.start(i);
            }
        }
    }

    fn retire(&mut self, i: usize) {
        if let Some(p) = self.live[i].take() {
            self.retired.push(p);
        }
    }

    fn kill9(&mut self, i: usize) {
        self.live[i].as_mut().unwrap().kill9();
        self.retire(i);
    }

    fn sigterm(&mut self, i: usize) {
        let p = self.live[i].as_mut().unwrap();
        p.signal(Signal::SIGTERM);
        let status = p.wait(Duration::from_secs(20));
        // An instance stuck inside librdkafka when the SIGTERM comes leaves with 4 (what it
        // held is fenced by the next start, as after any exit 4).
        let stuck = status.code() == Some(4) && p.log_text().contains("is stuck in");
        assert!(
            status.code() == Some(0) || stuck,
            "SIGTERM exit {status:?}; log:\n{}",
            p.log_text()
        );
        self.stuck_exits += usize::from(stuck);
        self.retire(i);
    }

    /// What a supervisor (systemd, compose, a kubelet) does: an instance that left because a
    /// client call was stuck past its bound (exit code 4, librdkafka #5456) is started again.
    /// Any other exit is left for [`Run::progress`] to report.
    fn supervise(&mut self) {
        for i in 0..self.live.len() {
            if !self.live[i].as_ref().is_some_and(|p| p.has_exited()) {
                continue;
            }
            let p = self.live[i].as_mut().unwrap();
            if p.wait(Duration::from_secs(5)).code() != Some(4) {
                continue;
            }
            assert!(
                p.log_text().contains("is stuck in"),
                "{}: {} exited 4 without naming a stuck call; log:\n{}",
                self.name,
                p.name,
                p.log_text()
            );
            eprintln!(
                "[{}] {} left stuck in a client call (exit 4); restarted",
                self.name, p.name
            );
            self.stuck_exits += 1;
            // Rare (librdkafka #5456 needs a coordinator to die mid-call): more is a regression.
            assert!(
                self.stuck_exits <= 2,
                "{}: {} stuck exits",
                self.name,
                self.stuck_exits
            );
            self.retire(i);
            self.start(i);
        }
    }

    fn progress(&self) -> i64 {
        for p in self.live.iter().flatten() {
            // One that left stuck (exit 4) is restarted by the next [`Run::supervise`].
            if p.has_exited() && !p.log_text().contains("is stuck in") {
                panic!(
                    "{}: {} exited on its own; log:\n{}",
                    self.name,
                    p.name,
                    p.log_text()
                );
            }
        }
        committed_total(&self.group, &self.topics.input)
    }

    fn generating(&self) -> bool {
        self.generator.as_ref().is_some_and(|g| !g.is_finished())
    }

    /// Waits until `n` input offsets are committed, or the input is all committed.
    fn wait_progress(&mut self, n: i64, timeout: Duration) -> i64 {
        let deadline = Instant::now() + timeout;
        loop {
            self.supervise();
            let p = self.progress();
            if p >= n.min(self.total()) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "{}: progress stuck at {p} (waiting for {n}); the instances' last words:\n{}",
                self.name,
                self.last_words()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines each running instance logged, for a failure message.
    fn last_words(&self) -> String {
        let mut out = String::new();
        for p in self.live.iter().flatten() {
            let text = p.log_text();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {}\n", p.name);
            for line in &lines[lines.len().saturating_sub(30)..] {
                out += line;
                out.push('\n');
            }
        }
        out
    }

    /// Injects a fault and measures the recovery: the time from the start of the fault until
    /// the group's committed offsets move again (or everything is committed).
    fn fault(&mut self, kind: &'static str, inject: impl FnOnce(&mut Run)) {
        self.fault_on(kind, None, inject)
    }

    /// Like [`Run::fault`], watching only the input partitions `watch` when given.
    fn fault_on(
        &mut self,
        kind: &'static str,
        watch: Option<&[i32]>,
        inject: impl FnOnce(&mut Run),
    ) {
        let moved = |run: &Run, before: &BTreeMap<i32, i64>| {
            let now = committed(&run.group, &run.topics.input);
            let total: i64 = now.values().sum();
            total >= run.total()
                || now.iter().any(|(p, o)| {
                    watch.is_none_or(|w| w.contains(p)) && before.get(p).is_none_or(|b| o > b)
                })
        };
        let before = committed(&self.group, &self.topics.input);
        let t0 = Instant::now();
        inject(self);
        let deadline = t0 + Duration::from_secs(180);
        while !moved(self, &before) {
            assert!(
                Instant::now() < deadline,
                "{}: no progress after {kind}; the instances' last words:\n{}",
                self.name,
                self.last_words()
            );
            self.supervise();
            self.progress();
            std::thread::sleep(Duration::from_millis(50));
        }
        let recovery = t0.elapsed();
        let before: i64 = before.values().sum();
        eprintln!(
            "[{}] {kind}: progress {before} -> moving again after {recovery:?}",
            self.name
        );
        self.faults.push(Fault { kind, recovery });
        self.last_fault = Some(Instant::now());
    }

    /// Waits until a further `fraction` of the input not committed yet is committed (and a
    /// random moment more), so the next fault lands on fresh progress. False when the input
    /// would run out first.
    fn after_more_progress(&mut self, fraction: f64) -> bool {
        // A share of what is left, not of the whole: a fault whose recovery catches up a
        // backlog (a frozen owner's session, a restore) must not leave the next one no input.
        let progress = self.progress();
        let target = progress + ((self.total() - progress) as f64 * fraction) as i64;
        if target >= self.total() {
            return false;
        }
        self.wait_progress(target, Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(rand::rng().random_range(0..300)));
        self.generating()
    }

    fn events(&self, message: &str) -> usize {
        self.live
            .iter()
            .flatten()
            .chain(&self.retired)
            .map(|p| p.events(message).len())
            .sum()
    }

    /// Waits for the end, checks lag and stability, stops everything, audits, reports.
    fn finish(mut self) -> Value {
        let generated = self.generator.take().unwrap().join().expect("generator");
        let settle_from = self.last_fault.map_or(generated, |f| f.max(generated));
        let deadline = settle_from + Duration::from_secs(60);
        let end = end_offsets(&self.topics.input);
        let settled = loop {
            let lag_zero = committed(&self.group, &self.topics.input) == end;
            let stable = [&self.topics.output, &self.topics.dlq]
                .iter()
                .all(|t| stability(t).iter().all(|(_, lso, hw)| lso == hw));
            if lag_zero && stable {
                break settle_from.elapsed();
            }
            self.supervise();
            assert!(
                Instant::now() < deadline,
                "{}: lag {:?} vs end {end:?}, stable {stable}, 60 s after the last fault; \
                 the instances' last words:\n{}",
                self.name,
                committed(&self.group, &self.topics.input),
                self.last_words()
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        for i in 0..self.live.len() {
            if self.live[i].is_some() {
                self.sigterm(i);
            }
        }
        let b = bootstrap();
        let mut audit = vec![
            "--bootstrap-servers",
            &b,
            "--input-topics",
            &self.topics.input,
            "--output-topic",
            &self.topics.output,
            "--group-id",
            &self.group,
            "--timeout",
            "30s",
        ];
        match self.profile.stage {
            Stage::None => audit.extend(["--jq", PROGRAM]),
            Stage::Dedup => audit.extend(["--jq", PROGRAM].iter().chain(&DEDUP)),
            Stage::Aggregate => audit.extend(AGGREGATE),
        }
        let (code, report) = audit_json(&audit);
        for f in [
            "lost",
            "duplicated",
            "unexpected",
            "in_output_and_dlq",
            "order_violations",
            "without_lineage",
            "hanging_partitions",
            "pending",
        ] {
            assert_eq!(report[f], 0, "{}: audit {f}: {report:#}", self.name);
        }
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["group_reached_end"], true);
        assert_eq!(report["inputs"], self.profile.records);
        // The poison records, all in the DLQ.
        let poison = (0..self.profile.records)
            .filter(|i| i % 100 == 37 || i % 100 == 73)
            .count();
        let rejected = (0..self.profile.records)
            .filter(|&i| self.profile.hostile && rejected(i))
            .count();
        assert_eq!(report["rejected_by_broker"], rejected, "{report:#}");
        match self.profile.stage {
            Stage::Dedup => {
                // The audit replays exactly's own dedup; this is worked out apart from it.
                let (outputs, dlq, dropped) = dedup_expected(self.profile.records);
                assert_eq!(report["outputs"], outputs, "{report:#}");
                assert_eq!(report["dlq"], dlq, "{report:#}");
                assert_eq!(report["dropped"], dropped, "{report:#}");
            }
            Stage::Aggregate => {
                // One output per record taken, and the last one of each (hour, device), in
                // its output partition's order, holds the totals worked out apart.
                assert_eq!(
                    report["outputs"],
                    self.profile.records - poison - rejected,
                    "{report:#}"
                );
                assert_eq!(report["dlq"], poison + rejected, "{report:#}");
                let mut last = BTreeMap::new();
                for o in read_all(&self.topics.output, "read_committed") {
                    let v = o.json();
                    let hour = (v["start"].as_i64().unwrap() - dedup_start()) / HOUR;
                    let dev: usize = v["group"].as_str().unwrap().parse().unwrap();
                    let totals = (v["count"].as_u64().unwrap(), v["sum"].as_i64().unwrap());
                    last.insert((hour, dev), totals);
                }
                let want = aggregate_expected(self.profile.records, self.profile.hostile);
                assert_eq!(
                    last.len(),
                    want.len(),
                    "{}: (hour, device) pairs",
                    self.name
                );
                assert!(
                    last == want,
                    "{}: the last totals differ from the model",
                    self.name
                );
            }
            Stage::None => assert_eq!(report["dlq"], poison + rejected),
        }

        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for f in &self.faults {
            *kinds.entry(f.kind).or_default() += 1;
        }
        let mut recoveries: Vec<Duration> = self.faults.iter().map(|f| f.recovery).collect();
        recoveries.sort();
        let longest = recoveries.last().copied().unwrap_or_default();
        let median = recoveries
            .get(recoveries.len() / 2)
            .copied()
            .unwrap_or_default();
        let figures = json!({
            "scenario": self.name,
            "profile": self.profile.name,
            "records": self.profile.records,
            "outputs": report["outputs"],
            "dlq": report["dlq"],
            "rejected_by_broker": report["rejected_by_broker"],
            "aborted_records": report["aborted"],
            "faults": kinds,
            "aborts_logged": self.events("transaction aborted"),
            "producer_recreations": self.events("producer recreated"),
            "rebalance_events": self.events("assignment now"),
            "stuck_exits": self.stuck_exits,
            "anomalies": 0,
            "longest_recovery_s": longest.as_secs_f64(),
            "median_recovery_s": median.as_secs_f64(),
            "settled_after_last_fault_s": settled.as_secs_f64(),
            "duration_s": self.started.elapsed().as_secs_f64(),
        });
        eprintln!("[{}] {figures}", self.name);
        if let Ok(path) = std::env::var("EXACTLY_FAULT_REPORT") {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            writeln!(f, "{figures}").unwrap();
        }
        figures
    }
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn kill_9_repeatedly() {
    let _s = serial();
    let mut run = Run::new("f-kill", 1, &[]);
    for _ in 0..run.profile.kills {
        if !run.after_more_progress(0.05) {
            break;
        }
        run.fault("kill -9", |r| {
            r.kill9(0);
            r.start(0);
        });
    }
    assert!(!run.faults.is_empty(), "no kill landed mid-stream");
    run.finish();
}

#[test]
fn sigterm_restarts() {
    let _s = serial();
    let mut run = Run::new("f-term", 1, &[]);
    for _ in 0..run.profile.terms {
        if !run.after_more_progress(0.05) {
            break;
        }
        run.fault("SIGTERM restart", |r| {
            r.sigterm(0);
            r.start(0);
        });
    }
    assert!(!run.faults.is_empty());
    run.finish();
}

/// Stops and starts members of a three-instance group at random intervals.
fn change_membership(run: &mut Run, changes: usize) {
    let mut rng = rand::rng();
    for _ in 0..changes {
        let (lo, hi) = run.profile.change_every;
        std::thread::sleep(Duration::from_millis(rng.random_range(lo..=hi)));
        if !run.generating() {
            break;
        }
        let alive: Vec<usize> = (0..run.live.len())
            .filter(|&i| run.live[i].is_some())
            .collect();
        let dead: Vec<usize> = (0..run.live.len())
            .filter(|&i| run.live[i].is_none())
            .collect();
        let leave = match (alive.len(), dead.is_empty()) {
            (1, _) => false,
            (_, true) => true,
            _ => rng.random_bool(0.5),
        };
        if leave {
            let i = alive[rng.random_range(0..alive.len())];
            run.fault("member leaves", |r| r.sigterm(i));
        } else {
            let i = dead[0];
            run.fault("member joins", |r| r.start(i));
        }
    }
}

#[test]
fn membership_changes() {
    let _s = serial();
    let mut run = Run::new("f-members", 3, &[]);
    let changes = run.profile.membership_changes;
    change_membership(&mut run, changes);
    assert!(
        run.faults.len() >= changes.min(4),
        "only {} membership changes",
        run.faults.len()
    );
    let figures = run.finish();
    assert!(
        figures["rebalance_events"].as_u64().unwrap() >= 10,
        "{figures}"
    );
}

/// SIGSTOP one of two instances past the session timeout, let the other take its partitions,
/// SIGCONT it: its open transaction must never become visible.
fn zombie(run: &mut Run) {
    let a = 0;
    run.live[a]
        .as_ref()
        .unwrap()
        .wait_log("a owns partitions", Duration::from_secs(60), |e| {
            e.owned().is_some_and(|o| count_partitions(&o) > 0)
        });
    let owned = partitions_of(&run.live[a].as_ref().unwrap().owned().unwrap());
    // Only what the zombie logs after it wakes counts (a stopped process logs nothing).
    let before = run.live[a].as_ref().unwrap().log_lines().len();
    run.fault_on(
        "zombie (SIGSTOP past the session timeout, SIGCONT)",
        Some(&owned),
        |r| {
            let a_proc = r.live[a].as_ref().unwrap();
            a_proc.signal(Signal::SIGSTOP);
            // The other instance(s) take a's partitions after the 6 s session timeout.
            std::thread::sleep(Duration::from_secs(9));
            a_proc.signal(Signal::SIGCONT);
        },
    );
    let a_proc = run.live[a].as_ref().unwrap();
    // Woken up, the zombie learns it lost its partitions or is fenced, and aborts. An abort
    // the storm injects (test_injected) proves nothing about the zombie.
    a_proc.wait_log(
        "the zombie aborts or is fenced",
        Duration::from_secs(60),
        |e| {
            e.log_lines()[before..].iter().any(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
                let m = v["message"].as_str().unwrap_or_default();
                m.contains("partitions lost")
                    || m.contains("fenced")
                    || (m == "transaction aborted" && v["reason"] != "test_injected")
            })
        },
    );
}

#[test]
fn zombie_is_fenced() {
    let _s = serial();
    // A transaction timeout longer than the pause: the zombie's transaction is still open
    // when it wakes, so only the group generation (KIP-447) stops it from committing.
    let mut run = Run::new("f-zombie", 2, &["--transaction-timeout", "30s"]);
    run.wait_progress(run.total() / 5, Duration::from_secs(120));
    zombie(&mut run);
    run.finish();
}

fn broker_restart(run: &mut Run) {
    run.fault("broker kill -9 + restart", |_| {
        let script = repo().join("scripts/kafka.sh");
        assert!(
            std::process::Command::new(&script)
                .arg("kill")
                .status()
                .unwrap()
                .success()
        );
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            std::process::Command::new(&script)
                .arg("start")
                .status()
                .unwrap()
                .success()
        );
    });
}

#[test]
fn broker_kill_and_restart() {
    let _s = serial();
    let mut run = Run::new("f-broker", 1, &[]);
    for _ in 0..run.profile.broker_kills {
        if !run.after_more_progress(0.15) {
            break;
        }
        broker_restart(&mut run);
    }
    assert!(!run.faults.is_empty());
    run.finish();
}

/// The call-out's application (answering like PROGRAM, so the audit replays it with jq)
/// killed -9 and restarted on its port: exactly stays up, backs off while it is down, and
/// catches up.
#[test]
fn application_killed() {
    let _s = serial();
    let mut app = App::answering("faults", None);
    let url = app.url();
    let mut run = Run::new("f-app", 1, &["--call-url", &url, "--call-timeout", "2s"]);
    for _ in 0..run.profile.kills {
        if !run.after_more_progress(0.05) {
            break;
        }
        run.fault("application kill -9", |_| {
            app.kill9();
            std::thread::sleep(Duration::from_millis(rand::rng().random_range(200..1500)));
            app.restart();
        });
    }
    assert!(!run.faults.is_empty(), "no kill landed mid-stream");
    let unavailable = run.events("transform unavailable; aborting, rewinding and backing off");
    assert!(unavailable > 0, "the kills were never noticed");
    run.finish();
}

#[test]
fn random_aborts() {
    let _s = serial();
    let mut run = Run::new("f-aborts", 2, &["--test-abort-probability", "0.33"]);
    run.wait_progress(run.total(), Duration::from_secs(300));
    let figures = run.finish();
    assert!(figures["aborts_logged"].as_u64().unwrap() > 0, "{figures}");
}

#[test]
fn storm() {
    let _s = serial();
    let p = profile();
    // More input, so that every kind of fault lands while it flows: the zombie and the broker
    // restart alone take about 25 s (5× in the reduced profile: 100 s of input; 3× in full).
    let extra = ["--test-abort-probability", "0.33"];
    let scale = if p.name == "full" { 3 } else { 5 };
    let mut run = Run::scaled("f-storm", 3, &extra, scale, (true, Stage::None));
    let mut rng = rand::rng();
    let mut plan: Vec<&str> = Vec::new();
    plan.extend(std::iter::repeat_n("kill", p.kills.div_ceil(2)));
    plan.extend(std::iter::repeat_n("term", p.terms.div_ceil(2)));
    plan.extend(std::iter::repeat_n("members", 2));
    plan.push("zombie");
    plan.shuffle(&mut rng);
    // The broker restart goes last: an instance caught by a SIGTERM while the broker is down
    // cannot commit and does not exit 0 (it stops within the grace, leaving its open
    // transaction to the coordinator); that is not what the SIGTERM fault tests.
    plan.extend(std::iter::repeat_n("broker", p.broker_kills.div_ceil(2)));
    let step = 0.4 / plan.len() as f64;
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        let alive: Vec<usize> = (0..3).filter(|&i| run.live[i].is_some()).collect();
        let i = alive[rng.random_range(0..alive.len())];
        match what {
            "kill" => run.fault("kill -9", |r| {
                r.kill9(i);
                r.start(i);
            }),
            "term" => run.fault("SIGTERM restart", |r| {
                r.sigterm(i);
                r.start(i);
            }),
            "members" => change_membership(&mut run, 2),
            "zombie" => {
                // The zombie must be instance 0 for `zombie`; make sure it is alive.
                if run.live[0].is_none() {
                    run.start(0);
                }
                zombie(&mut run);
            }
            _ => broker_restart(&mut run),
        }
    }
    run.start_stopped();
    let kinds: std::collections::BTreeSet<&str> = run
        .faults
        .iter()
        .map(|f| {
            if f.kind.starts_with("member") {
                "membership change"
            } else {
                f.kind
            }
        })
        .collect();
    assert_eq!(kinds.len(), 5, "the storm injected only {kinds:?}");
    run.finish();
}

/// A stateful scenario's faults: `faults`, and half the profile's kills, in random order.
fn stateful_plan(faults: &[&'static str], p: Profile, rng: &mut impl Rng) -> Vec<&'static str> {
    let mut plan = faults.to_vec();
    plan.extend(std::iter::repeat_n("kill", p.kills.div_ceil(2)));
    plan.shuffle(rng);
    plan
}

/// The dedup (per device per hour, both instances with a local store) through every way its
/// state can be caught out: a crash after a commit before the local store write, kill -9
/// mid-transaction, kill -9 while a partition's state is being read back (slowed by a test
/// switch), the local store deleted between a kill and the restart, members leaving and
/// joining. Exactly one output per (hour, device), the first in
/// partition order: the audit replays the dedup from the start of each partition, and the
/// counts are worked out apart from exactly (`dedup_expected`).
#[test]
fn dedup_survives_crashes_and_rebalances() {
    let _s = serial();
    let p = profile();
    let scale = if p.name == "full" { 1 } else { 4 };
    let mut run = Run::scaled("f-dedup", 2, &[], scale, (false, Stage::Dedup));
    let mut rng = rand::rng();
    let mut plan = stateful_plan(&["store deleted", "members", "zombie"], p, &mut rng);
    // First, while the input is young: the crash waits for commits of its own, and the run
    // must not end before the restore is killed.
    plan.splice(0..0, ["crash before store", "restore"]);
    let planned = plan.len();
    let mut ran = 0;
    let mut mid_restore = 0;
    let step = 0.6 / plan.len() as f64;
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        let i = rng.random_range(0..2);
        ran += 1;
        match what {
            "crash before store" => {
                run.fault("crash after a commit, before the local store", |r| {
                    r.kill9(i);
                    r.start_with(i, &["--test-crash-before-store", "2"]);
                    let crashed = r.live[i].as_mut().unwrap();
                    let status = crashed.wait(Duration::from_secs(60));
                    assert!(
                        !crashed
                            .events("test: crashing after a commit, before its local store write")
                            .is_empty(),
                        "{status:?}; log:\n{}",
                        crashed.log_text()
                    );
                    r.retire(i);
                    r.start(i);
                })
            }
            "restore" => run.fault("kill -9 mid-restore", |r| {
                // The restart reads its changelog 10 ms a record, and is killed in the middle
                // of it (a read killed stores nothing: the next start reads it all again).
                r.kill9(i);
                // Without its store, the restart reads its changelogs whole.
                std::fs::remove_dir_all(r.state_dir(i).unwrap()).unwrap();
                r.start_with(i, &["--test-restore-pace", "10ms"]);
                let again = r.live[i].as_ref().unwrap();
                again.wait_log("an assignment", Duration::from_secs(60), |e| {
                    e.owned().is_some_and(|o| count_partitions(&o) > 0)
                });
                std::thread::sleep(Duration::from_millis(200));
                let owned = count_partitions(&again.owned().unwrap());
                if again.events("dedup state restored").len() < owned {
                    mid_restore += 1;
                }
                r.kill9(i);
                r.start(i);
            }),
            "store deleted" => run.fault("kill -9, local store deleted", |r| {
                r.restart_without_store(i)
            }),
            "members" => change_membership(&mut run, 2),
            "zombie" => stateful_zombie(&mut run),
            _ => run.fault("kill -9", |r| r.restart_killed(i)),
        }
    }
    run.start_stopped();
    assert!(mid_restore > 0, "no kill landed during a restore");
    assert_eq!(ran, planned, "the input ran out before every fault");
    run.finish();
}

/// The windowed aggregates (count and sum per device per hour, as updates, both instances
/// with a local store) under the hostile profile (a record whose output the broker refuses
/// goes to the DLQ and is counted nowhere), through kill -9 mid-transaction, kill -9 with the
/// local store deleted, a frozen owner (SIGSTOP past its session) and members leaving and
/// joining. One output per record taken (the audit replays the aggregate from the start of
/// each partition), and the last totals of each (hour, device) are the ones worked out apart
/// from exactly (`aggregate_expected`).
#[test]
fn aggregates_survive_crashes_and_rebalances() {
    let _s = serial();
    let p = profile();
    let scale = if p.name == "full" { 1 } else { 2 };
    let mut run = Run::scaled("f-aggregate", 2, &[], scale, (true, Stage::Aggregate));
    let mut rng = rand::rng();
    let plan = stateful_plan(&["store deleted", "members", "zombie"], p, &mut rng);
    let (planned, mut ran) = (plan.len(), 0);
    let step = 0.6 / plan.len() as f64;
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        let i = rng.random_range(0..2);
        ran += 1;
        match what {
            "store deleted" => run.fault("kill -9, local store deleted", |r| {
                r.restart_without_store(i)
            }),
            "members" => change_membership(&mut run, 2),
            "zombie" => stateful_zombie(&mut run),
            _ => run.fault("kill -9", |r| r.restart_killed(i)),
        }
    }
    run.start_stopped();
    assert_eq!(ran, planned, "the input ran out before every fault");
    run.finish();
}

/// A stateful owner frozen (SIGSTOP) past its session and woken: the other instance restored
/// its partitions meanwhile; whatever the zombie commits on waking, no key goes out twice and
/// no total is short (the run's audit and its model).
fn stateful_zombie(run: &mut Run) {
    if run.live[0].is_none() {
        run.start(0);
    }
    zombie(run);
}

// ---------------------------------------------------------------------------------------------
// The three-broker cluster (scripts/faults.sh cluster; scripts/cluster.sh): replication 3,
// min.insync.replicas 2, a dedicated controller. Each scenario faults brokers by their role for
// this run — the transaction coordinator of its transactional id, the group coordinator, the
// leader of its output partitions — with kill -9 of exactly mixed in, and ends with the same
// audit as the rest.

impl Run {
    /// Instance `i`'s transactional id (exactly's default: `<group>-<instance>`).
    fn transactional_id(&self, i: usize) -> String {
        format!("{}-{}-{i}", self.group, self.name)
    }

    /// How many times the profile's input lasts `at_least` at the profile's rate.
    fn scale_for(at_least: Duration) -> usize {
        let p = profile();
        let lasts = p.records as f64 / p.per_second as f64;
        (at_least.as_secs_f64() / lasts).ceil().max(1.0) as usize
    }
}

/// Brings broker `node` back and waits until every partition has its replicas in sync again
/// (outside the fault's recovery: exactly must have moved on without it).
fn heal(cluster: &Cluster, node: i32) {
    cluster.start(node);
    cluster.wait_replicated(Duration::from_secs(120));
}

/// A random pause in `range` milliseconds.
fn pause_ms(range: std::ops::Range<u64>) {
    std::thread::sleep(Duration::from_millis(rand::rng().random_range(range)));
}

/// kill -9 of instance `i` and a restart, as a fault of its own.
fn exactly_killed(run: &mut Run, i: usize) {
    run.fault("kill -9", |r| r.restart_killed(i));
}

/// The broker coordinating the instance's transactional id killed (-9) while it commits every
/// 100 ms; once with the instance itself killed while that broker is down, so its restart must
/// find the new coordinator and settle the open transaction there.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_transaction_coordinator_killed() {
    let _s = serial();
    let cluster = Cluster::required();
    let p = profile();
    let scale = Run::scale_for(Duration::from_secs(60));
    let mut run = Run::scaled("c-txn", 1, &[], scale, (false, Stage::None));
    let txn = run.transactional_id(0);
    run.wait_progress(run.total() / 20, Duration::from_secs(120));
    // The formula the scenarios find coordinators by agrees with Kafka's own tool.
    assert_eq!(
        cluster.transaction_coordinator(&txn),
        cluster.described_transaction_coordinator(&txn),
        "the transaction coordinator of {txn}"
    );
    let mut plan = vec!["coordinator"; p.broker_kills];
    plan.push("coordinator and exactly");
    plan.extend(std::iter::repeat_n("kill", p.kills.div_ceil(4)));
    plan.shuffle(&mut rand::rng());
    let step = 0.6 / plan.len() as f64;
    let mut coordinators = Vec::new();
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        match what {
            "kill" => exactly_killed(&mut run, 0),
            _ => {
                let node = cluster.transaction_coordinator(&txn);
                coordinators.push(node);
                let also = what == "coordinator and exactly";
                let kind = if also {
                    "transaction coordinator kill -9, then exactly kill -9 while it is down"
                } else {
                    "transaction coordinator kill -9"
                };
                run.fault(kind, |r| {
                    cluster.kill(node);
                    if also {
                        pause_ms(100..1500);
                        r.restart_killed(0);
                    }
                });
                let moved = cluster.transaction_coordinator(&txn);
                assert_ne!(
                    moved, node,
                    "the coordinator did not move off the killed broker"
                );
                heal(&cluster, node);
            }
        }
    }
    assert!(
        !coordinators.is_empty(),
        "no coordinator kill landed mid-stream"
    );
    eprintln!("[c-txn] coordinators killed: {coordinators:?}");
    run.finish();
}

/// The group coordinator killed (-9) in the middle of a rebalance of three instances: a member
/// joins or leaves, and the broker coordinating the group dies while the group settles.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_group_coordinator_killed() {
    let _s = serial();
    let cluster = Cluster::required();
    let p = profile();
    let scale = Run::scale_for(Duration::from_secs(80));
    let mut run = Run::scaled("c-group", 3, &[], scale, (false, Stage::None));
    let group = run.group.clone();
    run.wait_progress(run.total() / 20, Duration::from_secs(120));
    let mut plan = vec!["rebalance"; p.broker_kills.max(2)];
    plan.extend(std::iter::repeat_n("kill", p.kills.div_ceil(4)));
    plan.shuffle(&mut rand::rng());
    let step = 0.6 / plan.len() as f64;
    let mut rebalances = 0;
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        let alive: Vec<usize> = (0..3).filter(|&i| run.live[i].is_some()).collect();
        let i = alive[rand::rng().random_range(0..alive.len())];
        if what == "kill" {
            exactly_killed(&mut run, i);
            continue;
        }
        let node = cluster.group_coordinator(&group);
        let join = alive.len() < 3;
        let kind = if join {
            "member joins, group coordinator kill -9 mid-rebalance"
        } else {
            "member leaves, group coordinator kill -9 mid-rebalance"
        };
        run.fault(kind, |r| {
            if join {
                let dead = (0..3).find(|&d| r.live[d].is_none()).unwrap();
                r.start(dead);
                // The new member's JoinGroup reaches the coordinator within a second or two.
                pause_ms(500..2000);
            } else {
                r.sigterm(i);
                pause_ms(0..300);
            }
            cluster.kill(node);
        });
        rebalances += 1;
        heal(&cluster, node);
    }
    assert!(rebalances > 0, "no coordinator kill landed mid-stream");
    run.start_stopped();
    run.finish();
}

/// The leader of an output partition killed (-9) while transactions write to it.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_output_leader_killed() {
    let _s = serial();
    let cluster = Cluster::required();
    let p = profile();
    let scale = Run::scale_for(Duration::from_secs(60));
    let mut run = Run::scaled("c-leader", 2, &[], scale, (false, Stage::None));
    let output = run.topics.output.clone();
    run.wait_progress(run.total() / 20, Duration::from_secs(120));
    let mut plan = vec!["leader"; p.broker_kills.max(2)];
    plan.extend(std::iter::repeat_n("kill", p.kills.div_ceil(4)));
    plan.shuffle(&mut rand::rng());
    let step = 0.6 / plan.len() as f64;
    let mut leaders = 0;
    for what in plan {
        if !run.after_more_progress(step) {
            break;
        }
        let i = rand::rng().random_range(0..2);
        if what == "kill" {
            exactly_killed(&mut run, i);
            continue;
        }
        let partition = rand::rng().random_range(0..3);
        let node = cluster.leader(&output, partition);
        run.fault("output partition leader kill -9", |_| cluster.kill(node));
        assert_ne!(
            cluster.leader(&output, partition),
            node,
            "leadership did not move"
        );
        leaders += 1;
        heal(&cluster, node);
    }
    assert!(leaders > 0, "no leader kill landed mid-stream");
    run.finish();
}

/// A rolling restart under load: each broker in turn stopped with SIGTERM (a controlled
/// shutdown), started again, and the next only once no partition is under-replicated — what
/// every upgrade does. exactly is killed (-9) once along the way.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_rolling_restart() {
    let _s = serial();
    let cluster = Cluster::required();
    let p = profile();
    let rounds = if p.name == "full" { 2 } else { 1 };
    // A controlled shutdown, a start and the catch-up take 10–20 s a broker.
    let scale = Run::scale_for(Duration::from_secs(75 * rounds as u64));
    let mut run = Run::scaled("c-rolling", 2, &[], scale, (false, Stage::None));
    run.wait_progress(run.total() / 20, Duration::from_secs(120));
    let kill_after = rand::rng().random_range(1..3 * rounds);
    let mut restarted = 0;
    for round in 0..rounds {
        for node in 1..=3 {
            if !run.generating() {
                break;
            }
            run.fault("broker SIGTERM + restart (rolling)", |_| {
                cluster.stop(node);
                cluster.start(node);
            });
            cluster.wait_replicated(Duration::from_secs(120));
            restarted += 1;
            if round * 3 + node as usize == kill_after {
                let i = rand::rng().random_range(0..2);
                exactly_killed(&mut run, i);
            }
        }
    }
    assert_eq!(
        restarted,
        3 * rounds,
        "the input ran out before the rolling restart ended"
    );
    run.finish();
}

/// A broker paused (SIGSTOP) for longer than the session and request timeouts — the
/// transaction coordinator of one instance, so the slow broker is one exactly must talk to —
/// then resumed. One instance is killed (-9) and restarted while the broker is stopped.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_broker_paused() {
    let _s = serial();
    let cluster = Cluster::required();
    let p = profile();
    let pauses = if p.name == "full" { 2 } else { 1 };
    // Past librdkafka's request.timeout.ms (30 s) and the tests' session timeout (6 s).
    let stopped = Duration::from_secs(35);
    let scale = Run::scale_for((stopped + Duration::from_secs(30)) * pauses as u32);
    let mut run = Run::scaled("c-paused", 2, &[], scale, (false, Stage::None));
    let txn = run.transactional_id(0);
    let step = 0.7 / pauses as f64;
    let mut paused = 0;
    for n in 0..pauses {
        if !run.after_more_progress(step / 2.0) {
            break;
        }
        let node = cluster.transaction_coordinator(&txn);
        run.fault("transaction coordinator SIGSTOP 35 s, SIGCONT", |r| {
            cluster.pause(node);
            std::thread::sleep(Duration::from_secs(5));
            if n == 0 {
                // kill -9 of an instance while the broker is stopped.
                r.restart_killed(1);
            }
            std::thread::sleep(stopped - Duration::from_secs(5));
            cluster.resume(node);
        });
        paused += 1;
        cluster.wait_replicated(Duration::from_secs(120));
    }
    assert_eq!(paused, pauses, "the input ran out before every pause");
    run.finish();
}

/// Two of three brokers down: fewer in-sync replicas than min.insync.replicas, so no
/// transaction can commit. exactly must stall without losing anything — the signals
/// ExactlyCommitsStalled fires on hold (no commit while records wait) and the aborts are
/// counted — survive a kill -9 of its own meanwhile, and resume once one broker returns.
#[test]
#[ignore = "needs the three-broker cluster: scripts/faults.sh cluster"]
fn cluster_min_insync_not_met() {
    let _s = serial();
    let cluster = Cluster::required();
    let outage = Duration::from_secs(20);
    let scale = Run::scale_for(outage + Duration::from_secs(60));
    let mut run = Run::scaled("c-minisr", 1, &[], scale, (false, Stage::None));
    run.wait_progress(run.total() / 5, Duration::from_secs(120));
    let mut nodes = [1, 2, 3];
    nodes.shuffle(&mut rand::rng());
    let (down, kept) = (&nodes[..2], nodes[2]);
    let before = run.progress();
    let t0 = Instant::now();
    for &n in down {
        cluster.kill(n);
    }
    eprintln!("[c-minisr] brokers {down:?} killed, {kept} left: min.insync.replicas not met");
    // Transactions open before the kill may still commit for a moment (the ISR shrinks only
    // when the controller fences the dead brokers); then nothing may.
    std::thread::sleep(Duration::from_secs(6));
    let stalled_at = run.progress();
    let addr = http_addr(run.live[0].as_ref().unwrap());
    let last_commit = |addr: &str| {
        get(addr, "/metrics")
            .map(|(_, text)| metric(&text, "exactly_last_commit_timestamp_seconds", &[]))
            .unwrap_or(0.0)
    };
    let lag = |addr: &str| -> f64 {
        let text = get(addr, "/metrics").map(|(_, t)| t).unwrap_or_default();
        samples(&text, "exactly_consumer_lag_records", &[])
            .iter()
            .sum()
    };
    let first = last_commit(&addr);
    std::thread::sleep(Duration::from_secs(5));
    // ExactlyCommitsStalled's two signals: no commit, and records waiting.
    let (second, waiting) = (last_commit(&addr), lag(&addr));
    // kill -9 while two brokers are down: the new instance cannot even initialise its
    // transactions until one returns (and waits for it, within --startup-timeout).
    run.restart_killed(0);
    std::thread::sleep(outage.saturating_sub(t0.elapsed()));
    let stalled = run.progress();
    eprintln!(
        "[c-minisr] progress {before} before, {stalled_at} 6 s in, {stalled} after {:?}; \
         {waiting} records waiting",
        t0.elapsed()
    );
    assert_eq!(
        stalled, stalled_at,
        "a transaction committed below min.insync.replicas"
    );
    assert!(first > 0.0, "no commit before the outage");
    assert_eq!(
        second, first,
        "the last-commit gauge moved during the outage"
    );
    assert!(waiting > 0.0, "the lag gauge shows no record waiting");
    let addr = http_addr(run.live[0].as_ref().unwrap());
    // The restarted instance has committed nothing (its last-commit gauge never set).
    assert_eq!(last_commit(&addr), 0.0, "the restarted instance committed");
    run.fault("broker back (exactly killed -9 during the outage)", |_| {
        cluster.start(down[0]);
    });
    heal(&cluster, down[1]);
    run.finish();
}

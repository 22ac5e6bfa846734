//! What the input should become, worked out apart from exactly, and the invariants checked
//! against the model after every commit.
//!
//! The reference is the stage's rule written plainly, one partition at a time in offset
//! order, for each of the three modes ([`Mode`]). In all of them a record whose window closed
//! at the partition's stream time goes to the dead-letter topic (`late`), and a record whose
//! outputs the broker refuses (their timestamp, the record's, is odd) goes there instead
//! (`rejected_by_broker`) and changes no state. Otherwise:
//! - the dedup: the first record of its key in its window goes out as it is; any other is
//!   dropped;
//! - the aggregates' updates: the record's group's new totals (count, sum of `n`) in its
//!   window go out;
//! - the aggregates' final totals: the totals of every window the record closes go out (the
//!   windows by start, their groups by name), and the record is counted.
//!
//! The stream time is the latest time of the records kept. State is compared as a set of
//! facts: the dedup's keys seen per window, the aggregates' last totals per window and group,
//! and the stream time.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{CHANGELOG, DLQ, INPUT, Model, OUTPUT};
use crate::state::changelog;
use crate::state::seen::{Change, Sum};
use crate::transform::OwnedRecord;

/// The windows' length.
pub const WINDOW_MS: i64 = 3_600_000;

/// What the instances run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The first record per key per window.
    Dedup,
    /// Count and sum per key per window, as updates.
    Updates,
    /// Count and sum per key per window, once it closes.
    Final,
}

/// What becomes of one input record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// These outputs go out (each as [`canonical`] has it), perhaps none.
    Out(Vec<String>),
    /// Its dead-letter copy goes, for this reason: the input's value, as it is (in every mode:
    /// an aggregate's [`canonical`] form would not tell one input from another).
    Dlq(&'static str, String),
}

/// A partition's state as facts (see the module's doc).
type State = BTreeSet<String>;

/// A record committed for an input: its topic, its reason header, its output as
/// [`canonical`] has it (a dead-letter copy: its value as it is).
type Written = (&'static str, Option<String>, String);

/// The fate of every input record, and each partition's state after each prefix.
pub struct Reference {
    fates: Vec<Vec<Fate>>,
    /// `states[p][n]`: partition `p`'s state after its first `n` records.
    states: Vec<Vec<State>>,
}

/// Whether the broker refuses the outputs of `r`: its timestamp is odd.
pub fn poisoned(r: &OwnedRecord) -> bool {
    r.timestamp.is_some_and(|t| t % 2 != 0)
}

/// One partition's running state, as the reference keeps it.
#[derive(Clone, Default)]
struct Running {
    keys: BTreeSet<(i64, Vec<u8>)>,
    totals: BTreeMap<(i64, Vec<u8>), (u64, i64)>,
    stream: Option<i64>,
}

impl Running {
    fn facts(&self) -> State {
        let mut f: State = (self.keys.iter())
            .map(|(w, k)| format!("key {w} {}", String::from_utf8_lossy(k)))
            .collect();
        for ((w, g), (count, sum)) in &self.totals {
            f.insert(total(*w, g, *count, *sum));
        }
        f.extend(self.stream.map(|t| format!("stream time {t}")));
        f
    }

    /// What `r` becomes in `mode`, and the state it leaves.
    fn take(&mut self, mode: Mode, r: &OwnedRecord) -> Fate {
        let t = r.timestamp.unwrap_or_default();
        let start = t.div_euclid(WINDOW_MS) * WINDOW_MS;
        let key = r.key.clone().unwrap_or_default();
        let copy = || String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into();
        if self.stream.is_some_and(|s| start + WINDOW_MS <= s) {
            return Fate::Dlq("late", copy());
        }
        let n = number(r);
        let outputs = match mode {
            Mode::Dedup if self.keys.contains(&(start, key.clone())) => Vec::new(),
            Mode::Dedup => {
                vec![String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into()]
            }
            Mode::Updates => {
                let (c, s) = self
                    .totals
                    .get(&(start, key.clone()))
                    .copied()
                    .unwrap_or_default();
                vec![total(start, &key, c + 1, s + n)]
            }
            Mode::Final => self.closing(t),
        };
        if poisoned(r) && !outputs.is_empty() {
            return Fate::Dlq("rejected_by_broker", copy());
        }
        match mode {
            Mode::Dedup => {
                self.keys.insert((start, key));
            }
            Mode::Updates | Mode::Final => {
                let acc = self.totals.entry((start, key)).or_default();
                *acc = (acc.0 + 1, acc.1 + n);
            }
        }
        self.stream = self.stream.max(Some(t));
        Fate::Out(outputs)
    }

    /// The totals of the windows a record at `t` closes.
    fn closing(&self, t: i64) -> Vec<String> {
        if self.stream.is_some_and(|s| t <= s) {
            return Vec::new();
        }
        let closes = |w: i64| w + WINDOW_MS <= t && self.stream.is_none_or(|s| w + WINDOW_MS > s);
        (self.totals.iter())
            .filter(|((w, _), _)| closes(*w))
            .map(|((w, g), (c, s))| total(*w, g, *c, *s))
            .collect()
    }
}

/// The `n` of a record's JSON value.
fn number(r: &OwnedRecord) -> i64 {
    let v: serde_json::Value =
        serde_json::from_slice(r.value.as_deref().unwrap_or_default()).unwrap_or_default();
    v["n"].as_i64().unwrap_or_default()
}

/// A group's totals as a fact and as an output's canonical form.
fn total(window: i64, group: &[u8], count: u64, sum: i64) -> String {
    let group = String::from_utf8_lossy(group);
    format!("total {window} {group} {count} {sum}")
}

/// An output's value as the reference writes it: the dedup's as it is, an aggregate's totals
/// as [`total`] writes them.
pub fn canonical(mode: Mode, value: &[u8]) -> String {
    if mode == Mode::Dedup {
        return String::from_utf8_lossy(value).into();
    }
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    let group = v["group"].as_str().unwrap_or_default().as_bytes();
    let (start, count) = (v["start"].as_i64(), v["count"].as_u64());
    total(
        start.unwrap_or(-1),
        group,
        count.unwrap_or(0),
        v["sum"].as_i64().unwrap_or(-1),
    )
}

impl Reference {
    /// The reference of `input` in `mode`.
    pub fn of(input: &[Vec<OwnedRecord>], mode: Mode) -> Reference {
        let (mut fates, mut states) = (Vec::new(), Vec::new());
        for records in input {
            let mut running = Running::default();
            let (mut f, mut s) = (Vec::new(), vec![running.facts()]);
            for r in records {
                f.push(running.take(mode, r));
                s.push(running.facts());
            }
            fates.push(f);
            states.push(s);
        }
        Reference { fates, states }
    }

    /// What committed for each input, by (partition, offset), in lineage order.
    fn written(&self, m: &Model) -> Result<BTreeMap<(i32, i64), Vec<Written>>, String> {
        let mut seen: BTreeMap<(i32, i64), Vec<(usize, Written)>> = BTreeMap::new();
        for topic in [OUTPUT, DLQ] {
            for (_, e) in m.committed_records(topic, 0) {
                let lineage = e.lineage.as_deref().unwrap_or_default();
                let Some((_, p, o, i)) = crate::headers::parse_lineage(lineage.as_bytes()) else {
                    return Err(format!("{topic}: a record without a lineage"));
                };
                let shown = match topic {
                    DLQ => String::from_utf8_lossy(e.value.as_deref().unwrap_or_default()).into(),
                    _ => e.canonical.clone(),
                };
                let w = (topic, e.reason.clone(), shown);
                seen.entry((p, o)).or_default().push((i, w));
            }
        }
        Ok(seen
            .into_iter()
            .map(|(k, mut v)| {
                v.sort_by_key(|(i, _)| *i);
                (k, v.into_iter().map(|(_, w)| w).collect())
            })
            .collect())
    }

    /// Checks what committed against the reference: every input below its partition's
    /// committed offset became what it should, exactly once; nothing above it did; and the
    /// changelog holds the state of what committed.
    pub fn check(&self, m: &Model) -> Result<(), String> {
        let mut seen = self.written(m)?;
        for (p, fates) in self.fates.iter().enumerate() {
            let tp = (INPUT.to_string(), p as i32);
            let committed = m.committed.get(&tp).copied().unwrap_or(0);
            for (o, fate) in fates.iter().enumerate() {
                let got = seen.remove(&(p as i32, o as i64)).unwrap_or_default();
                let at = format!("in/{p}/{o} (committed {committed}): {fate:?}, got {got:?}");
                if (o as i64) >= committed {
                    if !got.is_empty() {
                        return Err(format!("an output without its offset: {at}"));
                    }
                    continue;
                }
                let want: Vec<Written> = match fate {
                    Fate::Out(outputs) => (outputs.iter())
                        .map(|v| (OUTPUT, None, v.clone()))
                        .collect(),
                    Fate::Dlq(reason, copy) => vec![(DLQ, Some(reason.to_string()), copy.clone())],
                };
                if got != want {
                    return Err(format!("not exactly once: {at}"));
                }
            }
            self.check_state(m, p, committed)?;
        }
        match seen.keys().next() {
            Some(k) => Err(format!("an output of no input: {k:?}")),
            None => Ok(()),
        }
    }

    /// The changelog of partition `p` holds the state of its first `committed` records.
    fn check_state(&self, m: &Model, p: usize, committed: i64) -> Result<(), String> {
        let mut running = Running::default();
        for (_, e) in m.committed_records(CHANGELOG, p as i32) {
            match changelog::decode(e.key.as_deref(), e.value.as_deref()) {
                Ok(Change::Key { window, key }) => {
                    running.keys.insert((window.start, key.to_vec()));
                }
                Ok(Change::Total { window, group, acc }) => {
                    let Sum::Int(sum) = acc.sum else {
                        return Err(format!("changelog {p}: a float sum {acc:?}"));
                    };
                    let at = (window.start, group.to_vec());
                    running.totals.insert(at, (acc.count, sum));
                }
                Ok(Change::StreamTime(t)) => running.stream = running.stream.max(Some(t)),
                Err(e) => return Err(format!("changelog {p}: {e}")),
            }
        }
        let (got, want) = (running.facts(), &self.states[p][committed as usize]);
        if &got != want {
            let extra: Vec<&String> = got.difference(want).collect();
            let missing: Vec<&String> = want.difference(&got).collect();
            return Err(format!(
                "changelog {p} at committed offset {committed}: holds {extra:?} too, lacks \
                 {missing:?}"
            ));
        }
        Ok(())
    }

    /// The input with each record's fate, for the report of a failure.
    pub fn show(&self, m: &Model) -> String {
        let mut s = String::new();
        for (p, records) in m.input.iter().enumerate() {
            for (r, fate) in records.iter().zip(&self.fates[p]) {
                let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default());
                let t = r.timestamp.unwrap_or_default();
                s.push_str(&format!(
                    "in/{p}/{}: {key} at {t} (n {}): {fate:?}\n",
                    r.offset,
                    number(r)
                ));
            }
        }
        s
    }

    /// Whether every partition is committed to its end.
    pub fn done(&self, m: &Model) -> bool {
        self.fates.iter().enumerate().all(|(p, f)| {
            let tp = (INPUT.to_string(), p as i32);
            m.committed.get(&tp).copied().unwrap_or(0) == f.len() as i64
        })
    }
}

//! What the input should become, worked out apart from exactly, and the invariants checked
//! against the model after every step.
//!
//! The reference is the dedup's rule written plainly, one partition at a time in offset
//! order: a record whose window closed at the partition's stream time goes to the
//! dead-letter topic (`late`); the first record of its key in its window goes out, unless the
//! broker refuses its output (then its dead-letter copy goes, and it changes no state); any
//! other is dropped. The stream time is the latest time of the records kept (first or
//! dropped as duplicates).

use std::collections::{BTreeMap, BTreeSet};

use super::instance::WINDOW_MS;
use super::model::{CHANGELOG, DLQ, INPUT, Model, OUTPUT};
use crate::state::changelog;
use crate::state::seen::Change;
use crate::transform::OwnedRecord;

/// What becomes of one input record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It goes out.
    Out,
    /// Its dead-letter copy goes, for this reason.
    Dlq(&'static str),
    /// Nothing of it goes (a duplicate).
    Dropped,
}

/// The state of one partition after a prefix of its records: the (window start, key) pairs
/// seen, and the stream time.
pub type State = (BTreeSet<(i64, Vec<u8>)>, Option<i64>);

/// A record committed for an input: its topic, and its reason header.
type Written<'a> = (&'a str, Option<&'a str>);

/// The fate of every input record, and each partition's state after each prefix.
pub struct Reference {
    fates: Vec<Vec<Fate>>,
    /// `states[p][n]`: partition `p`'s state after its first `n` records.
    states: Vec<Vec<State>>,
}

/// Whether the broker refuses the output of `r` (its value holds `poison`).
pub fn poisoned(r: &OwnedRecord) -> bool {
    r.value
        .as_deref()
        .is_some_and(|v| v.windows(6).any(|w| w == b"poison"))
}

impl Reference {
    /// The reference of `input`.
    pub fn of(input: &[Vec<OwnedRecord>]) -> Reference {
        let (mut fates, mut states) = (Vec::new(), Vec::new());
        for records in input {
            let mut state: State = Default::default();
            let (mut f, mut s) = (Vec::new(), vec![state.clone()]);
            for r in records {
                let t = r.timestamp.unwrap_or_default();
                let start = t.div_euclid(WINDOW_MS) * WINDOW_MS;
                let key = (start, r.key.clone().unwrap_or_default());
                let fate = if state.1.is_some_and(|st| start + WINDOW_MS <= st) {
                    Fate::Dlq("late")
                } else if state.0.contains(&key) {
                    state.1 = state.1.max(Some(t));
                    Fate::Dropped
                } else if poisoned(r) {
                    Fate::Dlq("rejected_by_broker")
                } else {
                    state.0.insert(key);
                    state.1 = state.1.max(Some(t));
                    Fate::Out
                };
                f.push(fate);
                s.push(state.clone());
            }
            fates.push(f);
            states.push(s);
        }
        Reference { fates, states }
    }

    /// Checks what committed against the reference: every input below
    /// its partition's committed offset became what it should, exactly once; nothing above it
    /// did; and the changelog holds the state of what committed.
    pub fn check(&self, m: &Model) -> Result<(), String> {
        let mut seen: BTreeMap<(i32, i64), Vec<Written>> = BTreeMap::new();
        for topic in [OUTPUT, DLQ] {
            for (_, e) in m.committed_records(topic, 0) {
                let lineage = e.lineage.as_deref().unwrap_or_default();
                let Some((_, p, o, _)) = crate::headers::parse_lineage(lineage.as_bytes()) else {
                    return Err(format!("{topic}: a record without a lineage"));
                };
                seen.entry((p, o))
                    .or_default()
                    .push((topic, e.reason.as_deref()));
            }
        }
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
                let right = match fate {
                    Fate::Out => got == [(OUTPUT, None)],
                    Fate::Dlq(reason) => got == [(DLQ, Some(*reason))],
                    Fate::Dropped => got.is_empty(),
                };
                if !right {
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
        let mut state: State = Default::default();
        for (_, e) in m.committed_records(CHANGELOG, p as i32) {
            match changelog::decode(e.key.as_deref(), e.value.as_deref()) {
                Ok(Change::Key { window, key }) => {
                    state.0.insert((window.start, key.to_vec()));
                }
                Ok(Change::StreamTime(t)) => state.1 = state.1.max(Some(t)),
                Ok(other) => return Err(format!("changelog {p}: {other:?}")),
                Err(e) => return Err(format!("changelog {p}: {e}")),
            }
        }
        let want = &self.states[p][committed as usize];
        if &state != want {
            return Err(format!(
                "changelog {p} at committed offset {committed}: {} keys, stream time {:?}; \
                 the input's first {committed} records make {} keys, stream time {:?}",
                state.0.len(),
                state.1,
                want.0.len(),
                want.1
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
                let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default());
                let t = r.timestamp.unwrap_or_default() - 1_700_000_000_000;
                s.push_str(&format!(
                    "in/{p}/{}: {key} at {}m ({value}): {fate:?}\n",
                    r.offset,
                    t / 60_000
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

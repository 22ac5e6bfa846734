//! The keys seen per window, per input partition: what the dedup transform decides from.
//!
//! Two layers, so a decision never outlives its transaction: what committed units decided
//! (the cache of the changelog), and what the open unit decided so far. A decision sees both
//! (a key first seen earlier in the open unit is a duplicate now). [`Seen::committed`] moves
//! the open unit's layer down once its transaction committed; [`Seen::aborted`] drops it, and
//! the replay decides again from the committed layer. The changelog records a committed
//! decision needs are handed out when it is made ([`Change::Key`], one per new key, none for a
//! duplicate), so they go into the same transaction as the record's output and its offset; the
//! stream time, which nearly every record moves, once per unit and partition, before the
//! commit ([`Seen::stream_times`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::kafka::Tp;

use super::window::{Window, Windows};

/// What a record's (window, key) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The first of its window: it goes on.
    First,
    /// Its key was seen in its window already.
    Duplicate,
    /// Its window closed before it came (end + grace at or before the partition's stream
    /// time).
    Late,
    /// A new key for a window of its partition that holds the most keys allowed already.
    Full,
}

/// A group's running totals in a window (`--aggregate`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Acc {
    /// Records.
    pub count: u64,
    /// The sum of their numbers.
    pub sum: Sum,
    /// Distinct values among them.
    pub distinct: u64,
}

/// A sum: exact while every number is an integer and it fits an i64, a float from then on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sum {
    /// Exact.
    Int(i64),
    /// Not exact any more.
    Float(f64),
}

impl Default for Sum {
    fn default() -> Sum {
        Sum::Int(0)
    }
}

impl Sum {
    /// This plus `n`.
    pub fn plus(self, n: Sum) -> Sum {
        match (self, n) {
            (Sum::Int(a), Sum::Int(b)) => match a.checked_add(b) {
                Some(s) => Sum::Int(s),
                None => Sum::Float(a as f64 + b as f64),
            },
            (a, b) => Sum::Float(a.as_f64() + b.as_f64()),
        }
    }

    /// As a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Sum::Int(i) => i as f64,
            Sum::Float(f) => f,
        }
    }
}

/// What one record adds to its group's totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Adds<'a> {
    /// Its number, if it has one.
    pub number: Option<Sum>,
    /// Its distinct value's key (the group and the value, [`distinct_key`]), if it has one.
    pub distinct: Option<&'a [u8]>,
}

/// The key a distinct value is remembered by: the group's length (u32 BE), the group, the
/// value. Counting distinct values is the dedup of these.
pub fn distinct_key(group: &[u8], value: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + group.len() + value.len());
    k.extend(u32::try_from(group.len()).unwrap_or(u32::MAX).to_be_bytes());
    k.extend_from_slice(group);
    k.extend_from_slice(value);
    k
}

/// A state change for the changelog: a key first seen in a window, a group's totals in a
/// window, or the partition's stream time.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// `key` was first seen in `window`.
    Key {
        /// The window.
        window: Window,
        /// The key.
        key: Box<[u8]>,
    },
    /// `group`'s totals in `window` are now `acc`.
    Total {
        /// The window.
        window: Window,
        /// The group.
        group: Box<[u8]>,
        /// Its totals.
        acc: Acc,
    },
    /// The partition's stream time (the latest event time seen) moved to this.
    StreamTime(i64),
}

/// A window's groups and their totals, by group.
pub type Totals = Vec<(Box<[u8]>, Acc)>;

/// A window, the keys seen in it, and its groups' totals.
#[derive(Debug)]
struct Slot {
    window: Window,
    keys: HashSet<Box<[u8]>>,
    totals: HashMap<Box<[u8]>, Acc>,
    /// In the open layer: the groups of `totals` the committed layer does not have (the
    /// others are copies of its totals, moved on).
    fresh: usize,
}

impl Slot {
    fn new(window: Window) -> Slot {
        Slot {
            window,
            keys: HashSet::new(),
            totals: HashMap::new(),
            fresh: 0,
        }
    }
}

/// One partition's layer: the keys per window, and the stream time.
#[derive(Debug, Default)]
struct Layer {
    /// By window start. Ordered, so closed windows go in bulk.
    windows: BTreeMap<i64, Slot>,
    stream_time: Option<i64>,
}

impl Layer {
    fn contains(&self, window: &Window, key: &[u8]) -> bool {
        self.windows
            .get(&window.start)
            .is_some_and(|slot| slot.keys.contains(key))
    }

    fn slot(&mut self, window: Window) -> &mut Slot {
        self.windows
            .entry(window.start)
            .or_insert_with(|| Slot::new(window))
    }

    fn insert(&mut self, window: Window, key: Box<[u8]>) {
        self.slot(window).keys.insert(key);
    }

    fn total(&self, window: &Window, group: &[u8]) -> Option<&Acc> {
        self.windows.get(&window.start)?.totals.get(group)
    }

    /// Keys and groups held.
    fn keys(&self) -> usize {
        self.windows
            .values()
            .map(|s| s.keys.len() + s.totals.len())
            .sum()
    }

    /// Keys held in `window`, and the groups: all of them in the committed layer, the fresh
    /// ones in the open layer.
    fn keys_in(&self, window: &Window, open: bool) -> usize {
        self.windows.get(&window.start).map_or(0, |s| {
            s.keys.len() + if open { s.fresh } else { s.totals.len() }
        })
    }
}

/// The keys seen per window, for each partition this instance owns.
#[derive(Debug)]
pub struct Seen {
    windows: Windows,
    committed: HashMap<Tp, Layer>,
    open: HashMap<Tp, Layer>,
    /// The most keys a window of one partition takes.
    max_keys: usize,
}

impl Seen {
    /// Nothing seen yet, windows as `windows` says.
    pub fn new(windows: Windows) -> Seen {
        Seen {
            windows,
            committed: HashMap::new(),
            open: HashMap::new(),
            max_keys: usize::MAX,
        }
    }

    /// At most `max` keys per window of one partition: a new key past them is [`Verdict::Full`].
    pub fn capped(mut self, max: usize) -> Seen {
        self.max_keys = max;
        self
    }

    /// The windows.
    pub fn windows(&self) -> &Windows {
        &self.windows
    }

    /// Decides a record of `tp` with key `key` at event time `t` in `window` (the open
    /// unit's), and says what the changelog must get for it now.
    pub fn offer(
        &mut self,
        tp: &Tp,
        window: Window,
        key: &[u8],
        t: i64,
    ) -> (Verdict, Option<Change>) {
        let verdict = self.decide(tp, &window, key);
        self.advance(tp, t);
        if verdict != Verdict::First {
            return (verdict, None);
        }
        (Verdict::First, Some(self.remember(tp, window, key)))
    }

    /// What a record of `tp` with key `key` in `window` is, changing nothing.
    pub fn decide(&self, tp: &Tp, window: &Window, key: &[u8]) -> Verdict {
        if self.closed(tp, window) {
            return Verdict::Late;
        }
        if self.contains(tp, window, key) {
            return Verdict::Duplicate;
        }
        if self.held(tp, window) >= self.max_keys {
            return Verdict::Full;
        }
        Verdict::First
    }

    /// Whether `window` of `tp` closed at its stream time (the open unit's).
    fn closed(&self, tp: &Tp, window: &Window) -> bool {
        self.time(tp)
            .is_some_and(|s| self.windows.closes(window) <= s)
    }

    /// The stream time of `tp`, the open unit's if it moved it.
    fn time(&self, tp: &Tp) -> Option<i64> {
        let (committed, open) = (self.committed.get(tp), self.open.get(tp));
        open.and_then(|o| o.stream_time)
            .or(committed.and_then(|c| c.stream_time))
    }

    fn contains(&self, tp: &Tp, window: &Window, key: &[u8]) -> bool {
        let seen = |l: Option<&Layer>| l.is_some_and(|l| l.contains(window, key));
        seen(self.open.get(tp)) || seen(self.committed.get(tp))
    }

    /// Keys and groups held in `window` of `tp`, both layers.
    fn held(&self, tp: &Tp, window: &Window) -> usize {
        let open = self.open.get(tp).map_or(0, |l| l.keys_in(window, true));
        open + (self.committed.get(tp)).map_or(0, |l| l.keys_in(window, false))
    }

    /// `group`'s totals in `window` of `tp` so far (the open unit's, else the committed ones).
    pub fn total(&self, tp: &Tp, window: &Window, group: &[u8]) -> Option<Acc> {
        let of = |l: Option<&Layer>| l.and_then(|l| l.total(window, group)).copied();
        of(self.open.get(tp)).or_else(|| of(self.committed.get(tp)))
    }

    /// What a record of `tp` for `group` in `window` adding `adds` is, changing nothing:
    /// [`Verdict::First`] when it is taken (there is no duplicate of an aggregate's record).
    pub fn admit(&self, tp: &Tp, window: &Window, group: &[u8], adds: Adds<'_>) -> Verdict {
        if self.closed(tp, window) {
            return Verdict::Late;
        }
        let new_group = usize::from(self.total(tp, window, group).is_none());
        let new_value = adds
            .distinct
            .map_or(0, |k| usize::from(!self.contains(tp, window, k)));
        if new_group + new_value > 0
            && self.held(tp, window) + new_group + new_value > self.max_keys
        {
            return Verdict::Full;
        }
        Verdict::First
    }

    /// `group`'s totals in `window` of `tp` once `adds` is added, changing nothing.
    pub fn peek(&self, tp: &Tp, window: &Window, group: &[u8], adds: Adds<'_>) -> Acc {
        let mut acc = self.total(tp, window, group).unwrap_or_default();
        acc.count += 1;
        if let Some(n) = adds.number {
            acc.sum = acc.sum.plus(n);
        }
        if adds.distinct.is_some_and(|k| !self.contains(tp, window, k)) {
            acc.distinct += 1;
        }
        acc
    }

    /// A record of `tp` for `group` in `window` admitted by the open unit adds `adds`: its
    /// group's new totals, and the change for the changelog now (a distinct value first seen;
    /// the totals go once per unit, [`Seen::totals`]).
    pub fn add(
        &mut self,
        tp: &Tp,
        window: Window,
        group: &[u8],
        adds: Adds<'_>,
    ) -> (Acc, Option<Change>) {
        let acc = self.peek(tp, &window, group, adds);
        let change = adds
            .distinct
            .filter(|k| !self.contains(tp, &window, k))
            .map(|k| self.remember(tp, window, k));
        let committed = (self.committed.get(tp)).is_some_and(|l| l.total(&window, group).is_some());
        let slot = self.open.entry(tp.clone()).or_default().slot(window);
        if slot.totals.insert(group.into(), acc).is_none() && !committed {
            slot.fresh += 1;
        }
        (acc, change)
    }

    /// The windows of `tp` a record at event time `t` closes (its close after the stream time
    /// and at or before `t`), each with every group's totals, by group; changing nothing.
    pub fn closing(&self, tp: &Tp, t: i64) -> Vec<(Window, Totals)> {
        let now = self.time(tp);
        if now.is_some_and(|s| t <= s) {
            return Vec::new();
        }
        let closes = |w: &Window| {
            let c = self.windows.closes(w);
            c <= t && now.is_none_or(|s| c > s)
        };
        let mut closed = BTreeMap::<i64, (Window, BTreeMap<_, _>)>::new();
        // The committed totals first, the open unit's over them.
        for layer in [self.committed.get(tp), self.open.get(tp)]
            .into_iter()
            .flatten()
        {
            for slot in layer.windows.values().filter(|s| closes(&s.window)) {
                let (_, totals) = closed
                    .entry(slot.window.start)
                    .or_insert_with(|| (slot.window, BTreeMap::new()));
                totals.extend(slot.totals.iter().map(|(g, a)| (g.clone(), *a)));
            }
        }
        (closed.into_values())
            .filter(|(_, totals)| !totals.is_empty())
            .map(|(w, totals)| (w, totals.into_iter().collect()))
            .collect()
    }

    /// The totals the open unit moved, for the changelog before it commits: one change per
    /// (window, group) touched, with its latest totals.
    pub fn totals(&self) -> Vec<(Tp, Change)> {
        let mut moved = Vec::new();
        for (tp, open) in &self.open {
            for slot in open.windows.values() {
                moved.extend(slot.totals.iter().map(|(group, acc)| {
                    let change = Change::Total {
                        window: slot.window,
                        group: group.clone(),
                        acc: *acc,
                    };
                    (tp.clone(), change)
                }));
            }
        }
        moved.sort_by(|a, b| a.0.cmp(&b.0));
        moved
    }

    /// A record of `tp` at event time `t` was taken (whatever its verdict): the stream time
    /// moves to it if it is later.
    pub fn advance(&mut self, tp: &Tp, t: i64) {
        let committed = self.committed.get(tp).and_then(|c| c.stream_time);
        let open = self.open.entry(tp.clone()).or_default();
        if open.stream_time.or(committed).is_none_or(|s| t > s) {
            open.stream_time = Some(t);
        }
    }

    /// `key` was first seen in `window` by the open unit: the change for the changelog.
    pub fn remember(&mut self, tp: &Tp, window: Window, key: &[u8]) -> Change {
        self.open
            .entry(tp.clone())
            .or_default()
            .insert(window, key.into());
        Change::Key {
            window,
            key: key.into(),
        }
    }

    /// The stream times the open unit moved, for the changelog before it commits.
    pub fn stream_times(&self) -> Vec<(Tp, Change)> {
        let mut moved: Vec<_> = (self.open.iter())
            .filter_map(|(tp, open)| Some((tp.clone(), Change::StreamTime(open.stream_time?))))
            .collect();
        moved.sort_by(|a, b| a.0.cmp(&b.0));
        moved
    }

    /// The open unit's transaction committed: its decisions are the committed ones now, and
    /// windows closed by the stream time are dropped, in bulk.
    pub fn committed(&mut self) {
        for (tp, open) in self.open.drain() {
            let layer = self.committed.entry(tp).or_default();
            if open.stream_time > layer.stream_time {
                layer.stream_time = open.stream_time;
            }
            for (_, moved) in open.windows {
                let slot = layer.slot(moved.window);
                slot.keys.extend(moved.keys);
                slot.totals.extend(moved.totals);
            }
            expire(layer, &self.windows);
        }
    }

    /// The open unit ended without a commit (or with an outcome not known to be one): its
    /// decisions are forgotten; its records come again.
    pub fn aborted(&mut self) {
        self.open.clear();
    }

    /// A committed change read back from the changelog of `tp` (the restore).
    pub fn restore(&mut self, tp: &Tp, change: Change) {
        let layer = self.committed.entry(tp.clone()).or_default();
        match change {
            Change::StreamTime(t) => {
                if layer.stream_time.is_none_or(|s| t > s) {
                    layer.stream_time = Some(t);
                }
            }
            Change::Key { window, key } => layer.insert(window, key),
            Change::Total { window, group, acc } => {
                layer.slot(window).totals.insert(group, acc);
            }
        }
    }

    /// The restore of `tp` is complete: windows closed by its stream time are dropped.
    pub fn restored(&mut self, tp: &Tp) {
        if let Some(layer) = self.committed.get_mut(tp) {
            expire(layer, &self.windows);
        }
    }

    /// `tp` is no longer this instance's: its state goes (the next owner restores it).
    pub fn revoked(&mut self, tp: &Tp) {
        self.committed.remove(tp);
        self.open.remove(tp);
    }

    /// The committed stream time of `tp`, if it has one.
    pub fn stream_time(&self, tp: &Tp) -> Option<i64> {
        self.committed.get(tp)?.stream_time
    }

    /// Committed keys (and groups) held, over all partitions and windows.
    pub fn keys(&self) -> usize {
        self.committed.values().map(Layer::keys).sum()
    }

    /// Keys in the fullest committed window of one partition.
    pub fn fullest_window(&self) -> usize {
        (self.committed.values())
            .flat_map(|l| l.windows.values().map(|s| s.keys.len() + s.totals.len()))
            .max()
            .unwrap_or(0)
    }

    /// Windows held, over all partitions.
    pub fn open_windows(&self) -> usize {
        self.committed.values().map(|l| l.windows.len()).sum()
    }
}

/// Drops the windows of `layer` that closed at its stream time.
fn expire(layer: &mut Layer, windows: &Windows) {
    let Some(now) = layer.stream_time else {
        return;
    };
    // Windows are ordered by start, and with it by end: the closed ones come first.
    let still_open = layer
        .windows
        .iter()
        .find(|(_, slot)| windows.closes(&slot.window) > now)
        .map(|(start, _)| *start);
    match still_open {
        Some(start) => layer.windows = layer.windows.split_off(&start),
        None => layer.windows.clear(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jiff::tz::TimeZone;

    use super::super::window::Size;
    use super::*;

    const HOUR: i64 = 3_600_000;

    fn seen(grace_hours: u64) -> (Seen, Tp) {
        let windows = Windows::new(
            Size::Days(1),
            TimeZone::UTC,
            Duration::from_secs(grace_hours * 3600),
        );
        (Seen::new(windows), ("in".to_string(), 0))
    }

    fn offer(s: &mut Seen, tp: &Tp, key: &str, t: i64) -> Verdict {
        let w = s.windows().of(t).unwrap();
        s.offer(tp, w, key.as_bytes(), t).0
    }

    #[test]
    fn the_first_of_a_key_in_a_window_goes_on_and_later_ones_are_duplicates() {
        let (mut s, tp) = seen(0);
        assert_eq!(offer(&mut s, &tp, "dev-1", HOUR), Verdict::First);
        // The open unit's own decisions count.
        assert_eq!(offer(&mut s, &tp, "dev-1", 2 * HOUR), Verdict::Duplicate);
        assert_eq!(offer(&mut s, &tp, "dev-2", 2 * HOUR), Verdict::First);
        s.committed();
        assert_eq!(offer(&mut s, &tp, "dev-1", 3 * HOUR), Verdict::Duplicate);
        // The next day is another window.
        assert_eq!(offer(&mut s, &tp, "dev-1", 25 * HOUR), Verdict::First);
        // Partitions are apart (a key lives in one partition; co-partitioning is the
        // caller's to check).
        assert_eq!(
            offer(&mut s, &("in".into(), 1), "dev-1", HOUR),
            Verdict::First
        );
    }

    #[test]
    fn an_aborted_units_decisions_are_forgotten() {
        let (mut s, tp) = seen(0);
        assert_eq!(offer(&mut s, &tp, "a", HOUR), Verdict::First);
        s.committed();
        assert_eq!(offer(&mut s, &tp, "b", 2 * HOUR), Verdict::First);
        // Its stream time too: what moved it comes again.
        assert_eq!(offer(&mut s, &tp, "c", 30 * HOUR), Verdict::First);
        s.aborted();
        // The replay decides the same again.
        assert_eq!(offer(&mut s, &tp, "b", 2 * HOUR), Verdict::First);
        assert_eq!(offer(&mut s, &tp, "a", 2 * HOUR), Verdict::Duplicate);
    }

    #[test]
    fn a_record_after_its_window_closed_is_late_and_closed_windows_go() {
        let (mut s, tp) = seen(2);
        assert_eq!(offer(&mut s, &tp, "a", HOUR), Verdict::First);
        // Day 1 ends at 24 h and closes at 26 h.
        assert_eq!(offer(&mut s, &tp, "x", 25 * HOUR), Verdict::First);
        assert_eq!(
            offer(&mut s, &tp, "b", 23 * HOUR),
            Verdict::First,
            "within the grace"
        );
        assert_eq!(offer(&mut s, &tp, "y", 26 * HOUR), Verdict::First);
        assert_eq!(offer(&mut s, &tp, "c", 23 * HOUR), Verdict::Late);
        assert_eq!(offer(&mut s, &tp, "a", 23 * HOUR), Verdict::Late);
        s.committed();
        assert_eq!(s.open_windows(), 1, "day 0 closed and went");
        assert_eq!(s.keys(), 2);
    }

    #[test]
    fn the_changes_are_what_a_restore_needs_to_decide_the_same() {
        let (mut s, tp) = seen(1);
        let mut log = Vec::new();
        let mut decide = |s: &mut Seen, key: &str, t: i64| {
            let w = s.windows().of(t).unwrap();
            let (v, change) = s.offer(&tp, w, key.as_bytes(), t);
            log.extend(change);
            v
        };
        decide(&mut s, "a", HOUR);
        decide(&mut s, "a", 2 * HOUR);
        decide(&mut s, "b", 20 * HOUR);
        decide(&mut s, "c", 26 * HOUR);
        // One change per new key, a duplicate writes none; the stream time once per unit.
        assert_eq!(log.len(), 3);
        let times = s.stream_times();
        assert_eq!(times, [(tp.clone(), Change::StreamTime(26 * HOUR))]);
        log.extend(times.into_iter().map(|(_, c)| c));
        s.committed();
        assert!(s.stream_times().is_empty(), "nothing open");
        let (mut r, _) = seen(1);
        for c in log {
            r.restore(&tp, c);
        }
        r.restored(&tp);
        assert_eq!((r.keys(), r.open_windows()), (s.keys(), s.open_windows()));
        for (key, t) in [
            ("a", 3 * HOUR),
            ("b", 27 * HOUR),
            ("c", 27 * HOUR),
            ("d", 3 * HOUR),
        ] {
            assert_eq!(
                offer(&mut r, &tp, key, t),
                offer(&mut s, &tp, key, t),
                "{key} at {t}"
            );
        }
    }

    #[test]
    fn a_window_at_its_cap_takes_no_new_key_and_still_knows_its_own() {
        let (s, tp) = seen(0);
        let mut s = s.capped(2);
        assert_eq!(offer(&mut s, &tp, "a", HOUR), Verdict::First);
        s.committed();
        assert_eq!(offer(&mut s, &tp, "b", HOUR), Verdict::First);
        // Both layers count: one key committed, one open.
        assert_eq!(offer(&mut s, &tp, "c", HOUR), Verdict::Full);
        assert_eq!(offer(&mut s, &tp, "b", HOUR), Verdict::Duplicate);
        assert_eq!(offer(&mut s, &tp, "a", HOUR), Verdict::Duplicate);
        // Another window, another partition: their own counts.
        assert_eq!(offer(&mut s, &tp, "c", 25 * HOUR), Verdict::First);
        assert_eq!(offer(&mut s, &("in".into(), 1), "c", HOUR), Verdict::First);
    }

    #[test]
    fn a_revoked_partitions_state_goes() {
        let (mut s, tp) = seen(0);
        offer(&mut s, &tp, "a", HOUR);
        s.committed();
        offer(&mut s, &tp, "b", HOUR);
        s.revoked(&tp);
        s.committed();
        assert_eq!(s.keys(), 0);
    }
}

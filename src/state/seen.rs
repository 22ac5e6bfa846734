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

/// A state change for the changelog: a key first seen in a window, or the partition's stream
/// time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `key` was first seen in `window`.
    Key {
        /// The window.
        window: Window,
        /// The key.
        key: Box<[u8]>,
    },
    /// The partition's stream time (the latest event time seen) moved to this.
    StreamTime(i64),
}

/// A window and the keys seen in it.
type Slot = (Window, HashSet<Box<[u8]>>);

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
            .is_some_and(|(_, keys)| keys.contains(key))
    }

    fn insert(&mut self, window: Window, key: Box<[u8]>) {
        let slot = self
            .windows
            .entry(window.start)
            .or_insert_with(|| (window, HashSet::new()));
        slot.1.insert(key);
    }

    fn keys(&self) -> usize {
        self.windows.values().map(|(_, k)| k.len()).sum()
    }

    fn keys_in(&self, window: &Window) -> usize {
        self.windows.get(&window.start).map_or(0, |(_, k)| k.len())
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
        let (committed, open) = (self.committed.get(tp), self.open.get(tp));
        let time = open
            .and_then(|o| o.stream_time)
            .or(committed.and_then(|c| c.stream_time));
        if time.is_some_and(|s| self.windows.closes(window) <= s) {
            return Verdict::Late;
        }
        let seen = |l: Option<&Layer>| l.is_some_and(|l| l.contains(window, key));
        if seen(open) || seen(committed) {
            return Verdict::Duplicate;
        }
        let held = |l: Option<&Layer>| l.map_or(0, |l| l.keys_in(window));
        if held(open) + held(committed) >= self.max_keys {
            return Verdict::Full;
        }
        Verdict::First
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
            for (_, (window, keys)) in open.windows {
                let slot = layer
                    .windows
                    .entry(window.start)
                    .or_insert_with(|| (window, HashSet::new()));
                slot.1.extend(keys);
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

    /// Committed keys held, over all partitions and windows.
    pub fn keys(&self) -> usize {
        self.committed.values().map(Layer::keys).sum()
    }

    /// Keys in the fullest committed window of one partition.
    pub fn fullest_window(&self) -> usize {
        (self.committed.values())
            .flat_map(|l| l.windows.values().map(|(_, keys)| keys.len()))
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
        .find(|(_, (w, _))| windows.closes(w) > now)
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

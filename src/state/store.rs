//! The local store (`--state-dir`): the committed keys (and the aggregates' totals) on disk, so a restart reads only the
//! changelog's records since the store's mark, not the whole history.
//!
//! A cache of the changelog, never ahead of it: a unit's changes are written only after its
//! transaction committed, each write is one redb transaction (atomic, checksummed,
//! copy-on-write: a crash leaves the last complete write), and a partition's mark (the
//! changelog offset it holds everything below) moves only in a write that holds everything
//! below it. A write that is lost (a crash before it, a failed one) leaves the mark behind:
//! the next restore reads those changes from the changelog again, and applying a change twice
//! is applying it once (a key seen; a stream time that only moves forward).
//!
//! Why redb: pure Rust with no dependencies (a quick build; the container needs nothing), a
//! B-tree whose ordered keys give each partition's keys and its closed windows as ranges, and
//! ACID writes with a crash-safe format, maintained and at 1.0+ since 2023. fjall (an LSM
//! tree) writes faster under heavy random inserts but brings more crates and compaction
//! threads; a dedup writes one entry per new key per commit, which a B-tree takes easily.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::changelog;
use super::seen::Change;
use super::window::Window;

/// Keys: partition (4 bytes), window start (8, order-preserving), key bytes; value: the
/// window's end.
const KEYS: TableDefinition<&[u8], i64> = TableDefinition::new("keys");
/// Per partition: the changelog offset the store holds everything below, and the stream time
/// (`i64::MIN`: none).
const MARKS: TableDefinition<i32, (i64, i64)> = TableDefinition::new("marks");
/// The aggregates' totals: partition, window start, group (as in `KEYS`); value: the
/// changelog record's value (window end and the totals, `changelog`).
const TOTALS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("totals");

/// How far into the changelog a partition's stored state is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The first changelog offset the store does not hold: a restore reads from here.
    pub next: i64,
    /// The partition's stream time, if it has one.
    pub stream_time: Option<i64>,
}

/// One write: what a committed unit (or a restore) changed, the windows that closed, and new
/// marks.
#[derive(Debug, Default)]
pub struct Batch {
    /// Keys first seen: partition, window, key.
    pub keys: Vec<(i32, Window, Box<[u8]>)>,
    /// Totals moved (`Change::Total`s), by partition; a later one of a (window, group) wins.
    pub totals: Vec<(i32, Change)>,
    /// Stream times moved: partition, time.
    pub stream_times: Vec<(i32, i64)>,
    /// Windows that start before this are closed: partition, start.
    pub expire: Vec<(i32, i64)>,
    /// Marks moved: partition, next changelog offset.
    pub marks: Vec<(i32, i64)>,
}

impl Batch {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
            && self.totals.is_empty()
            && self.stream_times.is_empty()
            && self.expire.is_empty()
            && self.marks.is_empty()
    }
}

/// Where the committed state is kept between runs.
pub trait Store: Send {
    /// Hands `partition`'s stored keys and totals to `each` (as the changes that made them),
    /// and says how far into the changelog they are (`None`: nothing stored; read the
    /// changelog from its beginning).
    fn load(
        &mut self,
        partition: i32,
        each: &mut dyn FnMut(Change),
    ) -> Result<Option<Mark>, String>;
    /// Writes `batch`, whole or not at all.
    fn write(&mut self, batch: &Batch) -> Result<(), String>;
    /// Forgets everything of `partition` (its changelog no longer has what the mark says).
    fn wipe(&mut self, partition: i32) -> Result<(), String>;
}

/// The store in one redb file.
pub struct Redb {
    db: Database,
}

/// redb's page cache (its default is 1 GiB): the keys a decision reads are in memory anyway
/// (`Seen`), the store is read only by a restore and written at commits.
const CACHE: usize = 16 << 20;

impl Redb {
    /// Opens (or creates) the store at `path`. Another process holding it open is an error.
    pub fn open(path: &Path) -> Result<Redb, String> {
        let db = Database::builder()
            .set_cache_size(CACHE)
            .create(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let w = db.begin_write().map_err(|e| e.to_string())?;
        w.open_table(KEYS).map_err(|e| e.to_string())?;
        w.open_table(MARKS).map_err(|e| e.to_string())?;
        w.open_table(TOTALS).map_err(|e| e.to_string())?;
        w.commit().map_err(|e| e.to_string())?;
        Ok(Redb { db })
    }
}

/// The store's key of (partition, window start, key): ordered by partition, then start.
fn entry(partition: i32, start: i64, key: &[u8]) -> Vec<u8> {
    let mut e = Vec::with_capacity(12 + key.len());
    e.extend(partition.to_be_bytes());
    e.extend(order(start));
    e.extend_from_slice(key);
    e
}

/// `i64` as bytes that sort as the numbers do.
fn order(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn unorder(b: &[u8]) -> Option<i64> {
    let b: [u8; 8] = b.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// Every entry of `partition`: `[partition, partition + 1)`.
fn span(partition: i32) -> (Vec<u8>, Vec<u8>) {
    let from = partition.to_be_bytes().to_vec();
    let to = match partition.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 5],
    };
    (from, to)
}

impl Store for Redb {
    fn load(
        &mut self,
        partition: i32,
        each: &mut dyn FnMut(Change),
    ) -> Result<Option<Mark>, String> {
        let r = self.db.begin_read().map_err(|e| e.to_string())?;
        let marks = r.open_table(MARKS).map_err(|e| e.to_string())?;
        let Some(mark) = marks.get(partition).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let (next, time) = mark.value();
        let keys = r.open_table(KEYS).map_err(|e| e.to_string())?;
        let (from, to) = span(partition);
        for item in keys
            .range(from.as_slice()..to.as_slice())
            .map_err(|e| e.to_string())?
        {
            let (k, end) = item.map_err(|e| e.to_string())?;
            let k = k.value();
            // Written by `write` only: anything shorter is not ours, and is skipped.
            let Some(start) = k.get(4..12).and_then(unorder) else {
                continue;
            };
            let window = Window {
                start,
                end: end.value(),
            };
            each(Change::Key {
                window,
                key: k[12..].into(),
            });
        }
        let totals = r.open_table(TOTALS).map_err(|e| e.to_string())?;
        for item in totals
            .range(from.as_slice()..to.as_slice())
            .map_err(|e| e.to_string())?
        {
            let (k, v) = item.map_err(|e| e.to_string())?;
            // The changelog's record back from its parts; what does not decode is skipped.
            let Some(start) = k.value().get(4..12).and_then(unorder) else {
                continue;
            };
            let mut key = vec![changelog::VERSION, changelog::TOTAL];
            key.extend(start.to_be_bytes());
            key.extend(&k.value()[12..]);
            if let Ok(total) = changelog::decode(Some(&key), Some(v.value())) {
                each(total);
            }
        }
        Ok(Some(Mark {
            next,
            stream_time: (time != i64::MIN).then_some(time),
        }))
    }

    fn write(&mut self, batch: &Batch) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let w = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut keys = w.open_table(KEYS).map_err(|e| e.to_string())?;
            for (p, window, key) in &batch.keys {
                keys.insert(entry(*p, window.start, key).as_slice(), window.end)
                    .map_err(|e| e.to_string())?;
            }
            let mut totals = w.open_table(TOTALS).map_err(|e| e.to_string())?;
            for (p, change) in &batch.totals {
                if let Change::Total { window, group, .. } = change {
                    let (_, value) = changelog::encode(change);
                    totals
                        .insert(entry(*p, window.start, group).as_slice(), value.as_slice())
                        .map_err(|e| e.to_string())?;
                }
            }
            for (p, before) in &batch.expire {
                let (from, _) = span(*p);
                let to = entry(*p, *before, &[]);
                keys.retain_in(from.as_slice()..to.as_slice(), |_, _| false)
                    .map_err(|e| e.to_string())?;
                totals
                    .retain_in(from.as_slice()..to.as_slice(), |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
            let mut marks = w.open_table(MARKS).map_err(|e| e.to_string())?;
            let mut touched: Vec<i32> = (batch.stream_times.iter().map(|(p, _)| *p))
                .chain(batch.marks.iter().map(|(p, _)| *p))
                .chain(batch.keys.iter().map(|(p, _, _)| *p))
                .chain(batch.totals.iter().map(|(p, _)| *p))
                .collect();
            touched.sort_unstable();
            touched.dedup();
            for p in touched {
                let (mut next, mut time) = marks
                    .get(p)
                    .map_err(|e| e.to_string())?
                    .map_or((0, i64::MIN), |m| m.value());
                for (_, t) in batch.stream_times.iter().filter(|(q, _)| *q == p) {
                    time = time.max(*t);
                }
                for (_, n) in batch.marks.iter().filter(|(q, _)| *q == p) {
                    next = next.max(*n);
                }
                marks.insert(p, (next, time)).map_err(|e| e.to_string())?;
            }
        }
        w.commit().map_err(|e| e.to_string())
    }

    fn wipe(&mut self, partition: i32) -> Result<(), String> {
        let w = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut keys = w.open_table(KEYS).map_err(|e| e.to_string())?;
            let (from, to) = span(partition);
            keys.retain_in(from.as_slice()..to.as_slice(), |_, _| false)
                .map_err(|e| e.to_string())?;
            let mut totals = w.open_table(TOTALS).map_err(|e| e.to_string())?;
            totals
                .retain_in(from.as_slice()..to.as_slice(), |_, _| false)
                .map_err(|e| e.to_string())?;
            let mut marks = w.open_table(MARKS).map_err(|e| e.to_string())?;
            marks.remove(partition).map_err(|e| e.to_string())?;
        }
        w.commit().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(s: &mut Redb, p: i32) -> (Option<Mark>, Vec<(i64, Vec<u8>)>) {
        let mut keys = Vec::new();
        let mark = s
            .load(p, &mut |c| {
                if let Change::Key { window, key } = c {
                    keys.push((window.start, key.to_vec()))
                }
            })
            .unwrap();
        (mark, keys)
    }

    #[test]
    fn what_is_written_loads_back_by_partition_and_closed_windows_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let mut s = Redb::open(&path).unwrap();
        assert_eq!(
            loaded(&mut s, 0).0,
            None,
            "nothing stored: from the beginning"
        );
        let w = |start: i64| Window {
            start,
            end: start + 10,
        };
        let batch = Batch {
            keys: vec![
                (0, w(-10), (*b"old").into()),
                (0, w(0), (*b"a").into()),
                (0, w(10), (*b"b").into()),
                (1, w(0), (*b"other").into()),
            ],
            stream_times: vec![(0, 15)],
            marks: vec![(0, 7)],
            ..Batch::default()
        };
        s.write(&batch).unwrap();
        let (mark, keys) = loaded(&mut s, 0);
        assert_eq!(
            mark,
            Some(Mark {
                next: 7,
                stream_time: Some(15)
            })
        );
        assert_eq!(
            keys.len(),
            3,
            "ordered by window, negative starts first: {keys:?}"
        );
        assert_eq!(keys[0], (-10, b"old".to_vec()));
        // Windows before 10 close; the mark never moves back; a crash-free reopen keeps it.
        let expire = Batch {
            expire: vec![(0, 10)],
            marks: vec![(0, 3)],
            ..Batch::default()
        };
        s.write(&expire).unwrap();
        drop(s);
        let mut s = Redb::open(&path).unwrap();
        let (mark, keys) = loaded(&mut s, 0);
        assert_eq!(mark.map(|m| m.next), Some(7));
        assert_eq!(keys, [(10, b"b".to_vec())]);
        assert_eq!(loaded(&mut s, 1).1.len(), 1, "another partition untouched");
        s.wipe(0).unwrap();
        assert_eq!(loaded(&mut s, 0), (None, vec![]));
    }

    #[test]
    fn totals_load_back_the_last_of_each_and_closed_windows_go() {
        use super::super::seen::{Acc, Sum};

        let dir = tempfile::tempdir().unwrap();
        let mut s = Redb::open(&dir.path().join("state.redb")).unwrap();
        let total = |start: i64, group: &[u8], count: u64| Change::Total {
            window: Window {
                start,
                end: start + 10,
            },
            group: group.into(),
            acc: Acc {
                count,
                sum: Sum::Float(0.5),
                distinct: 1,
            },
        };
        let batch = Batch {
            totals: vec![
                (0, total(0, b"g", 1)),
                (0, total(0, b"g", 2)),
                (0, total(10, b"h", 1)),
                (1, total(0, b"g", 9)),
            ],
            marks: vec![(0, 4), (1, 1)],
            ..Batch::default()
        };
        s.write(&batch).unwrap();
        let load = |s: &mut Redb, p: i32| {
            let mut got = Vec::new();
            s.load(p, &mut |c| got.push(c)).unwrap();
            got
        };
        assert_eq!(load(&mut s, 0), [total(0, b"g", 2), total(10, b"h", 1)]);
        s.write(&Batch {
            expire: vec![(0, 10)],
            ..Batch::default()
        })
        .unwrap();
        assert_eq!(load(&mut s, 0), [total(10, b"h", 1)]);
        assert_eq!(
            load(&mut s, 1),
            [total(0, b"g", 9)],
            "another partition untouched"
        );
        s.wipe(1).unwrap();
        assert!(load(&mut s, 1).is_empty());
    }

    #[test]
    fn a_second_process_cannot_open_the_same_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let _first = Redb::open(&path).unwrap();
        assert!(Redb::open(&path).is_err());
    }
}

//! The changelog's records: how a [`Change`] is written to Kafka and read back.
//!
//! A key record's Kafka key is the window and the key, so compaction keeps one record per
//! (window, key) whatever replays wrote; the stream time has one key per partition, so only
//! its latest value stays. Every record starts with a format version.
//!
//! | change | Kafka key | Kafka value |
//! |---|---|---|
//! | key first seen | `01 'k'` window start (i64 BE) key bytes | window end (i64 BE) |
//! | a group's totals | `01 'a'` window start (i64 BE) group bytes | window end (i64 BE), count (u64 BE), distinct (u64 BE), `'i'` sum (i64 BE) or `'f'` sum (f64 BE) |
//! | stream time | `01 't'` | stream time (i64 BE) |
//!
//! A distinct value (`--aggregate distinct`) is a key first seen: its key is
//! [`super::seen::distinct_key`]'s.

use super::seen::{Acc, Change, Sum};
use super::window::Window;

/// The format version every record starts with.
pub(crate) const VERSION: u8 = 1;
const KEY: u8 = b'k';
const STREAM_TIME: u8 = b't';
/// The kind of a group's totals.
pub(crate) const TOTAL: u8 = b'a';

/// A change as a Kafka record's key and value.
pub fn encode(change: &Change) -> (Vec<u8>, Vec<u8>) {
    match change {
        Change::Key { window, key } => {
            let mut k = Vec::with_capacity(10 + key.len());
            k.extend([VERSION, KEY]);
            k.extend(window.start.to_be_bytes());
            k.extend_from_slice(key);
            (k, window.end.to_be_bytes().to_vec())
        }
        Change::Total { window, group, acc } => {
            let mut k = Vec::with_capacity(10 + group.len());
            k.extend([VERSION, TOTAL]);
            k.extend(window.start.to_be_bytes());
            k.extend_from_slice(group);
            let mut v = Vec::with_capacity(33);
            v.extend(window.end.to_be_bytes());
            v.extend(acc.count.to_be_bytes());
            v.extend(acc.distinct.to_be_bytes());
            match acc.sum {
                Sum::Int(i) => {
                    v.push(b'i');
                    v.extend(i.to_be_bytes());
                }
                Sum::Float(f) => {
                    v.push(b'f');
                    v.extend(f.to_be_bytes());
                }
            }
            (k, v)
        }
        Change::StreamTime(t) => (vec![VERSION, STREAM_TIME], t.to_be_bytes().to_vec()),
    }
}

/// A changelog record back as its change; what is not one of exactly's says why.
pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Change, String> {
    let key = key.ok_or("a record without a key")?;
    let value = value.ok_or("a record without a value (a tombstone)")?;
    let number = |b: &[u8]| -> Result<i64, String> {
        let bytes: [u8; 8] = b
            .try_into()
            .map_err(|_| format!("a value of {} bytes, not 8", b.len()))?;
        Ok(i64::from_be_bytes(bytes))
    };
    let window = |start: &[u8], end: &[u8]| -> Result<Window, String> {
        let window = Window {
            start: number(start)?,
            end: number(end)?,
        };
        if window.end <= window.start {
            return Err(format!(
                "a window that ends ({}) before it starts ({})",
                window.end, window.start
            ));
        }
        Ok(window)
    };
    match key {
        [VERSION, KEY, rest @ ..] if rest.len() >= 8 => {
            let (start, k) = rest.split_at(8);
            Ok(Change::Key {
                window: window(start, value)?,
                key: k.into(),
            })
        }
        [VERSION, TOTAL, rest @ ..] if rest.len() >= 8 => {
            let (start, group) = rest.split_at(8);
            let [end @ .., tag, s0, s1, s2, s3, s4, s5, s6, s7] = value else {
                return Err(format!("totals of {} bytes, not 33", value.len()));
            };
            let (end, counts) = end.split_at(8.min(end.len()));
            if counts.len() != 16 {
                return Err(format!("totals of {} bytes, not 33", value.len()));
            }
            let (count, distinct) = counts.split_at(8);
            let sum = [*s0, *s1, *s2, *s3, *s4, *s5, *s6, *s7];
            let sum = match tag {
                b'i' => Sum::Int(i64::from_be_bytes(sum)),
                b'f' => Sum::Float(f64::from_be_bytes(sum)),
                t => return Err(format!("a sum of kind {t}, not 'i' or 'f'")),
            };
            let acc = Acc {
                count: number(count)? as u64,
                distinct: number(distinct)? as u64,
                sum,
            };
            Ok(Change::Total {
                window: window(start, end)?,
                group: group.into(),
                acc,
            })
        }
        [VERSION, STREAM_TIME] => Ok(Change::StreamTime(number(value)?)),
        [v, ..] if *v != VERSION => Err(format!("format version {v}, not {VERSION}")),
        _ => Err("a key that is no state change".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_read_back_as_written() {
        let changes = [
            Change::Key {
                window: Window {
                    start: -86_400_000,
                    end: 0,
                },
                key: (*b"dev-1\x00\xff").into(),
            },
            Change::Key {
                window: Window { start: 5, end: 6 },
                key: (*b"").into(),
            },
            Change::StreamTime(1_764_633_600_000),
            Change::Total {
                window: Window { start: 0, end: 60 },
                group: (*b"shop\x00").into(),
                acc: Acc {
                    count: u64::MAX,
                    sum: Sum::Int(i64::MIN),
                    distinct: 7,
                },
            },
            Change::Total {
                window: Window { start: 0, end: 60 },
                group: (*b"").into(),
                acc: Acc {
                    count: 1,
                    sum: Sum::Float(-0.25),
                    distinct: 0,
                },
            },
        ];
        for c in changes {
            let (k, v) = encode(&c);
            assert_eq!(decode(Some(&k), Some(&v)), Ok(c));
        }
    }

    /// Totals for a window ending at 1, with a sum of kind `tag`.
    fn total(tag: u8) -> Vec<u8> {
        let mut v = 1i64.to_be_bytes().to_vec();
        v.extend([0; 16]);
        v.push(tag);
        v.extend([0; 8]);
        v
    }

    #[test]
    fn records_that_are_no_change_say_why() {
        let (k, v) = encode(&Change::StreamTime(1));
        let bad = [
            (None, Some(&v[..]), "without a key"),
            (Some(&k[..]), None, "tombstone"),
            (Some(&k[..]), Some(&v[..3]), "3 bytes"),
            (Some(&[2, b't'][..]), Some(&v[..]), "version 2"),
            (Some(&[1, b'k', 0, 0][..]), Some(&v[..]), "no state change"),
            (
                Some(&[1, b'k', 0, 0, 0, 0, 0, 0, 0, 9][..]),
                Some(&v[..]),
                "ends",
            ),
            (
                Some(&[1, b'a', 0, 0, 0, 0, 0, 0, 0, 0][..]),
                Some(&v[..]),
                "8 bytes, not 33",
            ),
            (
                Some(&[1, b'a', 0, 0, 0, 0, 0, 0, 0, 0][..]),
                Some(&total(b'x')[..]),
                "kind 120",
            ),
            (
                Some(&[1, b'a', 0, 0, 0, 0, 0, 0, 0, 9][..]),
                Some(&total(b'i')[..]),
                "ends",
            ),
        ];
        for (key, value, why) in bad {
            let e = decode(key, value).unwrap_err();
            assert!(e.contains(why), "{e} (wanted {why})");
        }
    }
}

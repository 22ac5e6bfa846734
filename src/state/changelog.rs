//! The changelog's records: how a [`Change`] is written to Kafka and read back.
//!
//! A key record's Kafka key is the window and the key, so compaction keeps one record per
//! (window, key) whatever replays wrote; the stream time has one key per partition, so only
//! its latest value stays. Every record starts with a format version.
//!
//! | change | Kafka key | Kafka value |
//! |---|---|---|
//! | key first seen | `01 'k'` window start (i64 BE) key bytes | window end (i64 BE) |
//! | stream time | `01 't'` | stream time (i64 BE) |

use super::seen::Change;
use super::window::Window;

const VERSION: u8 = 1;
const KEY: u8 = b'k';
const STREAM_TIME: u8 = b't';

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
    match key {
        [VERSION, KEY, rest @ ..] if rest.len() >= 8 => {
            let (start, k) = rest.split_at(8);
            let window = Window {
                start: number(start)?,
                end: number(value)?,
            };
            if window.end <= window.start {
                return Err(format!(
                    "a window that ends ({}) before it starts ({})",
                    window.end, window.start
                ));
            }
            Ok(Change::Key {
                window,
                key: k.into(),
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
        ];
        for c in changes {
            let (k, v) = encode(&c);
            assert_eq!(decode(Some(&k), Some(&v)), Ok(c));
        }
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
        ];
        for (key, value, why) in bad {
            let e = decode(key, value).unwrap_err();
            assert!(e.contains(why), "{e} (wanted {why})");
        }
    }
}

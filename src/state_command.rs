//! `exactly state show|import` (over [`crate::state`]): one key's windows as the changelog holds them, and the seed's
//! Redis sets loaded into the changelog (the migration of the daily-active-users job).
//!
//! The import writes each member as a key first seen in its set's day, to the changelog
//! partition of the input partition its records land in (by the input producers'
//! partitioner), with an idempotent producer: a restore reads them like any committed change,
//! and importing twice is importing once (compaction keeps one record per (window, key)).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::state::{ImportArgs, Partitioner, ShowArgs, StateArgs, StateCommand};
use crate::error::Error;
use crate::kafka::{Role, Settings};
use crate::state::changelog::{decode, encode};
use crate::state::restore::{Changelog, KafkaChangelog};
use crate::state::seen::Change;
use crate::state::window::{Size, Window, Windows};

/// `exactly state`: 0 done, 2 bad options, 3 could not complete.
pub fn command(args: StateArgs) -> u8 {
    crate::telemetry::init(crate::config::LogFormat::Text, "warn");
    let result = match args.command {
        StateCommand::Show(a) => show(&a),
        StateCommand::Import(a) => import(&a),
    };
    crate::offsets::report(result)
}

/// How many partitions `topic` has.
fn partitions(kafka: &Settings, topic: &str, timeout: Duration) -> Result<i32, Error> {
    let admin = crate::kafka::admin::Admin::create(&kafka.client(Role::Admin))?;
    match admin.partitions(topic, timeout).map_err(Error::Startup)? {
        Some((n, _)) if n > 0 => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
        _ => Err(Error::Config(format!("topic '{topic}' does not exist"))),
    }
}

/// Every window the changelog holds `--key` in.
fn show(a: &ShowArgs) -> Result<String, Error> {
    let kafka = a.changelog.resolve()?;
    let topic = &a.changelog.state_changelog;
    let n = partitions(&kafka, topic, a.changelog.timeout)?;
    let mut reader =
        KafkaChangelog::new(&kafka, topic, a.changelog.timeout, CancellationToken::new())?;
    let mut out = String::new();
    for p in 0..n {
        let mut seen: Vec<Window> = Vec::new();
        let mut stream_time = None;
        reader
            .read(p, None, &mut |_, k, v| match decode(k, v) {
                Ok(Change::Key { window, key }) if *key == *a.key.as_bytes() => seen.push(window),
                Ok(Change::StreamTime(t)) => stream_time = Some(t),
                _ => {}
            })
            .map_err(|e| Error::Startup(e.to_string()))?;
        seen.sort();
        seen.dedup();
        for w in seen {
            let line = json!({
                "partition": p, "key": a.key, "window_start": rfc3339(w.start),
                "window_end": rfc3339(w.end), "partition_stream_time": stream_time.map(rfc3339),
            });
            out.push_str(&format!("{line}\n"));
        }
    }
    Ok(out)
}

fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map_or_else(|_| ms.to_string(), |t| t.to_string())
}

/// The day a set's name gives after `prefix`: `2026-12-02` or `20261202`.
fn day(name: &str, prefix: &str) -> Option<jiff::civil::Date> {
    let dt = name.strip_prefix(prefix)?;
    if let Ok(d) = dt.parse::<jiff::civil::Date>() {
        return Some(d);
    }
    let (y, md) = (dt.get(0..4)?, dt.get(4..)?);
    if md.len() != 4 || !dt.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    jiff::civil::Date::new(
        y.parse().ok()?,
        md[..2].parse().ok()?,
        md[2..].parse().ok()?,
    )
    .ok()
}

/// Kafka's Java partitioner: murmur2 of the key, made positive, modulo the partitions.
fn murmur2(data: &[u8]) -> i32 {
    const M: i32 = 0x5bd1_e995;
    let mut h: i32 = 0x9747_b28c_u32 as i32 ^ data.len() as i32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= ((k as u32) >> 24) as i32;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= i32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= i32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= i32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= ((h as u32) >> 13) as i32;
    h = h.wrapping_mul(M);
    h ^= ((h as u32) >> 15) as i32;
    h
}

/// CRC-32 (IEEE), librdkafka's `consistent` partitioners.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The partition of `key` among `n`, as `partitioner` chooses it.
fn partition_of(key: &[u8], n: i32, partitioner: Partitioner) -> i32 {
    match partitioner {
        Partitioner::Murmur2 => (murmur2(key) & 0x7fff_ffff) % n,
        Partitioner::Crc32 => (crc32(key) % n as u32) as i32,
    }
}

/// Loads the sets into the changelog.
fn import(a: &ImportArgs) -> Result<String, Error> {
    let prefix = a.prefix()?.to_string();
    let tz = jiff::tz::TimeZone::get(&a.window_time_zone)
        .map_err(|e| Error::Config(format!("--window-time-zone: '{}': {e}", a.window_time_zone)))?;
    let kafka = a.changelog.resolve()?;
    let timeout = a.changelog.timeout;
    let n = partitions(&kafka, &a.input_topic, timeout)?;
    let windows = Windows::new(Size::Days(1), tz.clone(), a.window_grace);

    let client = redis::Client::open(a.redis_url.as_str())
        .map_err(|e| Error::Config(format!("--redis-url: {e}")))?;
    let mut con = client
        .get_connection_with_timeout(timeout)
        .map_err(|e| Error::Startup(format!("--redis-url: {e}")))?;
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(&a.redis_pattern)
        .query(&mut con)
        .map_err(|e| Error::Startup(format!("--redis-url: KEYS: {e}")))?;
    let mut plan: Vec<(i32, Change)> = Vec::new();
    let mut sets = BTreeMap::new();
    for name in names {
        let Some(date) = day(&name, &prefix) else {
            return Err(Error::Config(format!(
                "--redis-pattern: the set '{name}' does not end in a day (2026-12-02 or 20261202)"
            )));
        };
        let start = (date
            .to_zoned(tz.clone())
            .map(|z| z.timestamp().as_millisecond()))
        .map_err(|e| Error::Config(format!("'{name}': {e}")))?;
        let window = windows
            .of(start)
            .ok_or_else(|| Error::Config(format!("'{name}': no window")))?;
        let members: Vec<Vec<u8>> = redis::cmd("SMEMBERS")
            .arg(&name)
            .query(&mut con)
            .map_err(|e| Error::Startup(format!("--redis-url: SMEMBERS {name}: {e}")))?;
        sets.insert(name, members.len());
        for m in members {
            let p = partition_of(&m, n, a.partitioner);
            plan.push((
                p,
                Change::Key {
                    window,
                    key: m.into(),
                },
            ));
        }
    }
    let mut by_partition = BTreeMap::new();
    for (p, _) in &plan {
        *by_partition.entry(*p).or_insert(0u64) += 1;
    }
    let summary = json!({"sets": sets, "keys": plan.len(), "by_partition": by_partition,
                         "changelog": a.changelog.state_changelog, "written": !a.dry_run});
    if a.dry_run {
        return Ok(format!("{summary}\n"));
    }
    write(a, &kafka, &plan, timeout)?;
    Ok(format!("{summary}\n"))
}

/// Writes `plan` to the changelog, created as `exactly run` would create it, or checked.
fn write(
    a: &ImportArgs,
    kafka: &Settings,
    plan: &[(i32, Change)],
    timeout: Duration,
) -> Result<(), Error> {
    // The changelog as `exactly run` would create it with day windows and its default
    // --window-max-ahead (a day, a day ahead, a day's margin), or checked.
    let wanted = crate::state::topic::Wanted {
        changelog: &a.changelog.state_changelog,
        input: &a.input_topic,
        retention: Duration::from_secs(3 * 86_400).saturating_add(a.window_grace),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Startup(e.to_string()))?;
    let admin = crate::state::topic::admin(kafka)?;
    runtime
        .block_on(crate::state::topic::ensure(&admin, &wanted, timeout))
        .map_err(|e| Error::Startup(format!("--state-changelog: {e}")))?;
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (plan.iter())
        .map(|(p, change)| {
            let (key, value) = encode(change);
            (*p, key, value)
        })
        .collect();
    let writer = crate::kafka::produce::Writer::create(&kafka.client(Role::Idempotent))?;
    (writer.write_all(&a.changelog.state_changelog, &records, timeout)).map_err(Error::Startup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_to_the_partition_java_or_librdkafka_producers_chose() {
        // Kafka's own UtilsTest values, and the partitions its clients give among 6.
        for (key, hash, p) in [
            ("21", -973_932_308, 0),
            ("foobar", -790_332_482, 0),
            ("a-little-bit-long-string", -985_981_536, 2),
            ("dev-7", -424_616_445, 5),
            ("", 275_646_681, 3),
            ("abc", 479_470_107, 3),
        ] {
            assert_eq!(murmur2(key.as_bytes()), hash, "{key}");
            assert_eq!(
                partition_of(key.as_bytes(), 6, Partitioner::Murmur2),
                p,
                "{key}"
            );
        }
        // zlib's CRC-32, as librdkafka computes it.
        for (key, p) in [("21", 4), ("foobar", 5), ("dev-7", 3), ("abc", 0)] {
            assert_eq!(
                partition_of(key.as_bytes(), 6, Partitioner::Crc32),
                p,
                "{key}"
            );
        }
    }

    #[test]
    fn a_sets_name_ends_in_its_day() {
        let d = |y, m, d| jiff::civil::Date::new(y, m, d).ok();
        assert_eq!(day("dau:2026-12-02", "dau:"), d(2026, 12, 2));
        assert_eq!(day("dau:20261202", "dau:"), d(2026, 12, 2));
        assert_eq!(day("dau:2026-13-02", "dau:"), None);
        assert_eq!(day("dau:today", "dau:"), None);
        assert_eq!(day("other:20261202", "dau:"), None);
    }
}

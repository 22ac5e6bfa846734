//! What the stateful stage reads of a record: its key, its event time (and whether it is too
//! far ahead), and the programs that say so, compiled at start.

use std::borrow::Cow;

use super::super::jq::Jq;
use super::super::{InputRecord, TransformError};
use super::{Dedup, bad};
use crate::config::DedupConfig;

/// What the message of a record refused for an event time too far ahead of this host's clock
/// says: the audit, whose clock is later, takes such a refusal as the pipeline decided it.
pub const AHEAD_OF_CLOCK: &str = "ahead of this host's clock";

impl Dedup {
    /// The record's key: the Kafka key, or `--window-key`'s (a string's text, else JSON text).
    pub(super) fn key_of<'a>(
        &self,
        input: &InputRecord<'a>,
    ) -> Result<Cow<'a, [u8]>, TransformError> {
        let Some(program) = &self.key else {
            return input.key.map(Cow::Borrowed).ok_or_else(|| {
                bad("no Kafka key to deduplicate by (--window-key reads one from the value)")
            });
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--window-key yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Null) => Err(bad("--window-key yields null")),
            Ok(serde_json::Value::String(s)) => Ok(Cow::Owned(s.into_bytes())),
            _ => Ok(Cow::Owned(json)),
        }
    }

    /// The record's event time in ms: its timestamp, or `--window-time`'s (milliseconds since
    /// the epoch, or an RFC 3339 string).
    pub(super) fn time_of(&self, input: &InputRecord<'_>) -> Result<i64, TransformError> {
        let Some(program) = &self.time else {
            return input
                .timestamp
                .ok_or_else(|| bad("the record has no timestamp (--window-time reads one)"));
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--window-time yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Number(n)) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.is_finite())
                        .map(|f| f.floor() as i64)
                })
                .ok_or_else(|| bad(format!("--window-time yields {n}, not a time"))),
            Ok(serde_json::Value::String(s)) => s
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_millisecond())
                .map_err(|e| bad(format!("--window-time yields \"{s}\": {e}"))),
            _ => Err(bad(format!(
                "--window-time yields {}, not milliseconds or an RFC 3339 time",
                String::from_utf8_lossy(&json)
            ))),
        }
    }

    /// An event time too far ahead, of the record's own timestamp (with `--window-time`) or of
    /// this host's clock, is the record's fault: one wrong clock must not move the stream time
    /// and make every later record late (the changelog would keep it so across restarts).
    pub(super) fn not_ahead(&self, input: &InputRecord<'_>, t: i64) -> Result<(), TransformError> {
        let too_far = |from: i64, of: &str| {
            bad(format!(
                "event time {t} ms is {} s {of}, more than --window-max-ahead",
                (t - from) / 1000
            ))
        };
        if let Some(ts) = input.timestamp.filter(|_| self.time.is_some())
            && t > ts.saturating_add(self.max_ahead)
        {
            return Err(too_far(ts, "ahead of the record's timestamp"));
        }
        let now = crate::clock::wall_ms();
        if t > now.saturating_add(self.max_ahead) {
            return Err(too_far(now, AHEAD_OF_CLOCK));
        }
        Ok(())
    }
}

/// The programs of `config` compiled, and the transform of the first of each key (`--jq`, or
/// none: the record as it is). A program that does not compile names its flag.
pub fn programs(
    config: &DedupConfig,
    transform: &crate::config::TransformConfig,
) -> Result<[Option<Jq>; 5], crate::error::Error> {
    let limits = super::super::Limits::of(transform);
    let aggregate = config.aggregate.as_ref();
    let compile = |flag: &str, code: &Option<String>, envelope: bool| {
        code.as_deref()
            .map(|code| Jq::compile(code, envelope, limits))
            .transpose()
            .map_err(|e| crate::error::Error::Config(format!("{flag}: {e}")))
    };
    let then = match &transform.spec {
        crate::config::TransformSpec::Jq { program, envelope } => {
            compile("--jq", &Some(program.clone()), *envelope)?
        }
        _ => None,
    };
    Ok([
        compile("--window-key", &config.key, false)?,
        compile("--window-time", &config.time, false)?,
        then,
        compile(
            "--aggregate-sum",
            &aggregate.and_then(|a| a.sum.clone()),
            false,
        )?,
        compile(
            "--aggregate-distinct",
            &aggregate.and_then(|a| a.distinct.clone()),
            false,
        )?,
    ])
}

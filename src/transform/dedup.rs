//! The dedup (`--dedup-window`): the first record of each key per window of event time goes
//! on, through `--jq` if given (which sees the window's label as `$window`); later ones are
//! dropped and counted; a record for a window that closed follows `--dedup-late`.
//!
//! The keys seen are [`Seen`]'s two layers; each first decision is also a record to the
//! changelog partition of the record's input partition, among the record's own outputs, so it
//! commits with them and with the offset; each partition's stream time goes there once per
//! unit, before the commit ([`Transform::before_commit`]). How a unit ended moves the open
//! layer down or drops it. A partition assigned is restored from its changelog before any of
//! its records is decided: a restore that fails makes the transform unavailable (the unit
//! aborts, the loop backs off, the restore is tried again); so does a commit whose outcome
//! nobody can tell, for every partition owned (its changes may or may not have committed: only
//! the changelog knows).

use std::borrow::Cow;
use std::collections::BTreeSet;

use tracing::{info, warn};

use super::jq::Jq;
use super::{Failure, InputRecord, OutputHeaders, OutputRecord, Reason, Transform, TransformError};
use crate::config::{DedupConfig, Late};
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::state::changelog;
use crate::state::restore::Changelog;
use crate::state::seen::{Change, Seen, Verdict};
use crate::state::window::Window;

/// The dedup in front of the record's transform.
pub struct Dedup {
    key: Option<Jq>,
    time: Option<Jq>,
    /// What the first of each key becomes: the `--jq` program, or the record as it is.
    then: Option<Jq>,
    late: Late,
    topic: String,
    seen: Seen,
    source: Box<dyn Changelog>,
    owned: BTreeSet<Tp>,
    /// Owned partitions whose state is not read back yet.
    unrestored: BTreeSet<Tp>,
    metrics: Metrics,
}

impl Dedup {
    /// The dedup of `config`, restoring from `source`; `then`: the program for the first of
    /// each key (compiled already).
    pub fn new(
        config: &DedupConfig,
        key: Option<Jq>,
        time: Option<Jq>,
        then: Option<Jq>,
        source: Box<dyn Changelog>,
        metrics: Metrics,
    ) -> Dedup {
        Dedup {
            key,
            time,
            then,
            late: config.late,
            topic: config.changelog.clone(),
            seen: Seen::new(config.windows.clone()),
            source,
            owned: BTreeSet::new(),
            unrestored: BTreeSet::new(),
            metrics,
        }
    }

    /// Reads `tp`'s state back from its changelog partition, over whatever was held of it.
    fn restore(&mut self, tp: &Tp) -> Result<(), String> {
        self.seen.revoked(tp);
        self.metrics
            .state_restoring
            .set(self.unrestored.len() as i64);
        let started = std::time::Instant::now();
        let (seen, mut skipped) = (&mut self.seen, 0u64);
        let read = self
            .source
            .read(tp.1, &mut |k, v| match changelog::decode(k, v) {
                Ok(change) => seen.restore(tp, change),
                Err(why) => {
                    if skipped == 0 {
                        warn!(
                            partition = tp.1,
                            why, "a changelog record that is no state change; skipped"
                        );
                    }
                    skipped += 1;
                }
            });
        let read = match read {
            Ok(n) => n,
            Err(e) => {
                self.seen.revoked(tp);
                self.metrics.state_restore_failures.inc();
                return Err(format!("restoring the dedup state: {e}"));
            }
        };
        self.seen.restored(tp);
        self.unrestored.remove(tp);
        self.metrics.state_restored_records.inc_by(read);
        self.metrics
            .state_restoring
            .set(self.unrestored.len() as i64);
        self.gauges();
        info!(
            topic = %tp.0, partition = tp.1, records = read, skipped,
            took = ?started.elapsed(), keys = self.seen.keys(),
            "dedup state restored"
        );
        Ok(())
    }

    fn gauges(&self) {
        self.metrics.state_keys.set(self.seen.keys() as i64);
        self.metrics
            .state_windows
            .set(self.seen.open_windows() as i64);
    }

    /// The record's key: the Kafka key, or `--dedup-key`'s (a string's text, else JSON text).
    fn key_of<'a>(&self, input: &InputRecord<'a>) -> Result<Cow<'a, [u8]>, TransformError> {
        let Some(program) = &self.key else {
            return input.key.map(Cow::Borrowed).ok_or_else(|| {
                bad("no Kafka key to deduplicate by (--dedup-key reads one from the value)")
            });
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--dedup-key yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Null) => Err(bad("--dedup-key yields null")),
            Ok(serde_json::Value::String(s)) => Ok(Cow::Owned(s.into_bytes())),
            _ => Ok(Cow::Owned(json)),
        }
    }

    /// The record's event time in ms: its timestamp, or `--dedup-time`'s (milliseconds since
    /// the epoch, or an RFC 3339 string).
    fn time_of(&self, input: &InputRecord<'_>) -> Result<i64, TransformError> {
        let Some(program) = &self.time else {
            return input
                .timestamp
                .ok_or_else(|| bad("the record has no timestamp (--dedup-time reads one)"));
        };
        let json = program
            .first_json(input)?
            .ok_or_else(|| bad("--dedup-time yields nothing"))?;
        match serde_json::from_slice::<serde_json::Value>(&json) {
            Ok(serde_json::Value::Number(n)) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.is_finite())
                        .map(|f| f.floor() as i64)
                })
                .ok_or_else(|| bad(format!("--dedup-time yields {n}, not a time"))),
            Ok(serde_json::Value::String(s)) => s
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_millisecond())
                .map_err(|e| bad(format!("--dedup-time yields \"{s}\": {e}"))),
            _ => Err(bad(format!(
                "--dedup-time yields {}, not milliseconds or an RFC 3339 time",
                String::from_utf8_lossy(&json)
            ))),
        }
    }

    /// What the record becomes when it goes on, in `window`.
    fn output<'a>(
        &self,
        input: &InputRecord<'a>,
        window: &Window,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        match &self.then {
            Some(jq) => {
                let label = self.seen.windows().label(window);
                jq.apply_in(input, Some(&label))
            }
            None => Ok(vec![OutputRecord {
                topic: None,
                partition: None,
                key: input.key.map(Cow::Borrowed),
                value: input.value.map(Cow::Borrowed),
                headers: OutputHeaders::Input,
            }]),
        }
    }

    /// `change` as a record to the changelog partition `partition`.
    fn record(&self, partition: i32, change: &Change) -> OutputRecord<'static> {
        let (key, value) = changelog::encode(change);
        OutputRecord {
            topic: Some(self.topic.clone()),
            partition: Some(partition),
            key: Some(Cow::Owned(key)),
            value: Some(Cow::Owned(value)),
            headers: OutputHeaders::Set(Vec::new()),
        }
    }

    fn verdict(&self, verdict: &str) {
        self.metrics
            .dedup_records
            .with_label_values(&[verdict])
            .inc();
    }
}

fn bad(message: impl Into<String>) -> TransformError {
    TransformError::new(Reason::DedupInput, message.into())
}

impl Transform for Dedup {
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        let tp = (input.topic.to_string(), input.partition);
        if self.unrestored.contains(&tp) {
            self.restore(&tp).map_err(Failure::Unavailable)?;
        }
        let key = self.key_of(input)?;
        let t = self.time_of(input)?;
        let window = (self.seen.windows().of(t))
            .ok_or_else(|| bad(format!("event time {t} ms is outside years -9999 to 9999")))?;
        let (verdict, change) = self.seen.offer(&tp, window, &key, t);
        match verdict {
            Verdict::Duplicate => {
                self.verdict("duplicate");
                Ok(Vec::new())
            }
            Verdict::Late => {
                self.verdict("late");
                match self.late {
                    Late::Drop => Ok(Vec::new()),
                    Late::Pass => Ok(self.output(input, &window)?),
                    Late::Dlq => Err(Failure::BadRecord(TransformError::new(
                        Reason::Late,
                        format!(
                            "its window {} closed before it came (--dedup-grace)",
                            self.seen.windows().label(&window)
                        ),
                    ))),
                }
            }
            Verdict::First => {
                self.verdict("first");
                let mut outputs = match self.output(input, &window) {
                    Ok(outputs) => outputs,
                    Err(e) => {
                        // A bad record: its key was not seen (its changelog record never goes).
                        self.seen.withdraw(&tp, &window, &key);
                        return Err(e.into());
                    }
                };
                if let Some(change) = change {
                    outputs.insert(0, self.record(input.partition, &change));
                }
                Ok(outputs)
            }
        }
    }

    fn assigned(&mut self, partitions: &[Tp]) {
        for tp in partitions {
            self.owned.insert(tp.clone());
            self.unrestored.insert(tp.clone());
        }
        for tp in partitions {
            // Before any record; one that fails is tried again at its partition's next record.
            if let Err(e) = self.restore(tp) {
                warn!(error = %e, "the dedup state is not restored yet; trying again");
            }
        }
    }

    fn revoked(&mut self, partitions: &[Tp]) {
        for tp in partitions {
            self.seen.revoked(tp);
            self.owned.remove(tp);
            self.unrestored.remove(tp);
        }
        self.metrics
            .state_restoring
            .set(self.unrestored.len() as i64);
        self.gauges();
    }

    fn committed(&mut self) {
        self.seen.committed();
        self.gauges();
    }

    fn dropped(&mut self, known: bool) {
        self.seen.aborted();
        if !known {
            // The open unit's changes may have committed: only the changelogs can tell.
            warn!("a commit's outcome is unknown: the dedup state is read back from its changelog");
            self.unrestored.extend(self.owned.iter().cloned());
            for tp in self.owned.clone() {
                self.seen.revoked(&tp);
            }
            self.metrics
                .state_restoring
                .set(self.unrestored.len() as i64);
        }
    }

    fn before_commit(&mut self) -> Vec<OutputRecord<'static>> {
        (self.seen.stream_times().iter())
            .map(|(tp, change)| self.record(tp.1, change))
            .collect()
    }
}

/// The programs of `config` compiled, and the transform of the first of each key (`--jq`, or
/// none: the record as it is). A program that does not compile names its flag.
pub fn programs(
    config: &DedupConfig,
    transform: &crate::config::TransformConfig,
) -> Result<[Option<Jq>; 3], crate::error::Error> {
    let limits = super::Limits::of(transform);
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
        compile("--dedup-key", &config.key, false)?,
        compile("--dedup-time", &config.time, false)?,
        then,
    ])
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::state::window::{Size, Windows};

    const HOUR: i64 = 3_600_000;

    /// A changelog: what committed units wrote to it, by partition.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<Entry>>>);

    /// A changelog record: partition, key, value.
    type Entry = (i32, Vec<u8>, Vec<u8>);

    impl Changelog for Log {
        fn read(
            &mut self,
            partition: i32,
            each: &mut crate::state::restore::Each<'_>,
        ) -> Result<u64, String> {
            let log = self.0.lock().unwrap();
            let mine: Vec<_> = log.iter().filter(|(p, _, _)| *p == partition).collect();
            for (_, k, v) in &mine {
                each(Some(k), Some(v));
            }
            Ok(mine.len() as u64)
        }
    }

    fn dedup(log: &Log, late: Late) -> Dedup {
        let config = DedupConfig {
            windows: Windows::new(Size::Days(1), jiff::tz::TimeZone::UTC, Duration::ZERO),
            key: None,
            time: None,
            late,
            changelog: "cl".into(),
            retention: Duration::from_secs(86_400),
        };
        let mut d = Dedup::new(
            &config,
            None,
            None,
            None,
            Box::new(log.clone()),
            Metrics::new(),
        );
        d.assigned(&[("in".into(), 0)]);
        d
    }

    /// The outputs of a record of key `key` at `t`, with the changelog's apart: (outputs to
    /// the output topic, changelog records).
    fn offer(
        d: &mut Dedup,
        key: &str,
        t: i64,
    ) -> Result<(usize, Vec<OutputRecord<'static>>), Failure> {
        let input = InputRecord {
            topic: "in",
            partition: 0,
            offset: 0,
            timestamp: Some(t),
            key: Some(key.as_bytes()),
            value: Some(b"{}"),
            headers: Vec::new(),
        };
        let outs = d.apply(&input)?;
        let (cl, out): (Vec<_>, Vec<_>) = outs.into_iter().partition(|o| o.topic.is_some());
        let cl = cl.into_iter().map(owned).collect();
        Ok((out.len(), cl))
    }

    fn owned(o: OutputRecord<'_>) -> OutputRecord<'static> {
        OutputRecord {
            topic: o.topic,
            partition: o.partition,
            key: o.key.map(|k| Cow::Owned(k.into_owned())),
            value: o.value.map(|v| Cow::Owned(v.into_owned())),
            headers: o.headers,
        }
    }

    /// The unit committed: its changelog records are in the log.
    fn commit(d: &mut Dedup, log: &Log, mut written: Vec<OutputRecord<'static>>) {
        written.extend(d.before_commit());
        let mut l = log.0.lock().unwrap();
        for o in written {
            assert_eq!(o.topic.as_deref(), Some("cl"));
            let p = o.partition.expect("a changelog record names its partition");
            l.push((
                p,
                o.key.unwrap().into_owned(),
                o.value.unwrap().into_owned(),
            ));
        }
        drop(l);
        d.committed();
    }

    #[test]
    fn the_first_of_a_key_per_day_goes_on_once_across_aborts_and_restarts() {
        let log = Log::default();
        let mut d = dedup(&log, Late::Dlq);
        let mut unit = Vec::new();
        let (n, cl) = offer(&mut d, "dev-1", HOUR).unwrap();
        assert_eq!(
            (n, cl.len()),
            (1, 1),
            "the first: its output and one changelog record"
        );
        unit.extend(cl);
        let (n, cl) = offer(&mut d, "dev-1", 2 * HOUR).unwrap();
        assert_eq!((n, cl.len()), (0, 0), "a duplicate writes nothing");
        commit(&mut d, &log, unit);
        assert_eq!(
            log.0.lock().unwrap().len(),
            2,
            "the key, then the stream time"
        );

        // An aborted unit's decisions are forgotten: the replay decides the same.
        assert_eq!(offer(&mut d, "dev-2", 3 * HOUR).unwrap().0, 1);
        d.dropped(true);
        let (n, cl) = offer(&mut d, "dev-2", 3 * HOUR).unwrap();
        assert_eq!(n, 1);
        commit(&mut d, &log, cl);

        // A restart restores what committed, and only that.
        let mut again = dedup(&log, Late::Dlq);
        assert_eq!(offer(&mut again, "dev-1", 4 * HOUR).unwrap().0, 0);
        assert_eq!(offer(&mut again, "dev-2", 4 * HOUR).unwrap().0, 0);
        assert_eq!(offer(&mut again, "dev-3", 4 * HOUR).unwrap().0, 1);
        // The next day is a window of its own.
        assert_eq!(offer(&mut again, "dev-1", 25 * HOUR).unwrap().0, 1);
    }

    #[test]
    fn an_unknown_outcome_reads_the_state_back_from_the_changelog() {
        let log = Log::default();
        let mut d = dedup(&log, Late::Dlq);
        let (_, cl) = offer(&mut d, "dev-1", HOUR).unwrap();
        // The commit took effect, but nobody can tell: the changelog has it.
        commit_only_in_the_log(&mut d, &log, cl);
        d.dropped(false);
        assert_eq!(offer(&mut d, "dev-1", 2 * HOUR).unwrap().0, 0, "read back");
    }

    fn commit_only_in_the_log(d: &mut Dedup, log: &Log, mut written: Vec<OutputRecord<'static>>) {
        written.extend(d.before_commit());
        let mut l = log.0.lock().unwrap();
        for o in written {
            l.push((
                0,
                o.key.unwrap().into_owned(),
                o.value.unwrap().into_owned(),
            ));
        }
    }

    #[test]
    fn a_record_for_a_closed_window_follows_the_late_policy() {
        for (late, want) in [
            (Late::Dlq, None),
            (Late::Drop, Some(0)),
            (Late::Pass, Some(1)),
        ] {
            let log = Log::default();
            let mut d = dedup(&log, late);
            offer(&mut d, "a", 25 * HOUR).unwrap(); // day 0 closed (no grace)
            let got = offer(&mut d, "b", HOUR);
            match (want, got) {
                (None, Err(Failure::BadRecord(e))) => assert_eq!(e.reason, Reason::Late),
                (Some(n), Ok((out, cl))) => {
                    assert_eq!(out, n, "{late:?}");
                    assert!(cl.is_empty(), "a late record is never remembered");
                }
                (want, got) => panic!("{late:?}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn a_first_record_its_program_fails_for_leaves_its_key_unseen() {
        let log = Log::default();
        let mut d = dedup(&log, Late::Dlq);
        let limits = crate::transform::Limits {
            max_output_bytes: 1000,
            max_outputs: 10,
        };
        let program = r#"if .bad then error("bad") else {window: $window} end"#;
        d.then = Some(Jq::compile(program, false, limits).unwrap());
        let record = |value: &'static [u8]| InputRecord {
            topic: "in",
            partition: 0,
            offset: 0,
            timestamp: Some(HOUR),
            key: Some(b"a"),
            value: Some(value),
            headers: Vec::new(),
        };
        assert!(matches!(
            d.apply(&record(br#"{"bad":true}"#)),
            Err(Failure::BadRecord(_))
        ));
        let outs = d.apply(&record(b"{}")).unwrap();
        assert_eq!(outs.len(), 2, "the first of its key after all: {outs:?}");
        assert_eq!(
            outs[1].value.as_deref(),
            Some(&br#"{"window":"1970-01-01"}"#[..])
        );
    }

    #[test]
    fn a_record_without_a_key_or_time_is_a_bad_record() {
        let log = Log::default();
        let mut d = dedup(&log, Late::Dlq);
        let input = InputRecord {
            topic: "in",
            partition: 0,
            offset: 0,
            timestamp: Some(HOUR),
            key: None,
            value: Some(b"{}"),
            headers: Vec::new(),
        };
        match d.apply(&input) {
            Err(Failure::BadRecord(e)) => assert_eq!(e.reason, Reason::DedupInput),
            other => panic!("{other:?}"),
        }
    }
}

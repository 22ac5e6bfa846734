//! The stateful stage (`--window`), in one of two modes: the dedup ([`first`]: the first record
//! of each key per window of event time goes on, later ones are dropped and counted) or the
//! windowed aggregates ([`aggregate`], `--aggregate`). A record for a window that closed follows
//! `--window-late`.
//!
//! The state is [`Seen`]'s two layers, kept partition by partition by a [`Keeper`]: each
//! change is also a record to the changelog partition of the record's input partition, written
//! right before the commit ([`Transform::before_commit`]) in the same transaction as the
//! outputs and the offsets. How a unit ended moves the open layer down (and, with
//! `--state-dir`, writes the unit's changes to the local store) or drops it. A partition
//! assigned is restored when its first record comes, before that record is decided
//! ([`Keeper::assigned`]). A record's changes wait for the writer's verdict on it
//! ([`Transform::decided`]). A restore that fails makes the transform unavailable (the unit
//! aborts, the loop backs off, the restore is tried again); a partition with no changelog
//! partition is held; a commit whose outcome nobody can tell restores every partition owned
//! (its changes may or may not have committed: only the changelog knows).
//!
//! [`Seen`]: crate::state::seen::Seen

mod aggregate;
mod build;
mod first;
mod input;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use super::jq::Jq;
use super::{
    Failure, Fate, InputRecord, OutputHeaders, OutputRecord, Reason, Transform, TransformError,
};
use crate::config::{DedupConfig, Late};
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::state::changelog;
use crate::state::keeper::{Keeper, Unrestored};
use crate::state::restore::Changelog;
use crate::state::seen::{Adds, Change, Seen, Sum};
use crate::state::store::Store;
use crate::state::window::Window;
pub use aggregate::Aggregate;
pub use build::build;
pub use input::{AHEAD_OF_CLOCK, programs};

/// What one record changes in the state, held until the writer decided its fate
/// ([`Transform::decided`]): a record that goes to the dead-letter topic instead (its output
/// refused, too large, routed to a topic that keeps refusing) changes nothing.
struct Step {
    tp: Tp,
    /// Its event time: the stream time moves to it.
    t: i64,
    change: Effect,
}

/// A step's change besides the stream time.
enum Effect {
    /// None (a duplicate).
    Nothing,
    /// Its key, first seen in its window.
    Key(Window, Box<[u8]>),
    /// An aggregate's record: what it adds to its group in its window.
    Add {
        window: Window,
        group: Box<[u8]>,
        number: Option<Sum>,
        distinct: Option<Vec<u8>>,
    },
}

/// What the stage does with a record it takes.
enum Mode {
    /// The dedup: the first of each key goes on.
    First,
    /// The windowed aggregates.
    Aggregate(Box<Aggregate>),
}

/// The stateful stage in front of the record's transform.
pub struct Dedup {
    key: Option<Jq>,
    time: Option<Jq>,
    /// What goes out: the `--jq` program (over the first record, or over the totals), or the
    /// record (the totals) as it is.
    then: Option<Jq>,
    late: Late,
    mode: Mode,
    /// The changelog topic.
    topic: String,
    keeper: Keeper,
    /// The longest key: its changelog record stays within --max-output-bytes.
    max_key: usize,
    /// How far ahead of this host's clock (and of its record's timestamp, with --window-time)
    /// an event time may be (ms).
    max_ahead: i64,
    /// What the record last applied changes, once the writer says its outputs went out.
    step: Option<Step>,
    metrics: Metrics,
}

impl Dedup {
    /// The stage of `config`, restoring from `source` (and `store`, if any); its programs
    /// compiled already ([`programs`]).
    pub fn new(
        config: &DedupConfig,
        [key, time, then, sum, distinct]: [Option<Jq>; 5],
        source: Box<dyn Changelog>,
        store: Option<Box<dyn Store>>,
        metrics: Metrics,
    ) -> Dedup {
        let mode = match &config.aggregate {
            Some(a) => Mode::Aggregate(Box::new(Aggregate {
                count: a.count,
                sum,
                distinct,
                emit: a.emit,
            })),
            None => Mode::First,
        };
        let seen = Seen::new(config.windows.clone()).capped(config.max_keys);
        let limit = i64::try_from(config.max_keys).unwrap_or(i64::MAX);
        metrics.state_window_keys_limit.set(limit);
        let margin = config.max_ahead as f64 / 1000.0 + crate::config::dedup::MARGIN.as_secs_f64();
        metrics.state_changelog_margin.set(margin);
        Dedup {
            key,
            time,
            then,
            late: config.late,
            mode,
            topic: config.changelog.clone(),
            keeper: Keeper::new(seen, source, store, metrics.clone()),
            max_key: config.max_key,
            max_ahead: config.max_ahead,
            step: None,
            metrics,
        }
    }

    fn late_record(&self, window: &Window) -> Failure {
        Failure::BadRecord(TransformError::new(
            Reason::Late,
            format!(
                "its window {} closed before it came (--window-grace)",
                self.keeper.seen().windows().label(window)
            ),
        ))
    }

    fn full(&self, window: &Window, partition: i32) -> Failure {
        Failure::BadRecord(TransformError::new(
            Reason::DedupFull,
            format!(
                "its window {} holds --window-max-keys keys already (partition {partition})",
                self.keeper.seen().windows().label(window),
            ),
        ))
    }

    fn verdict(&self, verdict: &str) {
        self.metrics
            .dedup_records
            .with_label_values(&[verdict])
            .inc();
    }
}

/// `change` as a record to partition `partition` of the changelog `topic`.
fn changelog_record(topic: &str, partition: i32, change: &Change) -> OutputRecord<'static> {
    let (key, value) = changelog::encode(change);
    OutputRecord {
        topic: Some(topic.to_string()),
        partition: Some(partition),
        key: Some(Cow::Owned(key)),
        value: Some(Cow::Owned(value)),
        headers: OutputHeaders::Set(Vec::new()),
    }
}

fn bad(message: impl Into<String>) -> TransformError {
    TransformError::new(Reason::DedupInput, message.into())
}

impl Transform for Dedup {
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        // Nothing of a record whose fate was not told stays (the writer tells every one).
        self.step = None;
        let tp = (input.topic.to_string(), input.partition);
        self.keeper.ready(&tp).map_err(|e| match e {
            Unrestored::Later(why) => Failure::Unavailable(why),
            Unrestored::Homeless(why) => Failure::Held(why),
        })?;
        let key = self.key_of(input)?;
        let t = self.time_of(input)?;
        self.not_ahead(input, t)?;
        let window = (self.keeper.seen().windows().of(t))
            .ok_or_else(|| bad(format!("event time {t} ms is outside years -9999 to 9999")))?;
        if key.len() > self.max_key {
            return Err(bad(format!(
                "a key of {} bytes: its changelog record would be over --max-output-bytes",
                key.len()
            ))
            .into());
        }
        match self.mode {
            Mode::First => self.first(input, tp, key, t, window),
            Mode::Aggregate(_) => self.aggregate(input, &tp, &key, t, window),
        }
    }

    fn decided(&mut self, fate: Fate) {
        let Some(Step { tp, t, change }) = self.step.take() else {
            return;
        };
        if fate == Fate::Refused {
            return;
        }
        let seen = self.keeper.seen_mut();
        seen.advance(&tp, t);
        let change = match change {
            Effect::Nothing => None,
            Effect::Key(window, key) => Some(seen.remember(&tp, window, &key)),
            Effect::Add {
                window,
                group,
                number,
                distinct,
            } => {
                let adds = Adds {
                    number,
                    distinct: distinct.as_deref(),
                };
                seen.add(&tp, window, &group, adds).1
            }
        };
        if let Some(change) = change {
            self.keeper.changed(tp.1, change);
        }
    }

    fn assigned(&mut self, partitions: &[Tp]) {
        self.keeper.assigned(partitions);
    }

    fn revoked(&mut self, partitions: &[Tp]) {
        self.keeper.revoked(partitions);
    }

    fn committed(&mut self) {
        self.keeper.committed();
    }

    fn dropped(&mut self, known: bool) {
        self.step = None;
        self.keeper.dropped(known);
    }

    fn before_commit(&mut self) -> Vec<OutputRecord<'static>> {
        let totals = self.aggregating().is_some();
        let topic = &self.topic;
        (self.keeper.unsent(totals).iter())
            .map(|(p, change)| changelog_record(topic, *p, change))
            .collect()
    }
}

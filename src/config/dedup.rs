//! `exactly run --window`: the first record of each key per window of event time, with
//! the keys seen kept exactly once in a changelog topic (`state`, `transform::dedup`).

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse_duration;
use crate::error::Error;
use crate::state::window::{Size, Windows};

/// What happens to a record for a window that already closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Late {
    /// To the dead-letter topic (reason `late`), by the --on-error policy.
    Dlq,
    /// Dropped, counted.
    Drop,
    /// Goes on, not deduplicated (and not remembered).
    Pass,
}

/// The dedup options.
#[derive(Clone, Debug, Args)]
pub struct DedupArgs {
    /// Keep only the first record of each key per window of event time (the seed's daily
    /// active users: 1d); later ones are dropped and counted. The keys seen are kept exactly
    /// once, in a changelog topic written in the same transaction (docs/state.md,
    /// "Deduplication").
    #[arg(long, alias = "dedup-window", env = "EXACTLY_WINDOW", value_name = "DURATION", value_parser = parse_duration)]
    pub window: Option<Duration>,

    /// jq expression for the key [default: the Kafka key]: a string's text, else the JSON
    /// text of what it yields. Needs --window-key-partitioned.
    #[arg(
        long,
        alias = "dedup-key",
        env = "EXACTLY_WINDOW_KEY",
        value_name = "PROGRAM"
    )]
    pub window_key: Option<String>,

    /// Every record of one --window-key value is in one input partition (the input topic is
    /// keyed by it). Dedup is only right then; otherwise re-key first (docs/state.md).
    #[arg(
        long,
        alias = "dedup-key-partitioned",
        env = "EXACTLY_WINDOW_KEY_PARTITIONED"
    )]
    pub window_key_partitioned: bool,

    /// jq expression for the event time: milliseconds since the epoch, or an RFC 3339 string
    /// [default: the record's timestamp].
    #[arg(
        long,
        alias = "dedup-time",
        env = "EXACTLY_WINDOW_TIME",
        value_name = "PROGRAM"
    )]
    pub window_time: Option<String>,

    /// Time zone of windows of whole days (an IANA name): a day is a local day there.
    #[arg(
        long,
        alias = "dedup-time-zone",
        env = "EXACTLY_WINDOW_TIME_ZONE",
        value_name = "TZ",
        default_value = "UTC"
    )]
    pub window_time_zone: String,

    /// How long after its end a window still takes records.
    #[arg(long, alias = "dedup-grace", env = "EXACTLY_WINDOW_GRACE", value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub window_grace: Duration,

    /// A record for a window that closed (its end + grace at or before the partition's
    /// latest event time).
    #[arg(long, alias = "dedup-late", env = "EXACTLY_WINDOW_LATE", value_enum, default_value_t = Late::Dlq)]
    pub window_late: Late,

    /// The most keys one window of one input partition holds: a new key past it is a bad
    /// record (reason `dedup_full`, by --on-error) and the ExactlyDedupWindowFull alert
    /// fires, instead of the state growing without bound.
    #[arg(long, alias = "dedup-max-keys", env = "EXACTLY_WINDOW_MAX_KEYS", value_name = "N", default_value_t = 5_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub window_max_keys: u64,

    /// An event time further than this ahead of this host's clock (and, with --window-time,
    /// of the record's own timestamp) is a bad record (reason `dedup_input`), so one wrong
    /// clock cannot move the stream time ahead and make every later record late.
    #[arg(long, alias = "dedup-max-ahead", env = "EXACTLY_WINDOW_MAX_AHEAD", value_name = "DURATION", default_value = "1d", value_parser = parse_duration)]
    pub window_max_ahead: Duration,

    /// Windowed aggregates instead of the dedup.
    #[command(flatten)]
    pub aggregate: AggregateArgs,
}

/// What the windowed stage computes per window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Measure {
    /// Records per group.
    Count,
    /// The sum of --aggregate-sum's numbers per group.
    Sum,
    /// Distinct --aggregate-distinct values per group, counted exactly.
    Distinct,
}

/// When an aggregate is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Emit {
    /// Each record writes its group's new totals: an upsert stream keyed by window and group.
    Updates,
    /// Each group's totals once, when its window closes (end + grace passed by the
    /// partition's latest event time).
    Final,
}

/// The windowed aggregates' options (`--aggregate`).
#[derive(Clone, Debug, Args)]
pub struct AggregateArgs {
    /// Aggregate per --window-key group per --window instead of deduplicating: a list of
    /// count, sum, distinct (docs/state.md, "Windowed aggregates").
    #[arg(
        long,
        env = "EXACTLY_AGGREGATE",
        value_enum,
        value_delimiter = ',',
        value_name = "MEASURES"
    )]
    pub aggregate: Vec<Measure>,

    /// jq expression for the number --aggregate sum adds up (null: the record adds nothing).
    #[arg(long, env = "EXACTLY_AGGREGATE_SUM", value_name = "PROGRAM")]
    pub aggregate_sum: Option<String>,

    /// jq expression for the value --aggregate distinct counts (a string's text, else its
    /// JSON text; null: the record adds nothing).
    #[arg(long, env = "EXACTLY_AGGREGATE_DISTINCT", value_name = "PROGRAM")]
    pub aggregate_distinct: Option<String>,

    /// When aggregates are written [default: updates].
    #[arg(long, env = "EXACTLY_AGGREGATE_EMIT", value_enum)]
    pub aggregate_emit: Option<Emit>,
}

/// The resolved aggregate configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggregateConfig {
    /// Whether the count is written.
    pub count: bool,
    /// The sum's jq expression, if summed.
    pub sum: Option<String>,
    /// The distinct value's jq expression, if counted.
    pub distinct: Option<String>,
    /// When.
    pub emit: Emit,
}

impl AggregateArgs {
    /// `None` without --aggregate; `windowed`: whether --window is given.
    fn resolve(self, windowed: bool) -> Result<Option<AggregateConfig>, Error> {
        if self.aggregate.is_empty() {
            let set = [
                ("--aggregate-sum", self.aggregate_sum.is_some()),
                ("--aggregate-distinct", self.aggregate_distinct.is_some()),
                ("--aggregate-emit", self.aggregate_emit.is_some()),
            ];
            if let Some((flag, _)) = set.iter().find(|(_, on)| *on) {
                return Err(Error::Config(format!("{flag}: needs --aggregate")));
            }
            return Ok(None);
        }
        if !windowed {
            return Err(Error::Config("--aggregate: needs --window".into()));
        }
        let has = |m| self.aggregate.contains(&m);
        for (measure, flag, program) in [
            (Measure::Sum, "--aggregate-sum", &self.aggregate_sum),
            (
                Measure::Distinct,
                "--aggregate-distinct",
                &self.aggregate_distinct,
            ),
        ] {
            let name = measure.to_possible_value().map(|v| v.get_name().to_owned());
            let name = name.unwrap_or_default();
            match (has(measure), program.is_some()) {
                (true, false) => {
                    return Err(Error::Config(format!(
                        "--aggregate: {name} needs {flag} (what to {})",
                        if measure == Measure::Sum {
                            "add up"
                        } else {
                            "count"
                        }
                    )));
                }
                (false, true) => {
                    return Err(Error::Config(format!(
                        "{flag}: --aggregate does not list {name}"
                    )));
                }
                _ => {}
            }
        }
        Ok(Some(AggregateConfig {
            count: has(Measure::Count),
            sum: self.aggregate_sum,
            distinct: self.aggregate_distinct,
            emit: self.aggregate_emit.unwrap_or(Emit::Updates),
        }))
    }
}

/// Where `exactly run`'s dedup keeps its state (not the audit's: it replays in memory).
#[derive(Clone, Debug, Default, Args)]
pub struct DedupStateArgs {
    /// The changelog topic of the keys seen [default: <group-id>.dedup-changelog]; created
    /// at start when missing (one partition per input partition, compact,delete), checked
    /// when present.
    #[arg(
        long,
        alias = "dedup-changelog",
        env = "EXACTLY_STATE_CHANGELOG",
        value_name = "TOPIC"
    )]
    pub state_changelog: Option<String>,

    /// Keep the dedup's committed keys in a local store in this directory (created if
    /// missing), so a restart reads only the changelog's records since the store's last
    /// write [default: memory only: every restore reads the whole changelog].
    #[arg(long, env = "EXACTLY_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
}

/// The resolved dedup configuration.
#[derive(Clone, Debug)]
pub struct DedupConfig {
    /// The windows of event time.
    pub windows: Windows,
    /// The key's jq expression; `None`: the Kafka key.
    pub key: Option<String>,
    /// The event time's jq expression; `None`: the record's timestamp.
    pub time: Option<String>,
    /// Records for closed windows.
    pub late: Late,
    /// The changelog topic.
    pub changelog: String,
    /// How long the changelog keeps a record: the window, its grace, how far ahead an event
    /// time may be, and a day.
    pub retention: Duration,
    /// The local store's directory, if any.
    pub state_dir: Option<std::path::PathBuf>,
    /// The longest key (its changelog record within `--max-output-bytes`).
    pub max_key: usize,
    /// The most keys per window and input partition.
    pub max_keys: usize,
    /// How far ahead of this host's clock (and of the record's timestamp, with `--window-time`)
    /// an event time may be, in ms.
    pub max_ahead: i64,
    /// Aggregates instead of the dedup (`--aggregate`).
    pub aggregate: Option<AggregateConfig>,
}

/// A day, the margin the changelog keeps records past their window's close.
pub const MARGIN: Duration = Duration::from_secs(86_400);

impl DedupConfig {
    /// Keys fit the transform's limits: a changelog record is its key plus 18 bytes (format,
    /// window start and end), and stays within `--max-output-bytes`.
    pub fn fit(&mut self, transform: &super::TransformConfig) {
        self.max_key = transform.max_output_bytes.saturating_sub(18);
    }
}

/// The environment variables of the stage's flags before they were renamed (`--dedup-*`):
/// one still set is refused, naming its new name, since clap would ignore it and the stage
/// would silently not run (or start on a new, empty changelog).
pub fn renamed_env(names: impl IntoIterator<Item = String>) -> Result<(), Error> {
    for name in names {
        let Some(rest) = name.strip_prefix("EXACTLY_DEDUP_") else {
            continue;
        };
        let new = match rest {
            "CHANGELOG" => "EXACTLY_STATE_CHANGELOG".to_string(),
            "WINDOW" => "EXACTLY_WINDOW".to_string(),
            _ => format!("EXACTLY_WINDOW_{rest}"),
        };
        return Err(Error::Config(format!(
            "{name}: renamed {new}; set that instead"
        )));
    }
    Ok(())
}

impl DedupArgs {
    /// `None` without --window. `group`: the default changelog's prefix.
    pub fn resolve(self, state: DedupStateArgs, group: &str) -> Result<Option<DedupConfig>, Error> {
        renamed_env(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        let aggregate = self.aggregate.resolve(self.window.is_some())?;
        let Some(window) = self.window else {
            let set = [
                ("--window-key", self.window_key.is_some()),
                ("--window-time", self.window_time.is_some()),
                ("--state-changelog", state.state_changelog.is_some()),
                ("--window-key-partitioned", self.window_key_partitioned),
                ("--state-dir", state.state_dir.is_some()),
            ];
            if let Some((flag, _)) = set.iter().find(|(_, on)| *on) {
                return Err(Error::Config(format!("{flag}: needs --window")));
            }
            return Ok(None);
        };
        let size = Size::of(window).map_err(|e| Error::Config(format!("--window: {e}")))?;
        let tz = jiff::tz::TimeZone::get(&self.window_time_zone).map_err(|e| {
            Error::Config(format!(
                "--window-time-zone: '{}' is no time zone: {e}",
                self.window_time_zone
            ))
        })?;
        if self.window_key.is_some() && !self.window_key_partitioned {
            return Err(Error::Config(
                "--window-key: a window's state is only right when every record of a key is in \
                 one input partition; say so with --window-key-partitioned, or re-key the input \
                 by it first (docs/state.md, \"Deduplication\")"
                    .into(),
            ));
        }
        if aggregate.is_some() && self.window_late == Late::Pass {
            return Err(Error::Config(
                "--window-late: pass is for the dedup; a late record has no aggregate to go \
                 into (dlq or drop)"
                    .into(),
            ));
        }
        // Each mode its own changelog: one's records are not the other's state.
        let kind = if aggregate.is_some() {
            "aggregate"
        } else {
            "dedup"
        };
        let changelog = state
            .state_changelog
            .unwrap_or_else(|| format!("{group}.{kind}-changelog"));
        super::check_topic_name("--state-changelog", &changelog)?;
        Ok(Some(DedupConfig {
            windows: Windows::new(size, tz, self.window_grace),
            key: self.window_key,
            time: self.window_time,
            late: self.window_late,
            changelog,
            // A changelog record's timestamp is when it was written; its key's window may end
            // up to --window-max-ahead later than that.
            retention: window
                .saturating_add(self.window_grace)
                .saturating_add(self.window_max_ahead)
                .saturating_add(MARGIN),
            state_dir: state.state_dir,
            max_key: usize::MAX,
            max_keys: usize::try_from(self.window_max_keys).unwrap_or(usize::MAX),
            max_ahead: i64::try_from(self.window_max_ahead.as_millis()).unwrap_or(i64::MAX),
            aggregate,
        }))
    }
}

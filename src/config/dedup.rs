//! `exactly run --dedup-window`: the first record of each key per window of event time, with
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
    /// once, in a changelog topic written in the same transaction (README, "Deduplication").
    #[arg(long, env = "EXACTLY_DEDUP_WINDOW", value_name = "DURATION", value_parser = parse_duration)]
    pub dedup_window: Option<Duration>,

    /// jq expression for the key [default: the Kafka key]: a string's text, else the JSON
    /// text of what it yields. Needs --dedup-key-partitioned.
    #[arg(long, env = "EXACTLY_DEDUP_KEY", value_name = "PROGRAM")]
    pub dedup_key: Option<String>,

    /// Every record of one --dedup-key value is in one input partition (the input topic is
    /// keyed by it). Dedup is only right then; otherwise re-key first (README).
    #[arg(long, env = "EXACTLY_DEDUP_KEY_PARTITIONED")]
    pub dedup_key_partitioned: bool,

    /// jq expression for the event time: milliseconds since the epoch, or an RFC 3339 string
    /// [default: the record's timestamp].
    #[arg(long, env = "EXACTLY_DEDUP_TIME", value_name = "PROGRAM")]
    pub dedup_time: Option<String>,

    /// Time zone of windows of whole days (an IANA name): a day is a local day there.
    #[arg(
        long,
        env = "EXACTLY_DEDUP_TIME_ZONE",
        value_name = "TZ",
        default_value = "UTC"
    )]
    pub dedup_time_zone: String,

    /// How long after its end a window still takes records.
    #[arg(long, env = "EXACTLY_DEDUP_GRACE", value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub dedup_grace: Duration,

    /// A record for a window that closed (its end + grace at or before the partition's
    /// latest event time).
    #[arg(long, env = "EXACTLY_DEDUP_LATE", value_enum, default_value_t = Late::Dlq)]
    pub dedup_late: Late,

    /// The most keys one window of one input partition holds: a new key past it is a bad
    /// record (reason `dedup_full`, by --on-error) and the ExactlyDedupWindowFull alert
    /// fires, instead of the state growing without bound.
    #[arg(long, env = "EXACTLY_DEDUP_MAX_KEYS", value_name = "N", default_value_t = 5_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub dedup_max_keys: u64,

    /// With --dedup-time: an event time further than this past the record's own timestamp is
    /// a bad record (reason `dedup_input`), so one wrong clock cannot move the stream time
    /// ahead and make every later record late.
    #[arg(long, env = "EXACTLY_DEDUP_MAX_AHEAD", value_name = "DURATION", default_value = "1d", value_parser = parse_duration)]
    pub dedup_max_ahead: Duration,
}

/// Where `exactly run`'s dedup keeps its state (not the audit's: it replays in memory).
#[derive(Clone, Debug, Default, Args)]
pub struct DedupStateArgs {
    /// The changelog topic of the keys seen [default: <group-id>.dedup-changelog]; created
    /// at start when missing (one partition per input partition, compact,delete), checked
    /// when present.
    #[arg(long, env = "EXACTLY_DEDUP_CHANGELOG", value_name = "TOPIC")]
    pub dedup_changelog: Option<String>,

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
    /// How far past the record's timestamp an event time may be, in ms.
    pub max_ahead: i64,
}

/// A day, the margin the changelog keeps records past their window's close.
const MARGIN: Duration = Duration::from_secs(86_400);

impl DedupConfig {
    /// Keys fit the transform's limits: a changelog record is its key plus 18 bytes (format,
    /// window start and end), and stays within `--max-output-bytes`.
    pub fn fit(&mut self, transform: &super::TransformConfig) {
        self.max_key = transform.max_output_bytes.saturating_sub(18);
    }
}

impl DedupArgs {
    /// `None` without --dedup-window. `group`: the default changelog's prefix.
    pub fn resolve(self, state: DedupStateArgs, group: &str) -> Result<Option<DedupConfig>, Error> {
        let Some(window) = self.dedup_window else {
            let set = [
                ("--dedup-key", self.dedup_key.is_some()),
                ("--dedup-time", self.dedup_time.is_some()),
                ("--dedup-changelog", state.dedup_changelog.is_some()),
                ("--dedup-key-partitioned", self.dedup_key_partitioned),
                ("--state-dir", state.state_dir.is_some()),
            ];
            if let Some((flag, _)) = set.iter().find(|(_, on)| *on) {
                return Err(Error::Config(format!("{flag}: needs --dedup-window")));
            }
            return Ok(None);
        };
        let size = Size::of(window).map_err(|e| Error::Config(format!("--dedup-window: {e}")))?;
        let tz = jiff::tz::TimeZone::get(&self.dedup_time_zone).map_err(|e| {
            Error::Config(format!(
                "--dedup-time-zone: '{}' is no time zone: {e}",
                self.dedup_time_zone
            ))
        })?;
        if self.dedup_key.is_some() && !self.dedup_key_partitioned {
            return Err(Error::Config(
                "--dedup-key: dedup is only right when every record of a key is in one input \
                 partition; say so with --dedup-key-partitioned, or re-key the input by it \
                 first (README, \"Deduplication\")"
                    .into(),
            ));
        }
        let changelog = state
            .dedup_changelog
            .unwrap_or_else(|| format!("{group}.dedup-changelog"));
        super::check_topic_name("--dedup-changelog", &changelog)?;
        Ok(Some(DedupConfig {
            windows: Windows::new(size, tz, self.dedup_grace),
            key: self.dedup_key,
            time: self.dedup_time,
            late: self.dedup_late,
            changelog,
            // A changelog record's timestamp is when it was written; its key's window may end
            // up to --dedup-max-ahead later than that.
            retention: window
                .saturating_add(self.dedup_grace)
                .saturating_add(self.dedup_max_ahead)
                .saturating_add(MARGIN),
            state_dir: state.state_dir,
            max_key: usize::MAX,
            max_keys: usize::try_from(self.dedup_max_keys).unwrap_or(usize::MAX),
            max_ahead: i64::try_from(self.dedup_max_ahead.as_millis()).unwrap_or(i64::MAX),
        }))
    }
}

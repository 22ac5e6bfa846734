//! The transform and what to do when it fails: shared by `run` and `audit` (which replays it).

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse_duration;
use crate::error::Error;

/// What to do with a record that cannot be transformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnError {
    /// Write it to the dead-letter topic, in the same transaction, with the reason in headers.
    Dlq,
    /// Abort the open transaction and exit non-zero; the record is read again on restart.
    Fail,
    /// Drop it (counted and logged); its offset is committed.
    Skip,
}

/// The transform, shared by `run` and `audit` (which replays it).
#[derive(Clone, Debug, Args)]
#[command(group(clap::ArgGroup::new("jq_program").args(["jq", "jq_file"])))]
pub struct TransformArgs {
    /// jq program applied to each record's JSON value (jaq dialect). Without --jq or
    /// --jq-file, records pass through byte for byte.
    #[arg(long, env = "EXACTLY_JQ", value_name = "PROGRAM")]
    pub jq: Option<String>,

    /// File holding the jq program.
    #[arg(long, env = "EXACTLY_JQ_FILE", value_name = "PATH")]
    pub jq_file: Option<std::path::PathBuf>,

    /// The jq program yields envelopes {"key", "value", "topic", "headers"} instead of values,
    /// so it can re-key, route to another topic, or set headers.
    #[arg(long, env = "EXACTLY_ENVELOPE", requires = "jq_program")]
    pub envelope: bool,

    /// What to do with a record that cannot be transformed.
    #[arg(long, env = "EXACTLY_ON_ERROR", value_enum, default_value_t = OnError::Dlq)]
    pub on_error: OnError,

    /// Largest output record (key + value bytes); a larger one is a transform error.
    #[arg(long, env = "EXACTLY_MAX_OUTPUT_BYTES", value_name = "BYTES", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_output_bytes: u64,

    /// Most outputs one input record may fan out to; more is a transform error.
    #[arg(long, env = "EXACTLY_MAX_OUTPUTS_PER_RECORD", value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_outputs_per_record: u64,
}

/// The call-out (`exactly run` only: the audit cannot replay an application yet).
#[derive(Clone, Debug, Args)]
pub struct CallArgs {
    /// The call-out: POST batches of records to the application at this http:// URL and write
    /// what it answers for each, in the same transaction (docs/transforms.md, "Calling the
    /// application").
    #[arg(
        long,
        env = "EXACTLY_CALL_URL",
        value_name = "URL",
        conflicts_with = "jq_program"
    )]
    pub call_url: Option<String>,

    /// A call's batch closes at this many records.
    #[arg(long, env = "EXACTLY_CALL_BATCH_RECORDS", value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub call_batch_records: u64,

    /// A call's batch closes at this many bytes of keys and values.
    #[arg(long, env = "EXACTLY_CALL_BATCH_BYTES", value_name = "BYTES", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub call_batch_bytes: u64,

    /// A call's batch closes this long after its first record.
    #[arg(long, env = "EXACTLY_CALL_LINGER", value_name = "DURATION", default_value = "5ms", value_parser = parse_duration)]
    pub call_linger: Duration,

    /// Most calls in flight at once; answers are applied in the order records were read.
    #[arg(long, env = "EXACTLY_CALL_IN_FLIGHT", value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub call_in_flight: u64,

    /// A call not answered within this means the application is unavailable (abort, rewind,
    /// back off). Must be shorter than --transaction-timeout.
    #[arg(long, env = "EXACTLY_CALL_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub call_timeout: Duration,
}

/// A resolved transform configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransformConfig {
    /// Passthrough, jq or the call-out.
    pub spec: TransformSpec,
    /// Largest output.
    pub max_output_bytes: usize,
    /// Most outputs per input.
    pub max_outputs_per_record: usize,
}

impl TransformArgs {
    /// Reads the program file, if any; `call`: the call-out's options, where the command has
    /// them.
    pub fn resolve(self, call: Option<CallArgs>) -> Result<TransformConfig, Error> {
        let spec = match (self.jq, self.jq_file, call) {
            (None, None, Some(call)) if call.call_url.is_some() => call.resolve()?,
            (Some(program), _, _) => TransformSpec::Jq {
                program,
                envelope: self.envelope,
            },
            (None, Some(path), _) => {
                let program = std::fs::read_to_string(&path).map_err(|e| {
                    Error::Config(format!("--jq-file: cannot read {}: {e}", path.display()))
                })?;
                TransformSpec::Jq {
                    program,
                    envelope: self.envelope,
                }
            }
            (None, None, _) => TransformSpec::Passthrough,
        };
        Ok(TransformConfig {
            spec,
            max_output_bytes: usize::try_from(self.max_output_bytes).unwrap_or(usize::MAX),
            max_outputs_per_record: usize::try_from(self.max_outputs_per_record)
                .unwrap_or(usize::MAX),
        })
    }
}

impl CallArgs {
    fn resolve(self) -> Result<TransformSpec, Error> {
        let url = self.call_url.unwrap_or_default();
        if !url.starts_with("http://") {
            return Err(Error::Config(format!(
                "--call-url: {url:?} must be an http:// URL (the application runs \
                         next to exactly)"
            )));
        }
        if self.call_timeout.is_zero() || self.call_linger.is_zero() {
            let flag = if self.call_timeout.is_zero() {
                "--call-timeout"
            } else {
                "--call-linger"
            };
            return Err(Error::Config(format!("{flag}: must be greater than 0")));
        }
        Ok(TransformSpec::Call(CallSpec {
            url,
            batch_records: self.call_batch_records as usize,
            batch_bytes: usize::try_from(self.call_batch_bytes).unwrap_or(usize::MAX),
            linger: self.call_linger,
            in_flight: self.call_in_flight as usize,
            timeout: self.call_timeout,
        }))
    }
}

/// The transform, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransformSpec {
    /// Key, value and headers copied byte for byte.
    Passthrough,
    /// A jq program.
    Jq {
        /// Program text.
        program: String,
        /// Outputs are envelopes.
        envelope: bool,
    },
    /// The application, called over HTTP.
    Call(CallSpec),
}

/// The call-out: where the application listens and how records are batched for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSpec {
    /// http:// URL the batches are POSTed to.
    pub url: String,
    /// A batch closes at this many records…
    pub batch_records: usize,
    /// …or this many key and value bytes…
    pub batch_bytes: usize,
    /// …or this long after its first record.
    pub linger: Duration,
    /// Most calls in flight.
    pub in_flight: usize,
    /// Longest wait for an answer.
    pub timeout: Duration,
}

//! The transform and what to do when it fails: shared by `run` and `audit` (which replays it).

use clap::{Args, ValueEnum};

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

/// A resolved transform configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransformConfig {
    /// Passthrough or jq.
    pub spec: TransformSpec,
    /// Error policy.
    pub on_error: OnError,
    /// Largest output.
    pub max_output_bytes: usize,
    /// Most outputs per input.
    pub max_outputs_per_record: usize,
}

impl TransformArgs {
    /// Reads the program file, if any.
    pub fn resolve(self) -> Result<TransformConfig, Error> {
        let spec = match (self.jq, self.jq_file) {
            (Some(program), _) => TransformSpec::Jq {
                program,
                envelope: self.envelope,
            },
            (None, Some(path)) => {
                let program = std::fs::read_to_string(&path).map_err(|e| {
                    Error::Config(format!("--jq-file: cannot read {}: {e}", path.display()))
                })?;
                TransformSpec::Jq {
                    program,
                    envelope: self.envelope,
                }
            }
            (None, None) => TransformSpec::Passthrough,
        };
        Ok(TransformConfig {
            spec,
            on_error: self.on_error,
            max_output_bytes: usize::try_from(self.max_output_bytes).unwrap_or(usize::MAX),
            max_outputs_per_record: usize::try_from(self.max_outputs_per_record)
                .unwrap_or(usize::MAX),
        })
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
}

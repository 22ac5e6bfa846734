//! The errors that stop a command. What a failed Kafka call means is decided in
//! [`crate::kafka::failure`].

use crate::kafka::failure::ClientError;

/// Errors that stop `exactly run`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is wrong; the message names the option.
    #[error("{0}")]
    Config(String),
    /// The jq program does not compile.
    #[error("--jq: {0}")]
    Jq(String),
    /// Kafka refused us in a way that retrying cannot fix (authorisation, bad settings).
    #[error("{context}: {source}")]
    Unrecoverable {
        /// What exactly was doing.
        context: String,
        /// What Kafka said.
        source: ClientError,
    },
    /// The cluster refuses our clients: a wrong password, an untrusted certificate. Kafka's
    /// clients reconnect for ever; exactly stops with what librdkafka said.
    #[error("the Kafka cluster refused the connection (check the security settings): {0}")]
    Refused(String),
    /// The cluster denied a permission exactly needs (an ACL): librdkafka's words.
    #[error("the Kafka cluster denied a permission exactly needs (check the ACLs): {0}")]
    Denied(String),
    /// A record could not be transformed and the error policy is `fail`.
    #[error("{0} (--on-error fail)")]
    RecordFailed(String),
    /// Start-up did not complete (broker unreachable, coordinator never available, the HTTP
    /// address taken).
    #[error("{0}")]
    Startup(String),
    /// An offset store (Redis, MySQL, a file, the group) could not be read or written.
    #[error("{0}")]
    Store(String),
    /// Shutdown began while the pipeline could not finish cleanly (a producer was being
    /// replaced): what was open is left to the broker to abort.
    #[error("{0}")]
    Stopped(String),
    /// The loop has been inside one client call far longer than its timeout (see
    /// [`crate::health::Health::watch`]): the process leaves so that its restart fences the
    /// stuck producer.
    #[error(
        "{0}: leaving, so that a restart fences the stuck producer, aborts its transaction and resumes from the last commit"
    )]
    Stuck(String),
    /// Another live process runs the same instance of the group: on this host (see
    /// [`crate::pipeline::identity`]), or one whose consumer fenced this one's twice in a row
    /// ([`crate::pipeline::YIELD_WITHIN`]).
    #[error("{0}")]
    InstanceClash(String),
}

impl From<crate::kafka::NotCreated> for Error {
    /// librdkafka refused a client's settings: a bad option, named in the message.
    fn from(e: crate::kafka::NotCreated) -> Error {
        Error::Config(e.to_string())
    }
}

impl Error {
    /// [`Error::Unrecoverable`]: Kafka said `source` while exactly was doing `context`.
    pub fn kafka(context: &str, source: impl Into<ClientError>) -> Error {
        Error::Unrecoverable {
            context: context.to_string(),
            source: source.into(),
        }
    }

    /// `exactly run`'s exit code for it: 2 for a bad option or program, 4 for a stuck client
    /// call, 5 for a second process of one instance, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Jq(_) => 2,
            Error::Stuck(_) => 4,
            Error::InstanceClash(_) => 5,
            _ => 1,
        }
    }
}

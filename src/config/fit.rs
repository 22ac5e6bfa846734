//! How the parts of `exactly run`'s configuration fit together: what the stateful stage and
//! the call-out need of the rest, and the watchdog's bound against the transaction timeout.

use std::time::Duration;

use super::run::{ErrorPolicy, GroupConfig, Guarantee, Input, SinkConfig, TestSwitches};
use super::{DedupConfig, TransformConfig, TransformSpec};
use crate::error::Error;
use crate::kafka::Common;

/// `--stuck-call-timeout`, or its default: the transaction timeout + 30 s. Every transactional
/// call is given the transaction timeout, so a bound closer to it than 5 s would end calls that
/// are only slow.
pub fn stuck_call_timeout(
    chosen: Option<Duration>,
    transaction_timeout: Duration,
) -> Result<Duration, Error> {
    let least = transaction_timeout + Duration::from_secs(5);
    match chosen {
        None => Ok(transaction_timeout + Duration::from_secs(30)),
        Some(t) if t < least => Err(Error::Config(format!(
            "--stuck-call-timeout: {} is shorter than --transaction-timeout ({}) + 5s; \
             librdkafka's calls are given the transaction timeout",
            humantime::format_duration(t),
            humantime::format_duration(transaction_timeout)
        ))),
        Some(t) => Ok(t),
    }
}

/// What dedup needs of the rest: transactions (the changelog commits with the outputs), one
/// input topic (its partitions are the changelog's), a transform it runs in front of.
pub fn check_dedup(
    group: &GroupConfig,
    sink: &SinkConfig,
    transform: &TransformConfig,
) -> Result<(), Error> {
    if sink.db.is_some() {
        return Err(Error::Config(
            "--window: not with --db-url yet (the keys seen commit in a Kafka transaction)".into(),
        ));
    }
    if sink.guarantee != Guarantee::ExactlyOnce {
        return Err(Error::Config(
            "--window: needs --guarantee exactly-once (the keys seen commit with the \
             outputs)"
                .into(),
        ));
    }
    if !matches!(&group.input, Input::Topics(ts) if ts.len() == 1) {
        return Err(Error::Config(
            "--window: needs exactly one --input-topics topic (the changelog has one \
             partition per input partition)"
                .into(),
        ));
    }
    if matches!(transform.spec, TransformSpec::Call(_)) {
        return Err(Error::Config(
            "--window: not with --call-url yet (dedup runs in front of --jq or the \
             passthrough)"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses a changelog topic that is also the output, the DLQ or the input topic.
pub fn check_changelog(
    d: &DedupConfig,
    group: &GroupConfig,
    sink: &SinkConfig,
    errors: &ErrorPolicy,
) -> Result<(), Error> {
    let taken = [
        ("--output-topic", sink.output_topic.as_str()),
        ("--dlq-topic", errors.dlq_topic.as_str()),
    ];
    let input = match &group.input {
        Input::Topics(ts) => ts.first().map(String::as_str),
        Input::Pattern(_) => None,
    };
    let clash = (taken.iter().copied())
        .chain(input.map(|i| ("--input-topics", i)))
        .find(|(_, t)| *t == d.changelog);
    if let Some((flag, topic)) = clash {
        return Err(Error::Config(format!(
            "--state-changelog: '{topic}' is also the {flag} topic"
        )));
    }
    Ok(())
}

/// The call-out's timeout fits inside a transaction; `--test-unavailable` is not for it.
pub fn check_call(
    transform: &TransformConfig,
    sink: &SinkConfig,
    test: &TestSwitches,
) -> Result<(), Error> {
    if let TransformSpec::Call(call) = &transform.spec {
        if call.timeout >= sink.transaction_timeout {
            return Err(Error::Config(format!(
                "--call-timeout: {} must be shorter than --transaction-timeout {}",
                humantime::format_duration(call.timeout),
                humantime::format_duration(sink.transaction_timeout)
            )));
        }
        if test.unavailable > 0 {
            return Err(Error::Config(
                "--test-unavailable: not with --call-url (stop the application instead)".into(),
            ));
        }
    }
    Ok(())
}

/// Refuses a key that belongs to the broker under `--group-protocol consumer`, naming
/// the option that sets it (`consumer_config`: `--consumer-config`).
pub fn check_group_protocol(
    group: &GroupConfig,
    common: &Common,
    consumer_config: &[(String, String)],
) -> Result<(), Error> {
    for (key, lives) in group.protocol.brokers_settings() {
        let set = |kv: &[(String, String)]| kv.iter().any(|(k, _)| k == key);
        let flag = if set(consumer_config) {
            "--consumer-config"
        } else if set(&common.flags) {
            "--kafka-config"
        } else if common.file.as_ref().is_some_and(|(_, kv)| set(kv)) {
            "--kafka-config-file"
        } else {
            continue;
        };
        return Err(Error::Config(format!(
            "{flag}: {key} is not the client's to set with --group-protocol consumer; \
             it is {lives}"
        )));
    }
    Ok(())
}

//! The changelog topic, created or checked at start: one partition per input partition (a
//! changelog partition holds the state of its input partition), `compact,delete` (one record
//! per (window, key) stays, and windows long closed go), a retention that outlives every open
//! window. An existing topic's configuration is checked, never altered (rust-rdkafka's
//! `alter_configs` resets every key it does not name); its partitions grow with the input's
//! ([`grow`]): partition n holds input partition n's keys, so adding partitions moves no key.

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use crate::kafka::{NotCreated, Role, Settings};

/// What the changelog must be.
#[derive(Clone, Debug)]
pub struct Wanted<'a> {
    /// Its name.
    pub changelog: &'a str,
    /// The input topic whose partitions it mirrors.
    pub input: &'a str,
    /// The shortest retention that keeps every open window's keys.
    pub retention: Duration,
}

/// The admin client [`ensure`] asks.
pub fn admin(kafka: &Settings) -> Result<AdminClient<DefaultClientContext>, NotCreated> {
    kafka.client(Role::Admin).create()
}

/// Creates the changelog if it is missing, then checks it, through `admin`. An error says
/// what is wrong (a wrong partition count, a policy that would delete keys too early), or why
/// the cluster could not be asked.
pub async fn ensure(
    admin: &AdminClient<DefaultClientContext>,
    wanted: &Wanted<'_>,
    timeout: Duration,
) -> Result<(), String> {
    let (input_partitions, replicas) = partitions(admin, wanted.input, timeout)?
        .ok_or_else(|| format!("the input topic '{}' does not exist", wanted.input))?;
    let opts = AdminOptions::new().operation_timeout(Some(timeout));
    if partitions(admin, wanted.changelog, timeout)?.is_none() {
        create(admin, wanted, (input_partitions, replicas), &opts).await?;
    }
    // A topic just created takes a moment to reach every broker's metadata.
    let listed_by = std::time::Instant::now() + timeout;
    let have = loop {
        match partitions(admin, wanted.changelog, timeout)? {
            Some((have, _)) => break have,
            None if std::time::Instant::now() < listed_by => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            None => {
                return Err(format!(
                    "'{}' was created but the cluster does not list it after {timeout:?}",
                    wanted.changelog
                ));
            }
        }
    };
    if have > input_partitions {
        return Err(format!(
            "'{}' has {have} partitions and the input '{}' {input_partitions}: each input \
             partition's state lives in the changelog partition of its number (the input was \
             recreated? choose another changelog, or recreate it)",
            wanted.changelog, wanted.input
        ));
    }
    // A topic refused for its configuration is not altered first.
    check(admin, wanted, &opts).await?;
    if have < input_partitions
        && let Err(e) = grow(admin, wanted.changelog, input_partitions, timeout).await
    {
        // The input grew while no instance ran: the partitions without a home are held.
        tracing::error!(
            changelog = wanted.changelog, have, input = input_partitions, error = %e,
            "the changelog has fewer partitions than the input, and cannot grow: input \
             partitions {have} and up are held until it does"
        );
    }
    Ok(())
}

/// The partitions and replicas of topic `name`, if it exists. All topics are asked for:
/// asking for one by name may create it with the broker's defaults.
fn partitions(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
    timeout: Duration,
) -> Result<Option<(usize, usize)>, String> {
    let md = admin
        .inner()
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("the cluster's topics: {e}"))?;
    Ok(md.topics().iter().find(|t| t.name() == name).map(|t| {
        let replicas = t.partitions().first().map_or(1, |p| p.replicas().len());
        (t.partitions().len(), replicas)
    }))
}

/// Creates the changelog with the input's partitions and replicas.
async fn create(
    admin: &AdminClient<DefaultClientContext>,
    wanted: &Wanted<'_>,
    (partitions, replicas): (usize, usize),
    opts: &AdminOptions,
) -> Result<(), String> {
    let retention = wanted.retention.as_millis().to_string();
    let topic = NewTopic::new(
        wanted.changelog,
        i32::try_from(partitions).unwrap_or(i32::MAX),
        TopicReplication::Fixed(i32::try_from(replicas).unwrap_or(1)),
    )
    .set("cleanup.policy", "compact,delete")
    .set("retention.ms", &retention)
    .set("message.timestamp.type", "CreateTime");
    let created = admin
        .create_topics([&topic], opts)
        .await
        .map_err(|e| format!("creating '{}': {e}", wanted.changelog))?;
    for result in created {
        match result {
            Ok(_) => tracing::info!(
                topic = wanted.changelog,
                partitions,
                retention_ms = %retention,
                "changelog topic created"
            ),
            // Another instance created it meanwhile: checked like any other.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(format!("creating '{name}': {code}")),
        }
    }
    Ok(())
}

/// Checks the changelog's configuration.
async fn check(
    admin: &AdminClient<DefaultClientContext>,
    wanted: &Wanted<'_>,
    opts: &AdminOptions,
) -> Result<(), String> {
    let configs = admin
        .describe_configs([&ResourceSpecifier::Topic(wanted.changelog)], opts)
        .await
        .map_err(|e| format!("describing '{}': {e}", wanted.changelog))?;
    let resource = configs
        .into_iter()
        .next()
        .ok_or_else(|| format!("describing '{}': no answer", wanted.changelog))?
        .map_err(|e| format!("describing '{}': {e}", wanted.changelog))?;
    let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
    check_configs(
        wanted,
        value("cleanup.policy").as_deref(),
        value("retention.ms").as_deref(),
        value("retention.bytes").as_deref(),
    )
}

/// Grows `changelog` to `partitions` (it has fewer: the input grew). Another instance that grew
/// it first is no error. An error says why it could not (a grant missing: ALTER on the topic).
pub async fn grow(
    admin: &AdminClient<DefaultClientContext>,
    changelog: &str,
    partitions: usize,
    timeout: Duration,
) -> Result<(), String> {
    let opts = AdminOptions::new().operation_timeout(Some(timeout));
    let wanted = NewPartitions::new(changelog, partitions);
    let grown = admin
        .create_partitions([&wanted], &opts)
        .await
        .map_err(|e| format!("growing '{changelog}' to {partitions} partitions: {e}"))?;
    for result in grown {
        match result {
            Ok(_) => tracing::info!(changelog, partitions, "changelog grown with the input"),
            // It has that many already.
            Err((_, RDKafkaErrorCode::InvalidPartitions)) => {}
            Err((_, code)) => {
                return Err(format!(
                    "growing '{changelog}' to {partitions} partitions: {code} (the principal \
                     needs ALTER on topic '{changelog}'; or add them: kafka-topics.sh --alter \
                     --topic {changelog} --partitions {partitions})"
                ));
            }
        }
    }
    Ok(())
}

/// Whether a changelog's `cleanup.policy`, `retention.ms` and `retention.bytes` keep what a
/// restore needs.
fn check_configs(
    wanted: &Wanted<'_>,
    policy: Option<&str>,
    retention: Option<&str>,
    bytes: Option<&str>,
) -> Result<(), String> {
    let name = wanted.changelog;
    let policy = policy.unwrap_or("delete");
    if !policy.split(',').any(|p| p.trim() == "compact") {
        return Err(format!(
            "'{name}' has cleanup.policy={policy}: a changelog needs compact (or \
             compact,delete), or it grows with every key ever seen"
        ));
    }
    let deletes = policy.split(',').any(|p| p.trim() == "delete");
    if deletes
        && bytes
            .and_then(|b| b.parse::<i64>().ok())
            .is_some_and(|b| b >= 0)
    {
        return Err(format!(
            "'{name}' has retention.bytes={}: with delete, a partition past that size loses \
             its oldest keys, open windows' too (set it to -1; compaction keeps it small)",
            bytes.unwrap_or_default()
        ));
    }
    let ms: i64 = match retention.map(str::parse) {
        Some(Ok(ms)) => ms,
        _ => return Ok(()),
    };
    let needed = i64::try_from(wanted.retention.as_millis()).unwrap_or(i64::MAX);
    if deletes && ms >= 0 && ms < needed {
        return Err(format!(
            "'{name}' keeps records {}; the window, its grace, --window-max-ahead and a day \
             need {}: keys of open windows would be deleted (raise its retention.ms)",
            humantime::format_duration(Duration::from_millis(ms as u64)),
            humantime::format_duration(wanted.retention)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changelog_must_compact_and_keep_every_open_window() {
        let w = Wanted {
            changelog: "c",
            input: "in",
            retention: Duration::from_secs(2 * 86_400),
        };
        let day = "86400000";
        assert!(check_configs(&w, Some("compact,delete"), Some("172800000"), None).is_ok());
        assert!(
            check_configs(&w, Some("compact"), Some(day), Some("1000")).is_ok(),
            "never deletes"
        );
        assert!(check_configs(&w, Some("compact, delete"), Some("-1"), Some("-1")).is_ok());
        let e = check_configs(&w, Some("delete"), Some("-1"), None).unwrap_err();
        assert!(e.contains("needs compact"), "{e}");
        let e = check_configs(&w, None, None, None).unwrap_err();
        assert!(e.contains("cleanup.policy=delete"), "{e}");
        let e = check_configs(&w, Some("compact,delete"), Some("-1"), Some("1073741824"));
        assert!(e.unwrap_err().contains("retention.bytes=1073741824"));
        let e = check_configs(&w, Some("compact,delete"), Some(day), None).unwrap_err();
        assert!(
            e.contains("keeps records 1day") && e.contains("2days"),
            "{e}"
        );
    }
}

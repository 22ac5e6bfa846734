//! The changelog topic, created or checked at start: one partition per input partition (a
//! changelog partition holds the state of its input partition), `compact,delete` (one record
//! per (window, key) stays, and windows long closed go), a retention that outlives every open
//! window. An existing topic's configuration is checked, never altered (rust-rdkafka's
//! `alter_configs` resets every key it does not name); its partitions grow with the input's
//! ([`grow`]): partition n holds input partition n's keys, so adding partitions moves no key.

use std::time::Duration;

use crate::kafka::admin::{Admin, Done, NotGrown};
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
pub fn admin(kafka: &Settings) -> Result<Admin, NotCreated> {
    Admin::create(&kafka.client(Role::Admin))
}

/// Creates the changelog if it is missing, then checks it, through `admin`. An error says
/// what is wrong (a wrong partition count, a policy that would delete keys too early), or why
/// the cluster could not be asked.
pub async fn ensure(admin: &Admin, wanted: &Wanted<'_>, timeout: Duration) -> Result<(), String> {
    let (input_partitions, replicas) = (admin.partitions(wanted.input, timeout)?)
        .ok_or_else(|| format!("the input topic '{}' does not exist", wanted.input))?;
    if admin.partitions(wanted.changelog, timeout)?.is_none() {
        create(admin, wanted, (input_partitions, replicas), timeout).await?;
    }
    // A topic just created takes a moment to reach every broker's metadata.
    let listed_by = std::time::Instant::now() + timeout;
    let have = loop {
        match admin.partitions(wanted.changelog, timeout)? {
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
    check(admin, wanted, timeout).await?;
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

/// Creates the changelog with the input's partitions and replicas.
async fn create(
    admin: &Admin,
    wanted: &Wanted<'_>,
    (partitions, replicas): (usize, usize),
    timeout: Duration,
) -> Result<(), String> {
    let retention = wanted.retention.as_millis().to_string();
    let configs = [
        ("cleanup.policy", "compact,delete"),
        ("retention.ms", retention.as_str()),
        ("message.timestamp.type", "CreateTime"),
    ];
    let done = (admin)
        .create_topic(wanted.changelog, (partitions, replicas), &configs, timeout)
        .await?;
    // Another instance created it meanwhile: checked like any other.
    if done == Done::Done {
        tracing::info!(
            topic = wanted.changelog,
            partitions,
            retention_ms = %retention,
            "changelog topic created"
        );
    }
    Ok(())
}

/// Checks the changelog's configuration.
async fn check(admin: &Admin, wanted: &Wanted<'_>, timeout: Duration) -> Result<(), String> {
    let keys = ["cleanup.policy", "retention.ms", "retention.bytes"];
    let values = admin.configs(wanted.changelog, &keys, timeout).await?;
    let value = |i: usize| values.get(i).cloned().flatten();
    check_configs(
        wanted,
        value(0).as_deref(),
        value(1).as_deref(),
        value(2).as_deref(),
    )
}

/// Grows `changelog` to `partitions` (it has fewer: the input grew). Another instance that grew
/// it first is no error. An error says why it could not (a grant missing: ALTER on the topic).
pub async fn grow(
    admin: &Admin,
    changelog: &str,
    partitions: usize,
    timeout: Duration,
) -> Result<(), String> {
    match admin.grow(changelog, partitions, timeout).await {
        Ok(Done::Done) => {
            tracing::info!(changelog, partitions, "changelog grown with the input");
            Ok(())
        }
        Ok(Done::Already) => Ok(()),
        Err(NotGrown::Unanswered(e)) => Err(format!(
            "growing '{changelog}' to {partitions} partitions: {e}"
        )),
        Err(NotGrown::Refused(e)) => Err(format!(
            "growing '{changelog}' to {partitions} partitions: {e} (the principal needs ALTER \
             on topic '{changelog}'; or add them: kafka-topics.sh --alter --topic {changelog} \
             --partitions {partitions})"
        )),
    }
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

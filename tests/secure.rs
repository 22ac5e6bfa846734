//! Secured clusters: the test broker's SASL_SSL listener (SCRAM-SHA-512) and SSL listener
//! (client certificates), with ACLs enforced by KRaft's StandardAuthorizer (scripts/kafka.sh
//! makes the CA, the certificates, the users and the ACLs).
//!
//! exactly-once holds over both (kill -9 mid-stream, restart), the lag gauges and `exactly
//! audit` work over them; a wrong password or certificate stops exactly at once with the
//! cause; each missing permission stops it naming the permission, with no partial output; and
//! no secret appears in anything a run writes.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
struct Pair {
    cert: String,
    key: String,
}

/// The broker's secured listeners, users and certificates (`scripts/kafka.sh security`).
#[derive(Debug, Deserialize)]
struct Security {
    sasl_ssl: String,
    ssl: String,
    passwords: HashMap<String, String>,
    ca: String,
    other_ca: String,
    client: Pair,
    admin: Pair,
    expired: Pair,
    stranger: Pair,
}

fn security() -> Security {
    let path = match std::env::var("EXACTLY_TEST_SECURITY") {
        Ok(p) => p,
        Err(_) => {
            bootstrap();
            let out = Command::new(repo().join("scripts/kafka.sh"))
                .arg("security")
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        }
    };
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A client's settings, for `--kafka-config` or a properties file.
type Settings = Vec<(String, String)>;

fn scram(s: &Security, user: &str, password: &str) -> Settings {
    [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", user),
        ("sasl.password", password),
        ("ssl.ca.location", &s.ca),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec()
}

fn user(s: &Security, user: &str) -> Settings {
    scram(s, user, &s.passwords[user])
}

fn mtls(ca: &str, pair: &Pair) -> Settings {
    [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca),
        ("ssl.certificate.location", &pair.cert),
        ("ssl.key.location", &pair.key),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec()
}

/// A properties file (the way a mounted Secret holds them), removed when dropped.
struct PropertiesFile(PathBuf);

impl PropertiesFile {
    fn new(settings: &Settings) -> PropertiesFile {
        let path = std::env::temp_dir().join(format!("{}.properties", unique("exactly-secure")));
        let text: String = settings.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        std::fs::write(&path, text).unwrap();
        PropertiesFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for PropertiesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Topics named for the ACLs: inputs `sec-in-*`, outputs `sec-out-*`, dead letters
/// `sec-dlq-*` (created over the plaintext listener, as an administrator would).
fn secured_topics(name: &str) -> Topics {
    let topics = Topics {
        input: unique(&format!("sec-in-{name}")),
        output: unique(&format!("sec-out-{name}")),
        dlq: unique(&format!("sec-dlq-{name}")),
    };
    create_topics(&[(&topics.input, 3), (&topics.output, 3), (&topics.dlq, 1)]);
    topics
}

/// `exactly run` against `listener`, with the settings in a properties file.
fn args(
    topics: &Topics,
    group: &str,
    instance: &str,
    listener: &str,
    file: &PropertiesFile,
) -> Vec<String> {
    let mut args = base_args(topics, group, instance);
    let at = args
        .iter()
        .position(|a| a == "--bootstrap-servers")
        .unwrap();
    args[at + 1] = listener.to_string();
    args.extend(
        [
            "--dlq-topic",
            &topics.dlq,
            "--kafka-config-file",
            file.path(),
            "--jq",
            DOUBLE,
            "--startup-timeout",
            "30s",
        ]
        .map(String::from),
    );
    args
}

/// Every password and private key of the test broker: none may appear in what a run writes.
fn assert_no_secret(s: &Security, what: &str, text: &str) {
    for (user, password) in &s.passwords {
        assert!(
            !text.contains(password.as_str()),
            "{user}'s password in {what}:\n{text}"
        );
    }
    for pair in [&s.client, &s.admin, &s.expired, &s.stranger] {
        let key = std::fs::read_to_string(&pair.key).unwrap();
        let body = key.lines().nth(1).unwrap();
        assert!(!text.contains(body), "a private key in {what}");
    }
}

/// kill -9 mid-stream and a restart, over a secured listener: nothing lost or duplicated; the
/// lag gauges and the audit work over the same listener.
fn exactly_once_over(name: &str, listener: &str, settings: &Settings, s: &Security) {
    let topics = secured_topics(name);
    let group = unique("sec-g");
    let total = 20_000;
    produce(&topics.input, &numbered(total, 3));
    let file = PropertiesFile::new(settings);

    let run = args(&topics, &group, &format!("sec-{name}-0"), listener, &file);
    let mut first = Exactly::start(&run);
    let at_kill = wait_committed_at_least(&group, &topics.input, 1, Duration::from_secs(60));
    first.kill9();
    assert!(
        at_kill < total as i64,
        "the kill came after the end ({at_kill})"
    );
    let first_log = first.log_text();

    let second = Exactly::start(&run);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    // The lag gauges read the input's offsets over the same listener: 0 left on every
    // partition once everything is committed.
    let addr = http_addr(&second);
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (_, text) = get(&addr, "/metrics").unwrap();
        let lags = samples(
            &text,
            "exactly_consumer_lag_records",
            &[("topic", &topics.input)],
        );
        if lags.len() == 3 && lags.iter().all(|l| *l == 0.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "lag gauges never showed 0 on 3 partitions:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    second.signal(nix::sys::signal::Signal::SIGTERM);
    let mut second = second;
    assert!(
        second.wait(Duration::from_secs(15)).success(),
        "{}",
        second.log_text()
    );

    let outputs = read_all(&topics.output, "read_committed");
    let checked = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    assert_eq!(checked, total);

    // The audit, as an operator with their own account on the same listener.
    let admin = PropertiesFile::new(&match settings[0].1.as_str() {
        "SASL_SSL" => user(s, "admin"),
        _ => mtls(&s.ca, &s.admin),
    });
    let (code, report) = audit_json(&[
        "--bootstrap-servers",
        listener,
        "--kafka-config-file",
        admin.path(),
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--dlq-topic",
        &topics.dlq,
        "--group-id",
        &group,
        "--jq",
        DOUBLE,
    ]);
    assert_eq!(code, 0, "{report:#}");
    // The offset tools over the same listener: the group's offsets, all at the end.
    let show = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["offsets", "show", "--bootstrap-servers", listener])
        .args(["--kafka-config-file", admin.path(), "--group-id", &group])
        .args(["--input-topics", &topics.input])
        .output()
        .unwrap();
    let shown = said(&show);
    assert!(show.status.success() && shown.contains("LSO"), "{shown}");
    let committed = committed(&group, &topics.input);
    for (partition, offset) in &committed {
        assert!(
            shown.contains(&offset.to_string()),
            "partition {partition} at {offset}: {shown}"
        );
    }
    for (what, text) in [
        ("the first run's log", first_log.as_str()),
        ("the second run's log", &second.log_text()),
        ("/metrics", &metrics),
        ("the audit report", &report.to_string()),
        ("offsets show", &shown),
    ] {
        assert_no_secret(s, what, text);
    }
    eprintln!(
        "{name}: {checked} outputs exactly once across a kill -9 (committed {at_kill} before it)"
    );
}

#[test]
fn exactly_once_over_sasl_ssl_with_scram() {
    let s = security();
    exactly_once_over("scram", &s.sasl_ssl, &user(&s, "exactly"), &s);
}

#[test]
fn exactly_once_over_mtls() {
    let s = security();
    exactly_once_over("mtls", &s.ssl, &mtls(&s.ca, &s.client), &s);
}

/// The error exactly exits with: its last ERROR line of its own (librdkafka's lines have
/// targets of their own).
fn exit_error(log: &str) -> String {
    log.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["level"] == "ERROR" && e["target"] == "exactly")
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Runs exactly with `settings` against `listener` until it exits; returns (exit code, time,
/// log).
fn refused(name: &str, listener: &str, settings: &Settings) -> (Option<i32>, Duration, String) {
    let topics = secured_topics(name);
    produce(&topics.input, &numbered(30, 3));
    let file = PropertiesFile::new(settings);
    let run = args(
        &topics,
        &unique("sec-g"),
        &format!("sec-{name}"),
        listener,
        &file,
    );
    let started = Instant::now();
    let mut ex = Exactly::start(&run);
    let status = ex.wait(Duration::from_secs(60));
    (status.code(), started.elapsed(), ex.log_text())
}

#[test]
fn a_wrong_password_or_certificate_stops_at_once_naming_the_cause() {
    let s = security();
    let cases = [
        (
            "wrong-password",
            s.sasl_ssl.as_str(),
            scram(&s, "exactly", "not-the-password"),
            "Authentication failed",
        ),
        (
            "unknown-ca",
            &s.sasl_ssl,
            {
                let mut c = user(&s, "exactly");
                for (k, v) in &mut c {
                    if k == "ssl.ca.location" {
                        v.clone_from(&s.other_ca);
                    }
                }
                c
            },
            "certificate verify failed",
        ),
        (
            "unknown-ca-mtls",
            &s.ssl,
            mtls(&s.other_ca, &s.client),
            "certificate verify failed",
        ),
        ("expired-cert", &s.ssl, mtls(&s.ca, &s.expired), "alert"),
        ("stranger-cert", &s.ssl, mtls(&s.ca, &s.stranger), "alert"),
    ];
    for (name, listener, settings, cause) in cases {
        let (code, took, log) = refused(name, listener, &settings);
        assert_eq!(code, Some(1), "{name}: {log}");
        // Well within --startup-timeout (30 s): no waiting it out, no retry loop.
        assert!(
            took < Duration::from_secs(20),
            "{name}: took {took:?}\n{log}"
        );
        let last = exit_error(&log);
        assert!(
            last.contains("refused the connection") && last.contains(cause),
            "{name}: {last}\n{log}"
        );
        assert_no_secret(&s, name, &log);
        eprintln!("{name}: exit 1 in {took:.1?}: {last}");
    }
}

#[test]
fn each_missing_permission_stops_exactly_naming_it_with_no_partial_output() {
    let s = security();
    // (principal, the broker's error, most aborts). Never an abort loop: only a missing
    // WRITE on the output or dead-letter topic is met inside a transaction, which aborts; at
    // most one more before it, when librdkafka refused a send of the failed transaction
    // (an "Erroneous state", not the cause) before it logged why.
    let cases = [
        ("no-input-read", "Topic authorization failed", 0),
        ("no-group-read", "Group authorization failed", 0),
        ("no-output-write", "Topic authorization failed", 2),
        ("no-dlq-write", "Topic authorization failed", 2),
        ("no-txn-write", "Transactional Id authorization failed", 0),
    ];
    for (principal, cause, most_aborts) in cases {
        let topics = secured_topics(principal);
        let group = unique("sec-g");
        produce(&topics.input, &numbered(300, 3));
        let file = PropertiesFile::new(&user(&s, principal));
        let run = args(&topics, &group, principal, &s.sasl_ssl, &file);
        let started = Instant::now();
        let mut ex = Exactly::start(&run);
        if principal == "no-dlq-write" {
            // Good records flow and commit; the refusal comes with the first dead letter.
            wait_committed_at_least(&group, &topics.input, 300, Duration::from_secs(60));
        }
        let mut records = numbered(30, 3);
        records.push(In::raw(1, "bad", b"not JSON"));
        produce(&topics.input, &records);
        let status = ex.wait(Duration::from_secs(90));
        let log = ex.log_text();
        assert_eq!(status.code(), Some(1), "{principal}: {log}");
        let last = exit_error(&log);
        // A topic exactly writes is named, with the grant it needs (not the call that failed).
        let cause = match principal {
            "no-output-write" => format!(
                "may not write the output topic '{0}': grant the principal WRITE on topic '{0}'",
                topics.output
            ),
            "no-dlq-write" => format!(
                "may not write the dead-letter topic '{0}': grant the principal WRITE on topic '{0}'",
                topics.dlq
            ),
            // Its id (`<group>-<instance>`), and the grant.
            "no-txn-write" => format!(
                "may not use the transactional id '{group}-{principal}': grant the principal \
                 WRITE on transactional-id '{group}-{principal}'"
            ),
            _ => cause.to_string(),
        };
        assert!(
            last.to_lowercase().contains(&cause.to_lowercase()),
            "{principal}: {last}\n{log}"
        );
        let aborts = ex.events("transaction aborted").len();
        assert!(
            aborts <= most_aborts,
            "{principal}: {aborts} aborts: {:?}",
            ex.events("transaction aborted")
        );
        // Nothing partial: what is committed matches the committed offsets exactly.
        wait_stable(&topics.output, Duration::from_secs(30));
        let committed = committed(&group, &topics.input);
        let mut expected = expected_outputs(&topics.input, doubled);
        expected.retain(|(_, p, o, _), _| committed.get(p).is_some_and(|c| o < c));
        assert_exactly_once(&read_all(&topics.output, "read_committed"), &expected);
        if principal == "no-dlq-write" {
            assert!(expected.len() >= 300, "{principal}: {}", expected.len());
        }
        assert_no_secret(&s, principal, &log);
        eprintln!(
            "{principal}: exit 1 in {:.1?}, {aborts} abort(s), {} outputs committed: {last}",
            started.elapsed(),
            expected.len()
        );
    }
}

/// An output routed by its record to a topic the principal may not write is the record's
/// fault once the route has refused for --route-timeout: it goes to the DLQ with
/// `route_refused`, everything else commits, and exactly keeps running (a missing write on the
/// output or DLQ topic still stops it, above).
#[test]
fn a_route_the_principal_may_not_write_sends_its_record_to_the_dlq_not_exactly_down() {
    let s = security();
    // no-dlq-write may write sec-out-* (output and, here, the DLQ) but not sec-dlq-*.
    let mut topics = secured_topics("denied-route");
    topics.dlq = unique("sec-out-denied-route-dlq");
    let denied = unique("sec-dlq-denied-route");
    create_topics(&[(&topics.dlq, 1), (&denied, 1)]);
    let mut records = numbered(300, 3);
    records.push(In::json(1, "routed", serde_json::json!({"route": denied})));
    produce(&topics.input, &records);

    let group = unique("sec-g");
    let file = PropertiesFile::new(&user(&s, "no-dlq-write"));
    let mut run = args(&topics, &group, "denied-route", &s.sasl_ssl, &file);
    let jq = run.iter().position(|a| a == "--jq").unwrap();
    run[jq + 1] = "if .route then {topic: .route, value: .} else {value: .} end".into();
    run.extend(["--envelope", "--route-timeout", "10s"].map(String::from));
    let mut ex = Exactly::start(&run);
    ex.wait_log("every record committed", Duration::from_secs(120), |ex| {
        ex.has_exited() || committed_total(&group, &topics.input) == 301
    });
    assert!(!ex.has_exited(), "exactly stopped: {}", ex.log_text());
    ex.stop_cleanly();

    let expected = expected_outputs(&topics.input, |v: &Value| {
        if v["route"].is_string() {
            vec![]
        } else {
            vec![v.clone()]
        }
    });
    assert_eq!(expected.len(), 300);
    assert_exactly_once(&read_all(&topics.output, "read_committed"), &expected);
    let dlq = read_all(&topics.dlq, "read_committed");
    assert_eq!(dlq.len(), 1, "{dlq:#?}");
    assert_eq!(
        dlq[0].header(ERROR_REASON).as_deref(),
        Some("route_refused")
    );
    let message = dlq[0].header(ERROR_MESSAGE).unwrap_or_default();
    assert!(
        message.contains(&denied) && message.contains("AUTHORIZATION"),
        "{message}"
    );
    assert!(read_all(&denied, "read_uncommitted").is_empty());
    assert_no_secret(&s, "denied-route", &ex.log_text());
}

#[test]
fn secrets_stay_out_of_help_errors_and_logs() {
    let s = security();
    let password = &s.passwords["exactly"];
    let bin = env!("CARGO_BIN_EXE_exactly");
    // --help with the settings in the environment.
    for sub in ["run", "audit"] {
        let out = Command::new(bin)
            .args([sub, "--help"])
            .env("EXACTLY_KAFKA_CONFIG", format!("sasl.password={password}"))
            .env(
                "EXACTLY_CONSUMER_CONFIG",
                format!("sasl.password={password}"),
            )
            .env(
                "EXACTLY_PRODUCER_CONFIG",
                format!("sasl.password={password}"),
            )
            .output()
            .unwrap();
        let text = said(&out);
        assert!(text.contains("EXACTLY_KAFKA_CONFIG"), "{text}");
        assert_no_secret(&s, &format!("{sub} --help"), &text);
    }
    // Refused settings, malformed pairs and a bad file name the flag, never the secret.
    let topics = secured_topics("secrets");
    for bad in [
        vec![
            "--kafka-config".to_string(),
            format!("sasl.jaas.config=x password=\"{password}\""),
        ],
        vec![
            "--kafka-config".to_string(),
            format!("sasl.password:{password}"),
        ],
        vec![
            "--kafka-config".to_string(),
            format!("sasl.pasword={password}"),
        ],
        vec![
            "--consumer-config".to_string(),
            format!("ssl.key.password{password}"),
        ],
    ] {
        let mut run = base_args(&topics, "sec-g", "sec-secrets");
        run.extend(bad.clone());
        let out = Command::new(bin).args(&run).output().unwrap();
        let text = said(&out);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {text}");
        assert!(text.contains(&bad[0]), "{bad:?}: {text}");
        assert_no_secret(&s, &format!("{bad:?}"), &text);
    }
}

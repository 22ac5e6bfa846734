//! Bad configuration fails at start-up with a message naming the option, a non-zero exit,
//! and nothing consumed or produced.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    exactly(&[&["run"], args].concat(), env)
}

/// `exactly` with `args` (a subcommand first): its exit code and stderr.
fn exactly(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exactly"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run exactly");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const OK: &[&str] = &[
    "--bootstrap-servers",
    "127.0.0.1:9",
    "--input-topics",
    "in",
    "--output-topic",
    "out",
    "--group-id",
    "g",
    "--http-addr",
    "127.0.0.1:0",
];

#[test]
fn bad_values_fail_fast_naming_the_option() {
    let cases: &[(&[&str], &str)] = &[
        (&["--commit-interval", "soon"], "--commit-interval"),
        (&["--transaction-timeout", "50ms"], "--transaction-timeout"),
        (&["--max-records-per-txn", "0"], "--max-records-per-txn"),
        (&["--max-bytes-per-txn", "lots"], "--max-bytes-per-txn"),
        (&["--on-error", "shrug"], "--on-error"),
        (&["--output-topic", "has space"], "--output-topic"),
        (&["--jq", ".a |"], "--jq"),
        (&["--jq", "nosuch(1)"], "--jq"),
        (
            &["--consumer-config", "enable.auto.commit=true"],
            "--consumer-config",
        ),
        (
            &["--consumer-config", "isolation.level=read_uncommitted"],
            "--consumer-config",
        ),
        (
            &["--producer-config", "transactional.id=mine"],
            "--transactional-id",
        ),
        (
            &["--producer-config", "not.a.real.key=1"],
            "--producer-config",
        ),
    ];
    for (extra, flag) in cases {
        let args: Vec<&str> = OK.iter().chain(extra.iter()).copied().collect();
        let started = Instant::now();
        let (code, err) = run(&args, &[]);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(flag),
            "{extra:?}: message does not name {flag}: {err}"
        );
        // Fails before touching the (unreachable) broker.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{extra:?} took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn environment_variables_configure_and_are_validated() {
    let (code, err) = run(
        &OK[..6],
        &[
            ("EXACTLY_GROUP_ID", "g"),
            ("EXACTLY_COMMIT_INTERVAL", "later"),
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--commit-interval"), "{err}");
    let (code, err) = run(&[], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--bootstrap-servers"), "{err}");
}

/// Settings each valid alone that librdkafka refuses together when it creates a client:
/// exit 2, naming the client (the pipeline's, the audit's, the offset tools') and the option
/// that holds the key librdkafka names, with a secret's value never shown.
#[test]
fn settings_librdkafka_refuses_name_the_client_and_the_option_that_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client.properties");
    std::fs::write(
        &file,
        "security.protocol=ssl\nssl.certificate.location=/nonexistent/client-cert.pem\n\
         ssl.key.location=/nonexistent/client-key.pem\nssl.key.password=k-secret\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let with = |cmd: &[&str], extra: &[&str]| -> Vec<String> {
        cmd.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    // The connection and group options `run` takes, which `offsets show` and `audit` share.
    let (connection, output) = (&OK[..4], &OK[4..6]);
    let run = [&["run"], OK].concat();
    let offsets = [&["offsets", "show"], connection, &OK[6..8]].concat();
    let audit = [&["audit"], connection, output, &OK[6..8]].concat();
    let from_file = format!("ssl.certificate.location is from --kafka-config-file {file}");
    let cases = [
        (
            with(&run, &["--kafka-config-file", file]),
            "the end-offset reader cannot be created: ssl.certificate.location failed",
            from_file.clone(),
        ),
        (
            with(&run, &["--producer-config", "linger.ms=600000"]),
            "the transactional producer cannot be created: `message.timeout.ms` must be \
             greater than `linger.ms`",
            "linger.ms is from --producer-config".to_string(),
        ),
        (
            with(&offsets, &["--kafka-config-file", file]),
            "the reader of the group's offsets cannot be created",
            from_file.clone(),
        ),
        (
            with(&audit, &["--kafka-config", "fetch.max.bytes=10"]),
            "the audit's reader cannot be created",
            "fetch.max.bytes is from --kafka-config".to_string(),
        ),
    ];
    for (args, client, option) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = exactly(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(client), "{args:?}: {err}");
        assert!(err.contains(&option), "{args:?}: {err}");
        assert!(!err.contains("k-secret"), "{args:?}: {err}");
    }
}

#[test]
fn unreachable_broker_fails_start_up_clearly() {
    let args: Vec<&str> = OK
        .iter()
        .copied()
        .chain(["--startup-timeout", "3s"])
        .collect();
    let started = Instant::now();
    let (code, err) = run(&args, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--bootstrap-servers 127.0.0.1:9"), "{err}");
    assert!(err.contains("--startup-timeout"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn nothing_is_produced_when_start_up_fails() {
    let topics = Topics::create("cfg", 1, 1);
    produce(&topics.input, &numbered(10, 1));
    let group = unique("cfg-g");
    let b = bootstrap();
    let base = [
        "--http-addr",
        "127.0.0.1:0",
        "--bootstrap-servers",
        b.as_str(),
        "--input-topics",
        topics.input.as_str(),
        "--group-id",
        group.as_str(),
    ];
    // A refused passthrough key, a bad program, a missing output topic, a missing DLQ topic.
    let missing_out = unique("missing");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--output-topic",
                &topics.output,
                "--consumer-config",
                "group.id=x",
            ],
            "--group-id",
        ),
        (vec!["--output-topic", &topics.output, "--jq", "{"], "--jq"),
        (vec!["--output-topic", &missing_out], "--output-topic"),
        (
            vec![
                "--output-topic",
                &topics.output,
                "--dlq-topic",
                &missing_out,
            ],
            "--dlq-topic",
        ),
    ];
    for (extra, flag) in cases {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let (code, err) = run(&args, &[]);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
    // Not a single record written, even uncommitted; no offset committed.
    assert!(end_offsets(&topics.output).values().all(|&e| e == 0));
    assert!(end_offsets(&topics.dlq).values().all(|&e| e == 0));
    assert!(committed(&group, &topics.input).is_empty());
}

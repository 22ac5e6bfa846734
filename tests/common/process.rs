//! Running the `exactly` binary (and the external checkers the tests call): start, signal, stop,
//! its log, its HTTP address, `exactly audit`, and logged partition assignments.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::broker::{Topics, bootstrap};

/// A running `exactly` process. Killed (SIGKILL) when dropped.
pub struct Exactly {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub name: String,
}

/// Settings every test run uses: its broker, quick group membership; and the consumer
/// settings in `EXACTLY_TEST_CONSUMER_CONFIG` (`key=value;…`), to run a suite with candidate
/// settings (`EXACTLY_CONSUMER_CONFIG` would not do: the arguments here replace it).
///
/// With `EXACTLY_TEST_GROUP_PROTOCOL=consumer` every instance joins with KIP-848's protocol,
/// whose quick session timeout and heartbeat are the test brokers' (`group.consumer.*`).
pub fn base_args(topics: &Topics, group: &str, instance: &str) -> Vec<String> {
    let extra = std::env::var("EXACTLY_TEST_CONSUMER_CONFIG").unwrap_or_default();
    let extra = extra
        .split(';')
        .filter(|kv| !kv.is_empty())
        .flat_map(|kv| ["--consumer-config".to_string(), kv.to_string()]);
    let membership: &[&str] = match group_protocol().as_str() {
        "classic" => &[
            "--consumer-config",
            "session.timeout.ms=6000",
            "--consumer-config",
            "heartbeat.interval.ms=500",
        ],
        _ => &["--group-protocol", "consumer"],
    };
    [
        "run",
        "--bootstrap-servers",
        &bootstrap(),
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--group-id",
        group,
        "--instance-id",
        instance,
        "--log-format",
        "json",
        "--http-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .chain(membership)
    .map(|s| s.to_string())
    .chain(extra)
    .collect()
}

/// `args` without the quick classic session and heartbeat of [`base_args`]: librdkafka's
/// defaults (45 s, 3 s), as exactly ships them.
pub fn with_shipped_session(args: Vec<String>) -> Vec<String> {
    let quick = ["session.timeout.ms=", "heartbeat.interval.ms="];
    let mut out = Vec::with_capacity(args.len());
    let mut args = args.into_iter().peekable();
    while let Some(a) = args.next() {
        if a == "--consumer-config"
            && args
                .peek()
                .is_some_and(|v| quick.iter().any(|k| v.starts_with(k)))
        {
            args.next();
            continue;
        }
        out.push(a);
    }
    out
}

/// The group protocol the tests run exactly with: `EXACTLY_TEST_GROUP_PROTOCOL`, classic by
/// default.
pub fn group_protocol() -> String {
    match std::env::var("EXACTLY_TEST_GROUP_PROTOCOL").as_deref() {
        Ok("consumer") => "consumer".into(),
        Ok("classic") | Err(_) => "classic".into(),
        Ok(other) => panic!("EXACTLY_TEST_GROUP_PROTOCOL={other}: classic or consumer"),
    }
}

impl Exactly {
    pub fn start(args: &[String]) -> Exactly {
        Self::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[String], env: &[(&str, &str)]) -> Exactly {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_exactly"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn exactly");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let name = args
            .iter()
            .position(|a| a == "--instance-id")
            .map(|i| args[i + 1].clone())
            .unwrap_or_default();
        let tag = name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("EXACTLY_TEST_ECHO").is_some() {
                    eprintln!("[{tag}] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Exactly { child, log, name }
    }

    /// The process has exited (a zombie waiting to be reaped counts). Linux only: reads /proc,
    /// because `try_wait` needs `&mut` and the callers only hold `&`.
    pub fn has_exited(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.child.wait().unwrap();
    }

    /// Waits for exit; panics after `timeout`.
    /// SIGTERM, then exit 0 within 15 s (the log in the panic otherwise).
    #[allow(dead_code)]
    pub fn stop_cleanly(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait(Duration::from_secs(15));
        assert_eq!(status.code(), Some(0), "{}", self.log_text());
    }

    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the log reader drain the pipe.
                std::thread::sleep(Duration::from_millis(100));
                return s;
            }
            if Instant::now() >= deadline {
                panic!(
                    "exactly did not exit within {timeout:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn log_text(&self) -> String {
        self.log_lines().join("\n")
    }

    /// JSON log events whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<serde_json::Value> {
        self.log_lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }

    /// The partitions this instance owns after its latest rebalance, as logged.
    pub fn owned(&self) -> Option<String> {
        self.events("assignment now")
            .last()
            .map(|e| e["owned"].as_str().unwrap_or("").to_string())
    }

    /// Waits until `pred` holds for this process's log.
    pub fn wait_log(&self, what: &str, timeout: Duration, pred: impl Fn(&Exactly) -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred(self) {
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exactly {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Number of partitions in a logged assignment like `topic[0,1,2]`.
pub fn count_partitions(owned: &str) -> usize {
    owned
        .split_whitespace()
        .filter_map(|t| t.split_once('['))
        .map(|(_, ps)| {
            ps.trim_end_matches(']')
                .split(',')
                .filter(|p| !p.is_empty())
                .count()
        })
        .sum()
}

/// Runs `exactly audit --json` and returns (exit code, report).
pub fn audit_json(args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .arg("audit")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "audit printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// `exactly audit --json` of `topics` for `group`, with `extra` arguments (the transform).
pub fn audit_of(topics: &Topics, group: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let b = bootstrap();
    let mut args = vec![
        "--bootstrap-servers",
        &b,
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--dlq-topic",
        &topics.dlq,
        "--group-id",
        group,
    ];
    args.extend(extra);
    audit_json(&args)
}

/// Partition numbers in a logged assignment like `topic[0,1,2]`.
pub fn partitions_of(owned: &str) -> Vec<i32> {
    owned
        .split_whitespace()
        .filter_map(|t| t.split_once('['))
        .flat_map(|(_, ps)| {
            ps.trim_end_matches(']')
                .split(',')
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What a finished command printed, stdout then stderr.
pub fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A checker that scripts/tools.sh installs (scripts/test.sh puts it on the PATH).
#[allow(dead_code)]
pub fn tool(name: &str) -> Command {
    let probe = Command::new(name).arg("--version").output();
    assert!(
        probe.is_ok(),
        "{name} not found: run the tests through scripts/test.sh, which installs it"
    );
    Command::new(name)
}

/// The address of a running exactly's HTTP endpoints (started with --http-addr 127.0.0.1:0).
#[allow(dead_code)]
pub fn http_addr(ex: &Exactly) -> String {
    let listening = "HTTP endpoints listening (/metrics /livez /readyz)";
    ex.wait_log("the HTTP endpoints", Duration::from_secs(30), |e| {
        !e.events(listening).is_empty()
    });
    ex.events(listening)[0]["addr"]
        .as_str()
        .unwrap()
        .to_string()
}

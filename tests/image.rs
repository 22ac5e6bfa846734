//! The container image, built from `docker/Dockerfile` and run for real against the test
//! broker: records flow exactly once, the HEALTHCHECK turns healthy, `/readyz` answers, the
//! process runs as uid 10001, `docker stop` (SIGTERM) exits 0 within the grace with its work
//! committed, and the log is JSON.
//!
//! It needs a Docker engine, so plain `cargo test` lists it as ignored; `scripts/test.sh`
//! starts one (`scripts/docker.sh`: no bridge network, base images built locally from Debian
//! packages) and runs it with `--ignored`, or says in one line why it could not. Containers use
//! the host network only and listen on 127.0.0.1.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const IMAGE: &str = "exactly-test:latest";
fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("run the docker client")
}

fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(out.status.success(), "docker {args:?}: {}", said(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `docker build` of the real Dockerfile, with the stand-in base images scripts/docker.sh
/// names (the Dockerfile's own defaults where none are named).
fn build() {
    let repo = repo();
    let mut args = vec![
        "build",
        "--network",
        "host",
        "-f",
        "docker/Dockerfile",
        "-t",
        IMAGE,
    ];
    let bases = [
        ("BUILD_IMAGE", std::env::var("EXACTLY_TEST_BUILD_IMAGE")),
        ("RUNTIME_IMAGE", std::env::var("EXACTLY_TEST_RUNTIME_IMAGE")),
    ];
    let bases: Vec<String> = bases
        .into_iter()
        .filter_map(|(arg, v)| v.ok().map(|v| format!("{arg}={v}")))
        .collect();
    for b in &bases {
        args.extend(["--build-arg", b]);
    }
    args.push(repo.to_str().unwrap());
    let started = Instant::now();
    let out = docker(&args);
    let log = said(&out);
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    assert!(
        out.status.success(),
        "docker build failed:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    eprintln!("image built in {:.0?}", started.elapsed());
}

/// A container, removed (with its log) when dropped.
struct Container(String);

impl Container {
    fn run(name: &str, env: &[(&str, String)]) -> Container {
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut args = vec!["run", "-d", "--name", name, "--network", "host"];
        for e in &env {
            args.extend(["-e", e]);
        }
        args.push(IMAGE);
        docker_ok(&args);
        Container(name.to_string())
    }

    fn inspect(&self, format: &str) -> String {
        docker_ok(&["inspect", "-f", format, &self.0])
    }

    /// stdout and stderr of the container, as docker recorded them.
    fn logs(&self) -> (String, String) {
        let out = docker(&["logs", &self.0]);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&Container) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}; container log:\n{}",
                self.logs().1
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// Outputs expected for the inputs below the group's committed offsets.
fn expected_below(
    topic: &str,
    committed: &BTreeMap<i32, i64>,
) -> std::collections::HashMap<(String, i32, i64, usize), Value> {
    let mut expected = expected_outputs(topic, doubled);
    expected.retain(|(_, p, offset, _), _| committed.get(p).is_some_and(|c| offset < c));
    expected
}

#[test]
#[ignore = "needs a Docker engine: scripts/test.sh starts one and runs this with --ignored"]
fn the_image_runs_exactly_once_healthy_as_uid_10001_and_stops_cleanly() {
    build();
    let size: f64 = docker_ok(&["image", "inspect", "-f", "{{.Size}}", IMAGE])
        .parse()
        .unwrap();
    eprintln!("image size: {:.0} MB", size / 1e6);
    // The README reports the size; it stays within 10 % of the image's.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let stated: f64 = regex::Regex::new(r"The image is \*\*(\d+) MB\*\*")
        .unwrap()
        .captures(&readme)
        .expect("README states the image size")[1]
        .parse()
        .unwrap();
    assert!(
        (stated * 1e6 - size).abs() < size / 10.0,
        "README says {stated} MB, the image is {:.0} MB",
        size / 1e6
    );

    let topics = Topics::create("image", 3, 3);
    let group = unique("image-g");
    produce(&topics.input, &numbered(5_000, 3));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // The image's settings come from the environment, the way a sidecar gets them.
    let env = [
        ("EXACTLY_BOOTSTRAP_SERVERS", bootstrap()),
        ("EXACTLY_INPUT_TOPICS", topics.input.clone()),
        ("EXACTLY_OUTPUT_TOPIC", topics.output.clone()),
        ("EXACTLY_GROUP_ID", group.clone()),
        ("EXACTLY_INSTANCE_ID", "image-0".to_string()),
        ("EXACTLY_JQ", DOUBLE.to_string()),
        ("EXACTLY_HTTP_ADDR", addr.clone()),
        ("EXACTLY_SHUTDOWN_GRACE", "20s".to_string()),
        (
            "EXACTLY_CONSUMER_CONFIG",
            "session.timeout.ms=6000;heartbeat.interval.ms=500".to_string(),
        ),
    ];
    let name = unique("exactly-image");
    let first = Container::run(&name, &env);

    first.wait_for("/readyz 200", Duration::from_secs(60), |_| {
        get(&addr, "/readyz").is_some_and(|(status, _)| status == 200)
    });
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    // The image's HEALTHCHECK (curl to /livez on EXACTLY_HTTP_ADDR's port) turns healthy.
    first.wait_for("the HEALTHCHECK to pass", Duration::from_secs(90), |c| {
        c.inspect("{{.State.Health.Status}}") == "healthy"
    });
    // The process itself (pid 1 of the container), not only the image's USER setting.
    let status = docker_ok(&["exec", &name, "cat", "/proc/1/status"]);
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["10001"; 4],
        "{uids}"
    );

    // `docker stop` while records flow in: SIGTERM commits what was read, and only that.
    let writing = AtomicBool::new(true);
    let (stopped_in, written) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let (writer, mut written) = (Writer::new(), 0);
            while writing.load(Ordering::Relaxed) && written < 200_000 {
                writer.write(&topics.input, &numbered(1_000, 3));
                written += 1_000;
                std::thread::sleep(Duration::from_millis(20));
            }
            written
        });
        wait_committed_at_least(&group, &topics.input, 10_000, Duration::from_secs(60));
        let stopping = Instant::now();
        docker_ok(&["stop", "--time", "30", &name]);
        let stopped_in = stopping.elapsed();
        // The input goes on a little after the stop, so some of it is left for the next one.
        std::thread::sleep(Duration::from_millis(500));
        writing.store(false, Ordering::Relaxed);
        (stopped_in, writer.join().unwrap())
    });
    let total = 5_000 + written as i64;
    assert_eq!(
        first.inspect("{{.State.ExitCode}}"),
        "0",
        "{}",
        first.logs().1
    );
    assert!(
        stopped_in < Duration::from_secs(20),
        "stop took {stopped_in:?}"
    );
    // Committed outputs match the committed offsets exactly: nothing read was left open.
    wait_stable(&topics.output, Duration::from_secs(30));
    let at_stop = committed(&group, &topics.input);
    let outputs = read_all(&topics.output, "read_committed");
    assert_exactly_once(&outputs, &expected_below(&topics.input, &at_stop));
    let at_stop: i64 = at_stop.values().sum();
    assert!(at_stop < total, "the stop came after the end");
    eprintln!(
        "docker stop: exit 0 in {stopped_in:.1?}, {at_stop} of {total} inputs committed with their outputs"
    );

    // The log: JSON lines, on the stream exactly writes its log to (stderr; stdout is for
    // the subcommands' results), ending with a clean shutdown.
    let (stdout, stderr) = first.logs();
    assert!(stdout.is_empty(), "stdout: {stdout}");
    let events: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(events.iter().all(|e| e["level"].is_string()));
    assert!(
        events.iter().any(|e| e["message"] == "exactly stopped"),
        "{stderr}"
    );
    // What was open at SIGTERM committed: an abort would leave the same committed state.
    let aborted = |e: &&Value| {
        let m = e["message"].as_str().unwrap_or("");
        m.contains("aborted")
    };
    assert!(!events.iter().any(|e| aborted(&e)), "{stderr}");

    // A second container finishes the input: everything exactly once overall.
    let second = Container::run(&unique("exactly-image"), &env);
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    docker_ok(&["stop", "--time", "30", &second.0]);
    assert_eq!(second.inspect("{{.State.ExitCode}}"), "0");
    let outputs = read_all(&topics.output, "read_committed");
    let checked = assert_exactly_once(&outputs, &expected_outputs(&topics.input, doubled));
    assert_eq!(checked as i64, total);
    assert_eq!(committed(&group, &topics.input), end_offsets(&topics.input));
}

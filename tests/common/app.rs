//! The call-out's application in the tests: `tests/apps/callee.py`, a real Python process
//! answering like the example (or like the fault suite's jq program), with switches to
//! misbehave, killed and restarted on the same port.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use super::broker::{repo, unique};
use super::http::post;

/// The application process.
pub struct App {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    answers: String,
}

impl App {
    /// Starts the test application on a free port, answering like the example.
    pub fn start(port: Option<u16>) -> App {
        Self::answering("example", port)
    }

    /// Starts it answering like `answers`: `example` (examples/call/app.py) or `faults` (the
    /// fault suite's jq program, output for output).
    pub fn answering(answers: &str, port: Option<u16>) -> App {
        let dir = std::env::temp_dir().join(unique("callee"));
        std::fs::create_dir_all(&dir).unwrap();
        Self::start_in(dir, answers.to_string(), port)
    }

    fn start_in(dir: PathBuf, answers: String, port: Option<u16>) -> App {
        let port_file = dir.join("port");
        let _ = std::fs::remove_file(&port_file);
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("tests/apps/callee.py"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--seen")
            .arg(dir.join("seen"))
            .args(["--answers", &answers]);
        if let Some(p) = port {
            cmd.args(["--port", &p.to_string()]);
        }
        let child = cmd.spawn().expect("python3 runs the test application");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "the test application did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        App {
            child,
            port,
            dir,
            answers,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/process", self.port)
    }

    /// Changes how it answers from now on.
    pub fn set(&self, control: Value) {
        let addr = format!("127.0.0.1:{}", self.port);
        let (status, body) = post(&addr, "/control", &control.to_string()).expect("control");
        assert_eq!(status, 200, "{body}");
    }

    pub fn kill9(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            Signal::SIGKILL,
        )
        .unwrap();
        self.child.wait().unwrap();
    }

    /// Starts it again on the same port (after `kill9`).
    pub fn restart(&mut self) {
        *self = Self::start_in(self.dir.clone(), self.answers.clone(), Some(self.port));
    }

    /// Lineages the application was sent, with repeats.
    pub fn seen(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("seen"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! A real Prometheus (Debian's package) scrapes exactly while records flow, loads the alert
//! rules, and evaluates every dashboard query and every alert expression; and `promtool check
//! metrics` lints what /metrics serves.
//!
//! `scripts/test.sh` installs prometheus and promtool when they are missing.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

/// How the dashboard's Grafana variables are filled in for Prometheus.
const RATE_INTERVAL: &str = "15s";

fn get_text(url: &str) -> String {
    ureq::get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// A Prometheus server on a free loopback port, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: &str, rules: &Path) -> Prometheus {
        let dir = std::env::temp_dir().join(unique("exactly-prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: exactly\n    static_configs:\n      \
                 - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tool("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while ureq::get(format!("{}/-/ready", p.url)).call().is_err() {
            assert!(Instant::now() < deadline, "prometheus never got ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// GET an API path: `data` of a successful answer, or Prometheus's error.
    fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let mut req = ureq::get(format!("{}{path}", self.url))
            .config()
            .http_status_as_error(false)
            .build();
        for (k, v) in params {
            req = req.query(*k, *v);
        }
        let body: Value = serde_json::from_str(
            &req.call()
                .map_err(|e| e.to_string())?
                .body_mut()
                .read_to_string()
                .map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!("{}: {}", body["errorType"], body["error"]))
        }
    }

    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/query", &[("query", expr)])?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The dashboard's variables filled in: every instance, topic and job.
fn fill_in(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$instance", ".*")
        .replace("$topic", ".*")
        .replace("$job", ".*")
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo().join("grafana/dashboards/exactly.json")).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// (panel title, query) of every panel target.
fn panel_queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// Writes bounded batches of input (and one bad record per batch) until `stop`.
fn keep_writing(topic: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let writer = Writer::new();
        let mut written = 0;
        let deadline = Instant::now() + Duration::from_secs(180);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let mut batch: Vec<In> = (written..written + 100)
                .map(|i| In::json(i as i32 % 2, &format!("k{i}"), json!({"id": i})))
                .collect();
            // About 2% of the input: above the dead-letter alert's 1%.
            batch.push(In::raw(0, "bad", b"not json"));
            batch.push(In::raw(1, "bad", b"not json either"));
            writer.write(&topic, &batch);
            written += batch.len();
            std::thread::sleep(Duration::from_millis(200));
        }
        written
    })
}

#[test]
fn prometheus_evaluates_every_panel_and_alert_while_records_flow() {
    let topics = Topics::create("prom", 2, 2);
    let group = unique("prom-g");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = keep_writing(topics.input.clone(), stop.clone());
    let mut args = base_args(&topics, &group, "prom-0");
    // Aborts now and then, so the abort panels have something to show.
    args.extend(
        [
            "--jq",
            "{id, doubled: (.id * 2)}",
            "--lag-interval",
            "500ms",
            "--test-abort-every",
            "7",
        ]
        .map(String::from),
    );
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    let rules = repo().join("grafana/prometheus/exactly-alerts.yaml");
    let prom = Prometheus::start(&addr, &rules);

    // Enough scrapes for a rate over RATE_INTERVAL, and records through every path.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let scrapes = prom
            .query("count_over_time(up{job=\"exactly\"}[1m])")
            .unwrap();
        let n = scrapes
            .first()
            .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let aborted = prom
            .query("exactly_transactions_total{outcome=\"aborted\"} > 0")
            .unwrap();
        if n >= 25.0 && !aborted.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} scrapes, aborted {aborted:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }

    let dash = dashboard();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (title, expr) in panel_queries(&dash) {
        match prom.query(&fill_in(&expr)) {
            Ok(r) if !r.is_empty() => {
                report.push(format!("ok    {title}: {expr} -> {} series", r.len()))
            }
            Ok(_) => failures.push(format!("empty {title}: {expr}")),
            Err(e) => failures.push(format!("error {title}: {expr}: {e}")),
        }
    }
    // The variables' label_values(metric, label) queries, as Grafana runs them.
    for v in dash["templating"]["list"].as_array().unwrap() {
        let Some(q) = v["query"]["query"].as_str() else {
            continue;
        };
        let (metric, label) = q
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(", "))
            .unwrap_or_else(|| panic!("variable query {q}"));
        let metric = fill_in(metric);
        match prom.api(
            &format!("/api/v1/label/{label}/values"),
            &[("match[]", &metric)],
        ) {
            Ok(values) if values.as_array().is_some_and(|a| !a.is_empty()) => {
                report.push(format!("ok    variable {}: {values}", v["name"]))
            }
            other => failures.push(format!("variable {}: {q}: {other:?}", v["name"])),
        }
    }

    // Every rule loaded, evaluated without error, and its expression parses on its own.
    let groups = prom.api("/api/v1/rules", &[]).unwrap()["groups"].clone();
    let rules: Vec<Value> = groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    let in_file = std::fs::read_to_string(repo().join("grafana/prometheus/exactly-alerts.yaml"))
        .unwrap()
        .matches("- alert: ")
        .count();
    assert_eq!(rules.len(), in_file, "{groups:#}");
    let deadline = Instant::now() + Duration::from_secs(30);
    for rule in &rules {
        let name = rule["name"].as_str().unwrap();
        // Rules evaluate every second; wait for each one's first evaluation.
        let health = loop {
            let groups = prom.api("/api/v1/rules", &[]).unwrap()["groups"].clone();
            let health = groups[0]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .map(|r| (r["health"].clone(), r["lastError"].clone()))
                .unwrap();
            if health.0 != "unknown" || Instant::now() > deadline {
                break health;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        // What this run injects (every 7th transaction aborted, 2% not JSON) must show;
        // what it does not inject must not.
        let expected = match name {
            "ExactlyAbortRateHigh" | "ExactlyDeadLettersHigh" => Some(true),
            "ExactlyInstanceDown"
            | "ExactlyNotReady"
            | "ExactlyCommitsStalled"
            | "ExactlyHangingTransaction"
            | "ExactlyLagGrowing" => Some(false),
            _ => None,
        };
        match (
            health.0.as_str(),
            prom.query(rule["query"].as_str().unwrap()),
        ) {
            (Some("ok"), Ok(r)) if expected.is_none_or(|shows| shows != r.is_empty()) => report
                .push(format!(
                    "ok    alert {name}: evaluates; condition true for {} series now",
                    r.len()
                )),
            (h, q) => failures.push(format!(
                "alert {name}: health {h:?} {health:?}, expected condition {expected:?}, {q:?}"
            )),
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
    assert!(written > 0);
}

#[test]
fn promtool_accepts_what_metrics_serves() {
    let topics = Topics::create("promtool", 1, 1);
    let group = unique("promtool-g");
    produce(&topics.input, &numbered(200, 1));
    produce(&topics.input, &[In::raw(0, "bad", b"not json")]);
    let mut args = base_args(&topics, &group, "promtool-0");
    args.extend(["--jq", ".", "--lag-interval", "200ms"].map(String::from));
    let mut ex = Exactly::start(&args);
    let addr = http_addr(&ex);
    wait_all_committed(&group, &topics.input, Duration::from_secs(60));
    // Every family present, the lag gauges included.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = get_text(&format!("http://{addr}/metrics"));
        if text.contains("exactly_consumer_lag_records{") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for family in &metric_families() {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    let mut promtool = tool("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = said(&out);
    assert!(out.status.success(), "promtool check metrics: {said}");
    assert!(said.trim().is_empty(), "promtool check metrics: {said}");
    ex.signal(Signal::SIGTERM);
    assert_eq!(ex.wait(Duration::from_secs(15)).code(), Some(0));
}

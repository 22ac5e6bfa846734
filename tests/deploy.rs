//! What ships for operators, checked by the tools that consume it: the alert rules by
//! promtool (syntax and unit tests), the Dockerfile by hadolint, the compose file by
//! `docker compose config`, the dashboard and provisioning by their shape, the Kubernetes
//! example by its probes and grace. The image itself is built and run in `tests/image.rs`; a
//! real Prometheus evaluates the queries in `tests/prometheus.rs`.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde::Deserialize;
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every YAML document of a file, as JSON values.
fn yaml(path: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(&read(path))
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = repo().join("grafana/prometheus");
    let out = tool("promtool")
        .current_dir(&dir)
        .args(["check", "rules", "exactly-alerts.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let rules = yaml("grafana/prometheus/exactly-alerts.yaml");
    let count = rules[0]["groups"][0]["rules"].as_array().unwrap().len();
    assert!(
        said(&out).contains(&format!("SUCCESS: {count} rules found")),
        "{}",
        said(&out)
    );
    let out = tool("promtool")
        .current_dir(&dir)
        .args(["test", "rules", "exactly-alerts.test.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    // Every alert has a unit test.
    let tests = read("grafana/prometheus/exactly-alerts.test.yaml");
    for rule in rules[0]["groups"][0]["rules"].as_array().unwrap() {
        let name = rule["alert"].as_str().unwrap();
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{name} has no test"
        );
    }
    // The compose file's Prometheus configuration, with the rules at their path here.
    let config = read("grafana/prometheus/prometheus.yaml").replace(
        "/etc/prometheus/exactly-alerts.yaml",
        &dir.join("exactly-alerts.yaml").display().to_string(),
    );
    let tmp = std::env::temp_dir().join(unique("exactly-prometheus-config.yaml"));
    std::fs::write(&tmp, config).unwrap();
    let out = tool("promtool")
        .args(["check", "config"])
        .arg(&tmp)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&tmp);
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let out = tool("hadolint")
        .arg(repo().join("docker/Dockerfile"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).trim().is_empty(), "{}", said(&out));
    let dockerfile = read("docker/Dockerfile");
    for needed in [
        "USER 10001",
        "HEALTHCHECK",
        "/livez",
        "AS build",
        "COPY --from=build",
    ] {
        assert!(dockerfile.contains(needed), "Dockerfile lacks {needed}");
    }
}

#[test]
fn the_compose_file_validates() {
    let out = tool("docker")
        .args(["compose", "-f"])
        .arg(repo().join("docker/compose.yaml"))
        .args(["config", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    let services = &config["services"];
    let names: BTreeSet<&str> = services
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "app",
            "exactly",
            "exactly-call",
            "grafana",
            "kafka",
            "producer",
            "prometheus",
            "topics"
        ])
    );
    // The call-out's exactly is the application's sidecar: one network, calls on loopback.
    let call = &services["exactly-call"];
    assert_eq!(call["network_mode"], "service:app");
    assert!(
        call["environment"]["EXACTLY_CALL_URL"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    let kafka = &services["kafka"]["environment"];
    assert_eq!(kafka["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"], "1");
    assert_eq!(kafka["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"], "1");
    assert_eq!(kafka["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"], "1");
    let exactly = &services["exactly"];
    assert_eq!(
        exactly["environment"]["EXACTLY_BOOTSTRAP_SERVERS"],
        "kafka:9092"
    );
    // Every published port is on loopback only.
    for (name, s) in services.as_object().unwrap() {
        for p in s["ports"].as_array().into_iter().flatten() {
            assert_eq!(p["host_ip"], "127.0.0.1", "{name}: {p}");
        }
    }
    // The mounted files exist where the services expect them.
    for (service, file) in [
        ("prometheus", "grafana/prometheus/prometheus.yaml"),
        ("prometheus", "grafana/prometheus/exactly-alerts.yaml"),
        ("grafana", "grafana/provisioning"),
        ("grafana", "grafana/dashboards"),
        ("app", "examples/call"),
    ] {
        let sources: Vec<&str> = services[service]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["source"].as_str())
            .collect();
        let path = repo().join(file);
        assert!(path.exists(), "{file}");
        assert!(
            sources
                .iter()
                .any(|s| std::path::Path::new(s) == path.as_path()),
            "{service} does not mount {file}: {sources:?}"
        );
    }
}

#[test]
fn the_dashboard_can_be_provisioned_and_covers_every_metric() {
    let text = read("grafana/dashboards/exactly.json");
    // Import placeholders break file provisioning.
    assert!(!text.contains("${DS_"), "an import placeholder is left");
    let dash: Value = serde_json::from_str(&text).unwrap();
    let vars = dash["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    assert_eq!(var("datasource").unwrap()["type"], "datasource");
    assert_eq!(var("datasource").unwrap()["query"], "prometheus");
    assert!(var("instance").is_some() && var("topic").is_some());

    let mut ids = BTreeSet::new();
    let mut queries = String::new();
    for p in dash["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id {p}");
        let pos = &p["gridPos"];
        assert!(pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24);
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            let expr = t["expr"].as_str().unwrap();
            if expr.contains("exactly_") {
                assert!(expr.contains("$instance"), "{expr} ignores $instance");
            }
            queries.push_str(expr);
            queries.push('\n');
        }
    }
    let titles: Vec<&str> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for needed in [
        "Records in",
        "Records out",
        "Lag per partition",
        "Commit latency",
        "Aborts by reason",
        "Dead-letter rate",
        "End-to-end latency",
        "Open transaction age",
        "Unstable records per partition",
        "Rebalances",
        "Producer recreations",
        "Instances up",
        "Instances ready",
    ] {
        assert!(titles.contains(&needed), "no panel {needed}");
    }
    // Every metric is on the dashboard or watched by an alert.
    let alerts = read("grafana/prometheus/exactly-alerts.yaml");
    for family in &metric_families() {
        assert!(
            queries.contains(family) || alerts.contains(family),
            "{family} is neither on the dashboard nor in an alert"
        );
    }

    // The provisioning files point at the datasource uid and the folder compose mounts.
    let ds = &yaml("grafana/provisioning/datasources/prometheus.yaml")[0]["datasources"][0];
    assert_eq!(ds["type"], "prometheus");
    let provider = &yaml("grafana/provisioning/dashboards/exactly.yaml")[0]["providers"][0];
    assert_eq!(provider["options"]["path"], "/var/lib/grafana/dashboards");
    assert!(read("docker/compose.yaml").contains(":/var/lib/grafana/dashboards:ro"));
}

#[test]
fn the_kubernetes_examples_probe_and_wait_for_the_shutdown() {
    for path in [
        "docker/kubernetes/exactly-sidecar.yaml",
        "docker/kubernetes/exactly-call.yaml",
    ] {
        check_kubernetes_example(path);
    }
    // The call-out example calls the application in its own Pod.
    let docs = yaml("docker/kubernetes/exactly-call.yaml");
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let url = config["data"]["EXACTLY_CALL_URL"].as_str().unwrap();
    assert!(url.starts_with("http://127.0.0.1:8080/"), "{url}");
}

#[test]
fn the_sidecar_example_reads_its_credentials_from_a_mounted_secret() {
    let docs = yaml("docker/kubernetes/exactly-sidecar.yaml");
    let secret = docs.iter().find(|d| d["kind"] == "Secret").unwrap();
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == secret["metadata"]["name"])
        .expect("a volume of the Secret");
    let sidecar = &spec["initContainers"][0];
    let mount = sidecar["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the sidecar mounts it");
    assert_eq!(mount["readOnly"], true);
    // The file exactly reads is a key of the Secret, under the mount.
    let file = config["data"]["EXACTLY_KAFKA_CONFIG_FILE"]
        .as_str()
        .unwrap();
    let dir = mount["mountPath"].as_str().unwrap();
    let name = file
        .strip_prefix(&format!("{dir}/"))
        .expect("under the mount");
    let properties = secret["stringData"][name]
        .as_str()
        .expect("a key of the Secret");
    // Only the Secret holds the password: not the ConfigMap, not the container's env.
    assert!(properties.contains("sasl.password="));
    let elsewhere = format!("{config}{sidecar}");
    assert!(!elsewhere.contains("sasl.password"), "{elsewhere}");
    // Every path the properties name is in the mount too.
    for line in properties.lines().filter(|l| l.contains(".location=")) {
        let path = line.split_once('=').unwrap().1;
        let key = path
            .strip_prefix(&format!("{dir}/"))
            .expect("under the mount");
        assert!(
            secret["stringData"][key].is_string(),
            "{key} is not in the Secret"
        );
    }
}

fn check_kubernetes_example(path: &str) {
    let docs = yaml(path);
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let sidecar = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "exactly")
        .unwrap();
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(
        sidecar["envFrom"][0]["configMapRef"]["name"],
        config["metadata"]["name"]
    );
    // Every setting is an option exactly knows.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for key in config["data"].as_object().unwrap().keys() {
        assert!(
            help.contains(&format!("[env: {key}=")),
            "{key} is not an option"
        );
    }
    // The grace period covers exactly's shutdown grace.
    let grace = config["data"]["EXACTLY_SHUTDOWN_GRACE"].as_str().unwrap();
    let grace = humantime::parse_duration(grace).unwrap().as_secs();
    let pod_grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        pod_grace > grace + 5,
        "{pod_grace} s does not cover {grace} s"
    );
}

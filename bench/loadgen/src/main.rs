//! The benchmark's own tool (see bench/README.md): preload input, generate open-loop load,
//! check the output's latency and sequence, and time a drain through the consumer group's
//! committed offsets while reading the system under test's CPU and memory from /proc.
//!
//! Every command prints one JSON object on stdout.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;

#[derive(Parser)]
struct Cli {
    /// Kafka bootstrap servers.
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write `count` JSON records of about `size` bytes, as fast as the broker takes them.
    Preload {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        size: usize,
        /// Kafka Connect's JSON with its schema, `{"schema": …, "payload": {seq, ts, us,
        /// name, amount}}`, the payload about `size` bytes (a sink connector needs the schema).
        #[arg(long)]
        connect_schema: bool,
    },
    /// Write `count` app start-up events of about `size` bytes (the seed's daily active users),
    /// keyed by device, `devices` devices over `days` days in time order, from midnight UTC
    /// `days` days ago (recent: older records are the broker's to delete by retention).
    Startups {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        devices: u64,
        #[arg(long, default_value_t = 3)]
        days: u64,
        #[arg(long, default_value_t = 200)]
        size: usize,
    },
    /// Write one start-up event to each of `partitions` partitions, stamped now: a stateful
    /// pipeline restores a partition's state at its first record, so a restart's restores
    /// are timed from records already waiting.
    Touch {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partitions: i32,
    },
    /// Write records at `rate` per second for `seconds`, open loop (the schedule never waits
    /// for the system under test).
    Generate {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: u64,
        #[arg(long, default_value_t = 100)]
        size: usize,
    },
    /// Read the output (read_committed) until `idle` passes without a record; report the
    /// latency of records sent after the warm-up, and gaps and duplicates of `seq`.
    Check {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        warmup_seconds: u64,
        #[arg(long, default_value_t = 10)]
        idle_seconds: u64,
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
        /// Start at the output's end as it is now (its high watermarks, read before the first
        /// poll), not its beginning: for a topic written before, by an earlier load.
        #[arg(long)]
        from_end: bool,
        /// A file created once the start offsets are set, for a load to wait on.
        #[arg(long)]
        ready_file: Option<std::path::PathBuf>,
    },
    /// Answer exactly's call-out (`--call-url http://127.0.0.1:PORT/`) as a passthrough
    /// application that takes `delay_ms` per call; prints {"port": N} once listening.
    Serve {
        #[arg(long, default_value_t = 0)]
        port: u16,
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
    /// Wait until `group` has committed the end of `topic` (several: comma-separated); time it
    /// from the first commit (steady: the process's start and group join excluded) and from
    /// this command's start (whole: started right after the system under test), and read the
    /// CPU time and peak RSS of `pid` at the first commit and at the end.
    Drain {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 900)]
        timeout_seconds: u64,
    },
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// `{"seq":…,"ts":<ms>,"us":<µs>,"user":…,"amount":…,"drop":"…"}`, padded to about `size`.
fn record(seq: u64, size: usize) -> Vec<u8> {
    let us = now_us();
    let head = format!(
        r#"{{"seq":{seq},"ts":{},"us":{us},"user":"u{}","amount":{}.{:02},"drop":""#,
        us / 1000,
        seq % 1000,
        seq % 500,
        seq % 100
    );
    let pad = size.saturating_sub(head.len() + 2).max(1);
    let mut v = Vec::with_capacity(head.len() + pad + 2);
    v.extend_from_slice(head.as_bytes());
    v.extend(std::iter::repeat_n(b'x', pad));
    v.extend_from_slice(b"\"}");
    v
}

fn producer(bootstrap: &str) -> ThreadedProducer<rdkafka::producer::DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.size", "262144")
        .set("compression.type", "none")
        .set("queue.buffering.max.kbytes", "262144")
        .create()
        .expect("producer")
}

fn send(
    p: &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    seq: u64,
    value: &[u8],
) {
    let key = format!("k{seq}");
    let mut rec = BaseRecord::to(topic).key(key.as_bytes()).payload(value);
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => panic!("produce: {e}"),
        }
    }
}

fn preload(bootstrap: &str, topic: &str, count: u64, size: usize, connect_schema: bool) {
    let p = producer(bootstrap);
    let make = |seq| {
        if connect_schema {
            with_schema(seq, size)
        } else {
            record(seq, size)
        }
    };
    let started = Instant::now();
    for seq in 0..count {
        send(&p, topic, seq, &make(seq));
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"records": count, "bytes_per_record": make(0).len(), "seconds": secs})
    );
}

/// Kafka Connect's JSON with schema: five fields, the payload padded to about `size` bytes in
/// `name`.
fn with_schema(seq: u64, size: usize) -> Vec<u8> {
    let us = now_us();
    let field = |name: &str, kind: &str, optional: bool| json!({"field": name, "type": kind, "optional": optional});
    let schema = json!({
        "type": "struct", "name": "bench.Row", "optional": false,
        "fields": [
            field("seq", "int64", false), field("ts", "int64", true), field("us", "int64", true),
            field("name", "string", true), field("amount", "double", true),
        ],
    });
    let mut payload = json!({
        "seq": seq, "ts": us / 1000, "us": us, "name": format!("u{}", seq % 1000),
        "amount": (seq % 50_000) as f64 / 100.0,
    });
    let pad = size.saturating_sub(payload.to_string().len());
    payload["name"] = format!("u{}-{}", seq % 1000, "x".repeat(pad)).into();
    serde_json::to_vec(&json!({"schema": schema, "payload": payload})).expect("json")
}

fn startups(bootstrap: &str, topic: &str, count: u64, devices: u64, days: u64, size: usize) {
    const DAY: u64 = 86_400_000;
    let start = (now_us() / 1000 / DAY - days) * DAY;
    let p = producer(bootstrap);
    let started = Instant::now();
    let span = days * 86_400_000;
    let mut bytes = 0;
    for seq in 0..count {
        // A device per record, spread (a multiplier coprime with most counts), in time order.
        let device = seq.wrapping_mul(2_654_435_761) % devices;
        let ts = start + seq * span / count;
        let head = format!(
            r#"{{"device_id":"dev-{device}","ts":{ts},"event":"app_start","app":"4.2.{}","os":"android","pad":""#,
            seq % 7
        );
        let pad = size.saturating_sub(head.len() + 2).max(1);
        let mut v = Vec::with_capacity(size);
        v.extend_from_slice(head.as_bytes());
        v.extend(std::iter::repeat_n(b'x', pad));
        v.extend_from_slice(b"\"}");
        bytes = v.len();
        let key = format!("dev-{device}");
        let mut rec = BaseRecord::to(topic)
            .key(key.as_bytes())
            .payload(&v)
            .timestamp(ts as i64);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"records": count, "devices": devices, "days": days, "bytes_per_record": bytes, "seconds": secs})
    );
}

fn touch(bootstrap: &str, topic: &str, partitions: i32) {
    let p = producer(bootstrap);
    let ts = (now_us() / 1000) as i64;
    let value = format!(r#"{{"device_id":"dev-restart","ts":{ts},"event":"app_start"}}"#);
    for partition in 0..partitions {
        let rec = BaseRecord::to(topic)
            .partition(partition)
            .key("dev-restart")
            .payload(&value)
            .timestamp(ts);
        p.send(rec).map_err(|(e, _)| e).expect("produce");
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    println!("{}", json!({"records": partitions}));
}

fn generate(bootstrap: &str, topic: &str, rate: u64, seconds: u64, size: usize) {
    let p = producer(bootstrap);
    let started = Instant::now();
    let end = Duration::from_secs(seconds);
    let mut sent = 0u64;
    let mut behind_max = 0u64;
    loop {
        let elapsed = started.elapsed();
        if elapsed >= end {
            break;
        }
        // Open loop: the schedule says how many records should be out by now.
        let due = (elapsed.as_secs_f64() * rate as f64) as u64;
        behind_max = behind_max.max(due.saturating_sub(sent));
        while sent < due {
            send(&p, topic, sent, &record(sent, size));
            sent += 1;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    println!(
        "{}",
        json!({"sent": sent, "seconds": seconds, "rate": rate, "max_behind_schedule": behind_max})
    );
}

fn consumer(bootstrap: &str, isolation: &str, group: Option<&str>) -> BaseConsumer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("group.id", group.unwrap_or("loadgen-reader"));
    c.create().expect("consumer")
}

fn partitions(c: &BaseConsumer, topic: &str) -> Vec<i32> {
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    md.topics()[0].partitions().iter().map(|p| p.id()).collect()
}

fn check(
    bootstrap: &str,
    topic: &str,
    warmup: u64,
    idle: u64,
    timeout: u64,
    from_end: bool,
    ready: Option<&std::path::Path>,
) {
    let c = consumer(bootstrap, "read_committed", None);
    let mut tpl = TopicPartitionList::new();
    for p in partitions(&c, topic) {
        let start = if from_end {
            let (_, high) = c
                .fetch_watermarks(topic, p, Duration::from_secs(30))
                .expect("watermarks");
            Offset::Offset(high)
        } else {
            Offset::Beginning
        };
        tpl.add_partition_offset(topic, p, start).unwrap();
    }
    c.assign(&tpl).unwrap();
    if let Some(ready) = ready {
        std::fs::write(ready, b"").expect("the ready file");
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
    let mut seen: Vec<u8> = Vec::new();
    let (mut first_us, mut records, mut duplicates) = (None::<u64>, 0u64, 0u64);
    let started = Instant::now();
    let mut last = Instant::now();
    while last.elapsed() < Duration::from_secs(idle)
        && started.elapsed() < Duration::from_secs(timeout)
    {
        let Some(m) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.expect("consume");
        let now = now_us();
        last = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())
            .expect("output is the input's JSON");
        let (seq, us) = (v["seq"].as_u64().unwrap(), v["us"].as_u64().unwrap());
        records += 1;
        let i = seq as usize;
        if i >= seen.len() {
            seen.resize(i + 1, 0);
        }
        if seen[i] > 0 {
            duplicates += 1;
        }
        seen[i] = seen[i].saturating_add(1);
        let t0 = *first_us.get_or_insert(us);
        if us >= t0 + warmup * 1_000_000 {
            hist.saturating_record(now.saturating_sub(us).max(1));
        }
    }
    let missing = seen.iter().filter(|n| **n == 0).count();
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        json!({
            "records": records, "distinct": seen.len() - missing, "max_seq": seen.len() as i64 - 1,
            "duplicates": duplicates, "missing_below_max": missing,
            "measured": hist.len(), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "p999_ms": ms(0.999),
            "max_ms": hist.max() as f64 / 1000.0,
        })
    );
}

/// utime + stime of `pid`, in seconds, and its peak RSS in kB.
fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // CLK_TCK is 100 on Linux.
    Some((ticks as f64 / 100.0, hwm))
}

fn drain(bootstrap: &str, topics: &str, group: &str, pid: u32, timeout: u64) {
    let launched = Instant::now();
    let watcher = consumer(bootstrap, "read_uncommitted", None);
    let mut end = 0;
    let mut tpl = TopicPartitionList::new();
    for topic in topics.split(',') {
        for p in partitions(&watcher, topic) {
            let (_, high) = watcher
                .fetch_watermarks(topic, p, Duration::from_secs(30))
                .expect("watermarks");
            end += high;
            tpl.add_partition(topic, p);
        }
    }
    // Not a member: only reads the group's committed offsets (read_uncommitted, so a dead
    // producer's pending offsets never block the query).
    let group_reader = consumer(bootstrap, "read_uncommitted", Some(group));
    let started = Instant::now();
    let mut first: Option<(Instant, i64, (f64, u64))> = None;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(timeout),
            "drain of {group} timed out"
        );
        let committed: i64 =
            match group_reader.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
                Ok(c) => c
                    .elements()
                    .iter()
                    .map(|e| match e.offset() {
                        Offset::Offset(o) => o,
                        _ => 0,
                    })
                    .sum(),
                Err(_) => 0,
            };
        let now = Instant::now();
        if committed > 0 && first.is_none() {
            first = Some((now, committed, usage(pid).unwrap_or_default()));
        }
        if committed >= end {
            let (t0, c0, (cpu0, _)) = first.unwrap();
            let (cpu1, hwm) = usage(pid).unwrap_or_default();
            let secs = now.duration_since(t0).as_secs_f64().max(0.001);
            let whole = now.duration_since(launched).as_secs_f64().max(0.001);
            let records = (end - c0).max(1);
            println!(
                "{}",
                json!({
                    "records": end, "timed_records": records, "seconds": secs,
                    "records_per_second": records as f64 / secs,
                    "cpu_seconds": cpu1 - cpu0,
                    "cpu_seconds_per_million": (cpu1 - cpu0) * 1e6 / records as f64,
                    "peak_rss_kb": hwm,
                    "whole_seconds": whole,
                    "whole_records_per_second": end as f64 / whole,
                    "whole_cpu_seconds_per_million": cpu1 * 1e6 / end.max(1) as f64,
                })
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The call-out's answer for a request body: every record written on unchanged. The values
/// are copied through as raw JSON text, with no tree built, so the application costs the
/// benchmark as little CPU as a well-written one would and the numbers stay exactly's.
fn passthrough_answer(body: &[u8]) -> Option<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        records: Vec<Record<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Record<'a> {
        #[serde(borrow)]
        value: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        value_encoding: std::borrow::Cow<'a, str>,
    }
    let req: Request<'_> = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(b"{\"results\":[");
    for (i, r) in req.records.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let field: &[u8] = if r.value_encoding == "base64" {
            b"{\"outputs\":[{\"value_base64\":"
        } else {
            b"{\"outputs\":[{\"value\":"
        };
        out.extend_from_slice(field);
        out.extend_from_slice(r.value.map_or("null", |v| v.get()).as_bytes());
        out.extend_from_slice(b"}]}");
    }
    out.extend_from_slice(b"]}");
    Some(out)
}

fn serve(port: u16, delay_ms: u64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let app = axum::Router::new().fallback(axum::routing::post(
            move |body: axum::body::Bytes| async move {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                match passthrough_answer(&body) {
                    Some(out) => (axum::http::StatusCode::OK, out),
                    None => (axum::http::StatusCode::BAD_REQUEST, b"bad request".to_vec()),
                }
            },
        ));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        println!("{}", json!({ "port": port }));
        axum::serve(listener, app).await.expect("serve");
    });
}

fn main() {
    let cli = Cli::parse();
    let b = &cli.bootstrap;
    match cli.command {
        Cmd::Preload {
            topic,
            count,
            size,
            connect_schema,
        } => preload(b, &topic, count, size, connect_schema),
        Cmd::Startups {
            topic,
            count,
            devices,
            days,
            size,
        } => startups(b, &topic, count, devices, days, size),
        Cmd::Generate {
            topic,
            rate,
            seconds,
            size,
        } => generate(b, &topic, rate, seconds, size),
        Cmd::Check {
            topic,
            warmup_seconds,
            idle_seconds,
            timeout_seconds,
            from_end,
            ready_file,
        } => check(
            b,
            &topic,
            warmup_seconds,
            idle_seconds,
            timeout_seconds,
            from_end,
            ready_file.as_deref(),
        ),
        Cmd::Drain {
            topic,
            group,
            pid,
            timeout_seconds,
        } => drain(b, &topic, &group, pid, timeout_seconds),
        Cmd::Serve { port, delay_ms } => serve(port, delay_ms),
        Cmd::Touch { topic, partitions } => touch(b, &topic, partitions),
    }
}

#[cfg(test)]
mod tests {
    use super::passthrough_answer;

    #[test]
    fn the_application_answers_each_record_with_its_value() {
        let body = br#"{"records":[
            {"lineage":"t/0/1","value":{"a":[1,"x\""]},"value_encoding":"json","headers":[]},
            {"lineage":"t/0/2","value":"AAE=","value_encoding":"base64"},
            {"lineage":"t/0/3","value":null,"value_encoding":"null"}]}"#;
        let answer = passthrough_answer(body).expect("an answer");
        let answer: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
        assert_eq!(
            answer,
            serde_json::json!({"results": [
                {"outputs": [{"value": {"a": [1, "x\""]}}]},
                {"outputs": [{"value_base64": "AAE="}]},
                {"outputs": [{"value": null}]},
            ]})
        );
        assert!(passthrough_answer(b"{\"records\": 1}").is_none());
    }
}

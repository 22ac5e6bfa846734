//! The auditor is itself tested: fabricated histories, written to real topics without
//! transactions, each with one planted fault, must be caught; a clean one must pass.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use serde_json::Value;

const PROGRAM: &str = ".n * 10";

/// 20 inputs `{"n": i}` on 2 partitions (even i on 0, odd on 1), and input 20 on partition 0
/// that is not JSON.
fn write_inputs(topic: &str) {
    let mut inputs: Vec<In> = (0..20)
        .map(|i| In::json(i % 2, &format!("k{i}"), serde_json::json!({"n": i})))
        .collect();
    inputs.push(In::raw(0, "bad", b"oops"));
    produce(topic, &inputs);
}

/// What a correct pipeline writes: for input i (partition i%2, offset i/2) the value `i*10`
/// keyed like the input, in input order on output partition i%2; the bad record in the DLQ.
fn clean_outputs(input: &str) -> (Vec<In>, Vec<In>) {
    let outputs = (0..20)
        .map(|i| {
            let mut r = In::raw(i % 2, &format!("k{i}"), format!("{}", i * 10).as_bytes());
            r.headers.push((
                LINEAGE.into(),
                format!("{input}/{}/{}/0", i % 2, i / 2).into_bytes(),
            ));
            r
        })
        .collect();
    let mut bad = In::raw(0, "bad", b"oops");
    bad.headers
        .push((LINEAGE.into(), format!("{input}/0/10/0").into_bytes()));
    (outputs, vec![bad])
}

fn audit(topics: &Topics, extra: &[&str]) -> (i32, Value) {
    let b = bootstrap();
    let mut args = vec![
        "--bootstrap-servers",
        &b,
        "--input-topics",
        &topics.input,
        "--output-topic",
        &topics.output,
        "--jq",
        PROGRAM,
        "--timeout",
        "10s",
    ];
    args.extend_from_slice(extra);
    audit_json(&args)
}

/// Writes a fabricated history after `plant` changed the outputs, and audits it.
fn audit_planted(name: &str, plant: impl FnOnce(&mut Vec<In>, &mut Vec<In>)) -> (i32, Value) {
    let topics = Topics::create(name, 2, 2);
    write_inputs(&topics.input);
    let (mut outputs, mut dlq) = clean_outputs(&topics.input);
    plant(&mut outputs, &mut dlq);
    produce(&topics.output, &outputs);
    produce(&topics.dlq, &dlq);
    audit(&topics, &[])
}

fn count(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {r}"))
}

#[test]
fn a_clean_history_passes() {
    let (code, r) = audit_planted("aud-clean", |_, _| {});
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(count(&r, "inputs"), 21);
    assert_eq!(count(&r, "outputs"), 20);
    assert_eq!(count(&r, "dlq"), 1);
    for f in [
        "lost",
        "duplicated",
        "unexpected",
        "in_output_and_dlq",
        "order_violations",
    ] {
        assert_eq!(count(&r, f), 0, "{f}");
    }
}

#[test]
fn a_planted_duplicate_is_caught() {
    let (code, r) = audit_planted("aud-dup", |outs, _| {
        let copy = In {
            headers: outs[6].headers.clone(),
            ..In::raw(0, "k6", b"60")
        };
        outs.push(copy);
    });
    assert_eq!(code, 1);
    assert_eq!(count(&r, "duplicated"), 1, "{r:#}");
}

#[test]
fn a_planted_loss_is_caught() {
    let (code, r) = audit_planted("aud-loss", |outs, _| {
        outs.remove(7);
    });
    assert_eq!(code, 1);
    assert_eq!(count(&r, "lost"), 1, "{r:#}");
}

#[test]
fn a_planted_reorder_is_caught() {
    let (code, r) = audit_planted("aud-order", |outs, _| outs.swap(2, 4));
    assert_eq!(code, 1);
    assert_eq!(count(&r, "order_violations"), 1, "{r:#}");
    assert_eq!(
        count(&r, "lost") + count(&r, "duplicated") + count(&r, "unexpected"),
        0
    );
}

#[test]
fn a_wrong_transform_result_is_caught() {
    let (code, r) = audit_planted("aud-wrong", |outs, _| {
        outs[5].value = Some(b"51".to_vec());
    });
    assert_eq!(code, 1);
    assert_eq!(count(&r, "unexpected"), 1, "{r:#}");
}

#[test]
fn an_output_also_in_the_dlq_is_caught() {
    let (code, r) = audit_planted("aud-both", |outs, dlq| {
        dlq.push(In {
            headers: outs[3].headers.clone(),
            ..In::raw(0, "k3", b"{\"n\":3}")
        });
    });
    assert_eq!(code, 1);
    assert_eq!(count(&r, "in_output_and_dlq"), 1, "{r:#}");
}

#[test]
fn a_bounded_range_judges_only_its_records() {
    let topics = Topics::create("aud-range", 2, 2);
    write_inputs(&topics.input);
    let (mut outputs, dlq) = clean_outputs(&topics.input);
    // Lose input 18 (partition 0, offset 9): outside the range below, so not judged.
    outputs.remove(18);
    produce(&topics.output, &outputs);
    produce(&topics.dlq, &dlq);
    let (code, r) = audit(
        &topics,
        &["--from-offsets", "0=2,1=2", "--to-offsets", "0=8,1=8"],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(count(&r, "inputs"), 12);
    let (code, r) = audit(&topics, &[]);
    assert_eq!(code, 1);
    assert_eq!(count(&r, "lost"), 1);
}

#[test]
fn aborted_records_are_counted_and_a_hanging_transaction_is_flagged() {
    let topics = Topics::create("aud-txn", 2, 2);
    write_inputs(&topics.input);
    let (outputs, dlq) = clean_outputs(&topics.input);
    produce(&topics.output, &outputs);
    produce(&topics.dlq, &dlq);

    let p: ThreadedProducer<_> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("aud-txn"))
        .create()
        .unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    // An aborted transaction with three copies of outputs: invisible, counted as aborted.
    p.begin_transaction().unwrap();
    for o in &outputs[..3] {
        let h = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: LINEAGE,
            value: Some(&o.headers[0].1),
        });
        p.send(
            BaseRecord::<[u8], [u8]>::to(&topics.output)
                .partition(o.partition)
                .payload(b"x")
                .headers(h),
        )
        .unwrap();
    }
    // Flushed first: an abort purges what is still queued locally.
    p.flush(Duration::from_secs(30)).unwrap();
    p.abort_transaction(Duration::from_secs(30)).unwrap();
    let (code, r) = audit(&topics, &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(count(&r, "aborted"), 3, "{r:#}");

    // A transaction left open: its partition's last stable offset stays below the high
    // watermark for the whole audit.
    p.begin_transaction().unwrap();
    p.send(
        BaseRecord::<[u8], [u8]>::to(&topics.output)
            .partition(1)
            .payload(b"pending"),
    )
    .unwrap();
    p.flush(Duration::from_secs(30)).unwrap();
    let (code, r) = audit(&topics, &[]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(count(&r, "hanging_partitions"), 1, "{r:#}");
    let unstable: Vec<&Value> = r["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["high_watermark_at_end"] != p["last_stable_offset_at_end"])
        .collect();
    assert_eq!(unstable.len(), 1);
    assert_eq!(unstable[0]["partition"], 1);
    p.abort_transaction(Duration::from_secs(30)).unwrap();
}

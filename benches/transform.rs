//! Per-record cost of the transform and the output preparation (lineage header, size checks):
//! everything the loop does to one record between `poll` and the producer.
//!
//!   cargo bench --bench transform

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use exactly::config::TransformSpec;
use exactly::records;
use exactly::transform::{self, InputRecord, Limits};

/// The benchmark's enrichment (bench/run.sh uses the same program).
const ENRICH: &str =
    ".dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)";

/// A record shaped like bench/loadgen's, padded to about `size` bytes.
fn value(size: usize) -> Vec<u8> {
    let head = r#"{"seq":123456,"ts":1764460800123,"us":1764460800123456,"user":"u456","amount":56.78,"drop":""#;
    let mut v = head.as_bytes().to_vec();
    v.extend(std::iter::repeat_n(
        b'x',
        size.saturating_sub(head.len() + 2),
    ));
    v.extend_from_slice(b"\"}");
    v
}

fn per_record(c: &mut Criterion) {
    let limits = Limits {
        max_output_bytes: 1_000_000,
        max_outputs: 10_000,
    };
    let transforms = [
        ("passthrough", TransformSpec::Passthrough),
        // Parse and write back only: the floor of any jq program.
        (
            "jq-identity",
            TransformSpec::Jq {
                program: ".".into(),
                envelope: false,
            },
        ),
        (
            "jq-todate",
            TransformSpec::Jq {
                program: ".dt = (.ts / 1000 | todate)".into(),
                envelope: false,
            },
        ),
        (
            "jq-enrich",
            TransformSpec::Jq {
                program: ENRICH.into(),
                envelope: false,
            },
        ),
    ];
    let mut group = c.benchmark_group("per_record");
    for size in [100, 1000] {
        let value = value(size);
        let key = b"k123456".to_vec();
        let input = InputRecord {
            topic: "in",
            partition: 3,
            offset: 123_456_789,
            timestamp: Some(1_764_460_800_123),
            key: Some(&key),
            value: Some(&value),
            headers: vec![],
        };
        group.throughput(Throughput::Elements(1));
        for (name, spec) in &transforms {
            let mut t = transform::new(spec, limits).expect("compiles");
            group.bench_with_input(BenchmarkId::new(*name, size), &input, |b, input| {
                b.iter(|| {
                    records::outputs(input, t.apply(input), true, 1_000_000).expect("transforms")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, per_record);
criterion_main!(benches);

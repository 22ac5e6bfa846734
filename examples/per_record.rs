//! A fixed number of records through the transform and output preparation, for instruction
//! counts that do not depend on the machine's load:
//!
//!   cargo build --release --example per_record
//!   valgrind --tool=callgrind target/release/examples/per_record jq-enrich 100 10000
//!
//! (instructions per record = callgrind's total / count, minus the start-up run with count 0).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use exactly::config::TransformSpec;
use exactly::records;
use exactly::transform::{self, InputRecord, Limits};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (name, size, count) = match &args[1..] {
        [n, s, c] => (
            n.as_str(),
            s.parse::<usize>().unwrap(),
            c.parse::<u64>().unwrap(),
        ),
        _ => panic!("usage: per_record passthrough|jq-identity|jq-enrich SIZE COUNT"),
    };
    let spec = match name {
        "passthrough" => TransformSpec::Passthrough,
        "jq-identity" => TransformSpec::Jq {
            program: ".".into(),
            envelope: false,
        },
        "jq-enrich" => TransformSpec::Jq {
            program:
                ".dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)"
                    .into(),
            envelope: false,
        },
        other => panic!("unknown transform {other}"),
    };
    let limits = Limits {
        max_output_bytes: 1_000_000,
        max_outputs: 10_000,
    };
    let mut t = transform::new(&spec, limits).unwrap();
    let head = r#"{"seq":123456,"ts":1764460800123,"us":1764460800123456,"user":"u456","amount":56.78,"drop":""#;
    let mut value = head.as_bytes().to_vec();
    value.extend(std::iter::repeat_n(
        b'x',
        size.saturating_sub(head.len() + 2),
    ));
    value.extend_from_slice(b"\"}");
    let key = b"k123456".to_vec();
    let mut bytes = 0;
    for i in 0..count {
        let input = InputRecord {
            topic: "in",
            partition: 3,
            offset: i as i64,
            timestamp: Some(1_764_460_800_123),
            key: Some(&key),
            value: Some(&value),
            headers: vec![],
        };
        let out = records::outputs(&input, t.apply(&input), true, 1_000_000).unwrap();
        bytes += out.len();
    }
    std::hint::black_box(bytes);
}

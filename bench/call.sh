#!/usr/bin/env bash
# The call-out's throughput: exactly-once at 100 ms commits drains ~100 B records through an
# application that answers each call after 0, 1 or 10 ms (loadgen serve: a passthrough in
# Rust, so the numbers are exactly's, not the application's), for a few batch sizes.
#
#   bench/call.sh [BINARY] [records]      (defaults: target/release/exactly, 1,000,000)
#
# CALL_DELAYS (0 1 10) and CALL_BATCHES (100 500 2000) narrow the grid (a change's note).
#
# Prints a Markdown table: records/s from the first commit to the end of the input (steady),
# CPU s per million records and peak RSS of exactly, and the calls it made. Keeps the results in
# bench/results/call.jsonl and draws bench/results/call.png (when matplotlib is there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
bin=${1:-$repo/target/release/exactly}
count=${2:-1000000}

# shellcheck source=bench/lib.sh
source bench/lib.sh

topic in
"${loadgen[@]}" preload --topic in --count "$count" --size 100 >/dev/null
# A narrowed grid is a change's note, not the results BENCHMARKS.md draws.
out=bench/results/call.jsonl
if [ -n "${CALL_DELAYS:-}${CALL_BATCHES:-}" ]; then out=$EXACTLY_KAFKA_DIR/call.jsonl; fi
: >"$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "| application delay per call | --call-batch-records | records/s | CPU s per million | peak RSS MB | calls |"
echo "|---|---|---|---|---|---|"
run=0
for delay in ${CALL_DELAYS:-0 1 10}; do
  start_app "$delay"
  for batch in ${CALL_BATCHES:-100 500 2000}; do
    run=$((run + 1))
    topic "out-$run"
    "$bin" run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "out-$run" \
      --group-id "call-$run" --instance-id "call-$run" --on-error skip --log-level warn \
      --http-addr "127.0.0.1:$port" --call-url "http://127.0.0.1:$app_port/" \
      --call-batch-records "$batch" 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
    pid=$!
    result=$("${loadgen[@]}" drain --topic in --group "call-$run" --pid "$pid")
    calls=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^exactly_calls_total\{outcome="ok"\}/ {print $2}')
    kill -TERM "$pid"
    wait "$pid" || true
    python3 - "$delay" "$batch" "$result" "${calls:-0}" "$out" <<'PY'
import json, sys
delay, batch, r, calls = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
with open(sys.argv[5], "a") as f:
    f.write(json.dumps({"delay_ms": delay, "batch": batch, "calls": calls, "result": r}) + "\n")
print(f"| {delay} ms | {batch} | {int(r['records_per_second']):,} | "
      f"{r['cpu_seconds_per_million']:.1f} | {r['peak_rss_kb'] // 1024} | {int(calls):,} |")
PY
  done
done
[ "$out" = bench/results/call.jsonl ] || exit 0
python3 - "$out" bench/results/call.png <<'PY'
import json, sys
try:
    import matplotlib
except ImportError:
    sys.exit(0)
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1])]
fig, ax = plt.subplots(figsize=(7, 4))
for delay in sorted({r["delay_ms"] for r in rows}):
    pts = sorted((r["batch"], r["result"]["records_per_second"] / 1000) for r in rows if r["delay_ms"] == delay)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"application answers in {delay} ms")
ax.set_xscale("log")
ax.set_xlabel("--call-batch-records (4 calls in flight)")
ax.set_ylabel("thousand records/s (exactly-once, 100 ms)")
ax.set_title("The call-out, ~100 B records")
ax.axhline(300, color="grey", linestyle=":", label="target with a 1 ms application, 500 a call")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
PY

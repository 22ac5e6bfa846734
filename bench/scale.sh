#!/usr/bin/env bash
# The scaling curve: 1, 2 and 3 exactly instances in one consumer group drain the same preloaded
# input (~100 B records, 6 partitions, exactly-once at 100 ms commits, passthrough), each count
# twice, alternating. records/s is the group's, from its first commit to the end of the input;
# CPU is every instance's, start-up included.
#
#   bench/scale.sh [BINARY] [records]      (defaults: target/release/exactly, 2,000,000)
#
# On a machine whose cores the broker shares, the curve says what a second instance costs more
# than what it adds; run it where exactly has cores of its own to see it scale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
bin=${1:-$repo/target/release/exactly}
count=${2:-2000000}

# shellcheck source=bench/lib.sh
source bench/lib.sh

topic in
"${loadgen[@]}" preload --topic in --count "$count" --size 100 >/dev/null
ticks=$(getconf CLK_TCK)
cpu_seconds() { # utime + stime of a live process, in seconds
  awk -v t="$ticks" '{ print ($14 + $15) / t }' "/proc/$1/stat"
}
echo "| instances | records/s | CPU s per million (all instances) | peak RSS MB (instance 1) |"
echo "|---|---|---|---|"
run=0
for rep in 1 2; do
  for n in 1 2 3; do
    run=$((run + 1))
    topic "out-$run"
    pids=()
    for i in $(seq 1 "$n"); do
      "$bin" run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "out-$run" \
        --group-id "scale-$run" --instance-id "scale-$run-$i" --on-error skip \
        --log-level warn --http-addr off 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      pids+=("$!")
    done
    result=$("${loadgen[@]}" drain --topic in --group "scale-$run" --pid "${pids[0]}")
    cpu=0
    for pid in "${pids[@]}"; do
      cpu=$(echo "$cpu + $(cpu_seconds "$pid")" | bc)
    done
    kill -TERM "${pids[@]}"
    wait "${pids[@]}" || true
    python3 - "$n" "$result" "$cpu" "$count" <<'PY'
import json, sys
n, r, cpu, count = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"| {n} | {int(r['records_per_second']):,} | {cpu * 1e6 / count:.2f} "
      f"| {r['peak_rss_kb'] // 1024} |")
PY
  done
done

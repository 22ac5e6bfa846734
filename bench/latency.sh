#!/usr/bin/env bash
# End-to-end latency of two exactly binaries at one open-loop rate (~100 B records, 6
# partitions, exactly-once, 100 ms commits), A B A B: the check that a change of defaults does
# not cost latency (bench/run.sh measures latency at fractions of the maximum instead).
#
#   bench/latency.sh OLD_BINARY NEW_BINARY RATE [seconds measured]    (default 30)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
[ $# -ge 3 ] || { echo "usage: bench/latency.sh OLD_BINARY NEW_BINARY RATE [seconds]" >&2; exit 2; }
bins=("$1" "$2")
rate=$3
measure=${4:-30}
warmup=10

# shellcheck source=bench/lib.sh
source bench/lib.sh

run=0
for rep in 1 2; do
  for which in 0 1; do
    run=$((run + 1))
    topic "lat-in-$run"
    topic "lat-out-$run"
    "${bins[$which]}" run --bootstrap-servers "$bootstrap" --input-topics "lat-in-$run" \
      --output-topic "lat-out-$run" --group-id "lat-$run" --instance-id "lat-$run" \
      --on-error skip --log-level warn --http-addr off 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
    pid=$!
    sleep 8 # join the group before the clock starts
    "${loadgen[@]}" check --topic "lat-out-$run" --warmup-seconds "$warmup" --idle-seconds 10 \
      >"$EXACTLY_KAFKA_DIR/check.json" &
    checker=$!
    "${loadgen[@]}" generate --topic "lat-in-$run" --rate "$rate" \
      --seconds $((warmup + measure)) >/dev/null
    wait "$checker"
    kill -TERM "$pid"
    wait "$pid" || true
    python3 - "$([ "$which" = 0 ] && echo old || echo new)" "$rep" "$rate" \
      "$EXACTLY_KAFKA_DIR/check.json" <<'PY'
import json, sys
which, rep, rate, path = sys.argv[1:]
c = json.load(open(path))
print(f"latency: {which} rep {rep} at {rate}/s: p50 {c['p50_ms']:.0f} ms, p99 {c['p99_ms']:.0f} ms, "
      f"max {c['max_ms']:.0f} ms, duplicates {c['duplicates']}, missing {c['missing_below_max']}")
PY
  done
done

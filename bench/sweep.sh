#!/usr/bin/env bash
# The sweep behind exactly's fetch, queue and batch defaults (BENCHMARKS.md, "Defaults"): one
# exactly binary drains the same preloaded input (~100 B records, 6 partitions, exactly-once,
# 100 ms commits) once per setting below, and the table gives steady records/s, CPU s per
# million records and peak RSS for each.
#
#   [SWEEP_SIZE=bytes] [SWEEP_PARTITIONS=n] bench/sweep.sh [BINARY] [records] [transform]
#
# Defaults: ~100 B, 6 partitions, target/release/exactly, 1,000,000 records, passthrough (or jq).
#
# Each row is the settings it adds to the binary's own defaults, as --consumer-config (c:) and
# --producer-config (p:) pairs; `shipped` adds nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
bin=${1:-$repo/target/release/exactly}
count=${2:-1000000}
transform=${3:-passthrough}
size=${SWEEP_SIZE:-100}

rows=(
  "shipped|"
  "librdkafka defaults|c:fetch.queue.backoff.ms=1000 c:queued.min.messages=100000 c:queued.max.messages.kbytes=65536 c:fetch.max.bytes=52428800 p:queue.buffering.max.kbytes=1048576 p:queue.buffering.max.messages=100000 p:linger.ms=5 p:batch.size=1000000"
  "backoff 5 ms|c:fetch.queue.backoff.ms=5"
  "backoff 5 ms, queue 16 MB|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=16384"
  "backoff 5 ms, queue 4 MB|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096"
  "backoff 5 ms, queue 4 MB, min 10k|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096 c:queued.min.messages=10000"
  "backoff 5 ms, queue 4 MB, fetch 8 MB|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096 c:fetch.max.bytes=8388608"
  "backoff 5 ms, queue 4 MB, producer 16 MB|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096 p:queue.buffering.max.kbytes=16384"
  "backoff 5 ms, queue 4 MB, producer 16 MB, batch 256 KB|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096 p:queue.buffering.max.kbytes=16384 p:batch.size=262144"
  "backoff 5 ms, queue 4 MB, producer 16 MB, batch 256 KB, linger 10|c:fetch.queue.backoff.ms=5 c:queued.max.messages.kbytes=4096 p:queue.buffering.max.kbytes=16384 p:batch.size=262144 p:linger.ms=10"
)
if [ -n "${SWEEP_ROWS:-}" ]; then
  IFS=';' read -r -a rows <<<"$SWEEP_ROWS"
fi

# shellcheck source=bench/lib.sh
source bench/lib.sh

topic in
"${loadgen[@]}" preload --topic in --count "$count" --size "$size" >/dev/null
echo "| settings ($transform, $count × ~$size B) | records/s | CPU s per million | peak RSS MB |"
echo "|---|---|---|---|"
run=0
for row in "${rows[@]}"; do
  run=$((run + 1))
  name=${row%%|*}
  settings=${row#*|}
  topic "out-$run"
  args=(run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "out-$run"
    --group-id "sweep-$run" --instance-id "sweep-$run" --on-error skip --log-level warn
    --http-addr off)
  if [ "$transform" = jq ]; then args+=(--jq "$jq_program"); fi
  for s in $settings; do
    case "$s" in
      c:*) args+=(--consumer-config "${s#c:}") ;;
      p:*) args+=(--producer-config "${s#p:}") ;;
    esac
  done
  "$bin" "${args[@]}" 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
  pid=$!
  result=$("${loadgen[@]}" drain --topic in --group "sweep-$run" --pid "$pid")
  kill -TERM "$pid"
  wait "$pid" || true
  python3 - "$name" "$result" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
print(f"| {sys.argv[1]} | {int(r['records_per_second']):,} | {r['cpu_seconds_per_million']:.2f} "
      f"| {r['peak_rss_kb'] // 1024} |")
PY
done

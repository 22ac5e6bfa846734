#!/usr/bin/env bash
# The benchmark, side by side on one broker in one run (see bench/README.md):
#
#   bench/run.sh            full profile: 5,000,000 × ~100 B and 1,000,000 × ~1 KB drains (long
#                           enough that the JVM peer is warm), the call-out (1 ms application,
#                           500 a call), 6 against 1,000 partitions (2,000,000 × ~100 B each),
#                           latency at 25/50/75 % load (15 s warm-up, 60 s measured); ~40 min
#   bench/run.sh smoke      the same steps on tiny inputs (CI runs it so the harness works)
#   bench/run.sh focus      the full drains narrowed by BENCH_SIZES (100 1000), BENCH_TRANSFORMS
#                           (passthrough jq) and BENCH_SYSTEMS (those below), no ceiling and no
#                           latency: one row of the targets, for a change's note (no report)
#
# Systems: Kafka's own perf tools (ceiling), exactly --guarantee at-least-once, exactly
# exactly-once at commit intervals 10/100/1000 ms, Kafka Streams (bench/peers/kstreams) with
# exactly_once_v2 and at_least_once (the shared producer settings), and exactly_once_v2 with its
# own producer defaults (ratios are taken against the faster of its two exactly_once_v2 runs). Results: one JSON object per line in
# bench/results/<profile>.jsonl; bench/report.py turns the full one into BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

profile=${1:-full}
case "$profile" in
  full)
    small=5000000 large=1000000 spread=2000000 warmup=15 measure=60 intervals="10 100 1000" loads="25 50 75" ;;
  smoke)
    small=20000 large=5000 spread=20000 warmup=2 measure=4 intervals="100" loads="50" ;;
  focus)
    small=2000000 large=500000 spread=0 warmup=15 measure=60 intervals="10 100 1000" loads="" ;;
  *) echo "usage: bench/run.sh [full|smoke|focus]" >&2; exit 2 ;;
esac
partitions=6
# Identical producer settings for every system under test.
export BENCH_LINGER_MS=5 BENCH_BATCH_SIZE=262144 BENCH_COMPRESSION=none
producer_props="linger.ms=$BENCH_LINGER_MS batch.size=$BENCH_BATCH_SIZE acks=all compression.type=$BENCH_COMPRESSION"
jq_program='.dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)'

mkdir -p bench/results
out="bench/results/$profile.jsonl"
: >"$out"
log() { echo "bench: $*" >&2; }

# Its own broker, so a test broker's topics do not share the disk and page cache.
export EXACTLY_KAFKA_DIR="$repo/.kafka-bench"
scripts/kafka.sh reset >/dev/null 2>&1 || true
scripts/kafka.sh start
stop() {
  [ -z "${app:-}" ] || kill "$app" 2>/dev/null || true
  scripts/kafka.sh stop || true
}
trap stop EXIT
bootstrap=$(scripts/kafka.sh bootstrap)

log "building exactly and loadgen (release) and the Kafka Streams peer (Maven)"
cargo build -q --release -p exactly -p loadgen
mvn -q -B -f bench/peers/kstreams/pom.xml package -DskipTests
exactly_bin="$repo/target/release/exactly"
loadgen=("$repo/target/release/loadgen" --bootstrap "$bootstrap")
peer_cp="$repo/bench/peers/kstreams/target/classes:$repo/bench/peers/kstreams/target/lib/*"

# shellcheck source=bench/app.sh
source bench/app.sh
app=
kafka_tool() { scripts/kafka.sh tool "$@"; }
topic() { # name partitions
  kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create \
    --topic "$1" --partitions "$2" --replication-factor 1 >/dev/null
}
drop_topic() {
  kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --delete \
    --topic "$1" >/dev/null 2>&1 || true
}
record() { # kind system size transform json
  printf '{"kind":"%s","system":"%s","size":"%s","transform":"%s","result":%s}\n' \
    "$1" "$2" "$3" "$4" "$5" >>"$out"
}

metrics_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# exactly's /metrics, added to a drain's result (the commit-duration histogram).
with_metrics() { # result-json
  python3 - "$1" "$metrics_port" <<'PY'
import json, sys, urllib.request
r = json.loads(sys.argv[1])
try:
    r["metrics"] = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/metrics", timeout=5).read().decode()
except OSError:
    pass
print(json.dumps(r))
PY
}

# Starts a system under test in the background; sets $pid.
start_system() { # system transform input output group
  local system=$1 transform=$2 input=$3 output=$4 group=$5
  case "$system" in
    exactly-alo|exactly-eos-*|exactly-call)
      local args=(run --bootstrap-servers "$bootstrap" --input-topics "$input" --output-topic "$output"
        --group-id "$group" --instance-id "$group" --on-error skip --log-level warn
        --http-addr "127.0.0.1:$metrics_port"
        --producer-config "linger.ms=$BENCH_LINGER_MS" --producer-config "batch.size=$BENCH_BATCH_SIZE"
        --producer-config "compression.type=$BENCH_COMPRESSION")
      if [ "$system" = exactly-alo ]; then
        args+=(--guarantee at-least-once --commit-interval 100ms)
      elif [ "$system" = exactly-call ]; then
        # The call-out: every record through an application answering each call after 1 ms.
        args+=(--commit-interval 100ms --call-url "http://127.0.0.1:$app_port/" --call-batch-records 500)
      else
        args+=(--commit-interval "${system#exactly-eos-}ms")
      fi
      if [ "$transform" = jq ]; then args+=(--jq "$jq_program"); fi
      "$exactly_bin" "${args[@]}" 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      pid=$!
      ;;
    kstreams-*)
      local guarantee=exactly_once_v2 interval=100 producer=shared
      case "$system" in
        kstreams-alo) guarantee=at_least_once ;;
        kstreams-eos-100-own) producer=own ;;
      esac
      local t=passthrough
      if [ "$transform" = jq ]; then t=enrich; fi
      java -Xmx1g -cp "$peer_cp" exactly.bench.Peer "$bootstrap" "$input" "$output" "$group" \
        "$guarantee" "$interval" "$t" "$producer" 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      pid=$!
      ;;
  esac
}

stop_system() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

drain_systems="exactly-alo"
for i in $intervals; do drain_systems+=" exactly-eos-$i"; done
drain_systems+=" kstreams-alo kstreams-eos-100 kstreams-eos-100-own exactly-call"
sizes="100 1000" transforms="passthrough jq"
if [ "$profile" = focus ]; then
  sizes=${BENCH_SIZES:-$sizes} transforms=${BENCH_TRANSFORMS:-$transforms}
  drain_systems=${BENCH_SYSTEMS:-$drain_systems}
fi
run_id=0

for size in $sizes; do
  count=$small
  if [ "$size" = 1000 ]; then count=$large; fi
  input="in-$size"
  topic "$input" "$partitions"
  log "preloading $count records of ~$size B into $input"
  preload=$("${loadgen[@]}" preload --topic "$input" --count "$count" --size "$size")
  record preload loadgen "$size" none "$preload"

  if [ "$profile" != focus ]; then
  log "ceiling: Kafka's producer and consumer perf tools"
  perf_topic="perf-$size"
  topic "$perf_topic" "$partitions"
  # shellcheck disable=SC2086
  p=$(kafka_tool org.apache.kafka.tools.ProducerPerformance --topic "$perf_topic" \
    --num-records "$count" --record-size "$size" --throughput -1 \
    --producer-props bootstrap.servers="$bootstrap" $producer_props | tail -1)
  rps=$(sed -n 's/.*records sent, \([0-9.]*\) records\/sec.*/\1/p' <<<"$p")
  record ceiling kafka-producer-perf "$size" none "{\"records_per_second\":${rps:-0}}"
  c=$(kafka_tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$bootstrap" \
    --topic "$input" --messages "$count" --timeout 60000 | tail -1)
  rps=$(awk -F', *' '{print $6}' <<<"$c")
  record ceiling kafka-consumer-perf "$size" none "{\"records_per_second\":${rps:-0}}"
  drop_topic "$perf_topic"
  fi

  for transform in $transforms; do
    for system in $drain_systems; do
      if [ "$system" = exactly-call ]; then
        # The call-out's row: ~100 B passthrough only.
        [ "$size/$transform" = 100/passthrough ] || continue
        [ -n "$app" ] || start_app 1
      fi
      run_id=$((run_id + 1))
      output="out-$run_id" group="bench-$run_id"
      topic "$output" "$partitions"
      log "drain: $system, $transform, ~$size B × $count"
      start_system "$system" "$transform" "$input" "$output" "$group"
      result=$("${loadgen[@]}" drain --topic "$input" --group "$group" --pid "$pid")
      case "$system" in exactly-*) result=$(with_metrics "$result") ;; esac
      stop_system
      record drain "$system" "$size" "$transform" "$result"
      log "  $(cut -c1-200 <<<"$result")"
      drop_topic "$output"
    done
  done
  drop_topic "$input"
done

# Scale in partitions: the same ~100 B passthrough, exactly-once at 100 ms, from 6 and from 1,000
# partitions (input and output alike), the same number of records each.
if [ "$spread" -gt 0 ]; then
  for parts in 6 1000; do
    run_id=$((run_id + 1))
    input="spread-in-$parts" output="spread-out-$parts" group="bench-$run_id"
    topic "$input" "$parts"
    topic "$output" "$parts"
    log "partitions: $parts, preloading $spread records of ~100 B"
    "${loadgen[@]}" preload --topic "$input" --count "$spread" --size 100 >/dev/null
    start_system exactly-eos-100 passthrough "$input" "$output" "$group"
    result=$("${loadgen[@]}" drain --topic "$input" --group "$group" --pid "$pid")
    stop_system
    result=$(python3 -c 'import json, sys; r = json.loads(sys.argv[1]); r["partitions"] = int(sys.argv[2]); print(json.dumps(r))' "$result" "$parts")
    record partitions exactly-eos-100 100 passthrough "$result"
    log "  $(cut -c1-200 <<<"$result")"
    drop_topic "$input"
    drop_topic "$output"
  done
fi

# Latency at fractions of at-least-once's passthrough maximum at ~100 B.
max=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["kind"] == "drain" and r["system"] == "exactly-alo" and r["size"] == "100" and r["transform"] == "passthrough":
        print(int(r["result"]["records_per_second"]))' "$out")
for load in $loads; do
  rate=$((max * load / 100))
  for system in exactly-alo exactly-eos-100 kstreams-eos-100; do
    run_id=$((run_id + 1))
    input="lat-in-$run_id" output="lat-out-$run_id" group="bench-$run_id"
    topic "$input" "$partitions"
    topic "$output" "$partitions"
    start_system "$system" passthrough "$input" "$output" "$group"
    sleep 8 # join the group before the clock starts
    "${loadgen[@]}" check --topic "$output" --warmup-seconds "$warmup" --idle-seconds 10 \
      >"$EXACTLY_KAFKA_DIR/check.json" &
    checker=$!
    log "latency: $system at $load % of $max/s = $rate/s for $((warmup + measure)) s"
    gen=$("${loadgen[@]}" generate --topic "$input" --rate "$rate" --seconds $((warmup + measure)))
    wait "$checker"
    stop_system
    check=$(cat "$EXACTLY_KAFKA_DIR/check.json")
    record latency "$system" 100 passthrough \
      "{\"load_percent\":$load,\"rate\":$rate,\"generator\":$gen,\"checker\":$check}"
    log "  $check"
    drop_topic "$input"
    drop_topic "$output"
  done
done

log "results in $out"
if [ "$profile" = focus ]; then exit 0; fi
python3 bench/report.py --check "$out"

#!/usr/bin/env bash
# The dedup (issue 24): the seed's daily-active-users job on ~200 B app start-up events keyed
# by device over 3 days, exactly-once, side by side with Kafka Streams doing the same (a
# RocksDB store with its changelog, exactly_once_v2, commit 100 ms; bench/peers/kstreams).
# Every system drains the same preloaded input with a 3-day grace, so every key of the 3
# days is held at the end (~1M with the defaults). Then exactly restarts on its group and
# reports how long the restore of every partition takes: memory only (the whole changelog)
# and with --state-dir (the local store, after a clean stop).
#
#   bench/dedup.sh [events] [devices]     (default 2,000,000 events, 333,334 devices)
#   GRACE=1h bench/dedup.sh …             exactly's --window-grace (3d: every day stays open, so
#                                         every key is held at the end; 1h: only the last day)
#
# Last, a restart after kill -9 with the local store kept: a tenth more events (a fifth more
# devices) go in, the --state-dir instance takes them and is killed -9 once its group caught
# up, and the restart reads only the changelog after the store's last mark.
#
# One JSON object per system on stdout (output_end_offsets counts the transaction markers too).
# SYSTEMS="… exactly-aggregate" adds exactly's windowed aggregates on the same input: the count
# and the distinct app versions per device per day, each day's totals once it closes
# (--aggregate-emit final; with GRACE=1h the first two days close, the third stays open);
# AGGREGATE="--aggregate count" measures another set of measures; SYSTEMS="… kstreams-count"
# is Kafka Streams' count per device per day, each day once it closes (the peer's `count`).
# SYSTEMS="… kstreams-txn" adds Kafka Streams 4.4.0 (built apart, in target-4.4.0) with the
# KIP-892 transactional state stores (BENCH_STREAMS_CONFIG); the broker is the test broker (scripts/kafka/pom.xml).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
count=${1:-2000000}
devices=${2:-333334}

# shellcheck source=bench/lib.sh
source bench/lib.sh
cargo build -q --release -p exactly
mvn -q -B -f bench/peers/kstreams/pom.xml package -DskipTests
exactly=$repo/target/release/exactly
peer_cp="$repo/bench/peers/kstreams/target/classes:$repo/bench/peers/kstreams/target/lib/*"
txn_dir=$repo/bench/peers/kstreams/target-4.4.0
if [[ " ${SYSTEMS:-} " == *" kstreams-txn "* ]]; then
  mvn -q -B -f bench/peers/kstreams/pom.xml package -DskipTests -Dkafka.version=4.4.0 \
    -Dpeer.build.dir="$txn_dir"
fi
state=$(mktemp -d)
trap 'scripts/kafka.sh stop >&2 || true; rm -rf "$state"' EXIT

topic starts
"${loadgen[@]}" startups --topic starts --count "$count" --devices "$devices" --days 3 >&2

exactly_args() { # group output [extra…]
  local group=$1 output=$2
  shift 2
  echo run --bootstrap-servers "$bootstrap" --input-topics starts --output-topic "$output" \
    --group-id "$group" --instance-id "$group-0" --log-format json --http-addr off \
    --producer-config linger.ms=5 --producer-config batch.size=262144 \
    --window 1d --window-grace "${GRACE:-3d}" "$@"
}

# The restore of every partition (6) after a restart: seconds from start to the last one.
# A partition's state is read back at its first record: one waits in each before the start.
restore() { # log args…
  local log=$1
  shift
  "${loadgen[@]}" touch --topic starts --partitions 6 >&2
  local started
  started=$(date +%s.%N)
  "$exactly" "$@" 2>"$log" &
  local pid=$!
  for _ in $(seq 1 1200); do
    [ "$(grep -c 'dedup state restored' "$log" || true)" -ge 6 ] && break
    sleep 0.05
  done
  local done_at rss
  done_at=$(date +%s.%N)
  rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid" || true
  python3 - "$started" "$done_at" "$rss" "$log" <<'EOF'
import json, sys
started, done, rss, log = sys.argv[1:]
lines = [json.loads(l) for l in open(log) if "dedup state restored" in l]
print(json.dumps({"restore_seconds": round(float(done) - float(started), 2),
                  "changelog_records": sum(l["records"] for l in lines),
                  "stored_keys": sum(l.get("stored", 0) for l in lines),
                  "peak_rss_mb": int(rss) // 1024}))
EOF
}

# GRACE (1h, 3d, 30m) in milliseconds, for the Kafka Streams count.
grace_ms() {
  local g=${GRACE:-3d}
  case "$g" in
    *d) echo $((${g%d} * 86400000)) ;;
    *h) echo $((${g%h} * 3600000)) ;;
    *m) echo $((${g%m} * 60000)) ;;
    *) echo "bench/dedup.sh: GRACE=$g: use d, h or m" >&2; exit 2 ;;
  esac
}

drain() { # system group output pid
  local result
  result=$("${loadgen[@]}" drain --topic starts --group "$2" --pid "$4")
  kill -TERM "$4"; wait "$4" || true
  local outputs
  outputs=$(scripts/kafka.sh tool org.apache.kafka.tools.GetOffsetShell --bootstrap-server \
    "$bootstrap" --topic "$3" | awk -F: '{s+=$3} END {print s}')
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(json.dumps({"system": sys.argv[2],
    "output_end_offsets": int(sys.argv[3]), "records_per_second": round(r["records_per_second"]),
    "cpu_seconds_per_million": round(r["cpu_seconds_per_million"], 2),
    "peak_rss_mb": r["peak_rss_kb"] // 1024}))' "$result" "$1" "$outputs"
}

# SYSTEMS="exactly-store" bench/dedup.sh: some of them only (the restarts need both exactly's).
for system in ${SYSTEMS:-exactly exactly-store kstreams}; do
  topic "dau-$system"
  topic "dau-$system.dlq"
  case "$system" in
    exactly)
      read -ra a <<<"$(exactly_args "dau-$system" "dau-$system")"
      "$exactly" "${a[@]}" 2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
    exactly-store)
      read -ra a <<<"$(exactly_args "dau-$system" "dau-$system" --state-dir "$state")"
      "$exactly" "${a[@]}" 2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
    exactly-aggregate)
      read -ra a <<<"$(exactly_args "dau-$system" "dau-$system" --aggregate-emit final \
        ${AGGREGATE:---aggregate count,distinct --aggregate-distinct .app})"
      "$exactly" "${a[@]}" 2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
    kstreams)
      BENCH_LINGER_MS=5 BENCH_BATCH_SIZE=262144 BENCH_COMPRESSION=none \
        java -Xmx1g -cp "$peer_cp" exactly.bench.Peer "$bootstrap" starts "dau-$system" \
        "dau-$system" exactly_once_v2 100 dedup shared 2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
    kstreams-count)
      BENCH_LINGER_MS=5 BENCH_BATCH_SIZE=262144 BENCH_COMPRESSION=none \
        BENCH_WINDOW_GRACE_MS=$(grace_ms) java -Xmx1g -cp "$peer_cp" exactly.bench.Peer \
        "$bootstrap" starts "dau-$system" "dau-$system" exactly_once_v2 100 count shared \
        2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
    kstreams-txn)
      BENCH_LINGER_MS=5 BENCH_BATCH_SIZE=262144 BENCH_COMPRESSION=none \
        BENCH_STREAMS_CONFIG=${BENCH_STREAMS_CONFIG:-enable.transactional.statestores=true} \
        java -Xmx1g -cp "$txn_dir/classes:$txn_dir/lib/*" exactly.bench.Peer "$bootstrap" starts \
        "dau-$system" "dau-$system" exactly_once_v2 100 dedup shared \
        2>"$EXACTLY_KAFKA_DIR/$system.log" & ;;
  esac
  drain "$system" "dau-$system" "dau-$system" $!
done

if [[ " ${SYSTEMS:-exactly} " == *" exactly "* ]]; then
  read -ra a <<<"$(exactly_args dau-exactly dau-exactly)"
  echo "{\"restart\": \"memory only\", \"restore\": $(restore "$EXACTLY_KAFKA_DIR/restart.log" "${a[@]}")}"
fi
if [[ " ${SYSTEMS:-exactly-store} " != *" exactly-store "* ]]; then
  exit 0
fi
read -ra a <<<"$(exactly_args dau-exactly-store dau-exactly-store --state-dir "$state")"
echo "{\"restart\": \"--state-dir\", \"restore\": $(restore "$EXACTLY_KAFKA_DIR/restart-store.log" "${a[@]}")}"

"${loadgen[@]}" startups --topic starts --count $((count / 10)) --devices $((devices * 6 / 5)) \
  --days 3 >&2
"$exactly" "${a[@]}" 2>"$EXACTLY_KAFKA_DIR/killed.log" &
pid=$!
"${loadgen[@]}" drain --topic starts --group dau-exactly-store --pid "$pid" >/dev/null
kill -KILL "$pid"
wait "$pid" || true
echo "{\"restart\": \"--state-dir after kill -9\", \"restore\": $(restore "$EXACTLY_KAFKA_DIR/restart-killed.log" "${a[@]}")}"

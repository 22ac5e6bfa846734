#!/usr/bin/env bash
# The dedup (--dedup-window 1d, issue 24): the seed's daily-active-users job on ~200 B app
# start-up events keyed by device over 3 days. Drains the preloaded input exactly-once and
# reports records/s, CPU s per million, peak RSS with every key of the 3 days held (a 3-day
# grace keeps all windows open), then restarts on the same group and reports how long the
# restore of every partition's changelog takes.
#
#   bench/dedup.sh [events] [devices]        (default 2,000,000 events, 333,334 devices:
#                                             ~1M (day, device) keys)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
count=${1:-2000000}
devices=${2:-333334}

# shellcheck source=bench/lib.sh
source bench/lib.sh
cargo build -q --release -p exactly
exactly=$repo/target/release/exactly

topic starts
topic dau
topic dau.dlq
"${loadgen[@]}" startups --topic starts --count "$count" --devices "$devices" --days 3 >&2
args=(run --bootstrap-servers "$bootstrap" --input-topics starts --output-topic dau
  --group-id dau --instance-id dau-0 --log-format json --http-addr off
  --producer-config linger.ms=5 --producer-config batch.size=262144
  --dedup-window 1d --dedup-grace 3d)
log=$EXACTLY_KAFKA_DIR/dedup.log
"$exactly" "${args[@]}" 2>"$log" &
pid=$!
drain=$("${loadgen[@]}" drain --topic starts --group dau --pid "$pid")
kill -TERM "$pid"; wait "$pid" || true
outputs=$(scripts/kafka.sh tool org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$bootstrap" \
  --topic dau | awk -F: '{s+=$3} END {print s}')

# The restart: every partition read back from its changelog.
started=$(date +%s.%N)
"$exactly" "${args[@]}" 2>"$log.restart" &
pid=$!
for _ in $(seq 1 600); do
  [ "$(grep -c 'dedup state restored' "$log.restart" || true)" -ge 6 ] && break
  sleep 0.1
done
restored=$(date +%s.%N)
rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
kill -TERM "$pid"; wait "$pid" || true
python3 - "$drain" "$outputs" "$started" "$restored" "$rss_kb" "$log.restart" <<'EOF'
import json, sys
drain, outputs, started, restored, rss_kb, log = sys.argv[1:]
d = json.loads(drain)
records = sum(json.loads(l).get("records", 0) for l in open(log) if "dedup state restored" in l)
took = [json.loads(l).get("took") for l in open(log) if "dedup state restored" in l]
print(json.dumps({
    "events": d.get("records"), "outputs": int(outputs),
    "records_per_second": round(d["records_per_second"]),
    "cpu_seconds_per_million": round(d["cpu_seconds_per_million"], 2),
    "peak_rss_mb": d["peak_rss_kb"] // 1024,
    "restore_changelog_records": records,
    "restore_seconds_wall": round(float(restored) - float(started), 2),
    "restore_took_per_partition": took,
    "restart_peak_rss_mb": int(rss_kb) // 1024,
}))
EOF

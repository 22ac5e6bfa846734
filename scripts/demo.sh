#!/usr/bin/env bash
# The demo, end to end on this machine: start a local Kafka broker, create topics, write sample
# JSON orders (two of them broken), run exactly with a jq transform, and show what a
# read_committed consumer downstream sees: the transformed orders, and the broken records in
# the dead-letter topic with their reason. Stops exactly with SIGTERM at the end; the broker
# keeps running (scripts/kafka.sh stop).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A C toolchain, cmake, OpenSSL headers, Python 3, Java 17 and Maven, installed when missing.
scripts/setup.sh demo

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
tool() { scripts/kafka.sh tool "$@"; }

say "building exactly"
cargo build --quiet --bin exactly
bin=target/debug/exactly

say "starting Apache Kafka (KRaft, one node, 127.0.0.1)"
scripts/kafka.sh start
bootstrap=$(scripts/kafka.sh bootstrap)

run=demo-$(date +%s)
in=$run.orders
out=$run.orders-enriched
group=$run.enricher
say "creating topics $in (3 partitions), $out (3), $out.dlq (1)"
for spec in "$in:3" "$out:3" "$out.dlq:1"; do
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create \
    --if-not-exists --topic "${spec%:*}" --partitions "${spec#*:}" 2>/dev/null | grep -v WARNING
done

say "writing 1000 orders, and 2 broken records, to $in"
python3 - >"$run.input" <<'PY'
import json, random, time
random.seed(7)
# Orders of the last second, a millisecond apart: the enriched "day" is today's (UTC).
start = int(time.time() * 1000) - 1000
for i in range(1000):
    order = {"id": i, "customer": f"c{random.randint(1, 50)}",
             "amount": round(random.uniform(1, 250), 2), "ts": start + i}
    print(f"order-{i}|{json.dumps(order)}")
    if i == 300: print("bad-1|this is not JSON")
    if i == 700: print('bad-2|{"id": 700, "amount": {"value": 12.5}, "ts": 0}')
PY
tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$bootstrap" --topic "$in" \
  --property parse.key=true --property key.separator='|' <"$run.input"
rm -f "$run.input"

program='{order: .id, customer, cents: (.amount * 100 | round), day: (.ts / 1000 | todate[0:10]), large: (.amount > 200)}'
say "running exactly: $in -> jq -> $out (exactly once)"
echo "  jq: $program"
"$bin" run --bootstrap-servers "$bootstrap" --input-topics "$in" --output-topic "$out" \
  --group-id "$group" --jq "$program" --log-format text --http-addr 127.0.0.1:0 --lag-interval 1s >"$run.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT

say "waiting until the group has committed every input offset"
for _ in $(seq 1 60); do
  lag=$(tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server \
    "$bootstrap" --describe --group "$group" 2>/dev/null | awk -v t="$in" '$2 == t { print $6 }')
  # A partition without a committed offset yet shows its lag as "-": not done.
  total=0
  for l in $lag; do
    case "$l" in
      '' | *[!0-9]*) total=unknown; break ;;
      *) total=$((total + l)) ;;
    esac
  done
  if [ -n "$lag" ] && [ "$total" = 0 ]; then break; fi
  sleep 1
done
tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$bootstrap" \
  --describe --group "$group" 2>/dev/null | grep -E "TOPIC|$in"

say "output, as a read_committed consumer sees it (first 5 records)"
tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$bootstrap" --topic "$out" \
  --from-beginning --isolation-level read_committed --timeout-ms 5000 \
  --property print.key=true --property print.headers=true 2>/dev/null >"$run.out" || true
head -5 "$run.out"
records=$(wc -l <"$run.out")
distinct=$(cut -f1 "$run.out" | sort -u | wc -l)
echo "  ... $records records in $out, $distinct distinct lineages (1000 good orders went in)"
say "dead-letter topic $out.dlq"
tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$bootstrap" \
  --topic "$out.dlq" --from-beginning --isolation-level read_committed --timeout-ms 5000 \
  --property print.key=true --property print.headers=true 2>/dev/null || true
rm -f "$run.out"

metrics=$(sed -n 's/.*HTTP endpoints listening.*addr=\([0-9.:]*\).*/\1/p' "$run.log" | head -1)
say "metrics, from http://$metrics/metrics (also /livez and /readyz)"
python3 - "$metrics" <<'PY'
import sys, urllib.request
base = f"http://{sys.argv[1]}"
text = urllib.request.urlopen(f"{base}/metrics").read().decode()
keep = ("exactly_records_", "exactly_transactions_total", "exactly_transaction_commit_duration_seconds_count",
        "exactly_consumer_lag_records", "exactly_partition_unstable_records",
        "exactly_end_to_end_latency_seconds_count", "exactly_assigned_partitions", "exactly_ready")
for line in text.splitlines():
    # Counters with a reason label start at 0 for every reason; show the ones that moved.
    if line.startswith(keep) and not ("reason=" in line and line.endswith(" 0")):
        print("  " + line)
for path in ("/livez", "/readyz"):
    r = urllib.request.urlopen(f"{base}{path}")
    print(f"  GET {path}: {r.status} {r.read().decode().strip()}")
PY

say "stopping exactly with SIGTERM (it commits, leaves the group, exits 0)"
kill -TERM $pid
code=0
wait $pid || code=$?
trap - EXIT
echo "  exit code: $code"
say "exactly's log ($run.log)"
tail -n 12 "$run.log"
rm -f "$run.log"
echo
echo "The broker is still running on $bootstrap; stop it with: scripts/kafka.sh stop"

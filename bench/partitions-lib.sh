# Shared by bench/partitions.sh and bench/probe.sh (sourced after bench/lib.sh, with log()
# defined): exactly's metrics port ($metrics_port), what a drain's JSON gains from exactly's
# /metrics and from the broker's CPU time, and topics that are there when created.
metrics_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A drain's JSON with exactly's transactions from /metrics: how many, their mean commit time
# (offsets, flush, EndTxn), mean records, and the mean time of each blocking call.
with_transactions() { # json
  python3 - "$1" "$metrics_port" <<'PY'
import json, sys, urllib.request
r = json.loads(sys.argv[1])
try:
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/metrics", timeout=5).read().decode()
    m = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#") and "{" not in l}
    n = m.get("exactly_transaction_commit_duration_seconds_count", 0)
    r["transactions"] = n
    r["commit_ms_mean"] = 1000 * m.get("exactly_transaction_commit_duration_seconds_sum", 0) / max(n, 1)
    r["records_per_transaction"] = m.get("exactly_transaction_records_sum", 0) / max(m.get("exactly_transaction_records_count", 0), 1)
    # The commit's phases: mean milliseconds per call, by call.
    calls = {}
    for l in text.splitlines():
        if l.startswith("exactly_blocking_call_duration_seconds_"):
            name, value = l.rsplit(" ", 1)
            kind, call = name.split("{")[0].rsplit("_", 1)[1], name.split('call="')[1].split('"')[0]
            calls.setdefault(call, {})[kind] = float(value)
    r["call_ms_mean"] = {c: round(1000 * v.get("sum", 0) / max(v.get("count", 0), 1), 1)
                         for c, v in calls.items() if v.get("count")}
    # exactly's own share of the end-to-end latency (commit time minus the input's
    # timestamp): the upper bound of the bucket holding each quantile (meaningful under an
    # open-loop load, not for a drain of preloaded records).
    buckets = sorted((float(l.split('le="')[1].split('"')[0]), float(l.rsplit(" ", 1)[1]))
                     for l in text.splitlines()
                     if l.startswith("exactly_end_to_end_latency_seconds_bucket"))
    total = buckets[-1][1] if buckets else 0
    for q in (0.5, 0.99):
        le = next((le for le, n in buckets if n >= q * total), None) if total else None
        if le is not None and le != float("inf"):
            r[f"exactly_e2e_p{int(q * 100)}_le_ms"] = 1000 * le
except OSError:
    pass
print(json.dumps(r))
PY
}

# The broker's CPU seconds so far (user + system), to tell its share from exactly's.
broker_cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$(cat "$EXACTLY_KAFKA_DIR/pid")/stat"; }
with_broker_cpu() { # json since: the JSON with the broker's CPU seconds since `since`
  python3 -c 'import json, sys; r = json.loads(sys.argv[1]); r["broker_cpu_seconds"] = round(float(sys.argv[3]) - float(sys.argv[2]), 2); print(json.dumps(r))' "$1" "$2" "$(broker_cpu)"
}
# Creates a topic and waits until the broker's metadata lists all its partitions: a topic of
# 1,000 just created can be missing for a while, and exactly refuses an output topic it cannot
# see (the first latency run at 1,000 partitions measured nothing for that). TOPIC_CONFIG: one
# topic setting (key=value) for every topic created.
mktopic() { # name partitions
  local tool=(scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap")
  local config=()
  if [ -n "${TOPIC_CONFIG:-}" ]; then config=(--config "$TOPIC_CONFIG"); fi
  "${tool[@]}" --create --topic "$1" --partitions "$2" --replication-factor 1 "${config[@]}" >/dev/null
  for _ in $(seq 1 30); do
    # Not grep -q: under pipefail, the describe killed by SIGPIPE would read as a miss.
    if "${tool[@]}" --describe --topic "$1" 2>/dev/null | grep "PartitionCount: $2\b" >/dev/null; then
      return 0
    fi
    sleep 1
  done
  log "topic $1 is still not listed with $2 partitions"
  return 1
}

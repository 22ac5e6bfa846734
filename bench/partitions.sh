#!/usr/bin/env bash
# Scale in partitions (issue 29 §1), in one run on a broker of its own: one exactly instance
# (exactly-once, 100 ms commits, passthrough) and Kafka Streams (exactly_once_v2, 100 ms, one
# thread) drain the same number of preloaded ~100 B records from 6, 100 and 1,000 partitions,
# and from 10,000 (10 input topics of 1,000; the output has 1,000); the output has as many
# partitions as the input otherwise. Then exactly at 1,000 partitions again with one core kept
# busy by another program (a shell loop), and the end-to-end p99 at 6 and at 1,000 partitions
# under one open-loop load: half the slower of exactly's two drains.
#
#   bench/partitions.sh [records]     (default 1,000,000; PARTS="6 100 1000 10000",
#                                      SYSTEMS="exactly kstreams", LATENCY=1, BUSY=1;
#                                      the latency run: LATENCY_PARTS="6 1000", LATENCY_RATE
#                                      (half the slower drain), LATENCY_SECONDS=40,
#                                      LATENCY_WARMUP=10; LATENCY_EXISTING=1: topics written
#                                      before, by LATENCY_PRIME=20 s of the same load;
#                                      LATENCY_INSTANCES=1: exactly's instances in the group;
#                                      LATENCY_SYSTEMS="exactly" (or "exactly kstreams");
#                                      EXACTLY_ARGS: more of exactly's flags, BROKER_CONFIG:
#                                      one dynamic broker setting, for experiments)
#
# Results: one JSON object per line in bench/results/partitions.jsonl, and the table on stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
count=${1:-1000000}
parts_list=${PARTS-6 100 1000 10000}
systems=${SYSTEMS:-exactly kstreams}

# shellcheck source=bench/lib.sh
source bench/lib.sh
cargo build -q --release -p exactly
mvn -q -B -f bench/peers/kstreams/pom.xml package -DskipTests
bin="$repo/target/release/exactly"
peer_cp="$repo/bench/peers/kstreams/target/classes:$repo/bench/peers/kstreams/target/lib/*"
export BENCH_LINGER_MS=5 BENCH_BATCH_SIZE=262144 BENCH_COMPRESSION=none
out=bench/results/partitions.jsonl
mkdir -p bench/results
: >"$out"
log() { echo "partitions: $*" >&2; }
# shellcheck source=bench/partitions-lib.sh
source bench/partitions-lib.sh
pid= busy= others=()
if [ -n "${BROKER_CONFIG:-}" ]; then
  scripts/kafka.sh tool org.apache.kafka.tools.ConfigCommand --bootstrap-server "$bootstrap" \
    --alter --entity-type brokers --entity-default --add-config "$BROKER_CONFIG" >&2
fi
# Replaces lib.sh's trap: ends what runs here too, then the broker, on any exit.
trap '[ -z "$busy" ] || kill "$busy" 2>/dev/null || true
  for o in "${others[@]}"; do kill -TERM "$o" 2>/dev/null || true; done
  [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
  [ -z "$app" ] || kill "$app" 2>/dev/null || true
  scripts/kafka.sh stop >&2 || true' EXIT
record() { # kind system partitions json: one row, with the settings a run was narrowed by
  python3 -c 'import json, sys
k, s, p, r, args, topic, broker, existing, instances = sys.argv[1:]
row = {"kind": k, "system": s, "partitions": int(p), "result": json.loads(r)}
if args: row["exactly_args"] = args
if topic: row["topic_config"] = topic
if broker: row["broker_config"] = broker
if existing == "1" and k == "latency": row["existing_topics"] = True
if k == "latency" and s == "exactly" and instances != "1": row["instances"] = int(instances)
print(json.dumps(row, separators=(",", ":")))' "$1" "$2" "$3" "$4" "${EXACTLY_ARGS:-}" "${TOPIC_CONFIG:-}" \
  "${BROKER_CONFIG:-}" "${LATENCY_EXISTING:-0}" "${LATENCY_INSTANCES:-1}" >>"$out"
  log "$1 $2 $3: $(cut -c1-220 <<<"$4")"
}

# Starts a system in the background on inputs (comma-separated) and output; sets $pid. With
# an instance suffix, exactly is one more member of the group (its metrics not read).
start() { # system inputs output group [suffix]
  case "$1" in
    exactly)
      "$bin" run --bootstrap-servers "$bootstrap" --input-topics "$2" --output-topic "$3" \
        --group-id "$4" --instance-id "$4${5:-}" --on-error skip --log-level warn \
        --http-addr "127.0.0.1:$([ -z "${5:-}" ] && echo "$metrics_port" || echo 0)" \
        --commit-interval 100ms --producer-config "linger.ms=$BENCH_LINGER_MS" \
        --producer-config "batch.size=$BENCH_BATCH_SIZE" \
        --producer-config "compression.type=$BENCH_COMPRESSION" ${EXACTLY_ARGS:-} \
        2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      ;;
    kstreams)
      java -Xmx2g -cp "$peer_cp" exactly.bench.Peer "$bootstrap" "$2" "$3" "$4" \
        exactly_once_v2 100 passthrough shared 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      ;;
  esac
  pid=$!
}
drain() { # inputs group: the drain's JSON, or {"failed":…} (timed out after 15 minutes, or
  # loadgen failed: its error is in .kafka-bench/sut.log)
  "${loadgen[@]}" drain --topic "$1" --group "$2" --pid "$pid" --timeout-seconds 900 \
    2>>"$EXACTLY_KAFKA_DIR/sut.log" || echo '{"failed":"the drain failed or timed out (sut.log)"}'
}
stop() {
  for o in "${others[@]}"; do kill -TERM "$o" 2>/dev/null || true; done
  for o in "${others[@]}"; do wait "$o" 2>/dev/null || true; done
  others=()
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}

run=0
for parts in $parts_list; do
  # 10,000: ten input topics of 1,000 partitions (one topic of 10,000 is rare, and slow to
  # create on one broker).
  topics=1 per=$parts
  if [ "$parts" -gt 1000 ]; then topics=$((parts / 1000)) per=1000; fi
  inputs=()
  for t in $(seq 1 "$topics"); do
    inputs+=("p$parts-in-$t")
    mktopic "p$parts-in-$t" "$per"
    "${loadgen[@]}" preload --topic "p$parts-in-$t" --count $((count / topics)) --size 100 >/dev/null
  done
  input_list=$(IFS=,; echo "${inputs[*]}")
  log "$parts partitions: $count records preloaded into $topics topic(s) of $per"
  for system in $systems; do
    run=$((run + 1))
    mktopic "p$parts-out-$run" "$per"
    start "$system" "$input_list" "p$parts-out-$run" "p-$run"
    since=$(broker_cpu)
    result=$(with_broker_cpu "$(drain "$input_list" "p-$run")" "$since")
    if [ "$system" = exactly ]; then result=$(with_transactions "$result"); fi
    stop
    record drain "$system" "$parts" "$result"
  done
  if [ "$parts" = 1000 ] && [ "${BUSY:-1}" = 1 ] && [[ " $systems " == *" exactly "* ]]; then
    # One core kept busy by another program for the whole drain.
    run=$((run + 1))
    mktopic "p$parts-out-$run" "$per"
    (while :; do :; done) &
    busy=$!
    start exactly "$input_list" "p$parts-out-$run" "p-$run"
    since=$(broker_cpu)
    result=$(with_transactions "$(with_broker_cpu "$(drain "$input_list" "p-$run")" "$since")")
    stop
    kill "$busy"
    busy=
    record busy exactly "$parts" "$result"
  fi
done

# One latency row: the system on topics of its own under the open-loop load at $rate.
latency() { # system partitions
  local system=$1 parts=$2
  run=$((run + 1))
  mktopic "lat-in-$run" "$parts"
  mktopic "lat-out-$run" "$parts"
  # LATENCY_INSTANCES: more members of exactly's group, each with a producer (a connection).
  if [ "$system" = exactly ]; then
    for i in $(seq 2 "${LATENCY_INSTANCES:-1}"); do
      start exactly "lat-in-$run" "lat-out-$run" "p-$run" "-$i"
      others+=("$pid")
    done
  fi
  start "$system" "lat-in-$run" "lat-out-$run" "p-$run"
  sleep 8 # join the group before the clock starts
  if ! kill -0 "$pid" 2>/dev/null; then
    record latency "$system" "$parts" '{"failed":"exited before the load (sut.log)"}'
    stop # the other members too
    return
  fi
  local from_end=()
  if [ "${LATENCY_EXISTING:-0}" = 1 ]; then
    # Topics written before: the same load for LATENCY_PRIME seconds, drained, then the
    # measured load read from the output's end.
    log "latency: $system, $parts partitions, priming at $rate/s for ${LATENCY_PRIME:-20} s"
    "${loadgen[@]}" generate --topic "lat-in-$run" --rate "$rate" --seconds "${LATENCY_PRIME:-20}" >/dev/null
    drain "lat-in-$run" "p-$run" >/dev/null
    from_end=(--from-end)
  fi
  local ready="$EXACTLY_KAFKA_DIR/check.ready"
  rm -f "$ready"
  "${loadgen[@]}" check --topic "lat-out-$run" --warmup-seconds "$warmup" --idle-seconds 10 \
    --ready-file "$ready" "${from_end[@]}" >"$EXACTLY_KAFKA_DIR/check.json" &
  local checker=$!
  # The load starts once the checker holds its start offsets (read one partition at a time).
  for _ in $(seq 1 600); do [ -e "$ready" ] && break; sleep 0.1; done
  log "latency: $system, $parts partitions at $rate/s for $seconds s (the first $warmup s not measured)"
  local since gen own='{}'
  since=$(broker_cpu)
  gen=$("${loadgen[@]}" generate --topic "lat-in-$run" --rate "$rate" --seconds "$seconds")
  gen=$(with_broker_cpu "$gen" "$since")
  wait "$checker"
  if [ "$system" = exactly ]; then own=$(with_transactions '{}'); fi
  stop
  record latency "$system" "$parts" "{\"rate\":$rate,\"generator\":$gen,\"checker\":$(cat "$EXACTLY_KAFKA_DIR/check.json"),\"exactly\":$own}"
}

if [ "${LATENCY:-1}" = 1 ]; then
  rate=${LATENCY_RATE:-$(python3 - "$out" <<'PY'
import json, sys
# Half the slower of exactly's drains at 6 and 1,000 partitions: a load both keep up with.
rates = [json.loads(l)["result"].get("records_per_second") for l in open(sys.argv[1])
         if '"drain"' in l and '"exactly"' in l and ('"partitions":6,' in l or '"partitions":1000,' in l)]
rates = [r for r in rates if r]
print(int(min(rates) / 2) if rates else 20000)
PY
)}
  seconds=${LATENCY_SECONDS:-40} warmup=${LATENCY_WARMUP:-10}
  for parts in ${LATENCY_PARTS:-6 1000}; do
    for system in ${LATENCY_SYSTEMS:-exactly}; do
      latency "$system" "$parts"
    done
  done
fi

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def get(kind, system, parts):
    for r in rows:
        if (r["kind"], r["system"], r["partitions"]) == (kind, system, parts):
            return r["result"]
six = (get("drain", "exactly", 6) or {}).get("records_per_second")
print("| partitions | exactly records/s | ÷ its 6-partition figure | peak RSS MB | Kafka Streams records/s | its peak RSS MB | exactly ÷ Kafka Streams |")
print("|---:|---:|---:|---:|---:|---:|---:|")
def cell(v, row=None, f="{:,.0f}"):
    if v is not None:
        return f.format(v)
    return "failed" if row and row.get("failed") else "–"
for parts in sorted({r["partitions"] for r in rows if r["kind"] == "drain"}):
    e, k = get("drain", "exactly", parts) or {}, get("drain", "kstreams", parts) or {}
    er, kr = e.get("records_per_second"), k.get("records_per_second")
    rss = lambda r: r["peak_rss_kb"] / 1024 if "peak_rss_kb" in r else None
    print(f"| {parts:,} | {cell(er, e)} | {cell(er / six if er and six else None, e, '{:.2f}')} | "
          f"{cell(rss(e), e)} | {cell(kr, k)} | {cell(rss(k), k)} | "
          f"{cell(er / kr if er and kr else None, None, '{:.2f}')} |")
print("\n| partitions | exactly's transactions | mean commit ms (offsets, flush, EndTxn) | mean records per transaction |")
print("|---:|---:|---:|---:|")
for parts in sorted({r["partitions"] for r in rows if r["kind"] == "drain"}):
    e = get("drain", "exactly", parts) or {}
    if "transactions" in e:
        print(f"| {parts:,} | {e['transactions']:,.0f} | {e['commit_ms_mean']:.1f} | {e['records_per_transaction']:,.0f} |")
busy, quiet = get("busy", "exactly", 1000), get("drain", "exactly", 1000)
if busy and quiet and busy.get("records_per_second") and quiet.get("records_per_second"):
    print(f"\n1,000 partitions with one core busy: {busy['records_per_second']:,.0f} records/s, "
          f"{busy['records_per_second'] / quiet['records_per_second']:.2f} of the quiet figure")
for r in rows:
    if r["kind"] == "latency" and "checker" in r["result"]:
        lat, c = r["result"], r["result"]["checker"]
        print(f"latency, {r['system']} at {r['partitions']:,} partitions, {lat['rate']:,}/s: p50 {c.get('p50_ms')} ms, "
              f"p99 {c.get('p99_ms')} ms, missing {c.get('missing_below_max')}, duplicates {c.get('duplicates')}")
PY

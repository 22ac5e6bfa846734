#!/usr/bin/env bash
# Where the time goes at N partitions (issue 29 §1), on a broker of its own: one preload of
# ~100 B records, then one exactly drain (exactly-once, 100 ms commits unless the flags say
# otherwise) per setting given. Each prints one JSON line: records/s, exactly's and the
# broker's CPU seconds, the transactions with the commit's phases (mean ms per blocking call:
# send_offsets_to_transaction, flush, commit_transaction). Every drain reads the same input
# under a new group; OUT_SAME=1 writes every drain into the first one's output topic (written
# once already, as a running sidecar's is), else each into a topic just created. exactly runs
# with its shipped producer defaults (librdkafka's batch.size of 1 MB; bench/partitions.sh
# sets 256 KB, as the other comparisons do).
#
#   bench/probe.sh PARTITIONS 'label|exactly flags' ...     (COUNT=1000000, OUT_SAME=)
#   bench/probe.sh 1000 'first|' 'base|' 'ci300|--commit-interval 300ms'
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
parts=$1
shift
# shellcheck source=bench/lib.sh
source bench/lib.sh
log() { echo "probe: $*" >&2; }
# shellcheck source=bench/partitions-lib.sh
source bench/partitions-lib.sh
cargo build -q --release -p exactly
bin="$repo/target/release/exactly"
pid=
trap '[ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
  scripts/kafka.sh stop >&2 || true' EXIT
mktopic in "$parts"
"${loadgen[@]}" preload --topic in --count "${COUNT:-1000000}" --size 100 >/dev/null
n=0
for spec in "$@"; do
  label=${spec%%|*} flags=${spec#*|} n=$((n + 1)) output=out$n
  if [[ "$spec" != *"|"* ]]; then flags=; fi
  if [ -n "${OUT_SAME:-}" ]; then output=out1; fi
  if [ "$output" = "out$n" ]; then mktopic "$output" "$parts"; fi
  interval=(--commit-interval 100ms)
  if [[ "$flags" == *--commit-interval* ]]; then interval=(); fi
  # shellcheck disable=SC2086 # the flags are words
  "$bin" run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "$output" \
    --group-id "g$n" --instance-id "g$n" --on-error skip --log-level warn \
    --http-addr "127.0.0.1:$metrics_port" "${interval[@]}" $flags \
    2>>"$EXACTLY_KAFKA_DIR/sut.log" &
  pid=$!
  since=$(broker_cpu)
  result=$("${loadgen[@]}" drain --topic in --group "g$n" --pid "$pid" --timeout-seconds 600 \
    2>>"$EXACTLY_KAFKA_DIR/sut.log" || echo '{"failed":"the drain failed or timed out (sut.log)"}')
  result=$(with_transactions "$(with_broker_cpu "$result" "$since")")
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  pid=
  python3 -c 'import json, sys; r = json.loads(sys.argv[2]); r["label"] = sys.argv[1]; print(json.dumps(r))' \
    "$label" "$result"
done

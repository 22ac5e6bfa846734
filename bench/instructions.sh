#!/usr/bin/env bash
# Instructions of one whole exactly drain under callgrind (every thread, start-up included),
# per binary: a measure that does not move with the machine's load, for a change's note.
# callgrind runs the threads one at a time, so the drain is slow (200,000 records: ~30 s a
# binary); compare binaries on the same count.
#
#   bench/instructions.sh RECORDS BINARY...
#
# With CALL_DELAY_MS set, the records go through the call-out (bench/call.sh's application,
# answering after that many ms, 500 records a call); with JQ=1, through the jq enrichment
# (`$jq_program`, bench/lib.sh).
#
# Then e.g. callgrind_annotate --inclusive=yes /tmp/exactly-instructions-1.out | head -40
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
[ $# -ge 2 ] || { echo "usage: bench/instructions.sh RECORDS BINARY..." >&2; exit 2; }
count=$1
shift
# shellcheck source=bench/lib.sh
source bench/lib.sh
topic in
"${loadgen[@]}" preload --topic in --count "$count" --size 100 >/dev/null
call=()
if [ -n "${CALL_DELAY_MS:-}" ]; then
  start_app "$CALL_DELAY_MS"
  call=(--call-url "http://127.0.0.1:$app_port/" --call-batch-records 500)
fi
if [ "${JQ:-0}" = 1 ]; then call+=(--jq "$jq_program"); fi
run=0
for bin in "$@"; do
  run=$((run + 1))
  topic "out-$run"
  valgrind --tool=callgrind --callgrind-out-file=/tmp/exactly-instructions-$run.out "$bin" run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "out-$run" --group-id "c-$run" --instance-id "c-$run" --on-error skip --log-level warn --http-addr off "${call[@]}" 2>/tmp/exactly-instructions-$run.log &
  pid=$!
  "${loadgen[@]}" drain --topic in --group "c-$run" --pid "$pid" >/dev/null
  kill -TERM "$pid"
  wait "$pid" || true
  echo "$bin: $(grep -h 'Collected' /tmp/exactly-instructions-$run.log | tail -1)"
done

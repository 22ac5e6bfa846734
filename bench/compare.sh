#!/usr/bin/env bash
# Before/after on the per-record path, for a change's note: two exactly binaries drain the same
# preloaded input (~100 B records), exactly-once at the default 100 ms commit interval,
# passthrough and the jq enrichment, alternating A B A B so drift hits both alike.
#
#   bench/compare.sh OLD_BINARY NEW_BINARY [records]     (default 1,000,000)
#
# Build the old one from a worktree, e.g.
#   git worktree add /tmp/old <commit> && CARGO_TARGET_DIR=/tmp/old-target \
#     cargo build --release --manifest-path /tmp/old/Cargo.toml -p exactly
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
[ $# -ge 2 ] || { echo "usage: bench/compare.sh OLD_BINARY NEW_BINARY [records]" >&2; exit 2; }
bins=("$1" "$2")
count=${3:-1000000}

# shellcheck source=bench/lib.sh
source bench/lib.sh

topic in
"${loadgen[@]}" preload --topic in --count "$count" --size 100 >/dev/null
run=0
for rep in 1 2; do
  for transform in passthrough jq; do
    for which in 0 1; do
      run=$((run + 1))
      topic "out-$run"
      args=(run --bootstrap-servers "$bootstrap" --input-topics in --output-topic "out-$run"
        --group-id "cmp-$run" --instance-id "cmp-$run" --on-error skip --log-level warn
        --http-addr off --producer-config linger.ms=5 --producer-config batch.size=262144)
      if [ "$transform" = jq ]; then args+=(--jq "$jq_program"); fi
      "${bins[$which]}" "${args[@]}" 2>>"$EXACTLY_KAFKA_DIR/sut.log" &
      pid=$!
      result=$("${loadgen[@]}" drain --topic in --group "cmp-$run" --pid "$pid")
      kill -TERM "$pid"; wait "$pid" || true
      rps=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(int(r["records_per_second"]), round(r["cpu_seconds_per_million"], 2), r["peak_rss_kb"] // 1024)' "$result")
      echo "compare: $([ "$which" = 0 ] && echo old || echo new) $transform rep $rep: records/s, CPU s per million, peak RSS MB = $rps"
    done
  done
done

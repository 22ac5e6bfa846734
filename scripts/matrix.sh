#!/usr/bin/env bash
# The broker matrix: the core exactly-once tests against each Apache Kafka release users run,
# each on a single-node broker of its own from Maven Central's jars, under each group protocol
# the release serves; then a table for docs/operating.md. Not part of CI (about 6 minutes a row).
#
#   scripts/matrix.sh                    3.9.2, 4.1.1 and 4.4.0
#   scripts/matrix.sh 4.4.0 ...          those releases
#
# The core tests: tests/exactly_once.rs, tests/lifecycle.rs, tests/dlq.rs, and the fault
# scenarios kill -9, zombie and broker restart (reduced profile). The consumer protocol
# (KIP-848) rows run only on 4.x: 3.9 ships it as an early-access preview, off by default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.9.2 4.1.1 4.4.0)
results=$PWD/target/matrix.tsv
mkdir -p target
: >"$results"
cargo build --tests --quiet
for version in "${versions[@]}"; do
  protocols=(classic)
  case "$version" in 3.*) ;; *) protocols+=(consumer) ;; esac
  for protocol in "${protocols[@]}"; do
    export EXACTLY_KAFKA_VERSION=$version EXACTLY_KAFKA_DIR=$PWD/.kafka-matrix-$version
    export EXACTLY_TEST_GROUP_PROTOCOL=$protocol EXACTLY_FAULT_PROFILE=reduced
    log=$PWD/target/matrix-$version-$protocol.log
    echo "matrix.sh: Apache Kafka $version, group protocol $protocol (log: $log)"
    started=$SECONDS
    outcome=passed
    if ! scripts/kafka.sh start >"$log" 2>&1; then
      outcome="broker did not start"
    else
      EXACTLY_TEST_BOOTSTRAP=$(scripts/kafka.sh bootstrap)
      export EXACTLY_TEST_BOOTSTRAP
      cargo test --test exactly_once --test lifecycle --test dlq >>"$log" 2>&1 || outcome=failed
      cargo test --test faults -- --test-threads 1 kill_9_repeatedly zombie_is_fenced \
        broker_kill_and_restart >>"$log" 2>&1 || outcome=failed
    fi
    scripts/kafka.sh stop >>"$log" 2>&1 || true
    passed=$({ grep -Eo '[0-9]+ passed' "$log" || true; } | awk '{s += $1} END {print s + 0}')
    failed=$({ grep -Eo '[0-9]+ failed' "$log" || true; } | awk '{s += $1} END {print s + 0}')
    failures=$(grep -E '^    [a-z_0-9:]+$' "$log" | sed 's/^ *//' | paste -sd, - || true)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$version" "$protocol" "$outcome" "$passed" \
      "$failed" "$((SECONDS - started))" "${failures:-}" >>"$results"
  done
done
echo
echo "| Apache Kafka | group protocol | result | tests passed | failed | minutes | failing tests |"
echo "|---|---|---|---|---|---|---|"
while IFS=$'\t' read -r version protocol outcome passed failed secs failures; do
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$version" "$protocol" "$outcome" "$passed" \
    "$failed" "$(awk -v s="$secs" 'BEGIN { printf "%.1f", s / 60 }')" "${failures:-–}"
done <"$results"

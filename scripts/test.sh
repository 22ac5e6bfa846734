#!/usr/bin/env bash
# The test command: starts the local Kafka broker (scripts/kafka.sh), runs every test against
# it, and stops the broker again if this script started it. Extra arguments go to cargo test,
# e.g. scripts/test.sh --test exactly_once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=0
if ! scripts/kafka.sh status; then
  scripts/kafka.sh start
  started=1
fi
stop() { if [ "$started" = 1 ]; then scripts/kafka.sh stop; fi; }
trap stop EXIT

EXACTLY_TEST_BOOTSTRAP=$(scripts/kafka.sh bootstrap)
export EXACTLY_TEST_BOOTSTRAP
echo "test.sh: broker at $EXACTLY_TEST_BOOTSTRAP"
cargo test --all-targets "$@"

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
# Redis and MariaDB for the offset stores (tests/offsets.rs), data under a temp dir.
stores=$(mktemp -d "${TMPDIR:-/tmp}/exactly-stores.XXXXXX")
stop() {
  scripts/stores.sh stop "$stores" || true
  rm -rf "$stores"
  if [ "$started" = 1 ]; then scripts/kafka.sh stop; fi
}
trap stop EXIT
eval "$(scripts/stores.sh start "$stores")"

# promtool, prometheus, hadolint, docker compose (installed when missing).
eval "$(scripts/tools.sh)"

EXACTLY_TEST_BOOTSTRAP=$(scripts/kafka.sh bootstrap)
export EXACTLY_TEST_BOOTSTRAP
echo "test.sh: broker at $EXACTLY_TEST_BOOTSTRAP"
# No arguments: every test. With arguments (e.g. --test exactly_once): only those.
if [ $# -eq 0 ]; then set -- --all-targets; fi
cargo test "$@"

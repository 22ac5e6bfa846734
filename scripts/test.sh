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
if [ $# -eq 0 ]; then
  cargo test --all-targets
  # The README's first command, as a new user runs it: exit 0 and no error from bash.
  echo "test.sh: scripts/demo.sh"
  demo_log=$(mktemp)
  scripts/demo.sh >"$demo_log" 2>&1 || { tail -40 "$demo_log"; echo "test.sh: the demo failed"; exit 1; }
  if grep -E "^scripts/demo.sh: line [0-9]+:|^tail: |syntax error" "$demo_log"; then
    echo "test.sh: the demo printed errors"; exit 1
  fi
  today=$(date -u +%F)
  grep -q "\"day\":\"$today\"" "$demo_log" || { echo "test.sh: the demo's orders are not from today"; exit 1; }
  rm -f "$demo_log"
else
  cargo test "$@"
fi

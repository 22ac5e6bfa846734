#!/usr/bin/env bash
# The test command: installs what a fresh Debian machine lacks (scripts/setup.sh test), starts
# the local Kafka broker (scripts/kafka.sh), the offset stores and a Docker engine, runs every
# test against them, and stops what it started. Extra arguments go to cargo test, e.g.
# scripts/test.sh --test exactly_once, or scripts/test.sh --test image -- --ignored.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh test
started=0
if ! scripts/kafka.sh status; then
  scripts/kafka.sh start
  started=1
fi
# Redis and MariaDB for the offset stores (tests/offsets.rs), PostgreSQL for the database
# sink (tests/postgres.rs), data under a temp dir.
stores=$(mktemp -d "${TMPDIR:-/tmp}/exactly-stores.XXXXXX")
stop() {
  if [ "${EXACTLY_DOCKERD_STARTED:-0}" = 1 ]; then scripts/docker.sh stop || true; fi
  scripts/stores.sh stop "$stores" || true
  rm -rf "$stores"
  if [ "$started" = 1 ]; then scripts/kafka.sh stop; fi
}
trap stop EXIT
eval "$(scripts/stores.sh start "$stores")"

# promtool, prometheus, hadolint, docker compose (installed when missing).
eval "$(scripts/tools.sh)"

# A Docker engine for the image test (tests/image.rs, ignored by plain cargo test). Where none
# can run, the test is skipped by name; with EXACTLY_REQUIRE_DOCKER=1 (CI sets it: its machines
# can run one) that is a failure.
image_test=tests/image.rs::the_image_runs_exactly_once_healthy_as_uid_10001_and_stops_cleanly
docker=0
if [ $# -gt 0 ] && [[ " $* " != *" image "* ]]; then
  : # a selection without the image test: no engine needed
elif docker_env=$(scripts/docker.sh start); then
  eval "$docker_env"
  docker=1
else
  if [ "${EXACTLY_REQUIRE_DOCKER:-0}" = 1 ]; then
    echo "test.sh: EXACTLY_REQUIRE_DOCKER=1 and no Docker engine started"
    exit 1
  fi
fi

EXACTLY_TEST_BOOTSTRAP=$(scripts/kafka.sh bootstrap)
# The secured listeners, users and certificates (tests/secure.rs).
EXACTLY_TEST_SECURITY=$(scripts/kafka.sh security)
export EXACTLY_TEST_BOOTSTRAP EXACTLY_TEST_SECURITY
echo "test.sh: broker at $EXACTLY_TEST_BOOTSTRAP"
# No arguments: every test. With arguments (e.g. --test exactly_once): only those.
if [ $# -eq 0 ]; then
  cargo test --all-targets
  if [ "$docker" = 1 ]; then
    echo "test.sh: the image test (docker build, then the container against the broker)"
    cargo test --test image -- --ignored
  else
    echo "test.sh: SKIPPED $image_test (no Docker engine, see above)"
  fi
  # One scenario of the three-broker cluster (scripts/faults.sh cluster runs them all): the
  # transaction coordinator killed during commits, once with exactly killed while it is down.
  echo "test.sh: the three-broker cluster (scripts/cluster.sh), one fault scenario"
  EXACTLY_CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/exactly-cluster.XXXXXX")
  export EXACTLY_CLUSTER_DIR
  cluster_stop() { scripts/cluster.sh reset || true; stop; }
  trap cluster_stop EXIT
  scripts/cluster.sh start
  EXACTLY_TEST_BOOTSTRAP=$(scripts/cluster.sh bootstrap) EXACTLY_TEST_CLUSTER=$EXACTLY_CLUSTER_DIR \
    EXACTLY_TEST_REPLICATION=3 EXACTLY_TEST_GROUP_PROTOCOL=${EXACTLY_CI_GROUP_PROTOCOL:-consumer} \
    cargo test --test faults -- --ignored --exact cluster_transaction_coordinator_killed
  scripts/cluster.sh reset
  trap stop EXIT
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

#!/usr/bin/env bash
# The fault-injection suite (tests/faults.rs) with a profile, against a broker of its own (the
# suite kills and restarts its broker), then a table of the figures for RELIABILITY.md.
#
#   scripts/faults.sh            full profile: 100,000 records a scenario (about 32 minutes)
#   scripts/faults.sh reduced    what CI runs as part of scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=${1:-full}
export EXACTLY_KAFKA_DIR=${EXACTLY_KAFKA_DIR:-$PWD/.kafka-faults}
scripts/kafka.sh start
trap 'scripts/kafka.sh stop' EXIT
EXACTLY_TEST_BOOTSTRAP=$(scripts/kafka.sh bootstrap)
report=$PWD/target/faults-$profile.jsonl
export EXACTLY_TEST_BOOTSTRAP EXACTLY_FAULT_PROFILE=$profile EXACTLY_FAULT_REPORT=$report
mkdir -p target
rm -f "$report"
started=$(date -u +%FT%TZ)
cargo test --test faults -- --test-threads 1 --nocapture
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)
python3 - "$report" "$profile" "$version" "$started" <<'PY'
import json, sys
path, profile, version, started = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
print(f"\nProfile `{profile}`, Apache Kafka {version} (KRaft, one node), started {started}, "
      f"command `scripts/faults.sh {profile}`.\n")
print("| scenario | records | outputs | DLQ | faults injected | aborted records (read_uncommitted only) "
      "| aborts logged | producer recreations | rebalance events | anomalies | longest recovery | settled after last fault |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    faults = ", ".join(f"{k} ×{v}" for k, v in r["faults"].items()) or "random aborts only"
    rejected = r.get("rejected_by_broker") or 0
    dlq = f"{r['dlq']:,}" + (f" ({rejected:,} rejected by the broker)" if rejected else "")
    print(f"| {r['scenario']} | {r['records']:,} | {r['outputs']:,} | {dlq} | {faults} | "
          f"{r['aborted_records']:,} | {r['aborts_logged']} | {r['producer_recreations']} | "
          f"{r['rebalance_events']} | {r['anomalies']} | {r['longest_recovery_s']:.1f} s | "
          f"{r['settled_after_last_fault_s']:.1f} s |")
PY

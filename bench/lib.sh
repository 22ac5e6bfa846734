# Shared by bench/compare.sh, bench/sweep.sh, bench/latency.sh, bench/partitions.sh and
# bench/probe.sh (sourced from the repo root, with $repo set): a fresh broker of the benchmark's
# own, stopped on exit; $bootstrap; the loadgen command in $loadgen; topic NAME (6 partitions, or
# $SWEEP_PARTITIONS, which every script sourcing this file honours); start_app DELAY_MS (the
# call-out's application, stopped on exit: $app, $app_port); and the jq enrichment of bench/run.sh.
jq_program='.dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)'

export EXACTLY_KAFKA_DIR="$repo/.kafka-bench"
scripts/kafka.sh reset >/dev/null 2>&1 || true
scripts/kafka.sh start >&2
app=
trap '[ -z "$app" ] || kill "$app" 2>/dev/null || true; scripts/kafka.sh stop >&2 || true' EXIT
bootstrap=$(scripts/kafka.sh bootstrap)
cargo build -q --release -p loadgen
loadgen=("$repo/target/release/loadgen" --bootstrap "$bootstrap")

topic() {
  scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
    --create --topic "$1" --partitions "${SWEEP_PARTITIONS:-6}" --replication-factor 1 >/dev/null
}

# shellcheck source=bench/app.sh
source bench/app.sh

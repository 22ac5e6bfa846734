#!/usr/bin/env bash
# The database sink (issue 25) against Kafka Connect (standalone, connect-runtime) with
# Debezium's JDBC sink connector (at-least-once, upsert mode), into the same PostgreSQL 15 on
# this machine, and against exactly's own Kafka→Kafka exactly-once on the same records.
#
#   bench/database.sh [records]      (default 1,000,000)
#   SYSTEMS="exactly-mysql" bench/database.sh    only some of exactly-postgres,
#                                                connect-debezium-jdbc, exactly-kafka and
#                                                exactly-mysql (exactly into MariaDB: not run
#                                                by default)
#
# The input: Kafka Connect's JSON with schema (a sink connector needs the schema), the payload
# ~200 B of five fields, 6 partitions, preloaded. Each system drains it from the start: exactly
# --db-url (--jq .payload) into a table of its own, Debezium's connector (one task, its
# defaults but for upsert by `seq`) into another of the same DDL, exactly --output-topic
# (--jq .payload). Timed by `loadgen drain` from each group's first commit to the end (the
# database sink copies its offsets to the group; Connect commits its own), with the process's
# CPU seconds and peak RSS. One JSON object per system on stdout; then the rows in each table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
count=${1:-1000000}
systems=${SYSTEMS:-exactly-postgres connect-debezium-jdbc exactly-kafka}
wants() { [[ " $systems " == *" $1 "* ]]; }

# shellcheck source=bench/lib.sh
source bench/lib.sh
stores=$(mktemp -d)
connect_dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; scripts/stores.sh stop "$stores" >&2 || true; scripts/kafka.sh stop >&2 || true; rm -rf "$stores" "$connect_dir"' EXIT
eval "$(scripts/stores.sh start "$stores")"
export EXACTLY_TEST_STORE_PASSWORD
pg_port=${EXACTLY_TEST_POSTGRES_URL##*:}
pg_port=${pg_port%%/*}

cargo build -q --release -p exactly
exactly=$repo/target/release/exactly
peer=bench/peers/connect
if wants connect-debezium-jdbc; then
  mvn -q -B -f "$peer/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory=target/lib >&2
  archive=$peer/target/plugin-archive/debezium-connector-jdbc-3.3.1.Final-plugin.tar.gz
  if [ ! -f "$archive" ]; then
    mvn -q -B dependency:copy -Dtransitive=false \
      -Dartifact=io.debezium:debezium-connector-jdbc:3.3.1.Final:tar.gz:plugin \
      -DoutputDirectory="$peer/target/plugin-archive" >&2
  fi
  mkdir -p "$connect_dir/plugins"
  tar -xzf "$archive" -C "$connect_dir/plugins"
fi

sql() { # statement
  PGPASSWORD=$EXACTLY_TEST_STORE_PASSWORD psql -qAt "$EXACTLY_TEST_POSTGRES_URL" -c "$1"
}
ddl='(seq bigint PRIMARY KEY, ts bigint, us bigint, name text, amount double precision)'
sql "CREATE TABLE bench_exactly $ddl; CREATE TABLE bench_connect $ddl"
mysql_sql() { # statement
  mariadb --no-defaults --socket="$EXACTLY_TEST_MYSQL_SOCKET" -uroot -N offsets -e "$1"
}
mysql_sql "CREATE TABLE bench_exactly (seq BIGINT PRIMARY KEY, ts BIGINT, us BIGINT,
           name TEXT, amount DOUBLE) ENGINE=InnoDB"

topic in
"${loadgen[@]}" preload --topic in --count "$count" --size 200 --connect-schema >&2

drain() { # system group pid
  local result
  result=$("${loadgen[@]}" drain --topic in --group "$2" --pid "$3")
  kill -TERM "$3" 2>/dev/null || true
  wait "$3" 2>/dev/null || true
  python3 -c 'import json,sys; r=json.loads(sys.argv[2]); r["system"]=sys.argv[1]; print(json.dumps(r))' "$1" "$result"
}

# exactly into PostgreSQL, exactly once.
if wants exactly-postgres; then
"$exactly" run --bootstrap-servers "$bootstrap" --input-topics in --group-id bench-db \
  --instance-id bench-db --db-url "$EXACTLY_TEST_POSTGRES_URL" \
  --db-password-env EXACTLY_TEST_STORE_PASSWORD --db-table bench_exactly --jq .payload \
  --log-format json --log-level warn --http-addr off 2>"$stores/exactly-db.log" &
drain exactly-postgres bench-db $!
fi

# exactly into MariaDB, exactly once.
if wants exactly-mysql; then
"$exactly" run --bootstrap-servers "$bootstrap" --input-topics in --group-id bench-my \
  --instance-id bench-my --db-url "$EXACTLY_TEST_MYSQL_URL" \
  --db-password-env EXACTLY_TEST_STORE_PASSWORD --db-table bench_exactly --jq .payload \
  --log-format json --log-level warn --http-addr off 2>"$stores/exactly-my.log" &
drain exactly-mysql bench-my $!
fi

# Kafka Connect standalone with Debezium's JDBC sink, at least once, upsert by seq.
if wants connect-debezium-jdbc; then
cat >"$connect_dir/worker.properties" <<EOF
bootstrap.servers=$bootstrap
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=true
offset.storage.file.filename=$connect_dir/offsets
offset.flush.interval.ms=1000
plugin.path=$connect_dir/plugins
EOF
cat >"$connect_dir/jdbc.properties" <<EOF
name=bench-connect
connector.class=io.debezium.connector.jdbc.JdbcSinkConnector
tasks.max=1
topics=in
connection.url=jdbc:postgresql://127.0.0.1:$pg_port/postgres
connection.username=exactly
connection.password=$EXACTLY_TEST_STORE_PASSWORD
insert.mode=upsert
primary.key.mode=record_value
primary.key.fields=seq
schema.evolution=none
collection.name.format=bench_connect
EOF
# shellcheck disable=SC2086
java ${CONNECT_HEAP:--Xmx1g} -cp "$repo/$peer/target/lib/*" \
  org.apache.kafka.connect.cli.ConnectStandalone "$connect_dir/worker.properties" \
  "$connect_dir/jdbc.properties" >"$stores/connect.log" 2>&1 &
drain connect-debezium-jdbc connect-bench-connect $!
fi

# exactly Kafka→Kafka, exactly once, on the same records.
if wants exactly-kafka; then
topic out
topic out.dlq
"$exactly" run --bootstrap-servers "$bootstrap" --input-topics in --output-topic out \
  --group-id bench-kafka --instance-id bench-kafka --jq .payload --log-level warn \
  --http-addr off --producer-config linger.ms=5 --producer-config batch.size=262144 \
  2>"$stores/exactly-kafka.log" &
drain exactly-kafka bench-kafka $!
fi

for t in bench_exactly bench_connect; do
  echo "{\"table\": \"$t\", \"rows\": $(sql "SELECT count(*) FROM $t"), \"distinct\": $(sql "SELECT count(DISTINCT seq) FROM $t")}"
done
echo "{\"table\": \"mariadb bench_exactly\", \"rows\": $(mysql_sql "SELECT count(*) FROM bench_exactly"), \"distinct\": $(mysql_sql "SELECT count(DISTINCT seq) FROM bench_exactly")}"

#!/usr/bin/env bash
# The stores the tests use: a real Redis and a real MariaDB (the offset stores the tests import
# from and export to) and a real PostgreSQL 15 (the database sink, docs/database.md), on
# 127.0.0.1 (free ports), their data under DIR, each with a password.
#
#   scripts/stores.sh start DIR    install redis-server and mariadb-server when missing (setup.sh),
#                                  start the three, print `export` lines for the tests:
#                                  EXACTLY_TEST_REDIS_URL, EXACTLY_TEST_MYSQL_URL,
#                                  EXACTLY_TEST_POSTGRES_URL and EXACTLY_TEST_STORE_PASSWORD
#   scripts/stores.sh stop DIR     stop them
#   scripts/stores.sh restart DIR [SECONDS]
#                                  stop PostgreSQL and MariaDB, keep them down SECONDS (0),
#                                  start them again, data and ports kept (a test's database
#                                  restarted under load)
set -euo pipefail
cmd=${1:-}
dir=${2:-}
log() { echo "stores.sh: $*" >&2; }
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: scripts/stores.sh start|stop DIR" >&2; exit 2; }
# Absolute: PostgreSQL's server runs in its own directory.
dir=$(realpath -m "$dir")

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Debian keeps PostgreSQL's server programs off PATH.
PATH=$PATH:/usr/lib/postgresql/15/bin
# PostgreSQL refuses to run as root: as root, its server runs as nobody.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}

stop() {
  if [ -f "$dir/pg/data/postmaster.pid" ]; then
    as_pg pg_ctl -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ -f "$dir/redis.pid" ]; then kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; fi
  if [ -f "$dir/mariadb.pid" ]; then kill "$(cat "$dir/mariadb.pid")" 2>/dev/null || true; fi
  for _ in $(seq 50); do
    alive=0
    for f in "$dir/redis.pid" "$dir/mariadb.pid"; do
      if [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; then alive=1; fi
    done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  rm -f "$dir/redis.pid" "$dir/mariadb.pid"
}

# MariaDB on port $1, data in $dir/mariadb (made already).
start_mariadb() {
  mariadbd --no-defaults --datadir="$dir/mariadb" --user="$(id -un)" --bind-address=127.0.0.1 \
    --port="$1" --socket="$dir/mariadb.sock" --pid-file="$dir/mariadb.pid" \
    --skip-name-resolve --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
    --log-error="$dir/mariadb.log" >/dev/null 2>&1 &
  for _ in $(seq 100); do
    mariadb-admin --no-defaults --socket="$dir/mariadb.sock" -uroot ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  mariadb-admin --no-defaults --socket="$dir/mariadb.sock" -uroot ping >/dev/null \
    || { log "MariaDB did not start: $dir/mariadb.log"; tail -20 "$dir/mariadb.log" >&2; exit 1; }
}

# PostgreSQL on port $1, data in $dir/pg/data (made already).
start_pg() {
  as_pg pg_ctl -D "$dir/pg/data" -l "$dir/pg/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $1 -k '$dir/pg' -c fsync=off" start >/dev/null \
    || { log "PostgreSQL did not start: $dir/pg/server.log"; tail -20 "$dir/pg/server.log" >&2; exit 1; }
}

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  restart)
    as_pg pg_ctl -D "$dir/pg/data" -m fast -w stop >/dev/null
    kill "$(cat "$dir/mariadb.pid")"
    while kill -0 "$(cat "$dir/mariadb.pid" 2>/dev/null)" 2>/dev/null; do sleep 0.1; done
    sleep "${3:-0}"
    start_pg "$(cat "$dir/pg/port")"
    start_mariadb "$(cat "$dir/mariadb.port")"
    exit 0
    ;;
  *) echo "usage: scripts/stores.sh start|stop|restart DIR" >&2; exit 2 ;;
esac

"$(dirname "${BASH_SOURCE[0]}")/setup.sh" stores

mkdir -p "$dir"
password="exactly-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
user=$(id -un)

redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$dir" --save "" --appendonly no \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
  --requirepass "$password" >&2

mysql_port=$(free_port)
rm -rf "$dir/mariadb"
mariadb-install-db --no-defaults --datadir="$dir/mariadb" --user="$user" \
  --auth-root-authentication-method=normal --skip-test-db >"$dir/mariadb-install.log" 2>&1
echo "$mysql_port" >"$dir/mariadb.port"
start_mariadb "$mysql_port"
# The recipe's table, and a user with a password that may use it from 127.0.0.1.
mariadb --no-defaults --socket="$dir/mariadb.sock" -uroot <<SQL
CREATE DATABASE offsets;
CREATE TABLE offsets.kafka_offset (
  group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, partition_id INT NOT NULL,
  fromOffset BIGINT NOT NULL, untilOffset BIGINT NOT NULL,
  PRIMARY KEY (group_id, topic, partition_id));
CREATE USER 'exactly'@'127.0.0.1' IDENTIFIED BY '$password';
GRANT ALL ON offsets.* TO 'exactly'@'127.0.0.1';
SQL
pg_port=$(free_port)
rm -rf "$dir/pg"
mkdir -p "$dir/pg"
printf '%s\n' "$password" >"$dir/pg/password"
if [ "$(id -u)" = 0 ]; then
  # nobody must reach its data directory: DIR is the test's private temp dir.
  chmod o+x "$dir"
  chown -R nobody "$dir/pg"
fi
as_pg initdb -D "$dir/pg/data" -U exactly --pwfile="$dir/pg/password" --auth=scram-sha-256 \
  --no-sync --no-instructions >"$dir/pg/initdb.log" 2>&1 \
  || { log "initdb failed: $dir/pg/initdb.log"; tail -20 "$dir/pg/initdb.log" >&2; exit 1; }
echo "$pg_port" >"$dir/pg/port"
start_pg "$pg_port"
log "Redis on 127.0.0.1:$redis_port, MariaDB on 127.0.0.1:$mysql_port, PostgreSQL on 127.0.0.1:$pg_port (data in $dir)"
echo "export EXACTLY_TEST_REDIS_URL=redis://127.0.0.1:$redis_port/0"
echo "export EXACTLY_TEST_MYSQL_URL=mysql://exactly@127.0.0.1:$mysql_port/offsets"
echo "export EXACTLY_TEST_MYSQL_SOCKET=$dir/mariadb.sock"
echo "export EXACTLY_TEST_POSTGRES_URL=postgres://exactly@127.0.0.1:$pg_port/postgres"
echo "export EXACTLY_TEST_STORE_PASSWORD=$password"

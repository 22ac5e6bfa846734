#!/usr/bin/env bash
# A real, single-node Apache Kafka (KRaft) on 127.0.0.1 for the demo and the tests.
#
#   scripts/kafka.sh fetch      fetch the pinned Kafka jars from Maven Central (cached)
#   scripts/kafka.sh start      format (first time) and start the broker; wait until it serves
#   scripts/kafka.sh stop       stop it (SIGTERM, then SIGKILL after 30 s)
#   scripts/kafka.sh kill       SIGKILL it (fault tests)
#   scripts/kafka.sh status     exit 0 when running and serving
#   scripts/kafka.sh bootstrap  print host:port of the running broker
#   scripts/kafka.sh reset      stop and delete its data
#   scripts/kafka.sh tool CLASS ARGS…  run a Kafka tool from the same jars, e.g.
#       scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand --bootstrap-server … --list
#
# start, stop and fetch are idempotent. Ports are picked free at first start and kept, so a
# restarted broker (fault tests) comes back where clients expect it.
#
# Environment:
#   EXACTLY_KAFKA_DIR    run directory (data, logs, pid, port)   default: <repo>/.kafka
#   EXACTLY_KAFKA_CACHE  jar cache                               default: ~/.cache/exactly
#   EXACTLY_KAFKA_HEAP   JVM heap                                default: 1g
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
pom="$here/kafka/pom.xml"
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
cache=${EXACTLY_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exactly}
jars="$cache/kafka-$version-$(sha256sum "$pom" | cut -c1-12)"
run=${EXACTLY_KAFKA_DIR:-$repo/.kafka}
heap=${EXACTLY_KAFKA_HEAP:-1g}

log() { echo "kafka.sh: $*" >&2; }

fetch() {
  if [ -f "$jars/.complete" ]; then return 0; fi
  log "fetching Apache Kafka $version jars from Maven Central into $jars"
  rm -rf "$jars.tmp"
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$jars.tmp"
  rm -rf "$jars"
  mv "$jars.tmp" "$jars"
  touch "$jars/.complete"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

pid_alive() {
  [ -f "$run/pid" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null
}

serving() {
  pid_alive && [ -f "$run/port" ] &&
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),1)' \
      "$(cat "$run/port")" 2>/dev/null
}

jvm=(java -Xms256m -Xmx"$heap" -XX:+UseG1GC -Djava.awt.headless=true
  -Dorg.slf4j.simpleLogger.defaultLogLevel=info
  -Dorg.slf4j.simpleLogger.showDateTime=true
  -cp "$jars/*")

configure() {
  mkdir -p "$run/data"
  local port cport
  port=$(free_port)
  cport=$(free_port)
  while [ "$cport" = "$port" ]; do cport=$(free_port); done
  cat >"$run/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$run/data
num.partitions=1
auto.create.topics.enable=false
# One node: every internal topic has one replica, and transactions must still work.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
min.insync.replicas=1
default.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests join and leave groups often; do not hold the first rebalance back.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# A broker killed and restarted (fault tests) waits for its old registration to expire.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=3000
# Aborts and kills leave open transactions behind; let the coordinator find them quickly.
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
log.retention.check.interval.ms=60000
EOF
  echo "$port" >"$run/port"
  local cluster
  cluster=$(python3 -c 'import base64,uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')
  "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$run/server.properties" \
    >"$run/format.log" 2>&1 || { cat "$run/format.log" >&2; return 1; }
}

start() {
  if serving; then return 0; fi
  fetch
  if [ ! -f "$run/server.properties" ]; then configure; fi
  log "starting Apache Kafka $version on 127.0.0.1:$(cat "$run/port") (logs: $run/broker.log)"
  local mark
  mark=0
  if [ -f "$run/broker.log" ]; then mark=$(wc -l <"$run/broker.log"); fi
  # Created here, not by the broker's redirection: the wait below reads it at once.
  : >>"$run/broker.log"
  # setsid: the broker must outlive the shell (and the test) that started it.
  setsid "${jvm[@]}" kafka.Kafka "$run/server.properties" \
    >>"$run/broker.log" 2>&1 </dev/null &
  echo $! >"$run/pid"
  local deadline=$((SECONDS + 90))
  # grep without -q reads all its input: an early exit would SIGPIPE tail and, with pipefail,
  # fail the check.
  until tail -n +"$((mark + 1))" "$run/broker.log" | grep -F "Kafka Server started" >/dev/null &&
    serving; do
    if ! pid_alive; then
      tail -40 "$run/broker.log" >&2
      log "broker exited during start-up"
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -40 "$run/broker.log" >&2
      log "broker not ready after 90 s"
      return 1
    fi
    sleep 0.5
  done
  log "ready: bootstrap 127.0.0.1:$(cat "$run/port")"
}

stop() {
  pid_alive || { rm -f "$run/pid"; return 0; }
  local pid
  pid=$(cat "$run/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$run/pid"; log "stopped"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$run/pid"
  log "killed after 30 s"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  kill)
    if pid_alive; then kill -KILL "$(cat "$run/pid")"; fi
    # A SIGKILLed JVM is gone at once, but wait for the port to close all the same.
    while serving; do sleep 0.1; done
    rm -f "$run/pid"
    ;;
  status) serving ;;
  bootstrap)
    serving || { log "not running (scripts/kafka.sh start)"; exit 1; }
    echo "127.0.0.1:$(cat "$run/port")"
    ;;
  tool)
    shift
    fetch
    exec "${jvm[@]}" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn "$@"
    ;;
  reset)
    stop
    rm -rf "$run"
    ;;
  *)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

#!/usr/bin/env bash
# A real three-broker Apache Kafka cluster (KRaft) on 127.0.0.1, set up as a production cluster
# is for transactions, for the cluster fault scenarios (scripts/faults.sh cluster) and the
# broker matrix (scripts/matrix.sh).
#
#   scripts/cluster.sh start          format (first time) and start every node; wait until served
#   scripts/cluster.sh heal           resume paused nodes, start stopped ones; wait until served
#   scripts/cluster.sh stop           stop every node (SIGTERM: brokers first, then the controller)
#   scripts/cluster.sh bootstrap      print the three brokers' host:port, comma-separated
#   scripts/cluster.sh status         exit 0 when every node runs and serves
#   scripts/cluster.sh kill N         SIGKILL broker N (1, 2 or 3)
#   scripts/cluster.sh stop-node N    SIGTERM broker N (a controlled shutdown: its leaderships
#                                     move first) and wait for it to exit
#   scripts/cluster.sh start-node N   start broker N again and wait until it serves
#   scripts/cluster.sh pause N        SIGSTOP broker N (slow, not dead: its connections stay open)
#   scripts/cluster.sh resume N       SIGCONT broker N
#   scripts/cluster.sh reset          stop and delete the data
#   scripts/cluster.sh tool CLASS ARGS…   a Kafka tool from the same jars (scripts/kafka.sh tool)
#
# Four JVMs: brokers 1, 2 and 3 (node.id 1–3) and one dedicated KRaft controller (node.id 9), as
# production clusters run them. With the controller apart, two brokers down is what it says —
# fewer in-sync replicas than min.insync.replicas — and not also a lost controller quorum.
# Every topic, internal ones too, has three replicas and needs two in sync
# (min.insync.replicas=2, transaction.state.log.min.isr=2); no unclean leader election.
#
# Environment:
#   EXACTLY_CLUSTER_DIR    run directory                       default: <repo>/.kafka-cluster
#   EXACTLY_CLUSTER_HEAP   each JVM's heap                     default: 256m
#   EXACTLY_KAFKA_VERSION  the Apache Kafka release (scripts/kafka.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
run=${EXACTLY_CLUSTER_DIR:-$repo/.kafka-cluster}
heap=${EXACTLY_CLUSTER_HEAP:-256m}
brokers=(1 2 3)
controller=9

log() { echo "cluster.sh: $*" >&2; }

jars() { "$here/kafka.sh" jars; }
version() { "$here/kafka.sh" version; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The node's directory: n1, n2, n3, n9.
dir() { echo "$run/n$1"; }

pid_alive() {
  local d
  d=$(dir "$1")
  [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null
}

listening() {
  python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),1)' \
    "$(cat "$(dir "$1")/port")" 2>/dev/null
}

serving() { pid_alive "$1" && listening "$1"; }

# The JVM command line, set by init_jvm (the jars fetched first).
jvm=()
init_jvm() {
  [ ${#jvm[@]} -eq 0 ] || return 0
  local j
  j=$(jars)
  jvm=(java -Xms64m -Xmx"$heap" -XX:+UseG1GC -Djava.awt.headless=true
    -Dorg.slf4j.simpleLogger.defaultLogLevel=info -Dorg.slf4j.simpleLogger.showDateTime=true
    -cp "$j/*")
}

# The settings every node shares.
common() {
  cat <<EOF
controller.quorum.voters=$controller@127.0.0.1:$(cat "$(dir $controller)/port")
controller.listener.names=CONTROLLER
# A broker killed and restarted waits for its old registration to expire; a paused one is
# fenced after this long without heartbeats.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=3000
log.retention.check.interval.ms=60000
EOF
}

configure() {
  mkdir -p "$run"
  local n port ports=()
  # Ports are picked free once and kept: a restarted broker comes back where clients expect.
  for n in "${brokers[@]}" $controller; do
    mkdir -p "$(dir "$n")/data"
    port=$(free_port)
    while printf '%s\n' "${ports[@]}" | grep -qx "$port"; do port=$(free_port); done
    ports+=("$port")
    echo "$port" >"$(dir "$n")/port"
  done
  {
    echo "process.roles=controller"
    echo "node.id=$controller"
    echo "listeners=CONTROLLER://127.0.0.1:$(cat "$(dir $controller)/port")"
    echo "log.dirs=$(dir $controller)/data"
    common
  } >"$(dir $controller)/server.properties"
  for n in "${brokers[@]}"; do
    port=$(cat "$(dir "$n")/port")
    {
      echo "process.roles=broker"
      echo "node.id=$n"
      echo "listeners=PLAINTEXT://127.0.0.1:$port"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port"
      echo "inter.broker.listener.name=PLAINTEXT"
      echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
      echo "log.dirs=$(dir "$n")/data"
      common
      cat <<'EOF'
num.partitions=1
auto.create.topics.enable=false
# What a production cluster sets for transactions: three replicas of everything, two in sync
# for a write to count, and never a leader from outside the in-sync replicas.
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
# Tests join and leave groups often; do not hold the first rebalance back.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# The consumer group protocol (KIP-848): the session timeout and heartbeat are the broker's.
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=500
# Aborts and kills leave open transactions behind; let the coordinator find them quickly.
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
EOF
    } >"$(dir "$n")/server.properties"
  done
  local cluster
  cluster=$("$here/kafka.sh" cluster-id)
  for n in "${brokers[@]}" $controller; do
    init_jvm
    "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$(dir "$n")/server.properties" \
      >"$(dir "$n")/format.log" 2>&1 || { cat "$(dir "$n")/format.log" >&2; return 1; }
  done
  version >"$run/version"
}

# start_node N: start node N unless it serves; wait until it does.
start_node() {
  local n=$1 d mark
  d=$(dir "$n")
  if serving "$n"; then return 0; fi
  mark=0
  if [ -f "$d/node.log" ]; then mark=$(wc -l <"$d/node.log"); fi
  : >>"$d/node.log"
  # setsid: the node must outlive the shell (and the test) that started it.
  init_jvm
  setsid "${jvm[@]}" kafka.Kafka "$d/server.properties" >>"$d/node.log" 2>&1 </dev/null &
  echo $! >"$d/pid"
  echo "$mark" >"$d/mark"
}

wait_node() {
  local n=$1 d mark deadline=$((SECONDS + 120))
  d=$(dir "$n")
  mark=$(cat "$d/mark" 2>/dev/null || echo 0)
  # A broker logs "Kafka Server started", a controller "Kafka Server started" too (4.x) or
  # "KafkaRaftServer ... started": the port answering is what counts for a controller.
  until { [ "$n" = $controller ] || tail -n +"$((mark + 1))" "$d/node.log" |
    grep -F "Kafka Server started" >/dev/null; } && serving "$n"; do
    if ! pid_alive "$n"; then
      tail -40 "$d/node.log" >&2
      log "node $n exited during start-up"
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -40 "$d/node.log" >&2
      log "node $n not ready after 120 s"
      return 1
    fi
    sleep 0.5
  done
}

start() {
  "$here/kafka.sh" fetch
  if [ -f "$run/version" ] && [ "$(cat "$run/version")" != "$(version)" ]; then
    log "$run was formatted by another Kafka version: formatting it again"
    reset
  fi
  if [ ! -f "$run/version" ]; then
    rm -rf "$run"
    configure
  fi
  log "starting Apache Kafka $(version): controller $controller and brokers ${brokers[*]} (logs: $run/n*/node.log)"
  local n
  for n in $controller "${brokers[@]}"; do start_node "$n"; done
  for n in $controller "${brokers[@]}"; do wait_node "$n"; done
  log "ready: bootstrap $(bootstrap)"
}

# stop_node N: SIGTERM (a broker's controlled shutdown), SIGKILL after 60 s.
stop_node() {
  local n=$1 pid d
  d=$(dir "$n")
  pid_alive "$n" || { rm -f "$d/pid"; return 0; }
  pid=$(cat "$d/pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$d/pid"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$d/pid"
  log "node $n killed after 60 s"
}

stop() {
  local n
  [ -d "$run" ] || return 0
  for n in "${brokers[@]}"; do stop_node "$n" & done
  wait
  stop_node $controller
  log "stopped"
}

reset() {
  stop
  rm -rf "$run"
}

bootstrap() {
  local n out=()
  for n in "${brokers[@]}"; do out+=("127.0.0.1:$(cat "$(dir "$n")/port")"); done
  (IFS=,; echo "${out[*]}")
}

broker() {
  case "${1:-}" in
    1 | 2 | 3) echo "$1" ;;
    *) log "no broker '${1:-}' (1, 2 or 3)"; exit 2 ;;
  esac
}

case "${1:-}" in
  start) start ;;
  heal)
    # Whatever an earlier scenario left behind: paused nodes resumed, stopped ones started.
    for n in $controller "${brokers[@]}"; do
      if pid_alive "$n"; then kill -CONT "$(cat "$(dir "$n")/pid")"; fi
    done
    for n in $controller "${brokers[@]}"; do start_node "$n"; done
    for n in $controller "${brokers[@]}"; do wait_node "$n"; done
    ;;
  stop) stop ;;
  reset) reset ;;
  status)
    for n in $controller "${brokers[@]}"; do serving "$n" || exit 1; done
    ;;
  bootstrap)
    [ -f "$run/version" ] || { log "not set up (scripts/cluster.sh start)"; exit 1; }
    bootstrap
    ;;
  kill)
    n=$(broker "${2:-}")
    if pid_alive "$n"; then kill -KILL "$(cat "$(dir "$n")/pid")"; fi
    while listening "$n"; do sleep 0.1; done
    rm -f "$(dir "$n")/pid"
    ;;
  stop-node) stop_node "$(broker "${2:-}")" ;;
  start-node)
    n=$(broker "${2:-}")
    start_node "$n"
    wait_node "$n"
    ;;
  pause) n=$(broker "${2:-}") && kill -STOP "$(cat "$(dir "$n")/pid")" ;;
  resume) n=$(broker "${2:-}") && kill -CONT "$(cat "$(dir "$n")/pid")" ;;
  tool)
    shift
    exec "$here/kafka.sh" tool "$@"
    ;;
  *)
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

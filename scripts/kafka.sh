#!/usr/bin/env bash
# A real, single-node Apache Kafka (KRaft) on 127.0.0.1 for the demo and the tests.
#
#   scripts/kafka.sh fetch      fetch the pinned Kafka jars from Maven Central (cached)
#   scripts/kafka.sh start      format (first time) and start the broker; wait until it serves
#   scripts/kafka.sh stop       stop it (SIGTERM, then SIGKILL after 30 s)
#   scripts/kafka.sh kill       SIGKILL it (fault tests)
#   scripts/kafka.sh status     exit 0 when running and serving
#   scripts/kafka.sh bootstrap  print host:port of the running broker (PLAINTEXT)
#   scripts/kafka.sh security   print the path of security.json: the secured listeners, their
#                               users, passwords and certificates (tests/secure.rs)
#   scripts/kafka.sh reset      stop and delete its data
#   scripts/kafka.sh jars       fetch the jars and print their directory (scripts/cluster.sh)
#   scripts/kafka.sh version    print the Kafka version in use
#   scripts/kafka.sh cluster-id print a new KRaft cluster id (scripts/cluster.sh)
#   scripts/kafka.sh tool CLASS ARGS…  run a Kafka tool from the same jars, e.g.
#       scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand --bootstrap-server … --list
#
# start, stop and fetch are idempotent. Ports are picked free at first start and kept, so a
# restarted broker (fault tests) comes back where clients expect it.
#
# Besides PLAINTEXT (no authentication: User:ANONYMOUS, a super user, which every test but the
# security tests uses) the broker has two secured listeners, with ACLs enforced there by KRaft's
# StandardAuthorizer:
#   SASL_SSL  SCRAM-SHA-512 users, created when the storage is formatted
#   SSL       client certificates required (mTLS); the certificate's CN is the principal
# A throwaway CA and the certificates (broker, clients, an expired one, one from another CA)
# are made with openssl at the first start, under <run>/tls.
#
# Environment:
#   EXACTLY_KAFKA_DIR    run directory (data, logs, pid, port)   default: <repo>/.kafka
#   EXACTLY_KAFKA_CACHE  jar cache                               default: ~/.cache/exactly
#   EXACTLY_KAFKA_HEAP   JVM heap                                default: 1g
#   EXACTLY_KAFKA_VERSION  another Apache Kafka release from Maven Central (the broker
#                        matrix, scripts/matrix.sh)              default: scripts/kafka/pom.xml's
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
pom="$here/kafka/pom.xml"
version=${EXACTLY_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")}
cache=${EXACTLY_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exactly}
jars="$cache/kafka-$version-$(sha256sum "$pom" | cut -c1-12)"
run=${EXACTLY_KAFKA_DIR:-$repo/.kafka}
heap=${EXACTLY_KAFKA_HEAP:-1g}

log() { echo "kafka.sh: $*" >&2; }

fetch() {
  if [ -f "$jars/.complete" ]; then return 0; fi
  log "fetching Apache Kafka $version jars from Maven Central into $jars"
  rm -rf "$jars.tmp"
  mvn -q -B -Dstyle.color=never -f "$pom" -Dkafka.version="$version" dependency:copy-dependencies \
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

# The principals of the security tests: two allowed everything exactly needs (one by password,
# one by certificate), and one per permission that lacks just that one (see acls).
users=(exactly no-input-read no-group-read no-output-write no-dlq-write no-txn-write)

# certs DIR: a CA; the broker's certificate (127.0.0.1); client certificates for exactly-mtls
# (good, expired) and one from a CA the broker does not know.
certs() {
  local d=$1
  mkdir -p "$d"
  (
    cd "$d"
    ca() { # NAME: a self-signed CA
      openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 3650 \
        -subj "/CN=exactly test $1" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    }
    csr() { # NAME CN
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    }
    ca ca
    ca other-ca
    csr broker localhost
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -sha256 -extfile broker.ext -out broker.crt 2>/dev/null
    cat broker.key broker.crt ca.crt >broker.pem
    printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n' >client.ext
    csr client exactly-mtls
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -sha256 -extfile client.ext -out client.crt 2>/dev/null
    # The operator's certificate (User:admin, a super user): the audit over mTLS.
    csr admin admin
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -sha256 -extfile client.ext -out admin.crt 2>/dev/null
    csr stranger exactly-mtls
    openssl x509 -req -in stranger.csr -CA other-ca.crt -CAkey other-ca.key -CAcreateserial \
      -days 3650 -sha256 -extfile client.ext -out stranger.crt 2>/dev/null
    # Expired: OpenSSL 3.0's x509 cannot date a certificate in the past; `openssl ca` can.
    mkdir -p cadb
    : >cadb/index.txt
    echo 1000 >cadb/serial
    cat >ca.cnf <<'CNF'
[ca]
default_ca = CA_default
[CA_default]
dir = ./cadb
database = $dir/index.txt
serial = $dir/serial
new_certs_dir = $dir
certificate = ./ca.crt
private_key = ./ca.key
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
[client_ext]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
CNF
    csr expired exactly-mtls
    openssl ca -batch -config ca.cnf -extensions client_ext -startdate 20200101000000Z \
      -enddate 20200102000000Z -in expired.csr -out expired.crt -notext 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
}

configure() {
  mkdir -p "$run/data"
  local port cport sport mport
  port=$(free_port)
  cport=$(free_port)
  sport=$(free_port)
  mport=$(free_port)
  while [ "$(printf '%s\n' "$port" "$cport" "$sport" "$mport" | sort -u | wc -l)" != 4 ]; do
    cport=$(free_port)
    sport=$(free_port)
    mport=$(free_port)
  done
  certs "$run/tls"
  local tls=$run/tls
  cat >"$run/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SASL_SSL://127.0.0.1:$sport,SSL://127.0.0.1:$mport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,SSL://127.0.0.1:$mport
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
# The secured listeners (the security tests). The broker and controller talk over PLAINTEXT as
# User:ANONYMOUS, which must be a super user for the authorizer to let the node run.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=$tls/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.crt
listener.name.ssl.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]+).*\$/\$1/,DEFAULT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=false
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
# The consumer group protocol (KIP-848, exactly --group-protocol consumer) takes the session
# timeout and heartbeat interval from the broker, not the client: the tests' quick ones.
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=500
# Aborts and kills leave open transactions behind; let the coordinator find them quickly.
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
log.retention.check.interval.ms=60000
EOF
  echo "$port" >"$run/port"
  echo "$version" >"$run/version"
  # A password per user, new for each broker directory.
  local scram=() name
  python3 - "$run" "$sport" "$mport" "${users[@]}" admin <<'PY'
import json, secrets, sys
run, sport, mport, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
tls = f"{run}/tls"
json.dump({
    "sasl_ssl": f"127.0.0.1:{sport}",
    "ssl": f"127.0.0.1:{mport}",
    "passwords": {n: f"{n}-pw-{secrets.token_hex(8)}" for n in names},
    "ca": f"{tls}/ca.crt", "other_ca": f"{tls}/other-ca.crt",
    "client": {"cert": f"{tls}/client.crt", "key": f"{tls}/client.key"},
    "admin": {"cert": f"{tls}/admin.crt", "key": f"{tls}/admin.key"},
    "expired": {"cert": f"{tls}/expired.crt", "key": f"{tls}/expired.key"},
    "stranger": {"cert": f"{tls}/stranger.crt", "key": f"{tls}/stranger.key"},
}, open(f"{run}/security.json", "w"), indent=1)
PY
  for name in "${users[@]}" admin; do
    scram+=(--add-scram "SCRAM-SHA-512=[name=$name,password=$(password "$name")]")
  done
  "${jvm[@]}" kafka.tools.StorageTool format -t "$(cluster_id)" -c "$run/server.properties" \
    "${scram[@]}" >"$run/format.log" 2>&1 || { cat "$run/format.log" >&2; return 1; }
}

password() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["passwords"][sys.argv[2]])' \
    "$run/security.json" "$1"
}

# The ACLs of the security tests' principals, by prefix: inputs sec-in-*, outputs sec-out-*,
# dead letters sec-dlq-*, groups and transactional ids sec-*. Each no-<permission> user has
# everything but that one. Created once, after the first start (they live in the metadata log).
# A new cluster id: base64 of a random UUID, as Kafka's own, never starting with '-', which the
# storage tool's argument parser would take for an option (1 start in 64 failed CI so).
cluster_id() {
  python3 -c '
import base64, uuid
while True:
    id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not id.startswith("-"):
        print(id)
        break'
}

acls() {
  [ -f "$run/acls.done" ] && return 0
  log "creating the security tests' ACLs"
  local bootstrap all=(exactly exactly-mtls no-input-read no-group-read no-output-write no-dlq-write no-txn-write)
  bootstrap="127.0.0.1:$(cat "$run/port")"
  # Kafka 4.0 moved the tool from kafka.admin (Scala) to org.apache.kafka.tools.
  local acl_command=org.apache.kafka.tools.AclCommand
  case "$version" in 3.*) acl_command=kafka.admin.AclCommand ;; esac
  grant() { # LACKING RESOURCE-ARGS... : allow every principal but LACKING
    local lacking=$1 p args=()
    shift
    for p in "${all[@]}"; do
      [ "$p" = "$lacking" ] || args+=(--allow-principal "User:$p")
    done
    "${jvm[@]}" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn "$acl_command" \
      --bootstrap-server "$bootstrap" --add --resource-pattern-type prefixed "${args[@]}" "$@" \
      >>"$run/acls.log" 2>&1 || { tail -20 "$run/acls.log" >&2; return 1; }
  }
  # Everyone may describe every sec- topic and transactional id, so each missing permission
  # is met where it is used (fetch, produce, init), not hidden behind a metadata error.
  grant "" --topic sec- --operation Describe
  grant "" --transactional-id sec- --operation Describe
  grant no-input-read --topic sec-in- --operation Read
  grant no-output-write --topic sec-out- --operation Write
  grant no-dlq-write --topic sec-dlq- --operation Write
  grant no-group-read --group sec- --operation Read
  grant no-txn-write --transactional-id sec- --operation Write
  touch "$run/acls.done"
}

start() {
  if serving; then return 0; fi
  fetch
  if [ -f "$run/server.properties" ] && ! grep -q '^group.consumer.session.timeout.ms' "$run/server.properties"; then
    log "$run was formatted with older settings: formatting it again"
    rm -rf "$run"
  fi
  if [ -f "$run/server.properties" ] && [ "$(cat "$run/version" 2>/dev/null)" != "$version" ]; then
    log "$run was formatted by another Kafka version: formatting it again"
    rm -rf "$run"
  fi
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
  acls
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
  security)
    serving || { log "not running (scripts/kafka.sh start)"; exit 1; }
    echo "$run/security.json"
    ;;
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
  cluster-id) cluster_id ;;
  jars)
    fetch
    echo "$jars"
    ;;
  version) echo "$version" ;;
  *)
    sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

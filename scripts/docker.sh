#!/usr/bin/env bash
# A Docker engine for the image test (tests/image.rs), and local stand-ins for the Dockerfile's
# base images, which cannot be pulled here.
#
#   scripts/docker.sh start   start dockerd if none answers (installing docker.io and
#                             debootstrap on Debian when missing), build the stand-ins once,
#                             and print `export` lines: eval "$(scripts/docker.sh start)"
#   scripts/docker.sh stop    stop the dockerd this script starts (its images stay cached)
#
# The engine runs without a bridge network and without iptables rules: containers use
# `--network host` only. The stand-ins are two Debian images made by debootstrap from the same
# suite as the Dockerfile's defaults (so the binary's glibc matches the runtime's):
#   exactly-standin/debian:<suite>-slim    debootstrap --variant=minbase
#   exactly-standin/rust:<version>-<suite> the same plus gcc, make, and this machine's Rust
#                                          toolchain (the suite's own rustc is too old)
# They live in the engine's image store (/var/lib/exactly-docker), built on first use and
# again when this script changes.
#
# When no engine can run here (not root, no kernel support), `start` says why in one line on
# stderr and exits 1.
set -euo pipefail

suite=bookworm
mirror=${EXACTLY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
sock=/run/exactly-docker.sock
root=/var/lib/exactly-docker
state=/run/exactly-docker
log() { echo "docker.sh: $*" >&2; }
# Whether this run started the engine (start prints it for the caller's stop).
started=0
fail() {
  log "no Docker engine: $*"
  exit 1
}

answers() { DOCKER_HOST="unix://$sock" timeout 10 docker info >/dev/null 2>&1; }

# On a failed start: no half-built tree left behind, no engine this script started left
# running (the caller never learns it started one).
tree=
cleanup() {
  local code=$?
  [ -z "$tree" ] || rm -rf "$tree" "$tree.log"
  if [ "$code" != 0 ] && [ "$started" = 1 ]; then stop_engine; fi
}
trap cleanup EXIT

# Stops the dockerd of the pid file, if it is one.
stop_engine() {
  [ -f "$state/dockerd.pid" ] || return 0
  local pid
  pid=$(cat "$state/dockerd.pid")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$state/dockerd.pid"
    return 0
  fi
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  log "dockerd ($pid) still running after 30 s: killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

start_engine() {
  if answers; then return 0; fi
  [ "$(id -u)" = 0 ] || fail "dockerd runs as root and this is uid $(id -u)"
  "$(dirname "${BASH_SOURCE[0]}")/setup.sh" docker || fail "docker.io or debootstrap could not be installed"
  mkdir -p "$state"
  log "starting dockerd (no bridge, no iptables; data in $root)"
  # setsid: the daemon outlives this script and is not in the caller's process group.
  # Its own containerd namespaces: a system dockerd's containers are not ours to see.
  setsid dockerd --host "unix://$sock" --pidfile "$state/dockerd.pid" --data-root "$root" \
    --exec-root "$state" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    --containerd-namespace exactly --containerd-plugins-namespace exactly-plugins \
    >"$state/dockerd.log" 2>&1 </dev/null &
  started=1
  for _ in $(seq 1 60); do
    if answers; then return 0; fi
    if ! kill -0 $! 2>/dev/null; then
      fail "dockerd exited: $(grep -m1 -iE 'level=(fatal|error)' "$state/dockerd.log" || tail -1 "$state/dockerd.log")"
    fi
    sleep 0.5
  done
  fail "dockerd did not answer within 30 s (log: $state/dockerd.log)"
}

# debootstrap the suite into a temp dir, trimmed like Debian's slim images, and import it as
# TAG. Arguments: TAG, packages to include, then a command to run on the tree.
standin() {
  local tag=$1 include=$2
  shift 2
  # Built already, from the same recipe: this script, the mirror, the Rust toolchain and the
  # certificate authorities it copies in (the hash is the image's label).
  local recipe
  recipe=$({
    cat "${BASH_SOURCE[0]}"
    echo "$mirror"
    rustc -vV
    cat /etc/ssl/certs/ca-certificates.crt
  } | sha256sum | cut -c1-16)
  if [ "$(DOCKER_HOST="unix://$sock" docker image inspect -f '{{index .Config.Labels "exactly.recipe"}}' "$tag" 2>/dev/null)" = "$recipe" ]; then
    return 0
  fi
  tree=$(mktemp -d "${TMPDIR:-/tmp}/exactly-standin.XXXXXX")
  log "building stand-in $tag (debootstrap $suite${include:+ with $include})"
  debootstrap --variant=minbase ${include:+--include="$include"} "$suite" "$tree" "$mirror" \
    >"$tree.log" 2>&1 || { tail -20 "$tree.log" >&2; rm -rf "$tree" "$tree.log"; fail "debootstrap failed"; }
  rm -f "$tree.log"
  # What Debian's -slim images leave out, now and in every package installed later ...
  cat >"$tree/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  # ... and the apt settings that keep downloaded packages out of their layers.
  cat >"$tree/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  find "$tree/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/apt/*.bin "$tree"/var/cache/apt/archives/*.deb \
    "$tree"/usr/share/man/* \
    "$tree"/usr/share/locale/* "$tree"/usr/share/info/*
  "$@" "$tree"
  local changes=(--change "LABEL exactly.recipe=$recipe")
  [ -z "${STANDIN_PATH:-}" ] || changes+=(--change "ENV PATH=$STANDIN_PATH" --change "ENV CARGO_HOME=/usr/local/cargo")
  tar -C "$tree" -c . | DOCKER_HOST="unix://$sock" docker import "${changes[@]}" - "$tag" >/dev/null
  rm -rf "$tree"
  tree=
  # The stand-in it replaces, if any, is untagged now.
  DOCKER_HOST="unix://$sock" docker image prune -f >/dev/null
}

nothing() { :; }

# This machine's Rust toolchain (cargo, rustc and the standard library for this target only),
# where the official rust images keep theirs; and the certificate authorities this machine
# trusts beyond Debian's (a TLS-inspecting proxy's), so cargo can fetch crates in the build.
with_rust() {
  local extra=$1/usr/local/share/ca-certificates
  python3 - /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt" "$extra" <<'PY'
import re, sys
pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
with open(sys.argv[1]) as host, open(sys.argv[2]) as own:
    theirs, ours = pem.findall(host.read()), set(pem.findall(own.read()))
for i, cert in enumerate(c for c in theirs if c not in ours):
    with open(f"{sys.argv[3]}/exactly-host-{i}.crt", "w") as out:
        out.write(cert + "\n")
PY
  if compgen -G "$extra/exactly-host-*.crt" >/dev/null; then
    log "adding this machine's extra certificate authorities to the build stand-in"
    chroot "$1" update-ca-certificates >/dev/null 2>&1
  fi
  local sysroot
  sysroot=$(rustc --print sysroot)
  mkdir -p "$1/usr/local/rust/bin" "$1/usr/local/cargo/bin"
  local host
  host=$(rustc -vV | sed -n 's/^host: //p')
  mkdir -p "$1/usr/local/rust/lib/rustlib"
  cp "$sysroot/bin/cargo" "$sysroot/bin/rustc" "$1/usr/local/rust/bin/"
  cp -a "$sysroot"/lib/*.so* "$1/usr/local/rust/lib/"
  cp -a "$sysroot/lib/rustlib/$host" "$1/usr/local/rust/lib/rustlib/"
}

case "${1:-}" in
start)
  start_engine
  rust=$(rustc --version | awk '{ split($2, v, "."); print v[1] "." v[2] }')
  runtime=exactly-standin/debian:$suite-slim
  build=exactly-standin/rust:$rust-$suite
  standin "$runtime" "" nothing
  STANDIN_PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    standin "$build" "ca-certificates,curl,gcc,g++,make,libc6-dev,perl,git" with_rust
  echo "export DOCKER_HOST=unix://$sock"
  echo "export EXACTLY_TEST_BUILD_IMAGE=$build"
  echo "export EXACTLY_TEST_RUNTIME_IMAGE=$runtime"
  echo "export EXACTLY_DOCKERD_STARTED=$started"
  ;;
stop)
  # What builds left untagged (each rebuild of the test image replaces one) goes first.
  if answers; then DOCKER_HOST="unix://$sock" docker image prune -f >/dev/null || true; fi
  stop_engine
  ;;
*)
  echo "usage: scripts/docker.sh start|stop" >&2
  exit 2
  ;;
esac

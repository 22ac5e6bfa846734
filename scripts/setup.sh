#!/usr/bin/env bash
# What a fresh machine needs, installed when missing: the one list of system packages the
# project uses. On Debian it installs what is missing with apt-get and says so in one line; on
# any other system it stops with a message naming what is missing.
#
#   scripts/setup.sh demo     build exactly and run the broker: a C/C++ toolchain, cmake,
#                             pkg-config, perl, OpenSSL headers, Python 3, Java 17, Maven
#   scripts/setup.sh stores   the stores' servers: redis-server, mariadb-server, postgresql-15
#   scripts/setup.sh docker   a Docker engine and debootstrap (scripts/docker.sh)
#   scripts/setup.sh tools    Prometheus and promtool (scripts/tools.sh; they check the alerts)
#   scripts/setup.sh test     demo, stores and tools, and Node.js (the call-out's second
#                             example); the Docker engine comes from scripts/docker.sh, which
#                             installs it only where it can run one
#
# Rust itself is not a Debian package here (Debian 12's rustc is older than Cargo.toml's
# rust-version): without cargo the script stops and points at rustup.rs.
set -euo pipefail

missing=()
# need COMMAND-OR-FILE PACKAGE: PACKAGE is missing when the command (or file) is not there.
need() {
  case "$1" in
  /*) [ -e "$1" ] || missing+=("$2") ;;
  *) command -v "$1" >/dev/null || missing+=("$2") ;;
  esac
}
rust=0
demo() {
  rust=1
  need cmake cmake
  need c++ g++
  need make make
  need pkg-config pkg-config
  need perl perl
  need /usr/include/openssl/ssl.h libssl-dev
  need python3 python3
  need java openjdk-17-jre-headless
  need mvn maven
}
stores() {
  need redis-server redis-server
  need mariadbd mariadb-server
  need /usr/lib/postgresql/15/bin/initdb postgresql-15
}
engine() {
  need dockerd docker.io
  need debootstrap debootstrap
}
tools() {
  need promtool prometheus
  # tools.sh's virtualenv: Debian's python3 has no ensurepip without python3-venv.
  python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
}

case "${1:-}" in
demo) demo ;;
stores) stores ;;
docker) engine ;;
tools) tools ;;
test)
  # Not the Docker engine: scripts/docker.sh installs it when it can run one (as root).
  demo
  stores
  tools
  need node nodejs
  ;;
*)
  echo "usage: scripts/setup.sh demo|stores|docker|tools|test" >&2
  exit 2
  ;;
esac

if [ "$rust" = 1 ] && ! command -v cargo >/dev/null; then
  echo "setup.sh: Rust is missing (cargo not found): install it from https://rustup.rs, then run this again" >&2
  exit 1
fi
[ ${#missing[@]} -gt 0 ] || exit 0
if ! command -v apt-get >/dev/null; then
  echo "setup.sh: missing: ${missing[*]} (Debian package names); this is not Debian, so install them yourself" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: missing: ${missing[*]}; installing needs root or sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup.sh: installing ${missing[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >&2
# Packages with servers would start them where an init system runs; the scripts start their own.
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2

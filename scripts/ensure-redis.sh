#!/bin/sh
# Make sure a Redis server is installed for the state store's tests.
#
# Idempotent: does nothing when /usr/bin/redis-server exists. Otherwise
# installs Debian's redis-server (7.0 on Debian 12). The tests never use the
# packaged service: the harness (tests/src/redis.rs) runs its own throwaway
# server from /usr/bin/redis-server on a free port in a temporary directory,
# so the package's post-install failing to start a service (no init system
# on CI) is fine.
set -eu

SERVER=/usr/bin/redis-server

if [ -x "$SERVER" ]; then
    echo "ensure-redis: $SERVER already installed, nothing to do"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
else
    echo "ensure-redis: $SERVER is missing and we are not root and have no sudo;" >&2
    echo "ensure-redis: install it with: apt-get update && apt-get install -y redis-server" >&2
    exit 1
fi

# A fresh machine has no package lists yet, so the install would fail
# without this update.
echo "ensure-redis: $SERVER missing; running ${SUDO:+$SUDO }apt-get update"
$SUDO apt-get update
echo "ensure-redis: running ${SUDO:+$SUDO }apt-get install -y redis-server"
# Non-interactive so debconf never waits for an answer on a CI machine.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server

if [ ! -x "$SERVER" ]; then
    echo "ensure-redis: installed redis-server but $SERVER is still missing" >&2
    exit 1
fi
echo "ensure-redis: installed $(dpkg-query -W -f='redis-server ${Version}' redis-server)"

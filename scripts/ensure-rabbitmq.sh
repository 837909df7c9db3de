#!/bin/sh
# Make sure a RabbitMQ server is installed for the integration tests.
#
# Idempotent: does nothing when /usr/lib/rabbitmq/bin/rabbitmq-server exists.
# Otherwise installs Debian's rabbitmq-server (3.10.8 on Debian 12). The
# tests never use the packaged service: the harness (tests/src/broker.rs)
# runs its own throwaway node from /usr/lib/rabbitmq/bin, so the package's
# post-install failing to start a service (no init system on CI) is fine.
set -eu

SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server

if [ -x "$SERVER" ]; then
    echo "ensure-rabbitmq: $SERVER already installed, nothing to do"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
else
    echo "ensure-rabbitmq: $SERVER is missing and we are not root and have no sudo;" >&2
    echo "ensure-rabbitmq: install it with: apt-get update && apt-get install -y rabbitmq-server" >&2
    exit 1
fi

# A fresh machine has no package lists yet, so the install would fail
# without this update.
echo "ensure-rabbitmq: $SERVER missing; running ${SUDO:+$SUDO }apt-get update"
$SUDO apt-get update
echo "ensure-rabbitmq: running ${SUDO:+$SUDO }apt-get install -y rabbitmq-server"
# Non-interactive so debconf never waits for an answer on a CI machine.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server

if [ ! -x "$SERVER" ]; then
    echo "ensure-rabbitmq: installed rabbitmq-server but $SERVER is still missing" >&2
    exit 1
fi
echo "ensure-rabbitmq: installed $(dpkg-query -W -f='rabbitmq-server ${Version}' rabbitmq-server)"

#!/bin/sh
# Make sure a RabbitMQ server is installed for the integration tests.
#
# Idempotent: does nothing when /usr/lib/rabbitmq/bin/rabbitmq-server exists.
# Otherwise installs Debian's rabbitmq-server (3.10.8 on Debian 12). The
# tests never use the packaged service: the harness (tests/src/broker.rs)
# runs its own throwaway node from /usr/lib/rabbitmq/bin, so the package's
# post-install failing to start a service (no init system on CI) is fine.
set -eu
exec "$(dirname "$0")/ensure-debian-package" rabbitmq-server /usr/lib/rabbitmq/bin/rabbitmq-server

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
exec "$(dirname "$0")/ensure-debian-package" redis-server /usr/bin/redis-server

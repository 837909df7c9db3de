#!/bin/sh
# Make sure the tools the deployment files are checked with are installed
# (tests/tests/deploying.rs): systemd-analyze, which verifies the systemd
# unit offline, and buildah, which builds the container image offline
# (vfs storage, chroot isolation: no daemon, no registry). Idempotent.
set -eu
here=$(dirname "$0")
"$here/ensure-debian-package" systemd /usr/bin/systemd-analyze
"$here/ensure-debian-package" buildah /usr/bin/buildah

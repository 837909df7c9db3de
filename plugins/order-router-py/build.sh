#!/usr/bin/env bash
# Builds this plugin into target/plugins/<folder>.wasm, its tools under
# target/wasm-langs/: see scripts/build-python-plugin, which
# `acemq-host plugin build` runs too. Usage: build.sh [--stub-wasi]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec "$root/scripts/build-python-plugin" "$here" "$root/wit/plugin.wit" \
    "$root/target/plugins/$(basename "$here").wasm" "$root/target/wasm-langs" "$@"

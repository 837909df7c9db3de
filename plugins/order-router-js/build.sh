#!/usr/bin/env bash
# Builds this plugin into target/plugins/order-router-js.wasm, its tools
# under target/wasm-langs/: see scripts/build-js-plugin (the engines, the
# options), which `acemq-host plugin build` runs too.
#
# Usage: plugins/order-router-js/build.sh [--backend starlingmonkey|quickjs] [--stub-wasi]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec "$root/scripts/build-js-plugin" "$here" "$root/wit/plugin.wit" \
    "$root/target/plugins/$(basename "$here").wasm" "$root/target/wasm-langs" "$@"

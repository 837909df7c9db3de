#!/usr/bin/env bash
# Builds this plugin into target/plugins/velocity-py.wasm; see
# scripts/build-python-plugin. Usage: build.sh [--stub-wasi]
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/build-python-plugin" "$(dirname "${BASH_SOURCE[0]}")" "$@"

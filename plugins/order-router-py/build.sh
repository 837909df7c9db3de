#!/usr/bin/env bash
# Builds this Python plugin into a WebAssembly component:
#
#     plugins/order-router-py/src/app.py  ->  target/plugins/order-router-py.wasm
#
# with componentize-py (PyPI), against wit/plugin.wit, world `handler-plugin`.
# componentize-py is installed, pinned, into a venv under target/ the first
# time; the Python bindings (`wit_world`) are generated into bindings/ here,
# for editors and type checkers, and are not kept in git (componentize-py
# generates its own copy inside the component at every build).
#
# By default every WASI import is replaced by a stub that traps
# (`--stub-wasi`): this host gives plugins nothing but acemq:plugin/host, and
# with the stubs the component imports only that. A plugin that touches
# files, sockets, the clock or the environment traps instead (use the host's
# `now_ms`, `config` and `log`). `--with-wasi` keeps the WASI imports, for a
# host that provides them.
#
# Without Python 3 or the package index, it says `skipped: <reason>` and
# exits 0, so a build of everything does not fail on a machine without them.
#
# Usage: plugins/order-router-py/build.sh [--with-wasi]   (from anywhere)
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
name="$(basename "$here")"
wit="$root/wit/plugin.wit"
world=handler-plugin
out="$root/target/plugins/$name.wasm"
venv="$root/target/wasm-langs/componentize-py-$COMPONENTIZE_PY_VERSION"
tool="$venv/bin/componentize-py"

stub=(--stub-wasi)
case "${1:-}" in
    "") ;;
    --with-wasi) stub=() ;;
    *) echo "usage: $0 [--with-wasi]" >&2; exit 2 ;;
esac

skip() {
    echo "$name: skipped: $*"
    exit 0
}

if [[ ! -x "$tool" ]]; then
    python=$(command -v python3 || true)
    [[ -n "$python" ]] || skip "no python3 to install componentize-py $COMPONENTIZE_PY_VERSION with"
    echo "$name: installing componentize-py $COMPONENTIZE_PY_VERSION into ${venv#"$root/"}"
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        skip "python3 cannot make a venv (Debian: apt-get install python3-venv)"
    fi
    if ! log=$("$venv/bin/pip" install --disable-pip-version-check -q \
        "componentize-py==$COMPONENTIZE_PY_VERSION" 2>&1); then
        rm -rf "$venv"
        skip "pip could not install componentize-py $COMPONENTIZE_PY_VERSION (offline?): $(tail -n 1 <<<"$log")"
    fi
fi

cd "$here"
# Bindings for editors and type checkers (gitignored).
rm -rf bindings
"$tool" -q -d "$wit" -w "$world" bindings bindings

mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
start=$(date +%s)
"$tool" -q -d "$wit" -w "$world" componentize app -p "$here/src" "${stub[@]}" -o "$tmp"
mv "$tmp" "$out"
echo "$name: wrote ${out#"$root/"} ($(stat -c %s "$out") bytes, $(($(date +%s) - start)) s${stub[*]:+, WASI stubbed})"

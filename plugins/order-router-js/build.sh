#!/usr/bin/env bash
# Builds this JavaScript plugin into a WebAssembly component:
#
#     plugins/order-router-js/app.js  ->  target/plugins/order-router-js.wasm
#
# against wit/plugin.wit, world `handler-plugin`. The tools are the npm
# packages pinned in package.json (and package-lock.json), installed the
# first time into target/wasm-langs/order-router-js-tools/node_modules (never
# into this folder). TypeScript declarations of the WIT interfaces are
# generated into bindings/ here by `jco guest-types`, for editors; they are
# not kept in git.
#
# Two engines (--backend):
#   starlingmonkey  (default) componentize-js: SpiderMonkey, ~12 MB, built
#                   without its HTTP features (`-d http fetch-event`): the
#                   host links a locked-down WASI 0.2 but no wasi:http.
#                   `console.log` goes to the host log.
#   quickjs         componentize-qjs (shipped with jco): QuickJS, ~1.7 MB,
#                   built with `--sync` (no component-model async ABI).
# --stub-wasi builds a component that imports only acemq:plugin/* (every
# WASI feature disabled or stubbed: console output and clocks do nothing or
# trap).
#
# Without node/npm or the registry, it says `skipped: <reason>` and exits 0,
# so a build of everything does not fail on a machine without them.
#
# Usage: plugins/order-router-js/build.sh [--backend starlingmonkey|quickjs] [--stub-wasi]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
name="$(basename "$here")"
world=handler-plugin
out="$root/target/plugins/$name.wasm"
tools="$root/target/wasm-langs/$name-tools"

backend=starlingmonkey
wasi=keep
while (($#)); do
    case "$1" in
        --backend) backend="${2:-}"; shift 2 || true ;;
        --stub-wasi) wasi=stub; shift ;;
        *) echo "usage: $0 [--backend starlingmonkey|quickjs] [--stub-wasi]" >&2; exit 2 ;;
    esac
done
case "$backend" in
    starlingmonkey | quickjs) ;;
    *) echo "$0: unknown backend \`$backend\` (starlingmonkey or quickjs)" >&2; exit 2 ;;
esac

skip() {
    echo "$name: skipped: $*"
    exit 0
}

command -v node >/dev/null || skip "no node"
command -v npm >/dev/null || skip "no npm"

# (Re)install the pinned tools when package.json or the lock changed.
if ! cmp -s "$here/package.json" "$tools/package.json" ||
    ! cmp -s "$here/package-lock.json" "$tools/.installed-lock.json" ||
    [[ ! -d "$tools/node_modules" ]]; then
    echo "$name: installing $(node -e 'const d = require(process.argv[1]).devDependencies; console.log(Object.entries(d).map(([n, v]) => n + "@" + v).join(" "))' "$here/package.json") into ${tools#"$root/"}"
    rm -rf "$tools"
    mkdir -p "$tools"
    cp "$here/package.json" "$tools/"
    if [[ -f "$here/package-lock.json" ]]; then
        cp "$here/package-lock.json" "$tools/"
        install=(npm ci)
    else
        install=(npm install)
    fi
    if ! log=$(cd "$tools" && "${install[@]}" --no-audit --no-fund 2>&1); then
        rm -rf "$tools"
        skip "npm could not install the tools (offline?): $(grep -m 1 '^npm err' <<<"$log" || tail -n 1 <<<"$log")"
    fi
    # First install without a lock: keep the one npm wrote (commit it).
    [[ -f "$here/package-lock.json" ]] || cp "$tools/package-lock.json" "$here/"
    cp "$here/package-lock.json" "$tools/.installed-lock.json"
fi
bin="$tools/node_modules/.bin"

# jco 1.35.0 reads WIT files inside a WASI sandbox whose preview2-shim
# (0.26.1) starts with no preopened folder, so every path is "No such file
# or directory". Preopening / before jco runs fixes that.
preopen="$tools/preopen-root.mjs"
shim="$tools/node_modules/@bytecodealliance/jco-transpile/node_modules/@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js"
[[ -f "$shim" ]] || shim="$tools/node_modules/@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js"
printf "import { _addPreopen } from '%s';\n_addPreopen('/', '/');\n" "$shim" >"$preopen"

cd "$here"
rm -rf bindings
if ! node --import "$preopen" "$(readlink -f "$bin/jco")" guest-types "$root/wit/plugin.wit" \
    -n "$world" -o bindings -q >/dev/null 2>&1; then
    echo "$name: warning: jco guest-types failed; no TypeScript declarations in bindings/" >&2
fi

mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$.wasm"
trap 'rm -f "$tmp"' EXIT
start=$(date +%s)
# Paths relative to the repository root: componentize-js reads them from
# inside its own sandbox.
cd "$root"
src="${here#"$root/"}/app.js"
case "$backend/$wasi" in
    starlingmonkey/stub)
        "$bin/componentize-js" "$src" --wit wit/plugin.wit -n "$world" \
            -d stdio random clocks http fetch-event -o "$tmp" >/dev/null ;;
    starlingmonkey/keep)
        "$bin/componentize-js" "$src" --wit wit/plugin.wit -n "$world" \
            -d http fetch-event -o "$tmp" >/dev/null ;;
    quickjs/stub)
        "$bin/componentize-qjs" --wit wit/plugin.wit --js "$src" -n "$world" \
            --stub-wasi --sync -o "$tmp" >/dev/null ;;
    quickjs/keep)
        "$bin/componentize-qjs" --wit wit/plugin.wit --js "$src" -n "$world" \
            --sync -o "$tmp" >/dev/null ;;
esac
mv "$tmp" "$out"
if [[ $wasi == stub ]]; then note="no WASI imports"; else note="locked-down WASI imports"; fi
echo "$name: wrote ${out#"$root/"} ($(stat -c %s "$out") bytes, $(($(date +%s) - start)) s, $backend, $note)"

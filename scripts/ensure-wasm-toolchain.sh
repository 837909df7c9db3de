#!/usr/bin/env bash
# Makes sure Debian's wasm-capable Rust toolchain is installed: rustc-web and
# cargo-web (/usr/bin/rustc, /usr/bin/cargo), the matching std sources
# (rust-web-src, for -Zbuild-std) and lld-22 (/usr/bin/wasm-ld-22).
#
# Why: on the build machines (Debian 12) rustup cannot download a wasm32
# target (its server is unreachable), but Debian's packages are reachable.
# `acemq-host plugin build` runs this script (built into the binary, so it
# works outside the repository too) when rustup has no wasm32 target.
# Debian ships no prebuilt wasm std, so scripts/build-plugins builds std from
# rust-web-src (-Zbuild-std) and links with wasm-ld-22. It uses this
# toolchain only when the rustup one has no wasm32-unknown-unknown target.
#
# Idempotent: does nothing (and needs no network or root) when the packages
# are installed with matching versions. Installs through apt only; it never
# touches the rustup toolchain in ~/.cargo and ~/.rustup.
set -euo pipefail

packages=(rustc-web cargo-web rust-web-src lld-22)

installed_version() {
    dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null |
        sed -n 's/^install ok installed //p'
}

needs_install() {
    command -v dpkg-query >/dev/null || return 0
    local p
    for p in "${packages[@]}"; do
        [[ -n "$(installed_version "$p")" ]] || return 0
    done
    # rust-web-src does not depend on rustc-web: after a partial upgrade the
    # std sources could be of another version, which -Zbuild-std rejects.
    [[ "$(installed_version rustc-web)" == "$(installed_version rust-web-src)" ]] || return 0
    local f
    for f in /usr/bin/rustc /usr/bin/cargo /usr/bin/wasm-ld-22 /usr/lib/rustlib/src/rust/library/std; do
        [[ -e "$f" ]] || return 0
    done
    return 1
}

if ! needs_install; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "ensure-wasm-toolchain: no apt-get here. Install the wasm target with rustup instead:" >&2
    echo "    rustup target add wasm32-unknown-unknown" >&2
    exit 1
fi

as_root=()
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null; then
        as_root=(sudo)
    else
        echo "ensure-wasm-toolchain: must run as root (or with sudo) to install: ${packages[*]}" >&2
        echo "ensure-wasm-toolchain: as root, run:" >&2
        echo "    apt-get update && apt-get install -y ${packages[*]}" >&2
        echo "ensure-wasm-toolchain: or, with rustup, add the target instead:" >&2
        echo "    rustup target add wasm32-unknown-unknown" >&2
        exit 1
    fi
fi

echo "ensure-wasm-toolchain: installing ${packages[*]} (the rustup toolchain is left alone)" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"

if needs_install; then
    echo "ensure-wasm-toolchain: installed, but the toolchain is still incomplete:" >&2
    for p in "${packages[@]}"; do
        echo "    $p: $(installed_version "$p" || true)" >&2
    done
    exit 1
fi

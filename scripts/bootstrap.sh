#!/usr/bin/env bash
# Installs everything the build, demo and tests need on a fresh machine of this
# project's kind. Idempotent: every step checks first and skips what is there.
# Only registries this machine reaches are used (crates.io, Debian, npm); see
# ../shared/TOOLCHAIN.md for why nothing downloads prebuilt binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

WASM_BINDGEN_VERSION=0.2.130   # must equal the wasm-bindgen version in Cargo.lock
# Tools installed from crates.io at the versions this project was tested with,
# built from their published Cargo.lock (--locked), so a new release or a
# dependency raising its minimum Rust cannot break a fresh machine.
# (wasm-bindgen-cli 0.2.130's published lock names a yanked webpki-roots,
# so it is installed unlocked.)
WASM_PACK_VERSION=0.15.1
GECKODRIVER_VERSION=0.37.1
export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '[bootstrap] %s\n' "$*"; }
# `bootstrap.sh demo` installs only what the demo needs (no browsers,
# drivers or PostgreSQL).
MODE=${1:-all}

if ! rustup target list --installed | grep -q wasm32-unknown-unknown; then
  log "adding wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown
fi

# The pinned nightly that builds the shipped wasm (scripts/pkg-toolchain.sh).
. scripts/pkg-toolchain.sh
pkg_toolchain_install

# esbuild minifies the package's JS glue (scripts/package.mjs); npm's package
# of it carries the compiled binary for this platform.
npm_ci() {
  if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/esbuild ]; then
    log "npm ci (esbuild, playwright-core)"
    npm ci --no-audit --no-fund --silent
  fi
}

if [ "$MODE" = demo ]; then
  npm_ci
  command -v wasm-pack >/dev/null ||
    cargo install -q --locked wasm-pack --version "$WASM_PACK_VERSION"
  wasm-bindgen --version 2>/dev/null | grep -q " $WASM_BINDGEN_VERSION" ||
    cargo install -q wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
  log "demo toolchain ready"
  exit 0
fi

apt_pkgs=()
command -v chromium >/dev/null || apt_pkgs+=(chromium)
command -v chromedriver >/dev/null || apt_pkgs+=(chromium-driver)
command -v firefox-esr >/dev/null || apt_pkgs+=(firefox-esr)

[ -x /usr/lib/postgresql/15/bin/initdb ] || apt_pkgs+=(postgresql)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  log "apt-get install ${apt_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi

if ! wasm-bindgen --version 2>/dev/null | grep -q " $WASM_BINDGEN_VERSION"; then
  log "cargo install wasm-bindgen-cli $WASM_BINDGEN_VERSION"
  cargo install -q wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi
if ! command -v wasm-pack >/dev/null; then
  log "cargo install wasm-pack $WASM_PACK_VERSION"
  cargo install -q --locked wasm-pack --version "$WASM_PACK_VERSION"
fi
if ! command -v geckodriver >/dev/null; then
  log "cargo install geckodriver $GECKODRIVER_VERSION"
  cargo install -q --locked geckodriver --version "$GECKODRIVER_VERSION"
fi

npm_ci
log "toolchain ready"

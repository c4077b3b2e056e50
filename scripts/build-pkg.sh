#!/usr/bin/env bash
# Builds the npm package in pkg/ with its two entry points:
#   pkg/agentstore.js        "agentstore"        record store + lease client (--features lease)
#   pkg/store/agentstore.js  "agentstore/store"  record store only (--no-default-features):
#                            an app that imports only AgentStore downloads no lease code.
#   pkg/io/agentstore_io.js  import/export (--features io), loaded by both
#                            entry points (js/io-loader.js, which package.mjs
#                            inlines into their glue) on the first
#                            importPouchDump/importSnapshot/exportSnapshot*.
# with the pinned toolchain and flags of scripts/pkg-toolchain.sh, then completes
# pkg/package.json (scripts/package.mjs). Used by test.sh, demo.sh, bench.sh and
# the e2e helpers.
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=()
[ "${1:-}" = "--quiet" ] && quiet=(--quiet)
# shellcheck source=scripts/pkg-toolchain.sh
. scripts/pkg-toolchain.sh
pkg_toolchain_install
export RUSTUP_TOOLCHAIN="$PKG_TOOLCHAIN" RUSTFLAGS="$PKG_RUSTFLAGS"
# Built with the name section (and the target_features section wasm-bindgen
# reads): package.mjs uses the names to find the closure shims nothing can
# call, then drops both sections.
export CARGO_PROFILE_RELEASE_STRIP=false
# Its own target directory: the flags differ from the stable test builds'.
export CARGO_TARGET_DIR="$PWD/target/pkg"
rm -rf pkg
wasm-pack "${quiet[@]}" build --target web --release --out-dir pkg . -- --no-default-features --features lease,talc "${PKG_CARGO_ARGS[@]}"
wasm-pack "${quiet[@]}" build --target web --release --out-dir pkg/store . -- --no-default-features --features talc "${PKG_CARGO_ARGS[@]}"
wasm-pack "${quiet[@]}" build --target web --release --out-dir pkg/io --out-name agentstore_io . -- --no-default-features --features io,talc "${PKG_CARGO_ARGS[@]}"
# pkg/store and pkg/io are sub-paths of the one package, not packages of their own.
rm -f pkg/{store,io}/package.json pkg/{store,io}/README.md pkg/{store,io}/.gitignore
node scripts/package.mjs

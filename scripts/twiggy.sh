#!/usr/bin/env bash
# Size profile of the shipped wasm: builds it exactly as scripts/build-pkg.sh
# does (pinned toolchain and flags of scripts/pkg-toolchain.sh) but keeps the
# name section, then prints `twiggy top` and bytes per category
# (bench/twiggy-categories.py). Needs `cargo install twiggy` (a dev tool, not
# installed by bootstrap).
#
#   bash scripts/twiggy.sh          # store-only entry ("agentstore/store")
#   bash scripts/twiggy.sh --full   # the full entry ("agentstore")
# The named module is left in target/twiggy/<store|full>/agentstore_bg.wasm.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
. scripts/pkg-toolchain.sh
pkg_toolchain_install
which=store features=(--no-default-features --features talc)
[ "${1:-}" = "--full" ] && which=full features=(--no-default-features --features lease,talc)
export CARGO_TARGET_DIR="$PWD/target/pkg" RUSTFLAGS="$PKG_RUSTFLAGS" CARGO_PROFILE_RELEASE_STRIP=false
cargo "+$PKG_TOOLCHAIN" build -q --release --target wasm32-unknown-unknown "${PKG_CARGO_ARGS[@]}" "${features[@]}"
out="target/twiggy/$which"
rm -rf "$out"
wasm-bindgen --target web --out-dir "$out" "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/agentstore.wasm"
twiggy top -n 25 "$out/agentstore_bg.wasm"
python3 bench/twiggy-categories.py "$out/agentstore_bg.wasm"

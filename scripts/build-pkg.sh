#!/usr/bin/env bash
# Builds the npm package in pkg/ with its two entry points:
#   pkg/agentstore.js        "agentstore"        record store + lease client (default features)
#   pkg/store/agentstore.js  "agentstore/store"  record store only (--no-default-features):
#                            an app that imports only AgentStore downloads no lease code.
# then completes pkg/package.json (scripts/package.mjs). Used by test.sh, demo.sh, bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=()
[ "${1:-}" = "--quiet" ] && quiet=(--quiet)
rm -rf pkg
wasm-pack build --target web --release --out-dir pkg "${quiet[@]}"
wasm-pack build --target web --release --out-dir pkg/store "${quiet[@]}" -- --no-default-features
# pkg/store is a sub-path of the one package, not a package of its own.
rm -f pkg/store/package.json pkg/store/README.md pkg/store/.gitignore
node scripts/package.mjs

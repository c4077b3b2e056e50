#!/usr/bin/env bash
# Runs every test of the project on this machine: installs what is missing
# (scripts/bootstrap.sh), starts PostgreSQL on loopback, then runs lints,
# native tests (protocol + server on SQLite and PostgreSQL), the browser
# suites in headless Chromium AND Firefox, and the end-to-end demo tests.
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-180}"

step() { printf '\n=== %s ===\n' "$*"; }

step "bootstrap"
bash scripts/bootstrap.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo clippy -p agentstore --target wasm32-unknown-unknown --all-targets -q -- -D warnings
cargo clippy -p agentstore --target wasm32-unknown-unknown --no-default-features --lib -q -- -D warnings  # store-only build

step "PostgreSQL on loopback"
if [ -f scripts/pg.sh ]; then
  AGENTSTORE_TEST_PG_URL="$(bash scripts/pg.sh start | tail -n 1)"
  export AGENTSTORE_TEST_PG_URL
  echo "AGENTSTORE_TEST_PG_URL=$AGENTSTORE_TEST_PG_URL"
fi

step "native tests (protocol, server on SQLite and PostgreSQL)"
cargo test --workspace --exclude agentstore

step "lease server for the browser suites (loopback, short TTLs)"
# The lease suites (tests/lease_*.rs) read the URL and admin token at compile
# time; the server allows the test runner's random loopback port by CORS.
cargo build -q -p agentstore-server
LEASE_DIR="$(mktemp -d)"
LEASE_PORT="${AGENTSTORE_TEST_PORT:-18787}"
export AGENTSTORE_TEST_SERVER="http://127.0.0.1:$LEASE_PORT"
export AGENTSTORE_TEST_ADMIN_TOKEN="agentstore-lease-test-admin"
"${CARGO_TARGET_DIR:-target}/debug/agentstore-server" --listen "127.0.0.1:$LEASE_PORT" \
  --database "$LEASE_DIR/leases.sqlite" --admin-token "$AGENTSTORE_TEST_ADMIN_TOKEN" \
  --allow-origin 'http://127.0.0.1:*' --ttl-ms 3000 --heartbeat-ms 500 --reaper-ms 200 \
  --claim-rate 1000/s --idle-retry-ms 100 --www "$LEASE_DIR" --pkg "$LEASE_DIR" \
  >"$LEASE_DIR/server.log" 2>&1 &
LEASE_PID=$!
trap 'kill "$LEASE_PID" 2>/dev/null || true; rm -rf "$LEASE_DIR"' EXIT
for _ in $(seq 1 100); do
  curl -fsS "$AGENTSTORE_TEST_SERVER/v1/health" >/dev/null 2>&1 && break
  kill -0 "$LEASE_PID" 2>/dev/null || { cat "$LEASE_DIR/server.log"; exit 1; }
  sleep 0.2
done
curl -fsS "$AGENTSTORE_TEST_SERVER/v1/health" >/dev/null
echo "AGENTSTORE_TEST_SERVER=$AGENTSTORE_TEST_SERVER"
# A loopback proxy in front of it that holds heartbeat answers back or cuts off
# enrollments (tests/lease_network.rs); it picks a free port and prints it.
node scripts/delay-proxy.mjs --target "$AGENTSTORE_TEST_SERVER" >"$LEASE_DIR/proxy.log" 2>&1 &
PROXY_PID=$!
trap 'kill "$LEASE_PID" "$PROXY_PID" 2>/dev/null || true; rm -rf "$LEASE_DIR"' EXIT
for _ in $(seq 1 100); do
  grep -q '^listening ' "$LEASE_DIR/proxy.log" 2>/dev/null && break
  kill -0 "$PROXY_PID" 2>/dev/null || { cat "$LEASE_DIR/proxy.log"; exit 1; }
  sleep 0.1
done
AGENTSTORE_TEST_PROXY="$(sed -n 's/^listening //p' "$LEASE_DIR/proxy.log")"
export AGENTSTORE_TEST_PROXY
echo "AGENTSTORE_TEST_PROXY=$AGENTSTORE_TEST_PROXY"

step "browser suites in headless Chromium"
env -u GECKODRIVER CHROMEDRIVER=/usr/bin/chromedriver \
  cargo test -p agentstore --target wasm32-unknown-unknown --tests

step "browser suites in headless Firefox"
env -u CHROMEDRIVER GECKODRIVER="$(command -v geckodriver)" \
  cargo test -p agentstore --target wasm32-unknown-unknown --tests

step "wasm package (release, both entry points) and its size budgets"
bash scripts/build-pkg.sh --quiet
bash scripts/size.sh

step "npm package (dry run) and the Vite example build"
(cd pkg && npm pack --dry-run)
for example in examples/vite examples/ts; do
  (cd "$example" && timeout 600 npm ci --no-audit --no-fund --silent)
done
(cd examples/vite && timeout 300 node node_modules/vite/bin/vite.js build)

step "end-to-end tests (Playwright + Chromium against the demo server)"
node --test --test-concurrency=1 tests/e2e/

step "all test suites passed"

#!/usr/bin/env bash
# Runs every test of the project on this machine: installs what is missing
# (scripts/bootstrap.sh), starts PostgreSQL on loopback, then runs lints,
# native tests (protocol + server on SQLite and PostgreSQL), the browser
# suites in headless Chromium AND Firefox, and the end-to-end demo tests.
# Exits non-zero on the first failure.
#
# Each step prints how long it took, and a table of every step's duration ends
# the output. Whatever way the run ends (pass, failure, Ctrl-C, SIGTERM), what
# it started is stopped: the steps run in a child process, every process they
# start carries AGENTSTORE_TEST_RUN_DIR=<this run's directory> in its
# environment, and on exit this script stops its PostgreSQL cluster (when it
# started it) and then every process carrying that mark (lease servers, demo
# servers, browsers, drivers), then deletes the run directory.
#
# Environment: AGENTSTORE_PG_DIR / AGENTSTORE_PG_PORT (see scripts/pg.sh; by
# default a fresh cluster in the run directory on a free port),
# AGENTSTORE_TEST_PORT / AGENTSTORE_TEST_LONG_TTL_PORT (the lease servers for
# the browser suites, TTL 3 s and 60 s; default 18787 / 18788, or a port the
# server picks itself when that one is taken),
# WASM_BINDGEN_TEST_TIMEOUT (seconds per browser test binary, default 400: lease_network
# takes about 95 s on an idle machine of this kind and 120 s at a load of 6-9),
# WASM_BINDGEN_TEST_DRIVER_TIMEOUT (seconds the runner waits for chromedriver or
# geckodriver to take its port, default 60: the runner's own default of 5 s is
# overrun when the machine is busy, and a driver that has not bound by then fails
# the whole test binary).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-400}"
export WASM_BINDGEN_TEST_DRIVER_TIMEOUT="${WASM_BINDGEN_TEST_DRIVER_TIMEOUT:-60}"

# Seconds (one decimal) between two timestamps in microseconds.
seconds() { local us=$(($2 - $1)); printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10)); }

if [ -z "${AGENTSTORE_TEST_RUN_DIR:-}" ]; then
  AGENTSTORE_TEST_RUN_DIR="$(mktemp -d /tmp/agentstore-test.XXXXXX)"
  chmod 755 "$AGENTSTORE_TEST_RUN_DIR"  # the postgres user keeps its cluster in pg/
  export AGENTSTORE_TEST_RUN_DIR
  export AGENTSTORE_PG_DIR="${AGENTSTORE_PG_DIR:-$AGENTSTORE_TEST_RUN_DIR/pg}"
  PG_WAS_RUNNING=0
  bash scripts/pg.sh status 2>/dev/null && PG_WAS_RUNNING=1
  RUN_START=${EPOCHREALTIME/./}
  INNER=""

  # Processes started by this run (the mark is in the environment they were
  # started with; this shell's own environment predates it).
  run_pids() {
    local d
    for d in /proc/[0-9]*; do
      grep -qzxF "AGENTSTORE_TEST_RUN_DIR=$AGENTSTORE_TEST_RUN_DIR" "$d/environ" 2>/dev/null &&
        echo "${d#/proc/}"
    done
    return 0
  }

  # One line per step: name, seconds, outcome (the step running when the run
  # ended failed unless the steps finished).
  summary() {
    local rc=$1 now=${EPOCHREALTIME/./} name start next_name next_start outcome
    local -a names=() starts=()
    if [ -f "$AGENTSTORE_TEST_RUN_DIR/steps.tsv" ]; then
      while IFS=$'\t' read -r start name; do
        starts+=("$start"); names+=("$name")
      done <"$AGENTSTORE_TEST_RUN_DIR/steps.tsv"
    fi
    printf '\n=== step durations ===\n'
    local i
    for i in "${!names[@]}"; do
      next_start=${starts[$((i + 1))]:-$now}
      next_name=${names[$((i + 1))]:-}
      outcome=ok
      if [ -z "$next_name" ]; then
        [ "${names[$i]}" = "all test suites passed" ] && continue
        outcome=$([ "$rc" -ge 128 ] && echo INTERRUPTED || echo FAILED)
      fi
      printf '%-66s %8s s  %s\n' "${names[$i]}" "$(seconds "${starts[$i]}" "$next_start")" "$outcome"
    done
    printf '%-66s %8s s  %s\n' "total" "$(seconds "$RUN_START" "$now")" \
      "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")"
  }

  cleanup() {
    local rc=$? pids
    trap - EXIT INT TERM
    set +m
    set +e
    [ -n "$INNER" ] && kill -TERM "$INNER" 2>/dev/null
    if [ "$PG_WAS_RUNNING" = 0 ]; then bash scripts/pg.sh stop 2>&1 | sed 's/^/[cleanup] /'; fi
    pids=$(run_pids)
    if [ -n "$pids" ]; then
      echo "[cleanup] stopping what the run left running: $(echo $pids)"
      kill -TERM $pids 2>/dev/null
      for _ in $(seq 1 50); do
        pids=$(run_pids)
        [ -z "$pids" ] && break
        sleep 0.2
      done
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    fi
    summary "$rc"
    rm -rf "$AGENTSTORE_TEST_RUN_DIR"
    exit "$rc"
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # The steps run in a child with its own process group (job control): this
  # shell waits for it interruptibly, so Ctrl-C or SIGTERM cleans up at once.
  set -m
  bash scripts/test.sh "$@" &
  INNER=$!
  wait "$INNER"
  exit 0
fi

STEP_NAME=""
STEP_START=""
step() {
  local now=${EPOCHREALTIME/./}
  if [ -n "$STEP_NAME" ]; then
    printf -- '--- %s: %s s\n' "$STEP_NAME" "$(seconds "$STEP_START" "$now")"
  fi
  STEP_NAME="$*"
  STEP_START=$now
  printf '%s\t%s\n' "$now" "$*" >>"$AGENTSTORE_TEST_RUN_DIR/steps.tsv"
  printf '\n=== %s ===\n' "$*"
  # Free disk, so that a run that fails for lack of space says so up front.
  df -h . 2>/dev/null | awk 'NR == 2 { printf "(disk: %s free of %s)\n", $4, $2 }'
}

step "bootstrap"
bash scripts/bootstrap.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo clippy -p agentstore --target wasm32-unknown-unknown --all-targets -q -- -D warnings
# The three shipped builds (scripts/build-pkg.sh): "agentstore", "agentstore/store", io/.
cargo clippy -p agentstore --target wasm32-unknown-unknown --no-default-features --features lease,talc --lib -q -- -D warnings
cargo clippy -p agentstore --target wasm32-unknown-unknown --no-default-features --features talc --lib -q -- -D warnings
cargo clippy -p agentstore --target wasm32-unknown-unknown --no-default-features --features io,talc --lib -q -- -D warnings

step "PostgreSQL on loopback"
if [ -f scripts/pg.sh ]; then
  AGENTSTORE_TEST_PG_URL="$(bash scripts/pg.sh start | tail -n 1)"
  export AGENTSTORE_TEST_PG_URL
  echo "AGENTSTORE_TEST_PG_URL=$AGENTSTORE_TEST_PG_URL"
fi

step "native tests (protocol, server on SQLite and PostgreSQL)"
cargo test --workspace --exclude agentstore

step "lease servers for the browser suites (loopback, short and long TTLs)"
# The lease suites (tests/lease_*.rs) read the URLs and admin token at compile
# time; the servers allow the test runner's random loopback port by CORS.
# Two servers: TTL 3 s (AGENTSTORE_TEST_SERVER, for the tests of expiry and
# deadlines) and TTL 60 s (AGENTSTORE_TEST_SERVER_LONG_TTL, for the tests whose
# point is not expiry but whose multi-step sequence must fit in one TTL: on a
# busy machine it may not fit in 3 s). Both heartbeat every 0.5 s.
cargo build -q -p agentstore-server
LEASE_DIR="$AGENTSTORE_TEST_RUN_DIR/lease"
mkdir -p "$LEASE_DIR"
export AGENTSTORE_TEST_ADMIN_TOKEN="agentstore-lease-test-admin"
# The port of the line "agentstore-server listening addr=127.0.0.1:<port>" in
# the log of server $1 (short or long), once it is there.
listening() { sed 's/\x1b\[[0-9;]*m//g' "$LEASE_DIR/server-$1.log" | sed -n 's/.*agentstore-server listening addr=127\.0\.0\.1:\([0-9]*\).*/\1/p' | head -n 1; }
# Starts server $1 (short or long) with TTL $2 ms on 127.0.0.1:$3 and waits
# (bounded) until THIS server says it listens (another run's server on the
# same port would answer /v1/health too); its PID in LEASE_PID_$1. Fails
# when it exits first (the port taken).
start_lease_server() {
  RUST_LOG=info "${CARGO_TARGET_DIR:-target}/debug/agentstore-server" --listen "127.0.0.1:$3" \
    --database "$LEASE_DIR/leases-$1.sqlite" --admin-token "$AGENTSTORE_TEST_ADMIN_TOKEN" \
    --allow-origin 'http://127.0.0.1:*' --ttl-ms "$2" --heartbeat-ms 500 --reaper-ms 200 \
    --claim-rate 1000/s --auth-rate 1000/s --idle-retry-ms 100 --www "$LEASE_DIR" --pkg "$LEASE_DIR" \
    >"$LEASE_DIR/server-$1.log" 2>&1 &
  printf -v "LEASE_PID_$1" '%s' "$!"
  for _ in $(seq 1 300); do
    [ -n "$(listening "$1")" ] && return 0
    kill -0 "$!" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
LEASE_PID_short="" LEASE_PID_long="" PROXY_PID=""
trap 'kill $LEASE_PID_short $LEASE_PID_long $PROXY_PID 2>/dev/null || true; rm -rf "$LEASE_DIR"' EXIT
# Server $1 with TTL $2 ms on port $3 by default, since the suites are compiled
# with the URL (the same URL run after run keeps them built); when that port is
# taken, a port the server binds itself (port 0) instead of a failed run. $4
# is the port asked for explicitly (AGENTSTORE_TEST_PORT...), if any.
start_lease_server_on() {
  local pid_var="LEASE_PID_$1"
  if ! start_lease_server "$1" "$2" "${4:-$3}"; then
    kill "${!pid_var}" 2>/dev/null || true
    if [ -z "${4:-}" ]; then
      echo "port $3 taken: the $1-TTL lease server picks a port"
      start_lease_server "$1" "$2" 0 && return 0
    fi
    cat "$LEASE_DIR/server-$1.log"
    echo "$1-TTL lease server did not start (port ${4:-$3} taken?)"
    exit 1
  fi
}
start_lease_server_on short 3000 18787 "${AGENTSTORE_TEST_PORT:-}"
start_lease_server_on long 60000 18788 "${AGENTSTORE_TEST_LONG_TTL_PORT:-}"
export AGENTSTORE_TEST_SERVER="http://127.0.0.1:$(listening short)"
export AGENTSTORE_TEST_SERVER_LONG_TTL="http://127.0.0.1:$(listening long)"
curl -fsS "$AGENTSTORE_TEST_SERVER/v1/health" >/dev/null
curl -fsS "$AGENTSTORE_TEST_SERVER_LONG_TTL/v1/health" >/dev/null
echo "AGENTSTORE_TEST_SERVER=$AGENTSTORE_TEST_SERVER"
echo "AGENTSTORE_TEST_SERVER_LONG_TTL=$AGENTSTORE_TEST_SERVER_LONG_TTL"
# A loopback proxy in front of each that holds heartbeat answers back or cuts
# off enrollments (tests/lease_network.rs); it picks a free port and prints it.
# Starts a proxy in front of $1, its log $2; sets the variable named $3 to
# its URL.
start_proxy() {
  node scripts/delay-proxy.mjs --target "$1" >"$2" 2>&1 &
  local pid=$!
  PROXY_PID="$PROXY_PID $pid"
  for _ in $(seq 1 600); do
    grep -q '^listening ' "$2" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$2"; exit 1; }
    sleep 0.1
  done
  grep -q '^listening ' "$2" || { cat "$2"; exit 1; }
  printf -v "$3" '%s' "$(sed -n 's/^listening //p' "$2")"
}
start_proxy "$AGENTSTORE_TEST_SERVER" "$LEASE_DIR/proxy-short.log" AGENTSTORE_TEST_PROXY
start_proxy "$AGENTSTORE_TEST_SERVER_LONG_TTL" "$LEASE_DIR/proxy-long.log" AGENTSTORE_TEST_PROXY_LONG_TTL
export AGENTSTORE_TEST_PROXY AGENTSTORE_TEST_PROXY_LONG_TTL
echo "AGENTSTORE_TEST_PROXY=$AGENTSTORE_TEST_PROXY"
echo "AGENTSTORE_TEST_PROXY_LONG_TTL=$AGENTSTORE_TEST_PROXY_LONG_TTL"

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

step "lease server, release build (what scripts/demo.sh runs in the e2e tests)"
# Built here, untimed: the e2e tests start scripts/demo.sh under a bounded wait
# for its "listening" line, and a cold release build (LTO, one codegen unit)
# on a busy 2-core machine must not count against that bound.
cargo build --release -q -p agentstore-server

step "end-to-end tests (Playwright + Chromium against the demo server)"
node --test --test-concurrency=1 tests/e2e/

step "all test suites passed"

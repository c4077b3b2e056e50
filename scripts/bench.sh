#!/usr/bin/env bash
# The one benchmark command (see BENCHMARKS.md). Installs what it needs
# (scripts/bootstrap.sh, then bench/'s own npm packages), builds pkg/ and the
# server + load generator in release, then runs
#   1. browser: agentstore vs raw IndexedDB, Dexie 4, PouchDB 9, idb 8 in
#      headless Chromium AND headless Firefox ESR (geckodriver) (BENCH_RUNS
#      runs, default 5; medians), then time to first read on a slow profile
#      (agentstore/store vs Dexie 4 vs raw, fresh profile per run);
#   2. server: agentstore-server on SQLite and on PostgreSQL, claim → 3
#      heartbeats → settle and (like for like with pg-boss's fetch → complete)
#      claim → settle, and pg-boss 12 on the same PostgreSQL with the same pool
#      (BENCH_SERVER_RUNS, default 3; BENCH_POOL, default 20).
#   3. import/export: bench/import.mjs (a generated 120,000-document PouchDB dump;
#      time vs raw IndexedDB and the wasm module's memory; IMPORT_RUNS, default 3).
# Everything is loopback. Each phase is bounded by `timeout`; the browser phase
# also stops starting new runs when its share of BENCH_BUDGET_S is spent.
# Tables go to stdout and to bench/results/{browser,browser-firefox,first-read,import,server}.md.
#
#   bash scripts/bench.sh            # everything (about 15-25 min on 2 cores)
#   BENCH_SKIP_BUILD=1 BENCH_RUNS=1 bash scripts/bench.sh   # quick look
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

RUNS="${BENCH_RUNS:-5}"
SERVER_RUNS="${BENCH_SERVER_RUNS:-3}"
ITEMS="${BENCH_ITEMS:-4000}"
BUDGET_S="${BENCH_BUDGET_S:-2400}"   # whole script, builds excluded
BROWSER_S=$((BUDGET_S * 2 / 3))
SERVER_S=$((BUDGET_S - BROWSER_S))

step() { printf '\n=== %s ===\n' "$*" >&2; }

step "machine"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)   commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  free -h | sed -n 1,2p
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "chromium: $(/usr/bin/chromium --version 2>/dev/null | head -n1)"
  echo "node: $(node --version)   rustc: $(rustc --version | cut -d' ' -f2)"
} | tee /dev/stderr > /tmp/agentstore-bench-machine.txt

if [ -z "${BENCH_SKIP_BUILD:-}" ]; then
  step "toolchain (scripts/bootstrap.sh)"
  bash scripts/bootstrap.sh >&2
fi

step "bench npm packages (bench/package-lock.json)"
if ! (cd bench && npm ls --omit=dev >/dev/null 2>&1); then
  (cd bench && npm ci --no-audit --no-fund >&2)
fi

if [ -z "${BENCH_SKIP_BUILD:-}" ]; then
  step "build: pkg/ (wasm-pack --release) and the server + load generator (cargo --release)"
  bash scripts/build-pkg.sh >&2
  cargo build --release -q -p agentstore-server -p agentstore-loadgen >&2
fi

mkdir -p bench/results
# BENCH_BEFORE=DIR adds "agentstore (before)": another build of pkg/ (e.g. main's)
# run side by side in the same browsers, and in the time-to-first-read runs.
BEFORE_ARGS=()
[ -n "${BENCH_BEFORE:-}" ] && BEFORE_ARGS=(--before "$BENCH_BEFORE")
step "browser benchmarks, Chromium (${RUNS} runs, budget $((BROWSER_S / 2)) s)"
timeout --kill-after=30 "$((BROWSER_S / 2 + 300))" \
  node bench/run-browser.mjs --browser chromium --runs "$RUNS" --budget-s "$((BROWSER_S / 2))" \
  "${BEFORE_ARGS[@]}" --out bench/results/browser.json > bench/results/browser.md
step "browser benchmarks, Firefox ESR via geckodriver (${RUNS} runs, budget $((BROWSER_S / 2)) s)"
timeout --kill-after=30 "$((BROWSER_S / 2 + 300))" \
  node bench/run-browser.mjs --browser firefox --runs "$RUNS" --budget-s "$((BROWSER_S / 2))" \
  "${BEFORE_ARGS[@]}" --out bench/results/browser-firefox.json > bench/results/browser-firefox.md
step "time to first read (slow profile, fresh profile per run)"
timeout --kill-after=30 900 node bench/first-read.mjs --runs 3 "${BEFORE_ARGS[@]}" > bench/results/first-read.md

step "import/export memory and time (bench/import.mjs, ${IMPORT_RUNS:=3} runs)"
timeout --kill-after=30 1800 node bench/import.mjs --runs "$IMPORT_RUNS" > bench/results/import.md

step "PostgreSQL on loopback (scripts/pg.sh)"
PG_ARGS=()
# pg.sh picks a free port (or AGENTSTORE_PG_PORT) and prints the test URL
# last; the benchmark needs the cluster's superuser on that port.
if PG_URL="$(bash scripts/pg.sh start | tail -n 1)" && [[ "$PG_URL" =~ :([0-9]+)/ ]]; then
  PG_ARGS=(--pg-admin-url "postgres://postgres@127.0.0.1:${BASH_REMATCH[1]}/postgres")
else
  echo "PostgreSQL unavailable: PostgreSQL scenarios skipped" >&2
fi

step "server benchmarks (${SERVER_RUNS} runs × ${ITEMS} items, budget ${SERVER_S} s)"
timeout --kill-after=30 "$SERVER_S" \
  node bench/run-server.mjs "${PG_ARGS[@]}" --runs "$SERVER_RUNS" --items "$ITEMS" --pool "${BENCH_POOL:-20}" --max-secs 60 \
  --out bench/results/server.json > bench/results/server.md

printf '\n## Machine\n\n```\n'; cat /tmp/agentstore-bench-machine.txt; printf '```\n'
printf '\n## Browser (headless Chromium)\n\n'; cat bench/results/browser.md
printf '\n## Browser (headless Firefox ESR)\n\n'; cat bench/results/browser-firefox.md
printf '\n## Time to first read (Chromium, slow profile)\n\n'; cat bench/results/first-read.md
printf '\n## Import and export (headless Chromium)\n\n'; cat bench/results/import.md
printf '\n## Server (loopback)\n\n'; cat bench/results/server.md

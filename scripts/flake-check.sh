#!/usr/bin/env bash
# Flake check: runs the README's test command (scripts/test.sh) N times in a row
# while a CPU hog (stress-ng, from Debian) keeps every core busy, and prints each
# run's result and per-step durations, then a table of all runs.
#
#   bash scripts/flake-check.sh [N]     # N defaults to 3; exit 0 only if all N passed
#
# Environment: FLAKE_LOG_DIR (default: a new /tmp/agentstore-flake.* directory;
# run-<i>.log holds each run's full output), FLAKE_HOG_WORKERS (default: the
# number of cores), plus whatever scripts/test.sh reads (AGENTSTORE_TEST_PORT,
# AGENTSTORE_TEST_LONG_TTL_PORT, AGENTSTORE_PG_PORT, AGENTSTORE_PG_DIR, ...). Every run continues after a
# failure, so one check shows how often each step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-3}
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [N]" >&2; exit 2; }
LOG_DIR=${FLAKE_LOG_DIR:-$(mktemp -d /tmp/agentstore-flake.XXXXXX)}
mkdir -p "$LOG_DIR"
WORKERS=${FLAKE_HOG_WORKERS:-$(nproc)}

log() { printf '[flake-check] %s\n' "$*"; }

if ! command -v stress-ng >/dev/null; then
  log "apt-get install stress-ng"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
fi

HOG=""
stop_hog() {
  if [ -n "$HOG" ] && kill -0 "$HOG" 2>/dev/null; then
    kill -TERM "$HOG" 2>/dev/null || true
    wait "$HOG" 2>/dev/null || true
  fi
}
trap stop_hog EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "CPU hog: stress-ng --cpu $WORKERS (logs in $LOG_DIR)"
stress-ng --cpu "$WORKERS" --timeout 0 --quiet &
HOG=$!
# Bounded wait for the hog's workers to exist (stress-ng forks them).
for _ in $(seq 1 50); do
  [ "$(pgrep -c -P "$HOG" || true)" -ge "$WORKERS" ] && break
  sleep 0.1
done
kill -0 "$HOG" 2>/dev/null || { log "stress-ng did not start"; exit 1; }

results=()
failed=0
for i in $(seq 1 "$N"); do
  run_log="$LOG_DIR/run-$i.log"
  log "run $i/$N: bash scripts/test.sh > $run_log"
  start=$SECONDS
  rc=0
  bash scripts/test.sh >"$run_log" 2>&1 </dev/null || rc=$?
  took=$((SECONDS - start))
  if [ "$rc" = 0 ]; then outcome=passed; else outcome="FAILED (exit $rc)"; failed=$((failed + 1)); fi
  log "run $i/$N: $outcome in ${took} s; per step:"
  # scripts/test.sh ends with its table of step durations.
  sed -n '/^=== step durations ===$/,$p' "$run_log" | tail -n +2 | sed 's/^/    /'
  if [ "$rc" != 0 ]; then
    log "run $i/$N: last lines of its log:"
    grep -v '^\s*$' "$run_log" | grep -B 30 -m 1 '^=== step durations ===$' | head -n 30 | sed 's/^/    | /'
  fi
  results+=("run $i: $outcome, ${took} s")
done

printf '\n=== flake check: %d run(s) under stress-ng --cpu %s ===\n' "$N" "$WORKERS"
printf '%s\n' "${results[@]}"
printf '%d of %d passed; logs in %s\n' "$((N - failed))" "$N" "$LOG_DIR"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# Builds the SDK (wasm-pack → pkg/) and agentstore-server, then runs the
# server on its embedded SQLite default, serving www/ at `/` and pkg/ at
# `/pkg/`. Prints the URL once the server answers; Ctrl-C stops it.
#
# Environment:
#   PORT=8787            port on 127.0.0.1
#   DATABASE=path        SQLite file for agentstore-server (its default: ./agentstore.sqlite)
#   DEMO_SKIP_BUILD=1    reuse an existing pkg/ instead of running wasm-pack
#   DEMO_READY_TIMEOUT=60  seconds to wait for the server to answer
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/bootstrap.sh demo >&2

HOST=127.0.0.1
PORT=${PORT:-8787}
URL="http://$HOST:$PORT/"
log() { printf '[demo] %s\n' "$*" >&2; }

if [ "${DEMO_SKIP_BUILD:-0}" = 1 ] && [ -f pkg/agentstore.js ]; then
  log "DEMO_SKIP_BUILD=1: using the existing pkg/"
else
  log "building the SDK: wasm-pack build --target web --release --out-dir pkg"
  wasm-pack build --target web --release --out-dir pkg >&2
  node scripts/package.mjs >&2  # completes pkg/package.json (exports, sideEffects)
fi

log "building agentstore-server: cargo build --release -p agentstore-server"
cargo build --release -p agentstore-server >&2
server=("${CARGO_TARGET_DIR:-target}/release/agentstore-server" --listen "$HOST:$PORT" --www www --pkg pkg)
[ -n "${DATABASE:-}" ] && server+=(--database "$DATABASE")

log "starting: ${server[*]}"
"${server[@]}" >&2 &
pid=$!

# Background jobs of a script ignore SIGINT, so Ctrl-C reaches only this shell:
# stop the server ourselves on any exit.
cleanup() {
  trap - EXIT INT TERM
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deadline=$((SECONDS + ${DEMO_READY_TIMEOUT:-60}))
until curl -fsS -o /dev/null --max-time 2 "$URL" 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    log "the server exited before it answered"
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    log "the server did not answer at $URL within ${DEMO_READY_TIMEOUT:-60} s"
    exit 1
  fi
  sleep 0.2
done

echo "agentstore demo: $URL"
log "Ctrl-C to stop"
wait "$pid"

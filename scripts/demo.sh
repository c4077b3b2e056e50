#!/usr/bin/env bash
# Builds the SDK (wasm-pack → pkg/) and serves the demo page: www/ at `/`,
# pkg/ at `/pkg/`. Prints the URL once the server answers; Ctrl-C stops it.
#
# Serves with agentstore-server (the lease server, embedded SQLite) when it
# builds and takes `--www/--pkg`; otherwise with a small static Node server.
#
# Environment:
#   PORT=8787            port on 127.0.0.1
#   DATABASE=path        SQLite file for agentstore-server (its default: ./agentstore.sqlite)
#   DEMO_SKIP_BUILD=1    reuse an existing pkg/ instead of running wasm-pack
#   DEMO_SERVER=static   skip agentstore-server and use the static server
#   DEMO_READY_TIMEOUT=60  seconds to wait for the server to answer
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

HOST=127.0.0.1
PORT=${PORT:-8787}
URL="http://$HOST:$PORT/"
log() { printf '[demo] %s\n' "$*" >&2; }

if [ "${DEMO_SKIP_BUILD:-0}" = 1 ] && [ -f pkg/agentstore.js ]; then
  log "DEMO_SKIP_BUILD=1: using the existing pkg/"
else
  log "building the SDK: wasm-pack build --target web --release --out-dir pkg"
  wasm-pack build --target web --release --out-dir pkg >&2
fi

server=()
if [ "${DEMO_SERVER:-auto}" != static ]; then
  log "building agentstore-server: cargo build --release -p agentstore-server"
  if cargo build --release -p agentstore-server >&2; then
    bin=${CARGO_TARGET_DIR:-target}/release/agentstore-server
    help=$("$bin" --help 2>&1 || true)
    if grep -q -- '--www' <<<"$help" && grep -q -- '--pkg' <<<"$help" && grep -q -- '--listen' <<<"$help"; then
      server=("$bin" --listen "$HOST:$PORT" --www www --pkg pkg)
      [ -n "${DATABASE:-}" ] && server+=(--database "$DATABASE")
    else
      log "agentstore-server does not take --listen/--www/--pkg yet"
    fi
  else
    log "agentstore-server does not build"
  fi
fi
if [ ${#server[@]} -eq 0 ]; then
  log "falling back to the static server (no lease API)"
  server=(node tests/e2e/static-server.mjs --listen "$HOST:$PORT" --www www --pkg pkg)
fi

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

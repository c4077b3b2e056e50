#!/usr/bin/env bash
# The one-command demo. Builds the SDK (wasm-pack → pkg/) and agentstore-server,
# runs the server on a fresh embedded SQLite database with demo-friendly short
# lease times, enqueues a sample workload, gives the page what it needs to
# enroll workers, and prints the URL once the server answers. Ctrl-C stops it
# and deletes the run's files.
#
# Secrets, and why nothing leaks:
# - A random admin token is made for this run and handed to the server in its
#   environment (not on its command line). It is used only here, by curl on
#   loopback, to create single-use enrollment tokens and the sample items; it is
#   never written to a file or served.
# - The enrollment tokens go to <run dir>/www/runtime/demo.json, served at
#   /runtime/demo.json. The server listens on 127.0.0.1 only, so only this
#   machine can read them; each one enrolls one worker, once. The served www/ is
#   a run directory of symlinks to the repository's www/ plus runtime/, so no
#   token file is ever written inside the repository.
#
# Environment:
#   PORT=8787              port on 127.0.0.1 (0: one the server picks; the printed URL
#                          says which)
#   DATABASE=path          keep the SQLite database there (default: a fresh file
#                          in the run directory, deleted on exit)
#   AGENTSTORE_ADMIN_TOKEN use this admin token instead of a random one (tests)
#   DEMO_SKIP_BUILD=1      reuse an existing pkg/ instead of running wasm-pack
#   DEMO_READY_TIMEOUT=60  seconds to wait for the server to answer
#   DEMO_QUEUE=demo        queue the page's workers claim from
#   DEMO_TTL_MS=6000 DEMO_HEARTBEAT_MS=1000 DEMO_REAPER_MS=1000 DEMO_MAX_REDELIVERIES=5
#                          lease settings (the field defaults are 90 s / 15 s / 15 s / 5
#                          re-deliveries after the first delivery)
#   DEMO_WORKLOAD=24       sample items enqueued at start
#   DEMO_TOKENS=300        worker enrollment tokens for pages (three per page load)
#   DEMO_PRODUCER_TOKENS=100  producer enrollment tokens (one per page load)
#   DEMO_QUICKSTART_TOKENS=50 worker enrollment tokens the page never takes, for README's
#                          quickstart pasted into its console (a token a page's worker
#                          holds would be a reuse: it revokes that worker)
#
# Least privilege: the page's tokens are scoped to the demo queue. Worker tokens
# enroll workers (claim there, act on their own leases only); producer tokens
# enroll the panel's producer (enqueue into and list the demo queue). Neither
# can create tokens, pause, resume, or touch another queue.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/bootstrap.sh demo >&2

HOST=127.0.0.1
PORT=${PORT:-8787}
URL="http://$HOST:$PORT/"
QUEUE=${DEMO_QUEUE:-demo}
TTL_MS=${DEMO_TTL_MS:-6000}
HEARTBEAT_MS=${DEMO_HEARTBEAT_MS:-1000}
REAPER_MS=${DEMO_REAPER_MS:-1000}
MAX_REDELIVERIES=${DEMO_MAX_REDELIVERIES:-5}
WORKLOAD=${DEMO_WORKLOAD:-24}
TOKENS=${DEMO_TOKENS:-300}
PRODUCER_TOKENS=${DEMO_PRODUCER_TOKENS:-100}
QUICKSTART_TOKENS=${DEMO_QUICKSTART_TOKENS:-50}
log() { printf '[demo] %s\n' "$*" >&2; }

if [ "${DEMO_SKIP_BUILD:-0}" = 1 ] && [ -f pkg/agentstore.js ]; then
  log "DEMO_SKIP_BUILD=1: using the existing pkg/"
else
  log "building the SDK: scripts/build-pkg.sh (pkg/ and the store-only pkg/store/)"
  bash scripts/build-pkg.sh >&2
fi

log "building agentstore-server: cargo build --release -p agentstore-server"
cargo build --release -p agentstore-server >&2

# The run directory: served www/ (symlinks + runtime/) and, by default, the database.
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/agentstore-demo.XXXXXX")
mkdir -p "$RUN_DIR/www/runtime"
for entry in www/*; do
  [ "$(basename "$entry")" = runtime ] || ln -s "$ROOT/$entry" "$RUN_DIR/www/"
done
DB=${DATABASE:-$RUN_DIR/demo.sqlite}
ADMIN_TOKEN=${AGENTSTORE_ADMIN_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}

server=("${CARGO_TARGET_DIR:-target}/release/agentstore-server" --listen "$HOST:$PORT"
  --www "$RUN_DIR/www" --pkg "$ROOT/pkg" --database "$DB"
  --ttl-ms "$TTL_MS" --heartbeat-ms "$HEARTBEAT_MS" --reaper-ms "$REAPER_MS"
  --max-redeliveries "$MAX_REDELIVERIES" --idle-retry-ms 1000 --claim-rate 20/s)

log "starting: ${server[*]}"
# The server's log goes to stderr and to server.log, whose "listening" line
# (written once the server holds its port) is what readiness waits for.
AGENTSTORE_ADMIN_TOKEN=$ADMIN_TOKEN "${server[@]}" > >(tee "$RUN_DIR/server.log" >&2) &
pid=$!

# Background jobs of a script ignore SIGINT, so Ctrl-C reaches only this shell:
# stop the server ourselves on any exit, then delete the run directory.
cleanup() {
  trap - EXIT INT TERM
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Ready when this server says it listens (not when something on the port
# answers: another process may hold it) and then answers its health check.
# The port is read from that line, so PORT=0 works too.
listening_port() {
  sed 's/\x1b\[[0-9;]*m//g' "$RUN_DIR/server.log" 2>/dev/null |
    sed -n 's/.*agentstore-server listening addr=[0-9.]*:\([0-9]*\).*/\1/p' | head -n 1
}
deadline=$((SECONDS + ${DEMO_READY_TIMEOUT:-60}))
until [ -n "$(listening_port)" ] && curl -fsS -o /dev/null --max-time 2 "http://$HOST:$(listening_port)/v1/health" 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    [ "$PORT" = 0 ] && log "the server exited before it answered" ||
      log "the server exited before it answered (is port $PORT taken?)"
    exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    log "the server did not answer within ${DEMO_READY_TIMEOUT:-60} s"
    exit 1
  fi
  sleep 0.2
done
PORT=$(listening_port)
URL="http://$HOST:$PORT/"

# Admin calls: one curl process per batch, its config (with the admin token)
# on stdin so that the token never appears in a process list.
admin_header() {
  printf 'header = "Authorization: Bearer %s"\nheader = "Content-Type: application/json"\n' "$ADMIN_TOKEN"
}

# Single-use enrollment tokens of one role, scoped to the demo queue.
enrollment_tokens() { # role count
  {
    admin_header
    printf 'data = "{\\"role\\":\\"%s\\",\\"queues\\":[\\"%s\\"]}"\n' "$1" "$QUEUE"
    for _ in $(seq "$2"); do printf 'url = "%sv1/admin/enrollment-tokens"\n' "$URL"; done
  } | curl -fsS --max-time 60 -K - | grep -o '"token":"[^"]*"' | cut -d'"' -f4
}
json_list() { printf '%s\n' "$1" | sed 's/.*/"&"/' | paste -sd, -; }

log "creating $TOKENS worker, $PRODUCER_TOKENS producer and $QUICKSTART_TOKENS quickstart enrollment tokens (queue \"$QUEUE\" only)"
tokens=$(enrollment_tokens worker "$TOKENS")
producer_tokens=$(enrollment_tokens producer "$PRODUCER_TOKENS")
quickstart_tokens=$(enrollment_tokens worker "$QUICKSTART_TOKENS")
count=$(printf '%s\n' "$tokens" | grep -c . || true)
pcount=$(printf '%s\n' "$producer_tokens" | grep -c . || true)
qcount=$(printf '%s\n' "$quickstart_tokens" | grep -c . || true)
if [ "$count" != "$TOKENS" ] || [ "$pcount" != "$PRODUCER_TOKENS" ] || [ "$qcount" != "$QUICKSTART_TOKENS" ]; then
  log "expected $TOKENS + $PRODUCER_TOKENS + $QUICKSTART_TOKENS enrollment tokens, got $count + $pcount + $qcount"
  exit 1
fi

log "enqueueing a sample workload of $WORKLOAD items on queue \"$QUEUE\""
tasks=(summarise classify translate extract triage review)
if [ "$WORKLOAD" -gt 0 ]; then
  {
    for i in $(seq "$WORKLOAD"); do
      [ "$i" -gt 1 ] && printf 'next\n'
      admin_header
      printf 'url = "%sv1/queues/%s/items"\n' "$URL" "$QUEUE"
      printf 'data = "{\\"payload\\":{\\"task\\":\\"%s\\",\\"n\\":%d,\\"ms\\":%d,\\"source\\":\\"demo.sh\\"}}"\n' \
        "${tasks[$((i % ${#tasks[@]}))]}" "$i" $((1200 + (i * 397) % 2400))
    done
  } | curl -fsS --max-time 60 -K - >/dev/null
fi

cat >"$RUN_DIR/www/runtime/demo.json" <<EOF
{
  "runId": "$(basename "$RUN_DIR")",
  "queue": "$QUEUE",
  "ttlMs": $TTL_MS,
  "heartbeatMs": $HEARTBEAT_MS,
  "reaperMs": $REAPER_MS,
  "maxRedeliveries": $MAX_REDELIVERIES,
  "enrollmentTokens": [$(json_list "$tokens")],
  "producerTokens": [$(json_list "$producer_tokens")],
  "quickstartTokens": [$(json_list "$quickstart_tokens")]
}
EOF

echo "agentstore demo: $URL"
log "lease TTL ${TTL_MS} ms, heartbeat ${HEARTBEAT_MS} ms, reaper ${REAPER_MS} ms, retry cap ${MAX_REDELIVERIES} re-deliveries"
log "Ctrl-C to stop"
wait "$pid"

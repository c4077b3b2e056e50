#!/usr/bin/env bash
# Throwaway PostgreSQL cluster on loopback for the server's test suite.
#
#   scripts/pg.sh start   # idempotent; last line of output is the URL to export
#   scripts/pg.sh stop    # stops it (data stays until the directory is removed)
#   scripts/pg.sh url     # prints the URL
#
#   export AGENTSTORE_TEST_PG_URL="$(scripts/pg.sh start | tail -n 1)"
#
# initdb refuses to run as root, so the cluster belongs to the `postgres` user
# (created by Debian's postgresql package). Only 127.0.0.1 is listened on.
set -euo pipefail

PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
PGDIR="${AGENTSTORE_PG_DIR:-/tmp/agentstore-pg}"
PGPORT="${AGENTSTORE_PG_PORT:-55432}"
PGUSER_NAME=agentstore
PGDB=agentstore_test
URL="postgres://${PGUSER_NAME}@127.0.0.1:${PGPORT}/${PGDB}"

log() { printf '[pg.sh] %s\n' "$*" >&2; }

[ -x "$PGBIN/initdb" ] || { log "no PostgreSQL binaries (apt-get install -y postgresql)"; exit 1; }

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

running() { as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; }

pg_start() {
  log "starting on 127.0.0.1:$PGPORT"
  as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGDIR -c max_connections=300 -c fsync=off" \
    start >/dev/null 2>&1 || true
}

start() {
  if [ ! -f "$PGDIR/data/PG_VERSION" ]; then
    log "initdb in $PGDIR/data"
    mkdir -p "$PGDIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"
    as_pg "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  running || pg_start
  # After an unclean stop (the cluster's processes were killed) pg_ctl can return
  # while the server is still in crash recovery: wait until it accepts connections.
  local waited=0
  until "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; do
    if [ "$waited" -ge 60 ]; then
      log "PostgreSQL did not become ready; see $PGDIR/server.log"
      tail -n 20 "$PGDIR/server.log" >&2 || true
      exit 1
    fi
    if [ $((waited % 5)) = 4 ] && ! running; then pg_start; fi
    sleep 1
    waited=$((waited + 1))
  done
  local psql=("$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
  if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = '$PGUSER_NAME'")" != 1 ]; then
    "${psql[@]}" -c "CREATE ROLE $PGUSER_NAME LOGIN"
  fi
  if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$PGDB'")" != 1 ]; then
    "${psql[@]}" -c "CREATE DATABASE $PGDB OWNER $PGUSER_NAME"
  fi
  echo "$URL"
}

stop() {
  if running; then
    as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w stop >/dev/null
    log "stopped"
  else
    log "not running"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  url) echo "$URL" ;;
  *) log "usage: $0 start|stop|url"; exit 2 ;;
esac

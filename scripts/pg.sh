#!/usr/bin/env bash
# Throwaway PostgreSQL cluster on loopback for the server's test suite — one of
# its own, never someone else's.
#
#   scripts/pg.sh start    # idempotent; the last line of output is the URL to export
#   scripts/pg.sh stop     # stops it (data stays until the directory is removed)
#   scripts/pg.sh status   # exit 0 when this directory's cluster is running
#   scripts/pg.sh url      # prints the URL
#
#   export AGENTSTORE_TEST_PG_URL="$(scripts/pg.sh start | tail -n 1)"
#
# AGENTSTORE_PG_DIR (default /tmp/agentstore-pg) holds the cluster: data/, the
# socket directory sock/, server.log, the port it listens on (port) and the
# marker file `owner` that pg.sh writes when it creates the cluster. pg.sh
# refuses a directory without that marker and never attaches to a server it did
# not start: before using a port it checks that nothing listens there, and
# before handing out a URL it checks (over that TCP port) that the server
# answering is the one whose data directory is ours.
# AGENTSTORE_PG_PORT fixes the port; without it a free one is picked (and kept
# in `port` for the next start).
#
# initdb refuses to run as root, so the cluster belongs to the `postgres` user
# (created by Debian's postgresql package). Only 127.0.0.1 is listened on.
set -euo pipefail

PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
PGDIR="${AGENTSTORE_PG_DIR:-/tmp/agentstore-pg}"
PGUSER_NAME=agentstore
PGDB=agentstore_test
MARKER="$PGDIR/owner"

log() { printf '[pg.sh] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ -x "$PGBIN/initdb" ] || die "no PostgreSQL binaries (apt-get install -y postgresql)"

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# This directory's cluster is running (pg_ctl reads OUR data/postmaster.pid).
running() { as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; }

# The port our running postmaster listens on (line 4 of postmaster.pid).
running_port() { sed -n 4p "$PGDIR/data/postmaster.pid" 2>/dev/null; }

url_for() { echo "postgres://${PGUSER_NAME}@127.0.0.1:$1/${PGDB}"; }

recorded_port() { cat "$PGDIR/port" 2>/dev/null || true; }

# Refuses a directory pg.sh did not create.
check_owned() {
  [ -f "$PGDIR/data/PG_VERSION" ] || return 0
  if [ ! -f "$MARKER" ]; then
    # pg.sh before the marker existed laid out exactly data/ + server.log.
    if [ -f "$PGDIR/server.log" ] && [ -z "$(ls -A "$PGDIR" | grep -vxE 'data|server.log|\.s\.PGSQL\..*')" ]; then
      log "adopting $PGDIR (created by an older pg.sh, which wrote no marker)"
      echo "agentstore scripts/pg.sh" >"$MARKER"
    else
      die "$PGDIR/data holds a cluster pg.sh did not create (no $MARKER): refusing to touch it; set AGENTSTORE_PG_DIR to a new directory"
    fi
  fi
}

# Checks over TCP that the server on port $1 is this directory's cluster.
check_is_ours() {
  local want got
  want="$(cd "$PGDIR/data" && pwd -P)"
  got="$("$PGBIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -qtAX \
    -c "SELECT current_setting('data_directory')" 2>/dev/null || true)"
  got="$( (cd "$got" 2>/dev/null && pwd -P) || echo "${got:-<no answer>}")"
  [ "$got" = "$want" ] ||
    die "127.0.0.1:$1 is served by a cluster pg.sh did not start (data directory $got, ours is $want): refusing to use it"
}

# Starts our cluster on port $1; fails when that port is taken.
pg_start() {
  local port=$1
  if port_in_use "$port"; then
    log "127.0.0.1:$port is already in use by another program"
    return 1
  fi
  log "starting on 127.0.0.1:$port (data $PGDIR/data)"
  echo "$port" >"$PGDIR/port"
  as_pg mkdir -p "$PGDIR/sock"
  as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $PGDIR/sock -c max_connections=300 -c fsync=off" \
    start >/dev/null 2>&1 && return 0
  # After an unclean stop pg_ctl can give up while the server is still in crash
  # recovery: the caller waits for readiness. A bind failure ends the postmaster.
  running
}

start() {
  check_owned
  if [ ! -f "$PGDIR/data/PG_VERSION" ]; then
    log "initdb in $PGDIR/data"
    mkdir -p "$PGDIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"
    as_pg test -w "$PGDIR" || die "the cluster's owner cannot write $PGDIR (is its parent directory readable by the postgres user?)"
    as_pg "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
    echo "agentstore scripts/pg.sh" >"$MARKER"
  fi
  local port
  if running; then
    port="$(running_port)"
    if [ -n "${AGENTSTORE_PG_PORT:-}" ] && [ "$AGENTSTORE_PG_PORT" != "$port" ]; then
      die "this cluster already runs on port $port, not AGENTSTORE_PG_PORT=$AGENTSTORE_PG_PORT (scripts/pg.sh stop first)"
    fi
    echo "$port" >"$PGDIR/port"
  elif [ -n "${AGENTSTORE_PG_PORT:-}" ]; then
    port=$AGENTSTORE_PG_PORT
    pg_start "$port" || die "could not start on 127.0.0.1:$port; see $PGDIR/server.log"
  else
    # The port used last time if it is free, else a free one picked at random.
    port="$(recorded_port)"
    local tries=0
    until [ -n "$port" ] && pg_start "$port"; do
      tries=$((tries + 1))
      [ "$tries" -le 20 ] || die "found no free port to start on; see $PGDIR/server.log"
      port=$((20000 + RANDOM % 12000))
    done
  fi
  local waited=0
  until "$PGBIN/pg_isready" -q -h "$PGDIR/sock" -p "$port"; do
    if [ "$waited" -ge 60 ]; then
      tail -n 20 "$PGDIR/server.log" >&2 || true
      die "PostgreSQL did not become ready; see $PGDIR/server.log"
    fi
    running || die "PostgreSQL stopped while starting; see $PGDIR/server.log"
    sleep 1
    waited=$((waited + 1))
  done
  check_is_ours "$port"
  local psql=("$PGBIN/psql" -h "$PGDIR/sock" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtAX)
  if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = '$PGUSER_NAME'")" != 1 ]; then
    "${psql[@]}" -c "CREATE ROLE $PGUSER_NAME LOGIN"
  fi
  if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$PGDB'")" != 1 ]; then
    "${psql[@]}" -c "CREATE DATABASE $PGDB OWNER $PGUSER_NAME"
  fi
  url_for "$port"
}

stop() {
  check_owned
  if [ -f "$PGDIR/data/PG_VERSION" ] && running; then
    as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w -t 60 stop >/dev/null
    log "stopped"
  else
    log "not running"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) [ -f "$PGDIR/data/PG_VERSION" ] && running ;;
  url)
    port="${AGENTSTORE_PG_PORT:-$(recorded_port)}"
    [ -n "$port" ] || die "no port yet: run scripts/pg.sh start"
    url_for "$port"
    ;;
  *) log "usage: $0 start|stop|status|url"; exit 2 ;;
esac

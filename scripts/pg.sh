#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests and the benchmarks: a fresh
# data directory in a temporary folder, listening only on a Unix socket in
# that folder (no TCP), running as the `postgres` user (the server refuses
# root), with durability traded for speed unless asked (fsync off: the data
# is thrown away).
#
#   scripts/pg.sh start [--durable] [--for-pid PID] [--port N [--tls DIR]]
#                                         prints the connection URL (its socket)
#   scripts/pg.sh stop URL|DIR            stops it and removes its folder
#
# With --durable, commits wait for the disk as a real server's do (fsync
# on), for benchmarks that compare it with SQLite's synchronous commits.
# With --for-pid, a watcher stops and removes the server once PID exits
# (the store tests start their own server so, when NIGHTSHIFT_TEST_PG is
# not set). Each test makes its own database in the server, so tests run
# in parallel. With --port, it also listens on 127.0.0.1:N (password-less
# too: for the TLS tests only); with --tls, there only over TLS, with the
# certificate and key in DIR/server.pem and DIR/server.key (TCP connections
# without TLS are rejected).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

as_postgres() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

dir_of() {
  case "$1" in
    postgres://*|postgresql://*) sed -n 's/.*[?&]host=\([^&]*\).*/\1/p' <<<"$1" ;;
    *) echo "$1" ;;
  esac
}

stop() {
  local dir
  dir=$(dir_of "$1")
  [ -n "$dir" ] && [ -f "$dir/.nightshift-pg" ] || { echo "pg.sh: $1 is not a server pg.sh started" >&2; return 1; }
  ensure_postgres
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf -- "$dir"
}

start() {
  local for_pid="" sync="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  local port="" tls=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --for-pid) for_pid=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --tls) tls=$2; shift 2 ;;
      --durable) sync="-c fsync=on -c synchronous_commit=on"; shift ;;
      *) echo "pg.sh: unknown option $1" >&2; return 2 ;;
    esac
  done
  ensure_postgres
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/nightshift-pg.XXXXXX")
  touch "$dir/.nightshift-pg"
  chmod 0700 "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
  as_postgres "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 -N >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; rm -rf -- "$dir"; return 1; }
  # No TCP (listen_addresses empty) unless --port; the socket in $dir, which
  # only its owner (and root) can enter, so "trust" admits no one else.
  local listen="-c listen_addresses="
  if [ -n "$port" ]; then
    listen="-c listen_addresses=127.0.0.1 -c port=$port"
  fi
  if [ -n "$tls" ]; then
    install -m 0600 "$tls/server.pem" "$dir/data/server.pem"
    install -m 0600 "$tls/server.key" "$dir/data/server.key"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/data/server.pem" "$dir/data/server.key"; fi
    listen="$listen -c ssl=on -c ssl_cert_file=server.pem -c ssl_key_file=server.key"
    # TCP only over TLS: a plain connection is rejected before any trust.
    { echo "hostnossl all all 0.0.0.0/0 reject"; cat "$dir/data/pg_hba.conf"; } >"$dir/pg_hba" \
      && cat "$dir/pg_hba" >"$dir/data/pg_hba.conf" && rm -f "$dir/pg_hba"
  fi
  as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -s \
    -o "$listen -c unix_socket_directories=$dir $sync -c max_connections=200" \
    start || { cat "$dir/server.log" >&2; rm -rf -- "$dir"; return 1; }
  if [ -n "$for_pid" ]; then
    # Detached from the caller's pipes so that the caller is not kept waiting.
    setsid bash -c "while kill -0 $for_pid 2>/dev/null; do sleep 1; done; '$here/pg.sh' stop '$dir'" \
      </dev/null >/dev/null 2>&1 &
  fi
  echo "postgres:///postgres?host=$dir&user=postgres"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) [ $# -eq 2 ] || { echo "usage: pg.sh stop URL|DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: pg.sh start [--durable] [--for-pid PID] | stop URL|DIR" >&2; exit 2 ;;
esac

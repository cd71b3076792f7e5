#!/bin/sh
# The PostgreSQL image's main process (`nightshift image build --postgres`).
# First start: a cluster in $PGDATA whose superuser is $POSTGRES_USER with
# the password in the file $POSTGRES_PASSWORD_FILE (scram-sha-256), and a
# database $POSTGRES_DB. Then the server in the foreground, reachable only
# on its Unix socket in /run/postgresql (no TCP unless PG_LISTEN names an
# address; a socket in a shared volume is local, so the store needs no TLS).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=nightshift}"
: "${POSTGRES_DB:=nightshift}"
: "${PG_LISTEN:=}"
bin=/usr/local/lib/postgresql-bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD_FILE:-}" ] || [ ! -r "$POSTGRES_PASSWORD_FILE" ]; then
    echo "nightshift-postgres: POSTGRES_PASSWORD_FILE must name a readable file (the superuser's password)" >&2
    exit 2
  fi
  "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$POSTGRES_PASSWORD_FILE" \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses= -k /run/postgresql" -w start >/dev/null
  PGPASSWORD=$(cat "$POSTGRES_PASSWORD_FILE") "$bin/psql" -h /run/postgresql -U "$POSTGRES_USER" -d postgres -q \
    -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec "$bin/postgres" -D "$PGDATA" -k /run/postgresql -c "listen_addresses=$PG_LISTEN" \
  -c unix_socket_permissions=0777

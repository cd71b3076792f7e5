#!/usr/bin/env bash
# Workers on one PostgreSQL: tasks per minute for `-- true` runs on 1, 2 and
# 3 workers on this machine (the coordination's cost, not the hardware's:
# every worker shares the same cores and engine), and the store's load per
# run (transactions, rows, bytes written) from PostgreSQL's own statistics.
#
#   scripts/bench-workers.sh            (T=24 tasks a round, PARALLEL=2 a worker)
#
# Each round: a fresh database on a durable server of its own
# (scripts/pg.sh start --durable), W workers (`nightshift worker`, each its
# own state folder and host id), T tasks enqueued at once; the clock runs
# from the enqueue until every task is done. Prints markdown rows.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
ensure_postgres
T=${T:-24}
PARALLEL=${PARALLEL:-2}
bin=${BIN:-$PWD/target/release/nightshift}
[ -x "$bin" ] || cargo build --release -q -p orchestrator
work=$(mktemp -d /tmp/nightshift-bench-workers.XXXXXX)
pg=$(scripts/pg.sh start --durable)
cleanup() { pkill -f "$work/" 2>/dev/null || true; scripts/pg.sh stop "$pg" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
pgdir=$(sed -n 's/.*[?&]host=\([^&]*\).*/\1/p' <<<"$pg")
psql_() { runuser -u postgres -- "$PG_BIN/psql" -h "$pgdir" -U postgres -X -q -A -t "$@"; }

image=$(NIGHTSHIFT_STATE_DIR=$work/img "$bin" image ref)
NIGHTSHIFT_STATE_DIR=$work/img "$bin" image build >/dev/null
repo=$work/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x >"$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x

stats() {
  psql_ -d "$1" -F ' ' -c "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_returned + tup_fetched,
    (SELECT sum(pg_stat_get_db_blocks_fetched(oid)) FROM pg_database WHERE datname = '$1')::bigint
    FROM pg_stat_database WHERE datname = '$1'"
}

echo "| workers | tasks | seconds | tasks/min | transactions/run | rows written/run | rows read/run | database bytes/run |"
echo "|---|---|---|---|---|---|---|---|"
for W in 1 2 3; do
  db=bench_w$W
  psql_ -d postgres -c "CREATE DATABASE $db"
  url="postgres:///$db?host=$pgdir&user=postgres"
  # The store's schema, made once before the clock.
  NIGHTSHIFT_STATE_DIR=$work/enq$W NIGHTSHIFT_STORE=$url "$bin" tasks --json >/dev/null
  {
    for i in $(seq 1 "$T"); do
      printf '[[task]]\nrepo = "%s"\nimage = "%s"\ncommand = ["true"]\n\n' "$repo" "$image"
    done
  } >"$work/tasks$W.toml"
  pids=()
  for w in $(seq 1 "$W"); do
    NIGHTSHIFT_STATE_DIR=$work/w$W-$w NIGHTSHIFT_STORE=$url NIGHTSHIFT_HOST_ID=bench-$w \
      "$bin" worker --max-parallel "$PARALLEL" >"$work/w$W-$w.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
  size0=$(psql_ -d postgres -c "SELECT pg_database_size('$db')")
  read -r x0 i0 u0 d0 r0 _ <<<"$(stats "$db")"
  start=$(date +%s%N)
  NIGHTSHIFT_STATE_DIR=$work/enq$W NIGHTSHIFT_STORE=$url "$bin" enqueue --file "$work/tasks$W.toml" >/dev/null
  while :; do
    left=$(NIGHTSHIFT_STATE_DIR=$work/enq$W NIGHTSHIFT_STORE=$url "$bin" tasks --json \
      | python3 -c 'import json,sys; t=json.load(sys.stdin); t=t.get("tasks",t) if isinstance(t,dict) else t; print(sum(1 for x in t if x["state"] not in ("done","failed","cancelled")))')
    [ "$left" = 0 ] && break
    sleep 0.2
  done
  end=$(date +%s%N)
  sleep 1 # the statistics collector's last report
  read -r x1 i1 u1 d1 r1 _ <<<"$(stats "$db")"
  size1=$(psql_ -d postgres -c "SELECT pg_database_size('$db')")
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  failed=$(NIGHTSHIFT_STATE_DIR=$work/enq$W NIGHTSHIFT_STORE=$url "$bin" tasks --json \
      | python3 -c 'import json,sys; t=json.load(sys.stdin); t=t.get("tasks",t) if isinstance(t,dict) else t; print(sum(1 for x in t if x["state"]!="done"))')
  [ "$failed" = 0 ] || echo "warning: $failed tasks did not end done with $W workers" >&2
  awk -v w="$W" -v t="$T" -v ns=$((end - start)) -v x=$((x1 - x0)) -v rw=$(( (i1 - i0) + (u1 - u0) + (d1 - d0) )) \
      -v rr=$((r1 - r0)) -v b=$((size1 - size0)) \
    'BEGIN { s = ns / 1e9; printf "| %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f |\n", w, t, s, t * 60 / s, x / t, rw / t, rr / t, b / t }'
done

#!/usr/bin/env bash
# The agent's first instruction (issue 22, section 1): milliseconds from the
# command to the sandbox's first output line, which is the clock read inside
# the sandbox (`date +%s%N`; one host, one clock), for
#   - `nightshift run` in the foreground (a cold start: its own supervisor,
#     worktree, create, attestation, start), and
#   - `nightshift enqueue` of one task handed to a running `serve` over its
#     socket, whose dispatcher starts the run in process (woken by the
#     enqueue, not by its 500 ms poll),
#   - the same under a second `serve` that keeps one warm sandbox ready
#     (`[pool] size = 1`, docs/pool.md; refilled between rounds),
# beside the engine's own work for the same image through its API in one
# process (scripts/bench/engine_baseline.py: create, start, wait, logs,
# remove; no hardening, no worktree): to its first instruction, and whole.
# The whole `nightshift run` is timed too. Median and p90 of N each,
# interleaved. Prints markdown rows.
#
#   NIGHTSHIFT_BIN=path N=15 scripts/bench-first-instruction.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
N=${N:-15}
bin=${NIGHTSHIFT_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/nightshift}
[ -x "$bin" ] || { echo "build nightshift first (cargo build --release -p orchestrator) or set NIGHTSHIFT_BIN" >&2; exit 1; }
work=$(mktemp -d /tmp/nightshift-bench-first.XXXXXX)
serve_pid=
warm_pid=
stop_serve() { # PID: asks it to stop, waits until it has (its warm sandboxes removed)
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
}
cleanup() {
  stop_serve "$serve_pid"
  stop_serve "$warm_pid"
  rm -rf "$work"
}
trap cleanup EXIT
image=$(NIGHTSHIFT_STATE_DIR=$work/cli "$bin" image ref)
docker image inspect "$image" >/dev/null 2>&1 || NIGHTSHIFT_STATE_DIR=$work/cli "$bin" image build >/dev/null
repo=$work/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x >"$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x

latest_run() { NIGHTSHIFT_STATE_DIR=$1 "$bin" runs --json | python3 -c 'import json,sys; print(sorted(r["id"] for r in json.load(sys.stdin))[-1])'; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
p90() { sort -n | awk '{a[NR]=$1} END {i=int(NR*0.9+0.5); if (i<1) i=1; print a[i]}'; }

cli_ms() { # prints: to the first instruction, whole
  local s e id first
  s=$(date +%s%N)
  NIGHTSHIFT_STATE_DIR=$work/cli "$bin" run --image "$image" --repo "$repo" -- sh -c 'date +%s%N' >/dev/null
  e=$(date +%s%N)
  id=$(latest_run "$work/cli")
  first=$(head -n 1 "$work/cli/runs/$id/output.log")
  echo $(( (first - s) / 1000000 )) $(( (e - s) / 1000000 ))
}

printf '[[task]]\nrepo = "%s"\nimage = "%s"\ncommand = ["sh", "-c", "date +%%s%%N"]\n' "$repo" "$image" >"$work/one.toml"
start_serve() { # STATE: starts serve on it, prints its pid
  NIGHTSHIFT_STATE_DIR=$1 "$bin" tasks --json >/dev/null
  "$bin" --state-dir "$1" serve --bind 127.0.0.1:0 --max-parallel 2 >"$1.out" 2>"$1.err" &
  local pid=$!
  for _ in $(seq 1 100); do [ -S "$1/serve.sock" ] && break; sleep 0.1; done
  [ -S "$1/serve.sock" ] || { cat "$1.err" >&2; exit 1; }
  echo "$pid"
}
served=$work/served
mkdir -p "$served"
serve_pid=$(start_serve "$served")
warm=$work/warm
mkdir -p "$warm"
printf '[pool]\nsize = 1\nimages = ["%s"]\n' "$image" >"$warm/config.toml"
warm_pid=$(start_serve "$warm")
# The warm sandbox ready before the first round.
for _ in $(seq 1 300); do [ -n "$(ls -A "$warm/pool" 2>/dev/null)" ] && break; sleep 0.1; done
sleep 1

served_ms() { # STATE
  local s id first done served=$1
  # A warm serve's next sandbox is ready before the round begins.
  [ "$served" = "$warm" ] && for _ in $(seq 1 300); do [ -n "$(ls -A "$warm/pool" 2>/dev/null)" ] && break; sleep 0.05; done
  s=$(date +%s%N)
  NIGHTSHIFT_STATE_DIR=$served "$bin" enqueue --file "$work/one.toml" >/dev/null
  for _ in $(seq 1 600); do
    done=$(NIGHTSHIFT_STATE_DIR=$served "$bin" tasks --json | python3 -c '
import json, sys
t = json.load(sys.stdin)
t = t.get("tasks", t) if isinstance(t, dict) else t
print(sum(1 for x in t if x["state"] not in ("done", "failed", "cancelled")))')
    [ "$done" = 0 ] && break
    sleep 0.1
  done
  id=$(latest_run "$served")
  first=$(head -n 1 "$served/runs/$id/output.log")
  echo $(( (first - s) / 1000000 ))
}

cli_ms >/dev/null; served_ms "$served" >/dev/null; served_ms "$warm" >/dev/null # warm up
c=(); cw=(); v=(); h=(); e=(); ew=()
for _ in $(seq 1 "$N"); do
  read -r f w < <(cli_ms); c+=("$f"); cw+=("$w")
  v+=("$(served_ms "$served")")
  h+=("$(served_ms "$warm")")
  read -r f w < <(python3 scripts/bench/engine_baseline.py "$image" 1); e+=("$f"); ew+=("$w")
done
row() { # NAME VALUES...
  local name=$1; shift
  echo "| $name | $(printf '%s\n' "$@" | median) ms | $(printf '%s\n' "$@" | p90) ms |"
}
echo "| path | p50 | p90 |"
echo "|---|---:|---:|"
row "the engine's own create and start, to the first instruction" "${e[@]}"
row "\`nightshift run\` to the first instruction" "${c[@]}"
row "\`enqueue\` under \`serve\` to the first instruction" "${v[@]}"
row "\`enqueue\` under \`serve\` with a warm sandbox, to the first instruction" "${h[@]}"
row "the engine's own create, start, wait, logs, remove" "${ew[@]}"
row "\`nightshift run -- sh -c 'date +%s%N'\`, whole" "${cw[@]}"
echo "(N=$N each, interleaved, $bin, $(date -u +%F), load $(cut -d' ' -f1 /proc/loadavg))"

#!/usr/bin/env bash
# Memory of `nightshift serve` supervising N concurrent idle sandboxes (N=50):
# starts `serve --max-parallel N` on a fresh state, enqueues N tasks whose
# command idles (`sleep 600` in the default image, small caps so that all N
# fit the fleet), waits until all N runs are running, then sums the resident
# memory (RSS, and PSS from /proc/PID/smaps_rollup) of every nightshift
# process of that state on the host: serve, watchdogs, per-run supervisors
# (the processes whose executable is the binary and whose command line names
# the state). The lease wrappers inside the sandboxes are counted apart.
# Then cleans up: kill --all, waits until every task has ended, stops serve,
# and removes the state.
#
# PROFILE=release (default) or debug; NIGHTSHIFT_BIN=path skips the build.
# DISPATCHER=serve (default: runs in process, one watchdog) or tasks-run
# (`nightshift tasks run`: a `nightshift run` child and its watchdog per
# task, the design serve had before its runs moved in process).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
N=${N:-50}
PROFILE=${PROFILE:-release}
DISPATCHER=${DISPATCHER:-serve}
target=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${NIGHTSHIFT_BIN:-}" ]; then
  if [ "$PROFILE" = release ]; then
    cargo build --release -q -p orchestrator
  else
    cargo build -q -p orchestrator
  fi
  NIGHTSHIFT_BIN=$target/$PROFILE/nightshift
fi
bin=$(readlink -f "$NIGHTSHIFT_BIN")
state=$(mktemp -d /tmp/nightshift-bench-serve.XXXXXX)
export NIGHTSHIFT_STATE_DIR=$state
image=$("$bin" image ref)
docker image inspect "$image" >/dev/null 2>&1 || "$bin" image build >/dev/null 2>&1
repo=$state/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x > "$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x

serve_pid=
cleanup() {
  set +e
  "$bin" kill --all >/dev/null 2>&1
  # Every task ends (serve settles them) before serve stops.
  for _ in $(seq 1 120); do
    left=$("$bin" tasks --json 2>/dev/null \
      | jq '[.[] | select(.state == "running" or .state == "starting")] | length')
    [ "${left:-1}" = 0 ] && break
    sleep 1
  done
  [ -n "$serve_pid" ] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  # Whatever of this state is left (per-run supervisors, watchdogs) ends
  # once its sandbox is gone; wait for it, bounded.
  for _ in $(seq 1 60); do
    [ -z "$(our_pids)" ] && break
    sleep 1
  done
  if findmnt -rn -o TARGET | grep -q "^$state/"; then
    echo "bench: a worktree mount is left under $state; not removing it" >&2
  else
    rm -rf "$state"
  fi
}
trap cleanup EXIT

# The nightshift processes of this state (not the lease wrappers in the sandboxes).
our_pids() {
  local p exe
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    [ "$exe" = "$bin" ] || continue
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$state" || continue
    echo "${p#/proc/}"
  done
}

tasks=$state/tasks.toml
for n in $(seq 1 "$N"); do
  printf '[[task]]\nrepo = "repo"\nref = "main"\nimage = "%s"\nmemory = "64m"\ncpus = 0.03\npids = 64\ntask = "idle %s"\ncommand = ["sleep", "600"]\n\n' \
    "$image" "$n" >>"$tasks"
done
"$bin" enqueue --file "$tasks" >/dev/null

case "$DISPATCHER" in
  serve) "$bin" --state-dir "$state" serve --bind 127.0.0.1:0 --max-parallel "$N" \
    >"$state/serve.out" 2>"$state/serve.err" & ;;
  tasks-run) "$bin" --state-dir "$state" tasks run --max-parallel "$N" \
    >"$state/serve.out" 2>"$state/serve.err" & ;;
  *) echo "bench: DISPATCHER is serve or tasks-run" >&2; exit 2 ;;
esac
serve_pid=$!

started=$(date +%s)
while :; do
  running=$("$bin" runs --json | jq '[.[] | select(.status == "running")] | length')
  [ "$running" -ge "$N" ] && break
  if [ $(( $(date +%s) - started )) -gt 900 ]; then
    echo "bench: only $running of $N runs running after 900 s" >&2
    "$bin" tasks --json | jq -c '.[] | [.state, .progress.reason]' | sort | uniq -c >&2
    exit 1
  fi
  sleep 2
done
took=$(( $(date +%s) - started ))
sleep 10 # steady state: every run past its start

rss=0 pss=0 count=0 serve_kb=0 watchdogs=0 runs=0
for pid in $(our_pids); do
  r=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  p=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
  args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
  case "$args" in
    *" serve "* | *" tasks run "*) serve_kb=$r ;;
    *" watchdog "*) watchdogs=$((watchdogs + 1)) ;;
    *" run "*) runs=$((runs + 1)) ;;
  esac
  rss=$((rss + ${r:-0})) pss=$((pss + ${p:-0})) count=$((count + 1))
done
# The lease wrapper inside each sandbox (the same under either design).
lease_kb=0 leases=0
for p in /proc/[0-9]*; do
  [ "$(cat "$p/comm" 2>/dev/null)" = nightshift-leas ] || continue
  r=$(awk '/^VmRSS:/ {print $2}' "$p/status" 2>/dev/null || echo 0)
  lease_kb=$((lease_kb + ${r:-0})) leases=$((leases + 1))
done
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
echo "| nightshift processes of the state | $count (dispatcher 1, watchdogs $watchdogs, per-run supervisors $runs) |"
echo "| their resident memory (RSS), all together | $(mib "$rss") MiB |"
echo "| their proportional memory (PSS), all together | $(mib "$pss") MiB |"
echo "| the dispatcher ($DISPATCHER) alone (RSS) | $(mib "$serve_kb") MiB |"
echo "| lease wrappers in the sandboxes (not counted above) | $leases, $(mib "$lease_kb") MiB RSS in all |"
echo "($N idle sandboxes, all running ${took} s after the dispatcher started; $PROFILE build, $(date -u +%F), $(nproc) cores)"

#!/usr/bin/env bash
# `nightshift policy check` end to end, as the harness runs it: one process
# per tool call (spawn, open the state, load the rules, decide, audit on
# refuse/ask, exit). Times N invocations of each case with bash's
# $EPOCHREALTIME around the spawn and prints markdown rows: median and p99,
# beside the same number of `/bin/true` spawns, the floor any hook pays.
#
#   scripts/bench-policy-check.sh [N]      (default N=200)
#
# Uses a fresh temporary state under BENCH_DIR (default $TMPDIR or /tmp;
# /dev/shm takes the disk's fsyncs out); honours CARGO_TARGET_DIR.
set -euo pipefail

n=${1:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet -p orchestrator --manifest-path "$root/Cargo.toml"
bin=$target/release/nightshift

work=$(mktemp -d -p "${BENCH_DIR:-${TMPDIR:-/tmp}}")
trap 'rm -rf "$work"' EXIT
export NIGHTSHIFT_STATE_DIR=$work/state
unset NIGHTSHIFT_OWNER_KEY_FILE NIGHTSHIFT_LOG
printf '%s' '{"command":"ls"}' >"$work/allow.json"
printf '%s' '{"remote":"origin","ref":"refs/heads/main","force":true}' >"$work/refuse.json"
printf '%s' '{"remote":"origin","ref":"refs/heads/feature"}' >"$work/ask.json"

# The state is made first, as the supervisor's side makes it (the check never
# makes one); the first check is not timed.
"$bin" runs >/dev/null
"$bin" policy check --actor bench --tool Bash --args-json - <"$work/allow.json"

# time_case NAME EXPECTED_EXIT STDIN_FILE CMD...: N timed runs, microseconds.
time_case() {
  local name=$1 expect=$2 input=$3
  shift 3
  local out=$work/$name.us i t0 t1 rc
  : >"$out"
  for ((i = 0; i < n; i++)); do
    t0=$EPOCHREALTIME
    rc=0
    "$@" <"$input" >/dev/null 2>&1 || rc=$?
    t1=$EPOCHREALTIME
    if [[ $rc != "$expect" ]]; then
      echo "$name: exit $rc, expected $expect" >&2
      exit 1
    fi
    echo $(((${t1/./} - ${t0/./}))) >>"$out"
  done
}

time_case floor 0 "$work/allow.json" /bin/true
time_case allow 0 "$work/allow.json" "$bin" policy check --actor bench --tool Bash --args-json -
time_case refuse 2 "$work/refuse.json" "$bin" policy check --actor bench --tool push --args-json -
time_case ask 2 "$work/ask.json" "$bin" policy check --actor bench --tool push --args-json -

# Each refuse and ask appended one audit entry; the chain still verifies.
"$bin" audit verify >"$work/verify.txt"
entries=$(sed -n 's/^audit chain intact: \([0-9]*\) entries.*/\1/p' "$work/verify.txt")
if [[ $entries != $((2 * n)) ]]; then
  echo "expected $((2 * n)) audit entries, verify said: $(cat "$work/verify.txt")" >&2
  exit 1
fi

# stats FILE -> "median p99" in microseconds (nearest rank).
stats() {
  sort -n "$1" | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    r = int(NR * 0.99 + 0.999999); if (r > NR) r = NR
    printf "%d %d\n", m, v[r] }'
}
ms() { awk -v u="$1" 'BEGIN { printf "%.2f ms", u / 1000 }'; }

read -r floor_med floor_p99 < <(stats "$work/floor.us")
echo "| case ($n runs each) | median | p99 | median above the floor |"
echo "|---|---:|---:|---:|"
echo "| \`/bin/true\` (process-spawn floor) | $(ms "$floor_med") | $(ms "$floor_p99") | |"
for c in allow refuse ask; do
  read -r med p99 < <(stats "$work/$c.us")
  case $c in
    allow) label='`policy check`, allowed (no audit append)' ;;
    refuse) label='`policy check`, refused (one audit append)' ;;
    ask) label='`policy check`, asks (one audit append)' ;;
  esac
  echo "| $label | $(ms "$med") | $(ms "$p99") | $(ms $((med - floor_med))) |"
done

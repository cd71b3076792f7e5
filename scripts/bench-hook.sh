#!/usr/bin/env bash
# The hook every agent tool call pays (issue 22, section 2): `nightshift
# policy check` and `nightshift --version` as processes, each beside its
# baseline in one run, interleaved (one spawn of every case per round, so
# a change in the machine's load falls on all of them alike):
#  - the floor: a `/bin/true` spawn from the same loop;
#  - `--version` and `policy check` (allowed; refused and asks, which
#    append an audit entry) through the lean entry point (`fast.rs`);
#  - the same calls through the full command line (clap's tree, the async
#    runtime, the log), forced by spelling the flags `--flag=value`, which
#    the lean entry point leaves to clap: the path every call took before.
# Prints markdown rows: median and p99, the ratio to the floor and to the
# full path; then minor page faults and peak resident memory of one call
# of each (`/usr/bin/time -v`).
#
#   scripts/bench-hook.sh [N]      (default N=300 rounds)
#   NIGHTSHIFT_BIN=path scripts/bench-hook.sh   (that binary, not built)
#
# The state lives under BENCH_DIR (default $TMPDIR or /tmp; /dev/shm takes
# the disk's fsyncs out); honours CARGO_TARGET_DIR.
set -euo pipefail

n=${1:-300}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
# NIGHTSHIFT_BIN: a binary to measure instead of building this tree's.
if [[ -n ${NIGHTSHIFT_BIN:-} ]]; then
  bin=$NIGHTSHIFT_BIN
else
  cargo build --release --quiet -p orchestrator --manifest-path "$root/Cargo.toml"
  bin=$target/release/nightshift
fi

work=$(mktemp -d -p "${BENCH_DIR:-${TMPDIR:-/tmp}}")
trap 'rm -rf "$work"' EXIT
export NIGHTSHIFT_STATE_DIR=$work/state
unset NIGHTSHIFT_OWNER_KEY_FILE NIGHTSHIFT_LOG NIGHTSHIFT_LOG_FORMAT NIGHTSHIFT_STORE \
  NIGHTSHIFT_STORE_FILE NIGHTSHIFT_CONFIG
printf '%s' '{"command":"ls"}' >"$work/allow.json"
printf '%s' '{"remote":"origin","ref":"refs/heads/main","force":true}' >"$work/refuse.json"
printf '%s' '{"remote":"origin","ref":"refs/heads/feature"}' >"$work/ask.json"

# The state is made first, as the supervisor's side makes it (the check
# never makes one); the first checks are not timed.
"$bin" runs >/dev/null
"$bin" policy check --actor bench --tool Bash --args-json - <"$work/allow.json"
"$bin" policy check --actor=bench --tool=Bash --args-json=- <"$work/allow.json"

# name|expected exit|stdin|command...
cases=(
  "floor|0|allow|/bin/true"
  "version|0|allow|$bin --version"
  "version_full|0|allow|$bin --log-format=text --version"
  "allow|0|allow|$bin policy check --actor bench --tool Bash --args-json -"
  "allow_full|0|allow|$bin policy check --actor=bench --tool=Bash --args-json=-"
  "refuse|2|refuse|$bin policy check --actor bench --tool push --args-json -"
  "refuse_full|2|refuse|$bin policy check --actor=bench --tool=push --args-json=-"
  "ask|2|ask|$bin policy check --actor bench --tool push --args-json -"
  "ask_full|2|ask|$bin policy check --actor=bench --tool=push --args-json=-"
)
for c in "${cases[@]}"; do : >"$work/${c%%|*}.us"; done

for ((i = 0; i < n; i++)); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name expect input cmd <<<"$c"
    # shellcheck disable=SC2086 # the command's words
    {
      t0=$EPOCHREALTIME
      rc=0
      $cmd <"$work/$input.json" >/dev/null 2>&1 || rc=$?
      t1=$EPOCHREALTIME
    }
    if [[ $rc != "$expect" ]]; then
      echo "$name: exit $rc, expected $expect" >&2
      exit 1
    fi
    echo $(((${t1/./} - ${t0/./}))) >>"$work/$name.us"
  done
done

# Each refuse and ask appended one audit entry, whichever path took it;
# the chain still verifies.
"$bin" audit verify >"$work/verify.txt"
entries=$(sed -n 's/^audit chain intact: \([0-9]*\) entries.*/\1/p' "$work/verify.txt")
if [[ $entries != $((4 * n)) ]]; then
  echo "expected $((4 * n)) audit entries, verify said: $(cat "$work/verify.txt")" >&2
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
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f×", a / b }'; }

read -r floor _ < <(stats "$work/floor.us")
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $n interleaved rounds"
echo
echo "| case | median | p99 | × \`/bin/true\` | full path median | lean / full |"
echo "|---|---:|---:|---:|---:|---:|"
read -r med p99 < <(stats "$work/floor.us")
echo "| \`/bin/true\` (the floor) | $(ms "$med") | $(ms "$p99") | 1.00× | | |"
for c in version allow refuse ask; do
  read -r med p99 < <(stats "$work/$c.us")
  read -r full _ < <(stats "$work/${c}_full.us")
  case $c in
    version) label='`--version`' ;;
    allow) label='`policy check`, allowed' ;;
    refuse) label='`policy check`, refused (one audit append)' ;;
    ask) label='`policy check`, asks (one audit append)' ;;
  esac
  echo "| $label | $(ms "$med") | $(ms "$p99") | $(ratio "$med" "$floor") | $(ms "$full") | $(ratio "$med" "$full") |"
done

# CPU time (user + system, the process and its threads), which the
# machine's load changes less than wall time: perf stat's mean of N.
if command -v perf >/dev/null; then
  echo
  echo "| case | CPU time, mean of $n (perf stat) | × \`/bin/true\` | full path | lean / full |"
  echo "|---|---:|---:|---:|---:|"
  cpu() { # NAME -> mean task-clock in ms
    local c
    for c in "${cases[@]}"; do
      IFS='|' read -r name expect input cmd <<<"$c"
      [[ $name == "$1" ]] || continue
      # shellcheck disable=SC2086
      perf stat -r "$n" -x, -e task-clock -o "$work/perf.txt" \
        sh -c '"$@" <"$0" >/dev/null 2>&1 || true' "$work/$input.json" $cmd
      awk -F, '$3 == "task-clock" { print $1 }' "$work/perf.txt"
    done
  }
  f=$(cpu floor)
  printf '| `/bin/true` (the floor, through `sh -c`) | %.2f ms | 1.00× | | |\n' "$f"
  for c in version allow refuse ask; do
    l=$(cpu "$c")
    u=$(cpu "${c}_full")
    awk -v c="$c" -v l="$l" -v u="$u" -v f="$f" 'BEGIN {
      printf "| %s | %.2f ms | %.2f× | %.2f ms | %.2f× |\n", c, l, l / f, u, l / u }'
  done
fi

echo
echo "| one call | minor page faults | peak resident |"
echo "|---|---:|---:|"
vm() { # CMD... -> "faults kib"
  /usr/bin/time -f '%R %M' -o "$work/time.txt" "$@" <"$work/allow.json" >/dev/null 2>&1 || true
  cat "$work/time.txt"
}
for c in "/bin/true" "$bin --version" "$bin --log-format=text --version" \
  "$bin policy check --actor bench --tool Bash --args-json -" \
  "$bin policy check --actor=bench --tool=Bash --args-json=-"; do
  # shellcheck disable=SC2086
  read -r faults kib < <(vm $c)
  echo "| \`${c/#$bin/nightshift}\` | $faults | $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB |"
done

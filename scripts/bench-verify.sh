#!/usr/bin/env bash
# `audit verify` over a generated chain of N entries shaped as the
# product's own (default 1,000,000; a checkpoint every 100), made by
# `make_chain` (the entries sealed by `orchestrator_audit::seal` and
# stored as the store stores them): the streaming walk `audit verify`
# does (bodies hashed from their stored text) beside the two it replaced,
# the streaming walk over parsed bodies and the whole snapshot, each in
# its own process (seconds, peak resident memory), ROUNDS times
# interleaved, then the medians side by side as ratios; then the
# `nightshift audit verify` command itself and `audit export` (to
# /dev/null). Figures: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000000}
cargo build --release -q -p orchestrator
cargo build --release -q -p nightshift-store-sqlite --examples
bin=${CARGO_TARGET_DIR:-$PWD/target}/release
state=$(mktemp -d /tmp/nightshift-verify.XXXXXX)
trap 'rm -rf "$state"' EXIT
t0=$(date +%s.%N)
"$bin/examples/make_chain" "$state" "$N"
echo "made $N entries in $(echo "$(date +%s.%N) - $t0" | bc) s; state.db $(du -h "$state/state.db" | cut -f1)"
peak() { # prints the command's output, then its wall time and peak RSS
  /usr/bin/time -f "  wall %e s, peak resident %M KiB" "$@"
}
ROUNDS=${ROUNDS:-3}
ways="stream parsed${SNAPSHOT:+ snapshot}"
for ((round = 1; round <= ROUNDS; round++)); do
  for how in $ways; do
    /usr/bin/time -f "%e %M %U %S" -o "$state/time.txt" "$bin/examples/verify_chain" "$state" "$how"
    read -r wall kib user sys <"$state/time.txt"
    echo "$wall $kib $(echo "$user + $sys" | bc)" >>"$state/$how.txt"
  done
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds, medians"
echo "| walk | wall | CPU (user + system) | peak resident | wall / stream | CPU / stream |"
echo "|---|---:|---:|---:|---:|---:|"
read -r base < <(cut -d' ' -f1 "$state/stream.txt" | median)
read -r cbase < <(cut -d' ' -f3 "$state/stream.txt" | median)
for how in $ways; do
  read -r wall < <(cut -d' ' -f1 "$state/$how.txt" | median)
  read -r kib < <(cut -d' ' -f2 "$state/$how.txt" | median)
  read -r cpu < <(cut -d' ' -f3 "$state/$how.txt" | median)
  awk -v h="$how" -v w="$wall" -v k="$kib" -v b="$base" -v c="$cpu" -v cb="$cbase" \
    'BEGIN { printf "| %s | %.2f s | %.2f s | %.0f MiB | %.2f× | %.2f× |\n", h, w, c, k / 1024, w / b, c / cb }'
done
for round in 1 2; do
  echo "round $round:"
  NIGHTSHIFT_STATE_DIR=$state peak "$bin/nightshift" audit verify
  NIGHTSHIFT_STATE_DIR=$state peak "$bin/nightshift" audit export >/dev/null
done

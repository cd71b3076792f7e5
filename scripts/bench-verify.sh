#!/usr/bin/env bash
# `audit verify` over a generated chain of N entries shaped as the
# product's own (default 1,000,000; a checkpoint every 100): the streaming
# walk `audit verify` does beside the whole-snapshot walk it replaced, each
# in its own process (seconds, peak resident memory), then the `nightshift
# audit verify` command itself and `audit export` (to /dev/null). Figures: docs/benchmarks.md.
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
for round in 1 2; do
  echo "round $round:"
  peak "$bin/examples/verify_chain" "$state" snapshot
  peak "$bin/examples/verify_chain" "$state" stream
  NIGHTSHIFT_STATE_DIR=$state peak "$bin/nightshift" audit verify
  NIGHTSHIFT_STATE_DIR=$state peak "$bin/nightshift" audit export >/dev/null
done

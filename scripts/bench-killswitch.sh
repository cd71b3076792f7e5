#!/usr/bin/env bash
# Kill switch and supervisor overhead, with N (default 20) concurrent runs:
#  - supervisor overhead: CPU time and resident memory of the nightshift
#    processes (supervisors + watchdogs) over a window while the runs are
#    sampled, beside the sandboxes' own figures;
#  - time from `nightshift kill --all` to the last sandbox gone, beside
#    `docker kill` of the same containers as the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
N=${N:-20}
WINDOW=${WINDOW:-10}
cargo build --release -q -p orchestrator
bin=$PWD/target/release/nightshift
state=$(mktemp -d /tmp/nightshift-bench.XXXXXX)
export NIGHTSHIFT_STATE_DIR=$state
printf '[fleet]\ncpus = %s\n' "$(nproc)" > "$state/config.toml"
"$bin" image build >/dev/null 2>&1
repo=$state/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x > "$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x
tag=$(printf '%s' "$(realpath "$state")" | sha256sum | cut -c1-12)
count() { docker ps -q --filter "label=nightshift.state=$tag" | wc -l; }
start_runs() {
  for _ in $(seq 1 "$N"); do
    "$bin" run --repo "$repo" --cpus 0.05 -- sleep 600 >/dev/null 2>&1 &
  done
  while [ "$(count)" -lt "$N" ]; do sleep 0.5; done
  sleep 3
}
ticks() { # total utime+stime (clock ticks) and rss (kB) of nightshift processes
  local t=0 r=0
  for p in $(pgrep -f "$bin"); do
    read -r ut st < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null || echo "0 0")
    t=$((t + ut + st))
    r=$((r + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
  done
  echo "$t $r"
}

start_runs
read -r t0 _ < <(ticks)
sleep "$WINDOW"
read -r t1 rss < <(ticks)
hz=$(getconf CLK_TCK)
cpu_pct=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v w="$WINDOW" 'BEGIN {printf "%.2f", (b-a)/hz/w*100}')
procs=$(pgrep -f "$bin" | wc -l)

s=$(date +%s%N); "$bin" kill --all >/dev/null
while [ "$(count)" -gt 0 ]; do sleep 0.05; done
e=$(date +%s%N); ours=$(( (e - s) / 1000000 ))
wait || true

# Baseline: the same number of plain hardened containers, killed with docker kill.
ids=$(for _ in $(seq 1 "$N"); do docker run -d --rm --network none --cap-drop ALL --user 1000:1000 \
  --read-only "$("$bin" image ref)" sleep 600; done)
sleep 2
s=$(date +%s%N); docker kill $ids >/dev/null
while [ "$(docker ps -q --filter "id=$(echo "$ids" | head -1)" | wc -l)" -gt 0 ] || \
      [ "$(for i in $ids; do docker ps -q --filter id=$i; done | wc -l)" -gt 0 ]; do sleep 0.05; done
e=$(date +%s%N); base=$(( (e - s) / 1000000 ))
ratio=$(awk -v o="$ours" -v b="$base" 'BEGIN {printf "%.2f", o/b}')

echo "| \`docker kill\` of $N containers (baseline) | $base ms | 1.00 |"
echo "| \`nightshift kill --all\` with $N runs in flight, to the last sandbox gone | $ours ms | $ratio |"
echo
echo "| supervisor overhead, $N runs sampled each second, ${WINDOW}s window | figure |"
echo "|---|---|"
echo "| nightshift processes (supervisors + watchdogs) | $procs |"
echo "| their CPU, all together | ${cpu_pct}% of one core |"
echo "| their resident memory, all together | $((rss / 1024)) MiB ($((rss / procs)) kB each) |"
rm -rf "$state"

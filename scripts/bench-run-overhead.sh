#!/usr/bin/env bash
# Run overhead: `nightshift run -- true` against `docker run --rm` of the same
# image with the same hardening flags; median of N runs each, in one session.
# Prints a markdown table row set for docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
N=${N:-15}
cargo build --release -q -p orchestrator
bin=$PWD/target/release/nightshift
state=$(mktemp -d /tmp/nightshift-bench.XXXXXX)
export NIGHTSHIFT_STATE_DIR=$state
image=$("$bin" image ref)
"$bin" image build >/dev/null 2>&1
repo=$state/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x > "$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x
wt=$state/wt && mkdir -p "$wt" && chown 1000:1000 "$wt"

docker_run() {
  docker run --rm --network none --cap-drop ALL --security-opt no-new-privileges:true \
    --read-only --tmpfs /tmp:rw,nosuid,nodev,size=268435456 \
    --tmpfs /home/agent:rw,nosuid,nodev,size=268435456,uid=1000,gid=1000,mode=0700 \
    --user 1000:1000 --memory 2147483648 --memory-swap 2147483648 --cpus 1 --pids-limit 512 \
    --ulimit nofile=4096:4096 --cgroupns private --ipc private --init --log-driver none \
    --mount "type=bind,src=$wt,dst=/workspace" -w /workspace \
    -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin -e HOME=/home/agent \
    "$image" true >/dev/null
}
ours() { "$bin" run --repo "$repo" --image "$image" -- true >/dev/null; }

time_ms() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

ours; docker_run # warm up
d=(); o=()
for _ in $(seq 1 "$N"); do
  d+=("$(time_ms docker_run)")
  o+=("$(time_ms ours)")
done
dm=$(printf '%s\n' "${d[@]}" | median)
om=$(printf '%s\n' "${o[@]}" | median)
ratio=$(awk -v o="$om" -v d="$dm" 'BEGIN {printf "%.2f", o/d}')
echo "| \`docker run --rm\` (same image, same hardening) | $dm ms | 1.00 |"
echo "| \`nightshift run -- true\` (worktree, attestation, audit, import, cleanup) | $om ms | $ratio |"
echo "(median of $N each, interleaved, $(date -u +%F), $(nproc) cores)"
rm -rf "$state"

#!/usr/bin/env bash
# The Pod spec's start under `podman kube play` (docs/kubernetes.md): the
# Pod `nightshift kube pod` prints for `true`, played, waited for and taken
# down, beside `podman run --rm` of the same image with the same hardening
# flags; interleaved, median of N each, one session. Prints a markdown row
# for docs/benchmarks.md.
#
#   N=11 scripts/bench-kube-play.sh        (BIN=path to use another build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
scripts/podman.sh start >/dev/null
N=${N:-11}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p orchestrator
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/nightshift
fi
dir=$(mktemp -d /tmp/nightshift-kube-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export NIGHTSHIFT_STATE_DIR=$dir/state
image=$("$BIN" image ref)
"$BIN" --engine podman image build >/dev/null 2>&1
mkdir -p "$dir/seccomp"
"$BIN" kube seccomp-profile > "$dir/seccomp/nightshift-sandbox.json"
# This host's hard limits are below Podman's default ulimits (kube_play.rs).
printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n' > "$dir/containers.conf"
export CONTAINERS_CONF=$dir/containers.conf
"$BIN" kube pod --run-id bench --image "$image" --image-pull-policy Never -- true \
  | sed 's|^metadata:$|metadata:\n  annotations:\n    seccomp.security.alpha.kubernetes.io/pod: localhost/nightshift-sandbox.json|' \
  > "$dir/pod.yaml"
ms() { date +%s%N; }
play=() run=()
for _ in $(seq "$N"); do
  t0=$(ms)
  podman kube play --network none --seccomp-profile-root "$dir/seccomp" "$dir/pod.yaml" >/dev/null
  podman wait ns-run-bench-agent >/dev/null
  podman kube down "$dir/pod.yaml" >/dev/null
  play+=($(( ($(ms) - t0) / 1000000 )))
  t0=$(ms)
  podman run --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges \
    --security-opt "seccomp=$dir/seccomp/nightshift-sandbox.json" --user 2000000000:2000000000 \
    --memory 2g "$image" true >/dev/null
  run+=($(( ($(ms) - t0) / 1000000 )))
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p=$(median "${play[@]}") r=$(median "${run[@]}")
echo "| the Pod spec under \`podman kube play\` (play, wait, down) | $p ms | \`podman run --rm\`, same image and hardening: $r ms | $(awk -v a="$p" -v b="$r" 'BEGIN {printf "%.2f", a/b}')× |"

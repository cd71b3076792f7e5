#!/usr/bin/env bash
# Engines side by side: `nightshift run -- true` on Docker, on rootful
# Podman and on Podman with gVisor (docs/engines.md), each against that
# engine's own create, start,
# wait and remove of the same image through its API (a hardened request:
# no network, no capabilities, read-only root, the caps), interleaved, in
# one session; median of N each. Prints markdown rows for docs/benchmarks.md.
#
#   N=11 scripts/bench-engines.sh        (BIN=path to use another build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
scripts/podman.sh start >/dev/null
N=${N:-11}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p orchestrator
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/nightshift
fi
state=$(mktemp -d /tmp/nightshift-bench.XXXXXX)
export NIGHTSHIFT_STATE_DIR=$state
image=$("$BIN" image ref)
"$BIN" image build >/dev/null 2>&1
"$BIN" --engine podman image build >/dev/null 2>&1
repo=$state/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x > "$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x
wt=$state/wt && mkdir -p "$wt"

# One create/start/wait/remove through the engine's API on SOCKET.
api_run() {
  python3 - "$1" "$image" "$wt" "$2" <<'PY'
import http.client, json, socket, sys
sock, image, wt, seccomp = sys.argv[1:5]
class C(http.client.HTTPConnection):
    def __init__(self): super().__init__("localhost")
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sock)
def call(m, p, b=None):
    c = C(); c.request(m, "/v1.41" + p, json.dumps(b) if b is not None else None,
                       {"Content-Type": "application/json"})
    r = c.getresponse(); d = r.read()
    if r.status >= 300: sys.exit(f"{m} {p}: {r.status} {d[:300]!r}")
    return json.loads(d) if d else None
body = {"Image": image, "Cmd": ["true"], "Entrypoint": [], "User": "2000000000:2000000000",
        "WorkingDir": "/workspace", "NetworkDisabled": True,
        "HostConfig": {"NetworkMode": "none", "CapDrop": ["ALL"], "Privileged": False,
            "SecurityOpt": ["no-new-privileges", "seccomp=" + seccomp], "ReadonlyRootfs": True,
            "Tmpfs": {"/tmp": "rw,nosuid,nodev,size=268435456,mode=1777",
                      "/home/agent": "rw,nosuid,nodev,size=268435456,mode=1777"},
            "Mounts": [{"Type": "bind", "Source": wt, "Target": "/workspace"}],
            "Memory": 2147483648, "MemorySwap": 2147483648, "NanoCpus": 1000000000,
            "PidsLimit": 512, "Ulimits": [{"Name": "nofile", "Soft": 4096, "Hard": 4096},
                                          {"Name": "nproc", "Soft": 16384, "Hard": 16384}],
            "Init": True, "LogConfig": {"Type": "none", "Config": {}}}}
cid = call("POST", "/containers/create", body)["Id"]
call("POST", f"/containers/{cid}/start")
call("POST", f"/containers/{cid}/wait")
call("DELETE", f"/containers/{cid}?force=true")
PY
}
profile=core/src/seccomp.json
docker_profile=$(cat orchestrator/$profile)
podman_profile=$(ls /run/nightshift-podman/seccomp/*.json | head -1)
docker_api() { api_run /var/run/docker.sock "$docker_profile"; }
podman_api() { api_run /run/nightshift-podman/podman.sock "$podman_profile"; }
gvisor_api() { api_run /run/nightshift-podman/podman-runsc.sock "$podman_profile"; }
ours_gvisor() { "$BIN" --engine podman --runtime runsc run --repo "$repo" --image "$image" -- true >/dev/null; }
ours_docker() { "$BIN" run --repo "$repo" --image "$image" -- true >/dev/null; }
ours_podman() { "$BIN" --engine podman run --repo "$repo" --image "$image" -- true >/dev/null; }

time_ms() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

ours_podman # writes the seccomp file Podman reads, and warms up
podman_profile=$(ls /run/nightshift-podman/seccomp/*.json | head -1)
ours_docker; docker_api; podman_api; gvisor_api; ours_gvisor
da=(); dn=(); pa=(); pn=(); ga=(); gn=()
for _ in $(seq 1 "$N"); do
  da+=("$(time_ms docker_api)")
  dn+=("$(time_ms ours_docker)")
  pa+=("$(time_ms podman_api)")
  pn+=("$(time_ms ours_podman)")
  ga+=("$(time_ms gvisor_api)")
  gn+=("$(time_ms ours_gvisor)")
done
m() { printf '%s\n' "$@" | median; }
dam=$(m "${da[@]}"); dnm=$(m "${dn[@]}"); pam=$(m "${pa[@]}"); pnm=$(m "${pn[@]}")
gam=$(m "${ga[@]}"); gnm=$(m "${gn[@]}")
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
echo "| Docker: create, start, wait, remove through its API | $dam ms | 1.00 |"
echo "| Docker: \`nightshift run -- true\` | $dnm ms | $(r "$dnm" "$dam") |"
echo "| Podman: create, start, wait, remove through its API | $pam ms | $(r "$pam" "$dam") |"
echo "| Podman: \`nightshift --engine podman run -- true\` | $pnm ms | $(r "$pnm" "$dam") (against Podman's own: $(r "$pnm" "$pam")) |"
echo "| Podman + gVisor: create, start, wait, remove through its API | $gam ms | $(r "$gam" "$dam") |"
echo "| Podman + gVisor: \`nightshift --engine podman --runtime runsc run -- true\` | $gnm ms | $(r "$gnm" "$dam") (against its own: $(r "$gnm" "$gam")) |"
echo "(median of $N each, interleaved, $(date -u +%F), $(nproc) cores)"
rm -rf "$state"

#!/usr/bin/env bash
# The door and the queue (on the store NIGHTSHIFT_STORE names, if any: the
# door's round trip on PostgreSQL too; the 10,000-act queue on SQLite only):
#  - door round trip (request to verdict) for a refused act and a queued act,
#    measured inside a real sandbox with raw protocol frames (no client
#    process), median and p99 of N each;
#  - `nightshift queue` with 10,000 pending acts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_docker
N=${N:-300}
cargo build --release -q -p orchestrator
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/nightshift
state=$(mktemp -d /tmp/nightshift-bench.XXXXXX)
export NIGHTSHIFT_STATE_DIR=$state
"$bin" image build >/dev/null 2>&1
repo=$state/repo
mkdir -p "$repo" && git -C "$repo" init -q -b main && echo x > "$repo/x" \
  && git -C "$repo" add x && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm x
cat > "$state/probe.py" <<'PY'
import json, os, socket, struct, sys, time
def ask(req):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["NIGHTSHIFT_DOOR"])
    body = json.dumps({"v": 3, "request": req}).encode()
    t = time.perf_counter()
    s.sendall(struct.pack(">I", len(body)) + body)
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    n = struct.unpack(">I", head)[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    dt = time.perf_counter() - t
    s.close()
    return dt, json.loads(data)["response"]["verdict"]
def stats(name, xs):
    xs = sorted(xs)
    med = xs[len(xs) // 2] * 1e3
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3
    print(f"| {name} | {med:.2f} ms | {p99:.2f} ms |")
n = int(sys.argv[1])
refused, queued = [], []
for i in range(n):
    dt, v = ask({"door": "notify", "destination": "nowhere", "body": "x"})
    assert v == "refused", v
    refused.append(dt)
for i in range(min(n, 190)):
    dt, v = ask({"door": "ask", "body": "question %d" % i})
    assert v == "queued", v
    queued.append(dt)
stats("door round trip, refused act (routing)", refused)
stats("door round trip, queued act (gate, queue row, two audit entries)", queued)
PY
cp "$state/probe.py" "$repo/probe.py"
git -C "$repo" add probe.py && git -C "$repo" -c user.name=b -c user.email=b@b commit -qm probe
echo "| measure | median | p99 |"
echo "|---|---|---|"
"$bin" run --repo "$repo" --json -- python3 probe.py "$N" >/dev/null
cat "$state"/runs/*/output.log
case "${NIGHTSHIFT_STORE:-}" in
  postgres*)
    # The 10,000-act queue on PostgreSQL is the store bench's
    # (cargo bench -p nightshift-store-postgres --bench stores).
    rm -rf "$state"
    exit 0 ;;
esac
# 10,000 pending acts: copy the queued rows until there are 10,000.
python3 - "$state/state.db" <<'PY'
import sqlite3, sys, json
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT id, run, act, state, content, created_at FROM acts").fetchall()
i = 0
while db.execute("SELECT count(*) FROM acts").fetchone()[0] < 10000:
    for (id_, run, act, state, content, created) in rows:
        i += 1
        a = json.loads(act); a["id"] = "b%07d" % i
        db.execute("INSERT INTO acts(id, run, act, state, content, created_at, updated_at) VALUES (?,?,?,?,?,?,?)", (a["id"], run, json.dumps(a), state, content, created, created))
db.commit()
PY
time_ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
ls_ms=(); js_ms=()
for _ in 1 2 3 4 5; do ls_ms+=("$(time_ms "$bin" queue)"); js_ms+=("$(time_ms "$bin" queue --json)"); done
med() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
echo "| \`nightshift queue\`, 10,000 pending acts | $(med "${ls_ms[@]}") ms | |"
echo "| \`nightshift queue --json\`, 10,000 pending acts | $(med "${js_ms[@]}") ms | |"
rm -rf "$state"

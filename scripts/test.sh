#!/usr/bin/env bash
# Runs every test: lints, unit and property tests, the store tests against a
# throwaway PostgreSQL server, and the end-to-end tests against the real
# container engine (which need the sandbox image: built here
# when the engine lacks it; a no-op when it is up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# Each phase's start and the seconds since this script began, on stderr,
# so that a run's log says where its time went (docs/benchmarks.md).
began=$(date +%s)
# With the free space where the build cache lives: a full disk shows up as a
# linker's SIGBUS otherwise, far from its cause.
phase() {
  local free
  # (On a fresh machine the cache folder does not exist yet: df fails, and
  # the phase is printed all the same.)
  free=$(df -Pk "${XDG_CACHE_HOME:-$HOME/.cache}" 2>/dev/null | awk 'NR==2 { printf "%d", $4 / 1048576 }') || free=
  echo "== test.sh: $1 (at $(( $(date +%s) - began )) s, ${free:-?} GiB free)" >&2
}
# The build is a cache like the images: kept across clones of the
# repository on this machine (cargo rebuilds whatever changed), unless
# CARGO_TARGET_DIR says otherwise.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nightshift-target}
bin=$CARGO_TARGET_DIR/debug/nightshift
phase "packages and the engine"
ensure_packages
ensure_docker
# clang instruments the fuzz targets' C (scripts/fuzz.sh), whose build runs
# beside the images: installed here, before anything else uses apt.
command -v clang >/dev/null 2>&1 || apt_install clang
phase "format, lints, layers"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
# Only the adapter crates name bollard, rusqlite, the PostgreSQL client and
# axum; no crate's modules import each other in a cycle. Every module note
# that says only, never or without touching names a test that holds it.
python3 scripts/check-layers.py
python3 scripts/check-notes.py
phase "build"
cargo build -q -p orchestrator
phase "images (and, beside them, the fuzz targets' build)"
# The fuzz targets' instrumented build (long on a fresh machine, an
# incremental no-op after) runs beside the image builds, which mostly wait
# on debootstrap and pip; the tests begin once both are done.
fuzz_log=$(mktemp)
scripts/fuzz.sh build >"$fuzz_log" 2>&1 &
fuzz_build=$!
NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image "$bin" image build
# The agent images the tests use (heavy: each is built once, then a no-op
# while its inputs are unchanged). They share one Debian root filesystem
# (built by the first, kept in the build folder); the rest are mostly pip,
# two at a time on this machine's two cores, each line prefixed.
agent_image() {
  NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image "$bin" image build --agent "$1" 2>&1 | sed "s/^/[$1] /"
  return "${PIPESTATUS[0]}"
}
agent_image python-sdks
agent_image claude-code & a=$!
agent_image codex & b=$!
wait "$a"; wait "$b"
agent_image mini-swe-agent & a=$!
agent_image aider & b=$!
wait "$a"; wait "$b"
# The toolchain image tests/tests/toolchains.rs and setup.rs use (Debian's cargo and
# pip over the sandbox image; built once, then a no-op).
NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image "$bin" image build --with rust,python
# One throwaway PostgreSQL server for the PostgreSQL store's tests (each
# makes its own database in it), stopped and removed when this script ends.
NIGHTSHIFT_TEST_PG=$(scripts/pg.sh start)
export NIGHTSHIFT_TEST_PG
trap 'scripts/pg.sh stop "$NIGHTSHIFT_TEST_PG"' EXIT
phase "the fuzz targets' build (begun beside the images)"
if ! wait "$fuzz_build"; then
  tail -60 "$fuzz_log" >&2
  echo "test.sh: the fuzz targets' build failed (above)" >&2
  exit 1
fi
rm -f "$fuzz_log"
phase "tests"
# Tests that need this host (root, the engine, writable cgroups) fail
# rather than skip: CI runs them all.
NIGHTSHIFT_REQUIRE_HOST_TESTS=1 cargo test --workspace -q --no-fail-fast
phase "tests on PostgreSQL"
# The end-to-end suites of the act queue, the run queue, the audit, serve
# and the kill -9 faults again with every state in PostgreSQL (a fresh
# database each); the tests that change state.db itself say so and stop.
NIGHTSHIFT_TEST_STORE=postgres NIGHTSHIFT_REQUIRE_HOST_TESTS=1 cargo test -q -p tests --no-fail-fast \
  --test acts --test run_queue --test serve_queue --test audit --test dashboard_api \
  --test faults --test run --test pool --test result
phase "tests on Podman"
# The end-to-end suites that take the engine's paths, again with every
# sandbox on nightshift's rootful Podman service (scripts/podman.sh,
# docs/engines.md): attestation, run, sandbox probes, caps (the fleet's
# memory cap too), the lease, the kill switch and a kill independent of the
# supervisor, the boundary's channels, the door's races, warm sandboxes,
# the end-of-run packer, the setup phase (its networked container), bad
# input (an unreachable engine) and the kill -9 faults (a cut engine
# connection among them); and the generated Kubernetes Pod spec (and the
# Sandbox resource's template) played by `podman kube play` against the
# sandbox probes (tests/tests/kube_play.rs, docs/kubernetes.md). Every other
# suite passes on Podman too when run whole (`NIGHTSHIFT_TEST_ENGINE=podman
# cargo test -p tests`; docs/engines.md says which need the agent images
# there): they take no path through the engine these do not, and CI's time
# is kept for them once. (Run beside the PostgreSQL pass to save time, the
# two overloaded this machine's two cores and timed tests out.) The images
# are loaded into Podman's store (a no-op when they are up to date there);
# the service is left running, as dockerd is.
scripts/podman.sh start >/dev/null
NIGHTSHIFT_ENGINE=podman NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image "$bin" image build
NIGHTSHIFT_ENGINE=podman NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image "$bin" image build --with rust,python
NIGHTSHIFT_TEST_ENGINE=podman NIGHTSHIFT_REQUIRE_HOST_TESTS=1 cargo test -q -p tests --no-fail-fast \
  --test attestation --test run --test engines --test kube_play --test sandbox_probes \
  --test caps --test lease --test killswitch --test kill_independent --test channels \
  --test door_races --test pool --test result --test setup --test bad_input --test faults
phase "fuzz"
# A bounded fuzz pass: each fuzz target for 30 s over its committed
# corpus, failing on any crash (scripts/fuzz.sh, docs/fuzzing.md; longer
# campaigns are `scripts/fuzz.sh run TARGET SECONDS`).
scripts/fuzz.sh check "${NIGHTSHIFT_FUZZ_SECONDS:-30}"
phase "done"

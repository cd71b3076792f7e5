#!/usr/bin/env bash
# The fuzz targets (fuzz/, docs/fuzzing.md): build, run, minimise, check.
#
#   scripts/fuzz.sh build                  build every target (incremental)
#   scripts/fuzz.sh run TARGET [SECONDS] [-- LIBFUZZER ARGS]
#                                          fuzz one target (default 1200 s),
#                                          growing its committed corpus
#   scripts/fuzz.sh cmin TARGET            minimise its corpus in place
#   scripts/fuzz.sh check [SECONDS]        the bounded pass scripts/test.sh
#                                          runs: each target SECONDS (60) over
#                                          a copy of its corpus, two at a time;
#                                          fails on a crash
#   scripts/fuzz.sh list                   the targets
#
# cargo-fuzz (crates.io) and clang (Debian) are installed when missing.
# Only a stable toolchain is needed: RUSTC_BOOTSTRAP=1 lets it take
# cargo-fuzz's nightly flags. No sanitizer (the targets' crates forbid
# unsafe; libFuzzer still catches panics, overflows (debug assertions on),
# timeouts and memory over -rss_limit_mb). Builds go to a cache outside the
# checkout, $NIGHTSHIFT_FUZZ_CACHE (default ~/.cache/nightshift-fuzz:
# target/ and target-c/), so that a fresh clone (CI) rebuilds only the
# project's own crates, never every dependency with the fuzzer's
# instrumentation; runs' crashes go to fuzz/artifacts/TARGET/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
export CARGO_PROFILE_DEV_DEBUG=0
cache=${NIGHTSHIFT_FUZZ_CACHE:-${HOME:-/root}/.cache/nightshift-fuzz}
mkdir -p "$cache"

. scripts/lib.sh

ensure_tools() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked >&2
  fi
  # clang instruments libgit2's C code for the pack receiver's target.
  if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: installing clang (Debian's package)" >&2
    apt_install clang
  fi
}

targets() {
  sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^nightshift-fuzz$'
}

# libFuzzer flags per target: packs and streams get longer inputs.
target_flags() {
  local flags=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
  case "$1" in
    pack_index | pack_scan) flags+=(-max_len=65536) ;;
    gateway_sse | gateway_request) flags+=(-max_len=16384 -dict=fuzz/dicts/json.dict) ;;
    policy_rules) flags+=(-max_len=16384 -dict=fuzz/dicts/toml.dict) ;;
    door_frame) flags+=(-max_len=8192 -dict=fuzz/dicts/json.dict) ;;
    *) flags+=(-max_len=4096) ;;
  esac
  printf '%s\n' "${flags[@]}"
}

# cargo fuzz SUBCOMMAND TARGET ARGS..., built the target's way. The packs'
# targets run C: libgit2's indexer and zlib. They are built on their own
# ($cache/target-c) with the C compiled by clang with libFuzzer's coverage,
# so the fuzzer sees its branches too.
fuzz() {
  local sub=$1 target=$2
  shift 2
  local flags=(--sanitizer none --debug-assertions)
  if [ "$target" = pack_index ] || [ "$target" = pack_scan ]; then
    CC=clang CFLAGS="-fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp" \
      cargo fuzz "$sub" "${flags[@]}" --no-default-features --target-dir "$cache/target-c" "$target" "$@"
  else
    cargo fuzz "$sub" "${flags[@]}" --target-dir "$cache/target" "$target" "$@"
  fi
}

build() {
  ensure_tools
  cargo fuzz build --sanitizer none --debug-assertions --target-dir "$cache/target"
  fuzz build pack_index
  fuzz build pack_scan
}

cmd=${1:-}
shift || true
case "$cmd" in
  list) targets ;;
  build) build ;;
  run)
    target=${1:?usage: scripts/fuzz.sh run TARGET [SECONDS] [-- ARGS]}
    seconds=${2:-1200}
    shift $(($# < 2 ? $# : 2))
    [ "${1:-}" = "--" ] && shift
    ensure_tools
    mkdir -p "fuzz/corpus/$target"
    mapfile -t flags < <(target_flags "$target")
    # The real inputs it started from (fuzz/seed.sh); both pack targets share theirs.
    seeds=()
    seed_dir=fuzz/seeds/${target/pack_scan/pack_index}
    [ -d "$seed_dir" ] && seeds=("$seed_dir")
    fuzz run "$target" "fuzz/corpus/$target" "${seeds[@]}" -- \
      "${flags[@]}" -max_total_time="$seconds" "$@"
    ;;
  cmin)
    target=${1:?usage: scripts/fuzz.sh cmin TARGET}
    ensure_tools
    mapfile -t flags < <(target_flags "$target")
    # Edges only (not hit counts): a few hundred files per target, not thousands.
    # The inputs of fixed crashes (regression-*) are kept whatever their
    # coverage: every later pass replays them.
    keep=$(mktemp -d)
    cp "fuzz/corpus/$target"/regression-* "$keep"/ 2>/dev/null || true
    fuzz cmin "$target" "fuzz/corpus/$target" -- "${flags[@]}" -use_counters=0
    cp "$keep"/regression-* "fuzz/corpus/$target"/ 2>/dev/null || true
    rm -rf "$keep"
    ;;
  check)
    seconds=${1:-60}
    build
    # Two targets at a time (one core each; libFuzzer runs one thread),
    # NIGHTSHIFT_FUZZ_JOBS to change it; a failed target leaves a mark in
    # $failed_dir and its log's tail on stderr.
    jobs=${NIGHTSHIFT_FUZZ_JOBS:-2}
    failed_dir=$(mktemp -d)
    check_one() {
      local target=$1 scratch
      # A scratch copy: the committed corpus is read, never written.
      scratch=$(mktemp -d)
      mapfile -t flags < <(target_flags "$target")
      echo "fuzz: $target for ${seconds}s over fuzz/corpus/$target" >&2
      if ! fuzz run "$target" "$scratch" "fuzz/corpus/$target" -- \
        "${flags[@]}" -max_total_time="$seconds" >"$scratch.log" 2>&1; then
        {
          echo "fuzz: $target FAILED; its crash is in fuzz/artifacts/$target/:"
          tail -40 "$scratch.log"
        } >&2
        touch "$failed_dir/$target"
      else
        grep -E '^stat::number_of_executed_units|^#[0-9]+ +DONE' "$scratch.log" | sed "s/^/fuzz: $target: /" >&2 || true
      fi
      rm -rf "$scratch" "$scratch.log"
    }
    running=0
    for target in $(targets); do
      check_one "$target" &
      running=$((running + 1))
      if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
      fi
    done
    wait
    mapfile -t failed < <(ls "$failed_dir")
    rm -rf "$failed_dir"
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz: crashes in: ${failed[*]}" >&2
      exit 1
    fi
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

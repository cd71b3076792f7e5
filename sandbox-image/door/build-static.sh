#!/bin/sh
# Builds the door clients as static executables (they run in any image,
# even one with nothing else in it) and copies them to OUTDIR.
# usage: sandbox-image/door/build-static.sh OUTDIR
set -eu
out=${1:?usage: build-static.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release -p sandbox-image-door --bins --target "$target" \
    --manifest-path "$here/../../Cargo.toml"
dir=${CARGO_TARGET_DIR:-$here/../../target}/$target/release
mkdir -p "$out"
for bin in nightshift-act git-remote-nightshift; do
    cp "$dir/$bin" "$out/$bin"
    if command -v file >/dev/null && ! file "$out/$bin" | grep -q 'static'; then
        echo "build-static.sh: $bin is not statically linked" >&2
        exit 1
    fi
done

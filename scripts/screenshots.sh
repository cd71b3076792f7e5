#!/usr/bin/env bash
# The README's screenshots (docs/screenshots/): the browser test's night
# (hostile content, a capped run, a push the remote refuses), taken by its
# harness into target/screenshots/, copied here.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p orchestrator --bin nightshift
cargo test -p tests --test dashboard_browser the_morning_review_in_a_real_browser
dir="${CARGO_TARGET_DIR:-target}/screenshots"
mkdir -p docs/screenshots
cp "$dir/morning-after.png" docs/screenshots/morning.png
for f in queue policy run run-capped run-failed-push; do
  cp "$dir/$f.png" "docs/screenshots/$f.png"
done

#!/usr/bin/env bash
# Rootful Podman's Docker-compatible API on a socket of nightshift's own,
# for `--engine podman` (docs/engines.md), the tests and the benchmarks.
#
#   scripts/podman.sh start     installs Debian's podman and catatonit when
#                               missing, starts `podman system service` on
#                               /run/nightshift-podman/podman.sock (no
#                               timeout) and prints its endpoint; a no-op
#                               when it already answers
#   scripts/podman.sh stop      stops the service this script started
#   scripts/podman.sh endpoint  prints the endpoint
#
# The service runs as root with Podman's default store
# (/var/lib/containers/storage); its log is /run/nightshift-podman/service.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

dir=${NIGHTSHIFT_PODMAN_DIR:-/run/nightshift-podman}
sock="$dir/podman.sock"
endpoint="unix://$sock"

answers() {
  curl -sf --max-time 5 --unix-socket "$sock" http://d/_ping >/dev/null 2>&1
}

start() {
  ensure_podman
  if answers; then echo "$endpoint"; return 0; fi
  mkdir -p "$dir"
  chmod 0700 "$dir"
  rm -f "$sock"
  # Detached from the caller's pipes and session: it outlives this script.
  setsid podman system service --time=0 "$endpoint" </dev/null >"$dir/service.log" 2>&1 &
  echo $! >"$dir/service.pid"
  for _ in $(seq 1 100); do
    if answers; then echo "$endpoint"; return 0; fi
    sleep 0.1
  done
  echo "podman.sh: the service did not answer on $sock; see $dir/service.log" >&2
  return 1
}

stop() {
  [ -f "$dir/service.pid" ] || return 0
  local pid
  pid=$(cat "$dir/service.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$dir/service.pid" "$sock"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  endpoint) echo "$endpoint" ;;
  *) echo "usage: podman.sh start|stop|endpoint" >&2; exit 2 ;;
esac

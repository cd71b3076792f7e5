#!/usr/bin/env bash
# Rootful Podman's Docker-compatible API on a socket of nightshift's own,
# for `--engine podman` (docs/engines.md), the tests and the benchmarks.
#
#   scripts/podman.sh start     installs Debian's podman, catatonit and runsc
#                               when missing, starts `podman system service`
#                               on /run/nightshift-podman/podman.sock (no
#                               timeout) and a second one running every
#                               container with gVisor on podman-runsc.sock
#                               (Podman 4.3 has one runtime per service);
#                               prints the first's endpoint; a no-op for a
#                               service that already answers
#   scripts/podman.sh stop      stops the service this script started
#   scripts/podman.sh endpoint  prints the endpoint
#
# The services run as root with Podman's default store
# (/var/lib/containers/storage); their logs are /run/nightshift-podman/*.log,
# their configuration /run/nightshift-podman/containers.conf (gVisor's runsc
# registered, docs/engines.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

dir=${NIGHTSHIFT_PODMAN_DIR:-/run/nightshift-podman}
sock="$dir/podman.sock"
endpoint="unix://$sock"

answers() {
  curl -sf --max-time 5 --unix-socket "${1:-$sock}" http://d/_ping >/dev/null 2>&1
}

# Starts one service: NAME (its socket and files' stem), then podman's own
# arguments before `system service`.
service() {
  local name=$1; shift
  local s="$dir/$name.sock" pid
  if answers "$s"; then
    # A service started from a folder since removed (an earlier clone, as
    # a CI run's) answers but starts no container: conmon inherits the
    # deleted working directory and fails. Such a service is replaced.
    pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
    if [ -z "$pid" ] || ! readlink "/proc/$pid/cwd" 2>/dev/null | grep -q ' (deleted)$'; then
      return 0
    fi
    echo "podman.sh: restarting $name: its working directory was removed" >&2
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$s"
  # Detached from the caller's pipes and session: it outlives this script,
  # and so runs from / (never from a folder that may be removed).
  (cd / && CONTAINERS_CONF="$dir/containers.conf" exec setsid podman "$@" system service --time=0 "unix://$s" \
    </dev/null >"$dir/$name.log" 2>&1) &
  echo $! >"$dir/$name.pid"
  for _ in $(seq 1 100); do
    if answers "$s"; then return 0; fi
    sleep 0.1
  done
  echo "podman.sh: the service did not answer on $s; see $dir/$name.log" >&2
  return 1
}

start() {
  ensure_podman
  ensure_runsc
  mkdir -p "$dir"
  chmod 0700 "$dir"
  # gVisor as the runtime `runsc`, through a wrapper that gives it its
  # flags: ptrace (KVM hangs here), no network of its own (the sandbox has
  # none), host Unix sockets openable (the door), and the OCI seccomp
  # filter loaded inside the sandbox (without --oci-seccomp runsc ignores
  # the profile the attestation checks; tests/tests/engines.rs probes it).
  cat >"$dir/runsc" <<'WRAP'
#!/bin/sh
exec /usr/bin/runsc --platform=ptrace --network=none --host-uds=open --oci-seccomp "$@"
WRAP
  chmod 0755 "$dir/runsc"
  cat >"$dir/containers.conf" <<CONF
[engine.runtimes]
runsc = ["$dir/runsc"]
CONF
  service podman
  service podman-runsc --runtime runsc
  echo "$endpoint"
}

stop() {
  local name pid
  for name in podman podman-runsc; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dir/$name.pid" "$dir/$name.sock"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  endpoint) echo "$endpoint" ;;
  *) echo "usage: podman.sh start|stop|endpoint" >&2; exit 2 ;;
esac

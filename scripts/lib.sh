# Shared by the scripts: make sure the container engine answers, starting
# dockerd when it is not running, and that Debian's packages we need are in.

# Installs Debian packages; refreshes the package lists first if that is
# what stands in the way (a fresh machine may have none).
apt_install() {
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1; then
    # An install killed half-way (a cut session, a killed run) leaves dpkg
    # waiting to be finished; finish it, then refresh the lists and retry.
    DEBIAN_FRONTEND=noninteractive dpkg --configure -a >/dev/null 2>&1 || true
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
  fi
}

ensure_docker() {
  if docker info >/dev/null 2>&1; then return 0; fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "setup: installing docker.io (Debian's package)" >&2
    apt_install docker.io
  fi
  echo "setup: starting dockerd" >&2
  (dockerd >/var/log/nightshift-dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "setup: dockerd did not come up; see /var/log/nightshift-dockerd.log" >&2
  return 1
}

ensure_packages() {
  local missing=()
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v git >/dev/null 2>&1 || missing+=(git)
  # libgit2's https (OpenSSL) and ssh (libssh2 over OpenSSL) build against
  # Debian's libssl; the SSH destination tests run a real sshd on loopback.
  [ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
  # The dashboard's browser tests drive a real headless Chromium.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  # Each run's worktree is its own loop-mounted ext4 filesystem (hostview.rs).
  command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
  command -v losetup >/dev/null 2>&1 || [ -x /usr/sbin/losetup ] || [ -x /sbin/losetup ] || missing+=(mount)
  # deploy/compose.yaml is tested with Debian's docker-compose (tests/tests/compose.rs).
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    apt_install "${missing[@]}"
  fi
}

# PostgreSQL's server binaries (initdb, pg_ctl, postgres) from Debian's
# package, which keeps them out of PATH (/usr/lib/postgresql/N/bin); sets
# PG_BIN to their folder. Installs the package when it is missing.
ensure_postgres() {
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    echo "setup: installing postgresql (Debian's package)" >&2
    apt_install postgresql
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  # The server refuses to run as root: it runs as the package's own user.
  getent passwd postgres >/dev/null || useradd --system --home-dir /var/lib/postgresql postgres
  export PG_BIN
}

# Debian's podman (rootful) with what it needs to run nightshift's sandboxes:
# catatonit (the init binary podman's `--init` runs) and crun/runc. Installs
# them when missing.
ensure_podman() {
  local missing=()
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || missing+=(catatonit)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]} (Debian's packages)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q "${missing[@]}" >/dev/null 2>&1 || {
      apt-get -o DPkg::Lock::Timeout=900 update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q "${missing[@]}" >/dev/null
    }
  fi
}

# Debian's runsc (gVisor), the runtime of nightshift's second Podman service
# (scripts/podman.sh, docs/engines.md). Installs it when missing.
ensure_runsc() {
  if ! command -v runsc >/dev/null 2>&1; then
    echo "setup: installing runsc (Debian's package)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q runsc >/dev/null 2>&1 || {
      apt-get -o DPkg::Lock::Timeout=900 update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q runsc >/dev/null
    }
  fi
}

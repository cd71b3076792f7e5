#!/usr/bin/env bash
# Installs an agent preset into a sandbox root filesystem and writes it as a
# tar archive. Called by `nightshift image build --agent PRESET` after
# build-rootfs.sh made BASE.tar (the default image's packages plus the
# preset's); every line of this file, of the preset's requirements.txt and
# of its run.sh is an input of the agent image's content digest.
#
#   install-agent.sh BASE.tar OUT.tar PRESET_DIR PRESET
#
# The preset's packages come from PyPI with pip's --require-hashes: each
# pinned with == and the SHA-256 of its wheel (the lock file, made by
# scripts/lock-agent.sh), wheels only (no package's build script runs), so
# what is installed is exactly what was locked or the build fails. pip
# resolves nothing (--no-deps: the lock file already holds every
# dependency; resolving anew let a requirement with an extra, such as
# litellm's `httpx[http2]`, ask for a version the lock does not pin once a
# newer one was published), and `pip check` then refuses a lock file that
# misses a dependency.
# $NIGHTSHIFT_PIP_INDEX_URL names another index (a mirror): the hashes
# still decide what is accepted. TLS to the index is verified with the
# build host's CA bundle ($PIP_CERT, $SSL_CERT_FILE, else the system's), so
# a host behind a TLS-inspecting proxy can build; it is removed afterwards.
set -euo pipefail
base=$1 out=$2 dir=$3 preset=$4

step() { printf 'image: %s\n' "$*"; }

work=$(mktemp -d /var/tmp/nightshift-agent.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root
mkdir "$root"
tar --numeric-owner -xpf "$base" -C "$root"
rm -f "$root/etc/resolv.conf"
cat /etc/resolv.conf > "$root/etc/resolv.conf"
install -m 0644 "$dir/requirements.txt" "$root/tmp/requirements.txt"
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
install -m 0644 "$ca" "$root/tmp/build-ca.crt"

step "python venv /opt/agent"
chroot "$root" /usr/bin/python3 -m venv /opt/agent
count=$(grep -c '==' "$dir/requirements.txt")
step "pip install --require-hashes: $preset ($count pinned packages)"
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 \
  PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/tmp/build-ca.crt \
  /opt/agent/bin/pip install --quiet --no-input --no-compile --require-hashes \
  --no-deps --only-binary=:all: --index-url "${NIGHTSHIFT_PIP_INDEX_URL:-https://pypi.org/simple}" \
  -r /tmp/requirements.txt
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 \
  PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/agent/bin/pip check

step "linking the agent's commands into /usr/local/bin"
site=$(cd "$root" && ls -d opt/agent/lib/python3*/site-packages)
link() { ln -sf "$1" "$root/usr/local/bin/$2"; }
link /opt/agent/bin/python3 python3
case $preset in
  claude-code) link "/$site/claude_agent_sdk/_bundled/claude" claude ;;
  codex) link "/$site/codex_cli_bin/bin/codex" codex ;;
  mini-swe-agent) link /opt/agent/bin/mini mini ;;
  aider) link /opt/agent/bin/aider aider ;;
  python-sdks) ;;
  *) echo "unknown preset $preset" >&2; exit 1 ;;
esac
for f in "$root"/usr/local/bin/*; do
  name=$(basename "$f")
  chroot "$root" test -x "/usr/local/bin/$name" \
    || { echo "the preset's command $name is missing" >&2; exit 1; }
done
install -m 0755 "$dir/run.sh" "$root/usr/local/bin/nightshift-agent"

step "trimming"
: > "$root/etc/resolv.conf"
rm -rf "$root"/tmp/* "$root"/root/.cache
find "$root/opt/agent" -name '__pycache__' -prune -exec rm -rf {} +

step "packing the root filesystem"
tar --sort=name --mtime='@0' --numeric-owner --xattrs-include='security.capability' \
    -C "$root" -cf "$out" .
step "root filesystem packed: $(du -h "$out" | cut -f1)"

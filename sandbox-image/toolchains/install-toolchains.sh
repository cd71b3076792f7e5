#!/usr/bin/env bash
# Installs toolchains' Debian packages into a sandbox (or agent) root
# filesystem and writes it as a tar archive. Called by
# `nightshift image build --with rust,python,node` after the base image's
# root filesystem was made; every line of this file and of each
# toolchain's package list is an input of the image's content digest.
#
#   install-toolchains.sh BASE.tar OUT.tar PACKAGES_FILE SUITE MIRROR
#
# apt (not debootstrap's --include) resolves the packages' dependencies:
# debootstrap fails to configure rustc. Packages come from the Debian
# mirror with apt's signature checks; recommended packages are left out.
set -euo pipefail
base=$1 out=$2 packages=$3 suite=$4 mirror=$5

step() { printf 'image: %s\n' "$*"; }

work=$(mktemp -d /var/tmp/nightshift-toolchains.XXXXXX)
root=$work/root
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
mkdir "$root"
tar --numeric-owner -xpf "$base" -C "$root"
rm -f "$root/etc/resolv.conf"
cat /etc/resolv.conf > "$root/etc/resolv.conf"
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
mount -t proc proc "$root/proc"

list=$(grep -vE '^\s*(#|$)' "$packages" | tr '\n' ' ')
step "apt-get install --no-install-recommends $list"
apt() {
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive apt-get -q -o APT::Sandbox::User=root "$@"
}
# shellcheck disable=SC2086
if ! { apt update && apt install -y --no-install-recommends $list; } > "$work/apt.log" 2>&1; then
  tail -n 20 "$work/apt.log" >&2
  exit 1
fi
step "installed $(grep -c '^Setting up' "$work/apt.log") packages"
for p in $list; do
  chroot "$root" dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' \
    || { echo "the toolchain package $p is not installed" >&2; exit 1; }
done

step "trimming"
umount "$root/proc"
: > "$root/etc/resolv.conf"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
find "$root/usr/lib/python3" -name '__pycache__' -prune -exec rm -rf {} + 2>/dev/null || true

step "packing the root filesystem"
tar --sort=name --mtime='@0' --numeric-owner --xattrs-include='security.capability' \
    -C "$root" -cf "$out" .
step "root filesystem packed: $(du -h "$out" | cut -f1)"

#!/usr/bin/env bash
# Builds the default sandbox root filesystem from Debian packages and writes it
# as a tar archive. Called by `nightshift image build`; every line of this file
# and of packages.txt is an input of the image's content digest.
#
#   build-rootfs.sh OUT.tar PACKAGES_FILE SUITE MIRROR
#
# Needs root (debootstrap) and the debootstrap package; installs it when missing.
set -euo pipefail
out=$1 packages=$2 suite=$3 mirror=$4

step() { printf 'image: %s\n' "$*"; }

if ! command -v debootstrap >/dev/null 2>&1; then
  step "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/nightshift-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root

include=$(grep -vE '^\s*(#|$)' "$packages" | tr '\n' ',' | sed 's/,$//')
step "debootstrap $suite (minbase + $include)"
debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" \
  | while IFS= read -r line; do
      case "$line" in I:\ Retrieving*|I:\ Validating*|I:\ Unpacking*|I:\ Configuring*) ;; *) printf 'image:   %s\n' "$line";; esac
    done

step "configuring the sandbox user (uid 1000) and git defaults"
chroot "$root" /usr/sbin/groupadd --gid 1000 agent
chroot "$root" /usr/sbin/useradd --uid 1000 --gid 1000 --home-dir /home/agent --no-create-home --shell /bin/bash agent
mkdir -p "$root/home/agent" "$root/workspace" "$root/run/nightshift"
chown 1000:1000 "$root/home/agent" "$root/workspace"
cat > "$root/etc/gitconfig" <<'GIT'
[user]
	name = nightshift agent
	email = agent@nightshift.invalid
[init]
	defaultBranch = main
[safe]
	directory = /workspace
GIT

step "trimming caches and documentation"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/* "$root"/tmp/*
: > "$root/etc/machine-id"

step "packing the root filesystem"
# Sorted names, fixed times and numeric owners so the same packages give the same archive.
tar --sort=name --mtime='@0' --numeric-owner --xattrs-include='security.capability' \
    -C "$root" -cf "$out" .
step "root filesystem packed: $(du -h "$out" | cut -f1)"

#!/usr/bin/env bash
# Builds the root filesystem of the hosted deployment's images from Debian
# packages and writes it as a tar archive. Called by `nightshift image build
# --service` and `--postgres`; every line of this file, of the package list
# and (for the service image) the binary's bytes are inputs of the image's
# content digest (the binary is the service image's second layer).
#
#   build-image.sh OUT.tar PACKAGES_FILE SUITE MIRROR service|postgres START_SCRIPT
#
# The service image's root filesystem has no binary: `nightshift image build
# --service` adds it as a layer of its own, so a new binary costs a copy, not
# another debootstrap.
#
# Needs root (debootstrap) and the debootstrap package; installs it when missing.
set -euo pipefail
out=$1 packages=$2 suite=$3 mirror=$4 kind=$5 extra=$6

step() { printf 'image: %s\n' "$*"; }

if ! command -v debootstrap >/dev/null 2>&1; then
  step "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/nightshift-hosted-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root

include=$(grep -vE '^\s*(#|$)' "$packages" | tr '\n' ',' | sed 's/,$//')
step "debootstrap $suite (minbase + $include)"
debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" \
  | while IFS= read -r line; do
      case "$line" in I:\ Retrieving*|I:\ Validating*|I:\ Unpacking*|I:\ Configuring*|I:\ Extracting*) ;; *) printf 'image:   %s\n' "$line";; esac
    done

case "$kind" in
  service)
    step "the service account (uid 10001)"
    chroot "$root" /usr/sbin/groupadd --gid 10001 nightshift
    chroot "$root" /usr/sbin/useradd --uid 10001 --gid 10001 --home-dir /var/lib/nightshift \
      --no-create-home --shell /usr/sbin/nologin nightshift
    mkdir -p "$root/var/lib/nightshift" "$root/etc/nightshift"
    chown 10001:10001 "$root/var/lib/nightshift"
    chmod 0700 "$root/var/lib/nightshift"
    ;;
  postgres)
    step "installing the start script; the cluster is made at first start"
    install -m 0755 "$extra" "$root/usr/local/bin/nightshift-postgres"
    # Debian's package makes a cluster of its own; the image starts empty.
    chroot "$root" /usr/bin/pg_dropcluster --stop "$(ls "$root/usr/lib/postgresql")" main 2>/dev/null || true
    rm -rf "$root/var/lib/postgresql/"* "$root/etc/postgresql/"*
    mkdir -p "$root/var/lib/postgresql/data" "$root/run/postgresql"
    chroot "$root" /bin/chown postgres:postgres /var/lib/postgresql /var/lib/postgresql/data /run/postgresql
    ln -s "/usr/lib/postgresql/$(ls "$root/usr/lib/postgresql")/bin" "$root/usr/local/lib/postgresql-bin"
    ;;
  *)
    echo "build-image.sh: unknown kind $kind (service or postgres)" >&2
    exit 2
    ;;
esac

step "trimming caches and documentation"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/* "$root"/tmp/*
: > "$root/etc/machine-id"

step "packing the root filesystem"
tar --sort=name --mtime='@0' --numeric-owner --xattrs-include='security.capability' \
    -C "$root" -cf "$out" .
step "root filesystem packed: $(du -h "$out" | cut -f1)"

#!/usr/bin/env bash
# make image: the three images, from this project's own artifacts and Debian's packages.
#
#   localhost/redis-rl-base:bookworm   Debian 12 minbase, made here with debootstrap
#   localhost/redis-rl-envoy:latest    redis-rl-envoy as /bin/ratelimit, the peer's paths, non-root
#   localhost/redis-rl-server:redis7   Debian's redis-server 7.0 with the tarball's .so loaded
#   localhost/redis-rl-server:valkey9  the matrix's Valkey 9 (make servers) with the same .so
#
# No registry is reached: the base is a root file system debootstrap builds from Debian's
# mirror, imported with `podman import`; its tarball is cached under target/image/ so the next
# `make image` skips it, and podman's layer cache skips unchanged steps after that.
#
# Environment (mk/image.mk sets them): TARBALL (make dist's tarball), SERVICE (the release
# redis-rl-envoy), VALKEY_SERVER (valkey-server 9 as make servers unpacked it), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=deploy/images/podman.sh
. deploy/images/podman.sh
: "${TARBALL:?TARBALL (make dist) is not set}" "${SERVICE:?SERVICE is not set}" "${VALKEY_SERVER:?VALKEY_SERVER is not set}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
OUT="$PWD/target/image"
ROOTFS_TAR="$OUT/debian-bookworm-minbase.tar"
CONTEXT="$OUT/context"

say() { echo "image: $*" >&2; }
need_podman image
for f in "$TARBALL" "$SERVICE" "$VALKEY_SERVER"; do
    [ -f "$f" ] || { say "missing $f"; exit 1; }
done
mkdir -p "$OUT"

base() {
    if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then return; fi
    if [ ! -f "$ROOTFS_TAR" ]; then
        command -v debootstrap >/dev/null || { say "debootstrap is not installed (make deps-image)"; exit 1; }
        local root="$OUT/rootfs"
        rm -rf "$root"
        say "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR (once; cached in $ROOTFS_TAR)"
        debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >"$OUT/debootstrap.log" 2>&1 \
            || { tail -n 20 "$OUT/debootstrap.log" >&2; exit 1; }
        # Security fixes reach the server image's redis-server through these two suites.
        cat >"$root/etc/apt/sources.list" <<SOURCES
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb ${DEBIAN_MIRROR%/debian}/debian-security bookworm-security main
SOURCES
        # Manuals, translations and documents (but the copyright files) are not read in a
        # container: drop them now, and tell dpkg to skip them in packages installed later.
        cat >"$root/etc/dpkg/dpkg.cfg.d/01-container" <<DPKG
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
DPKG
        find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
        rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
        # Downloaded .debs, package lists and apt's caches only make the image bigger.
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/*
        tar --numeric-owner -C "$root" -cf "$ROOTFS_TAR.tmp" .
        mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
        rm -rf "$root"
    fi
    say "podman import $ROOTFS_TAR as $BASE_IMAGE"
    "${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
}

# One build context for the three Containerfiles: only the files they copy.
context() {
    rm -rf "$CONTEXT"
    mkdir -p "$CONTEXT/dist"
    tar -xzf "$TARBALL" -C "$CONTEXT/dist" --strip-components=1
    (cd "$CONTEXT/dist" && sha256sum --quiet -c SHA256SUMS)
    cp "$SERVICE" "$CONTEXT/redis-rl-envoy"
    cp "$VALKEY_SERVER" "$CONTEXT/valkey-server"
    cp deploy/images/redis-rl.conf "$CONTEXT/"
}

build() { # Containerfile, image
    say "building $2 from $1"
    "${PODMAN[@]}" build "${LIMITS[@]}" --layers --quiet -f "$1" -t "$2" "$CONTEXT" >/dev/null
}

base
context
build deploy/images/envoy.Containerfile "$ENVOY_IMAGE"
build deploy/images/redis.Containerfile "$REDIS_IMAGE"
build deploy/images/valkey.Containerfile "$VALKEY_IMAGE"
"${PODMAN[@]}" images --filter reference='localhost/redis-rl-*' --format '{{.Repository}}:{{.Tag}}  {{.Size}}'

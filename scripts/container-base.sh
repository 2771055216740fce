#!/usr/bin/env bash
# Makes the seed container's base image (default localhost/bushost-debian:12)
# from the Debian package mirror: debootstrap --variant=minbase of bookworm
# plus what the supervisor and its HEALTHCHECK use (git, curl, acl), imported
# into podman. No image registry is needed. Does nothing if the image exists.
set -euo pipefail
tag=${1:-localhost/bushost-debian:12}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# crun refuses a hybrid cgroups v1 host; cgroupfs where systemd is not pid 1.
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
if "${podman[@]}" image exists "$tag"; then
  exit 0
fi
dir=$(mktemp -d /var/tmp/bushost-rootfs-XXXXXX)
trap 'rm -rf "$dir"' EXIT
debootstrap --variant=minbase --include=git,curl,acl,ca-certificates bookworm "$dir/rootfs" "$mirror" >&2
rm -rf "$dir"/rootfs/var/cache/apt/archives/*.deb "$dir"/rootfs/var/lib/apt/lists/*
tar -C "$dir/rootfs" --numeric-owner -c . | "${podman[@]}" import --change 'CMD ["/bin/bash"]' - "$tag" >&2

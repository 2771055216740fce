#!/usr/bin/env bash
# Installs the Debian packages bushost needs to build, run and test, if they
# are missing, and downloads the Go modules. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# curl and python3 are run inside sessions by the --net=proxy tests;
# podman-compose translates deploy/container/compose.yaml in its test.
for pkg in git bubblewrap postgresql ca-certificates make gcc passwd util-linux systemd podman podman-compose runc debootstrap curl python3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing Debian packages: ${need[*]} (run as root, or apt-get install them)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
export PATH="/usr/local/go/bin:$PATH"
go mod download

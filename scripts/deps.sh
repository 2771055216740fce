#!/usr/bin/env bash
# Installs the Debian packages bushost needs for one use, if they are
# missing, and downloads the Go modules. Safe to run again.
#
#   scripts/deps.sh run         build and run: git, bubblewrap (make run)
#   scripts/deps.sh container   and the seed's container: podman, runc,
#                               debootstrap (make container)
#   scripts/deps.sh [test]      and the test suite: PostgreSQL, curl, python3,
#                               podman-compose, systemd-analyze, gcc for -race
#                               (make test, .ci/run)
#   scripts/deps.sh --list SET  print SET's packages, one a line; install nothing
set -euo pipefail
cd "$(dirname "$0")/.."

# The Go toolchain fetches modules over https (ca-certificates); useradd
# and groupadd (passwd) make the supervisor's users and the sockets'
# group.
run_pkgs=(git bubblewrap ca-certificates make passwd)
# scripts/container-base.sh debootstraps the base; podman builds on runc.
container_pkgs=(podman runc debootstrap)
# gcc for go test -race; postgresql for the broker's PostgreSQL half;
# systemd for systemd-analyze verify of the units; curl and python3 are
# run inside sessions by the --net=proxy tests, and python3 serves the
# installed supervisor example; podman-compose translates
# deploy/container/compose.yaml in its test; the tests run su and mount
# (util-linux); nodejs and npm run the official TypeScript MCP client
# against bushost mcp (integration/mcp_ts_test.go).
test_pkgs=(gcc postgresql systemd curl python3 podman-compose util-linux nodejs npm)

list=false
if [ "${1:-}" = "--list" ]; then
  list=true
  shift
fi
case "${1:-test}" in
  run) pkgs=("${run_pkgs[@]}") ;;
  container) pkgs=("${run_pkgs[@]}" "${container_pkgs[@]}") ;;
  test) pkgs=("${run_pkgs[@]}" "${container_pkgs[@]}" "${test_pkgs[@]}") ;;
  *)
    echo "deps: unknown set '$1': want run, container or test" >&2
    exit 2
    ;;
esac
if $list; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi

# A command that may come from outside Debian's package (nodesource's
# nodejs carries npm, and conflicts with Debian's npm): present on PATH,
# its package is not needed.
command_of() {
  case "$1" in
    nodejs) echo node ;;
    npm) echo npm ;;
  esac
}

need=()
for pkg in "${pkgs[@]}"; do
  cmd=$(command_of "$pkg")
  if [ -n "$cmd" ] && command -v "$cmd" >/dev/null 2>&1; then
    continue
  fi
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

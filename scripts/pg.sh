#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on a Unix socket (no TCP), owned by
# the postgres user, in the directory given (default /var/tmp/bushost-pg),
# and prints its DSN.   usage: scripts/pg.sh start|stop [DIR]
set -euo pipefail
cmd=${1:-start}
dir=${2:-/var/tmp/bushost-pg}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bindir" ] || { echo "pg: no PostgreSQL server installed" >&2; exit 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
if [ "$cmd" = stop ]; then
  as_pg "$bindir/pg_ctl -D $dir/data -m immediate stop" >/dev/null 2>&1 || true
  exit 0
fi
if [ -f "$dir/data/postmaster.pid" ] && as_pg "$bindir/pg_ctl -D $dir/data status" >/dev/null 2>&1; then
  echo "postgres://postgres@/postgres?host=$dir&sslmode=disable"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
as_pg "$bindir/initdb -D $dir/data -A trust -U postgres" >/dev/null
# Settings for a throwaway test cluster: many connections for parallel tests.
as_pg "$bindir/pg_ctl -D $dir/data -o \"-k $dir -c listen_addresses= -c max_connections=300\" -l $dir/log -w start" >/dev/null
echo "postgres://postgres@/postgres?host=$dir&sslmode=disable"

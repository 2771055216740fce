#!/usr/bin/env bash
# Runs every fuzz target of the module for the given time each (default
# 10s). CI's `make test` already runs their seed corpora; this explores.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-10s}
status=0
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $target ($time)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" "$pkg" || status=1
  done
done
exit $status

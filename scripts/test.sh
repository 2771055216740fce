#!/usr/bin/env bash
# The suite, as `make test` runs it: every package with -race, and the
# integration package's tests split over BUSHOST_TEST_SHARDS processes
# (default 2) that run beside the other packages. The integration tests
# spend most of their time waiting on daemons, sessions and git rather
# than on a core, and one after another they were the suite's long pole.
#
# Each test runs in exactly one shard: the names come from the sources
# (func TestX(t *testing.T) in integration/*_test.go), dealt out in turn
# by name, so tests of one area (TestSandbox*, TestLaunch*) spread over
# the shards. Every process's output is printed whole once all have
# ended; the exit status is 1 if any failed.
#
# Usage: scripts/test.sh [go test flags...]   (GO names the go binary)
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
shards=${BUSHOST_TEST_SHARDS:-2}
case $shards in '' | *[!0-9]* | 0) echo "scripts/test.sh: BUSHOST_TEST_SHARDS must be a positive number, not '$shards'" >&2; exit 2 ;; esac

logs=$(mktemp -d "${TMPDIR:-/tmp}/bushost-test.XXXXXX") || exit 2
trap 'rm -rf "$logs"' EXIT

others=$($GO list ./... | grep -v '/integration$') || { echo "scripts/test.sh: go list failed" >&2; exit 2; }
mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*(t \*testing\.T)' integration/*_test.go | sed 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/' | sort -u)
if [ "${#tests[@]}" -eq 0 ]; then
	echo "scripts/test.sh: no tests found in integration/*_test.go" >&2
	exit 2
fi

names=()
pids=()
start() {
	local name=$1
	shift
	("$@" >"$logs/$name.log" 2>&1; echo $? >"$logs/$name.rc") &
	pids+=($!)
	names+=("$name")
}

# shellcheck disable=SC2086 # $others is a list of packages
start packages $GO test -race "$@" $others
for ((i = 0; i < shards; i++)); do
	re=""
	for ((j = i; j < ${#tests[@]}; j += shards)); do
		re+="${re:+|}${tests[j]}"
	done
	[ -n "$re" ] && start "integration-$((i + 1))-of-$shards" $GO test -race "$@" -run "^($re)\$" ./integration/
done
echo "scripts/test.sh: running ${#names[@]} go test processes: ${names[*]} (${#tests[@]} integration tests)"

for pid in "${pids[@]}"; do
	wait "$pid"
done

failed=()
for name in "${names[@]}"; do
	echo "=== $name"
	cat "$logs/$name.log"
	rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
	[ "$rc" = 0 ] || failed+=("$name (exit $rc)")
done
if [ "${#failed[@]}" -gt 0 ]; then
	echo "scripts/test.sh: FAILED: ${failed[*]}" >&2
	exit 1
fi
echo "scripts/test.sh: every package passed"

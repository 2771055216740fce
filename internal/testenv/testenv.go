// Package testenv is what every test here shares about its surroundings:
// how a test that needs something this machine lacks (root, bwrap,
// PostgreSQL, a cgroup, a tmpfs, podman) says so, and how a test waits for
// a condition instead of sleeping.
//
// With BUSHOST_TEST_REQUIRE_ALL=1 (set by .ci/run) a missing component is a
// failure naming it, never a skip: a green run means every test ran.
// It must never be imported by non-test code.
package testenv

import (
	"os"
	"testing"
	"time"
)

// RequireAllEnv names the variable that turns skips into failures.
const RequireAllEnv = "BUSHOST_TEST_REQUIRE_ALL"

// RequireAll reports whether a missing component must fail the test.
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// Missing ends the test because component is not here: a skip, or with
// BUSHOST_TEST_REQUIRE_ALL=1 a failure. why says what it stops the test
// from checking; component is a short name (PostgreSQL, root, bwrap,
// cgroup, tmpfs, podman).
func Missing(t testing.TB, component, format string, args ...any) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("%s is required (%s=1) but missing: "+format, append([]any{component, RequireAllEnv}, args...)...)
	}
	t.Skipf("*** no %s: "+format+" NOT TESTED ***", append([]any{component}, args...)...)
}

// NeedRoot ends the test (Missing "root") unless it runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root", "%s", why)
	}
}

// WaitFor polls cond until it holds, failing the test with msg if it does
// not within timeout. It is the one way a test here waits for something to
// have happened; a sleep never stands for that.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("waited %v: %s", timeout, msg)
	}
}

// Poll is WaitFor without the test: it reports whether cond held within
// timeout, for callers that decide for themselves what a miss means.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

//go:build !bushost_failpoints

package gitd

// Without the bushost_failpoints build tag, failpoint does nothing.
func failpoint(string) {}

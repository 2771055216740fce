//go:build !bushost_failpoints

package gitd

// Without the bushost_failpoints build tag, crashpoint does nothing.
func crashpoint(string) {}

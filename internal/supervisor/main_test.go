package supervisor

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as the service shim, as the real
// supervisor binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		os.Exit(RunShim(os.Args[2:]))
	}
	os.Exit(m.Run())
}

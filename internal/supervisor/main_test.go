package supervisor

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as the service shim, as the real
// supervisor binary does, and as the helpers some tests start.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		os.Exit(RunShim(os.Args[2:]))
	}
	if spec := os.Getenv(holdEnv); spec != "" {
		holdConns(spec)
		os.Exit(0)
	}
	if os.Getenv(reapEnv) == "1" {
		os.Exit(runReaper())
	}
	os.Exit(m.Run())
}

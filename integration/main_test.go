// Package integration builds the project's binaries and drives them as a
// user would: real git, real bwrap, real sockets, real processes.
package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	binDir   string
	buildMu  sync.Mutex
	built    = map[string]error{}
	repoRoot string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bushost-integration-bin-")
	if err != nil {
		panic(err)
	}
	// The sandbox runs binaries as an unprivileged user: keep them reachable.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	binDir = dir
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Dir(filepath.Dir(file))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bin builds ./cmd/<name> once per test run and returns the binary's path.
func bin(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	out := filepath.Join(binDir, name)
	err, done := built[name]
	if !done {
		// The tags of `make build`, so tests and benchmarks run what users run.
		cmd := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", out, "./cmd/"+name)
		cmd.Dir = repoRoot
		b, berr := cmd.CombinedOutput()
		if berr != nil {
			err = &buildError{name: name, out: string(b), err: berr}
		}
		built[name] = err
	}
	if err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	return out
}

type buildError struct {
	name string
	out  string
	err  error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

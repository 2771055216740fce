// Package integration builds the project's binaries and drives them as a
// user would: real git, real bwrap, real sockets, real processes.
package integration

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	binDir   string
	buildMu  sync.Mutex
	built    = map[string]error{}
	repoRoot string
	// benchmarking is set when -test.bench was given.
	benchmarking bool
)

// raceBuilt are the binaries the tests build with -race: the client and
// the daemon. The sandbox and the supervisor run as a session's pid 1 and
// under other users, where the race runtime's memory would change what is
// tested.
var raceBuilt = map[string]bool{"./cmd/bushost": true, "./cmd/bushostd": true}

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
	// A binary built with -race sleeps a second at exit by default
	// (atexit_sleep_ms=1000), which every bushost call and every daemon
	// stop paid: the suite spent most of its time asleep. Its children
	// inherit the setting through cleanEnv and os.Environ.
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace("atexit_sleep_ms=0 "+os.Getenv("GORACE")))
	}
	flag.Parse()
	// Benchmarks time what users run; tests run the client and the daemon
	// built with -race, so a data race in either fails the test that
	// drives it (a race report makes the binary exit 66).
	benchmarking = flag.Lookup("test.bench").Value.String() != ""
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Dir(filepath.Dir(file))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bin builds ./cmd/<name> once per test run and returns the binary's path.
func bin(t testing.TB, name string) string {
	t.Helper()
	if name == "sandbox" {
		// Its small pid 1 beside it, as make install puts it.
		build(t, "./cmd/sandbox-init", "sandbox-init")
	}
	return build(t, "./cmd/"+name, name)
}

// testdataBin builds ./integration/testdata/<name>, a program the tests
// need beside the project's own, once per test run.
func testdataBin(t testing.TB, name string) string {
	t.Helper()
	return build(t, "./integration/testdata/"+name, name)
}

// hookBin builds ./cmd/<name> with the tag bushost_testhook
// (internal/testhook: a path is swapped between root's check and its use)
// into a directory of its own, where sandbox serve finds the hooked
// bushostd beside it.
func hookBin(t testing.TB, name string) string {
	t.Helper()
	const tags = "grpcnotrace,netgo,bushost_testhook"
	if name == "sandbox" {
		buildTags(t, "./cmd/sandbox-init", filepath.Join("testhook", "sandbox-init"), tags)
	}
	return buildTags(t, "./cmd/"+name, filepath.Join("testhook", name), tags)
}

// build builds the package pkg (a path from the repository root) into the
// binaries directory as out, once per test run.
func build(t testing.TB, pkg, out string) string {
	t.Helper()
	// The tags of `make build`, so tests and benchmarks run what users run.
	return buildTags(t, pkg, out, "grpcnotrace,netgo")
}

func buildTags(t testing.TB, pkg, out, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	path := filepath.Join(binDir, out)
	key := pkg + " " + tags
	err, done := built[key]
	if !done {
		args := []string{"build", "-tags", tags, "-o", path}
		if raceBuilt[pkg] && !benchmarking {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Dir = repoRoot
		b, berr := cmd.CombinedOutput()
		if berr != nil {
			err = &buildError{name: out, out: string(b), err: berr}
		}
		built[key] = err
	}
	if err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	return path
}

type buildError struct {
	name string
	out  string
	err  error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

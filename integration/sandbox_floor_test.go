package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// floorSource is the least a launcher written in Go can be: it starts, and
// execs bwrap with the arguments it was given. Timed beside the raw bwrap
// line, it shows what a Go start alone costs on this machine.
const floorSource = `// Command floor execs bwrap with its own arguments and does nothing else.
package main

import (
	"os"
	"syscall"
)

func main() {
	err := syscall.Exec("/usr/bin/bwrap", append([]string{"bwrap"}, os.Args[1:]...), os.Environ())
	os.Stderr.WriteString("floor: exec /usr/bin/bwrap: " + err.Error() + "\n")
	os.Exit(127)
}
`

var (
	floorOnce sync.Once
	floorPath string
	floorErr  error
)

// floorLauncher builds the empty Go launcher once per run, as its own module
// in the binaries directory (reachable by the session user), with the go
// version this module declares and nothing else.
func floorLauncher(t testing.TB) string {
	t.Helper()
	floorOnce.Do(func() { floorErr = buildFloorLauncher() })
	if floorErr != nil {
		t.Fatalf("build the empty Go launcher: %v", floorErr)
	}
	return floorPath
}

func buildFloorLauncher() error {
	src := filepath.Join(binDir, "floor-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		return err
	}
	var goVersion string
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "go" {
			goVersion = f[1]
		}
	}
	if goVersion == "" {
		return fmt.Errorf("go.mod has no go line")
	}
	files := map[string]string{
		"main.go": floorSource,
		"go.mod":  "module floor\n\ngo " + goVersion + "\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	floorPath = filepath.Join(binDir, "floor")
	cmd := exec.Command("go", "build", "-o", floorPath, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return &buildError{name: "floor", out: string(out), err: err}
	}
	return nil
}

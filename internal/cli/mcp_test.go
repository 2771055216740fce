package cli

import (
	"bytes"
	"context"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/mcp"
)

// TestMCPRunLeavesGCAlone: push-working run as bushost mcp runs its tools
// (in the server's process, for as long as it serves) leaves the process's
// garbage collector as it was; the same command run alone sets it for a
// one-shot run (shortLived), which shows the check can fail.
func TestMCPRunLeavesGCAlone(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	gc, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})
	home, repo := t.TempDir(), t.TempDir()
	e := &Env{Home: home, JSON: true, Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{},
		Getenv: func(string) string { return "" }}
	var out, warn bytes.Buffer
	// No bus host answers in home: the push fails after its setup.
	if err := (mcpRunner{e}).Run(context.Background(), "push-working", []mcp.Flag{{Name: "repo", Value: repo}}, nil, &out, &warn); err == nil {
		t.Fatal("push-working with no bus host succeeded")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("after a tool's push-working GOGC is %d, want the server's 100", got)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("after a tool's push-working the memory limit is %d, want none", got)
	}
	if _, _, code := run(t, map[string]string{"BUSHOST_HOME": home}, "push-working", "--repo", repo); code == 0 {
		t.Fatal("bushost push-working with no bus host exited 0")
	}
	if got := debug.SetGCPercent(100); got != -1 {
		t.Errorf("bushost push-working alone left GOGC %d, want -1 (shortLived)", got)
	}
	if left, _ := os.ReadDir(repo); len(left) != 0 {
		t.Errorf("the failed pushes left %d entries in the repository", len(left))
	}
}

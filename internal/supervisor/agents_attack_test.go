package supervisor

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// init regenerates AGENTS.md as root and moves an old file it cannot keep
// to AGENTS.unkept.md, a file the agent reads. What the workspace holds
// at AGENTS.md when init runs (the seed's, or the agent's at an earlier
// boot) must never make root copy another file's content there: a link
// to a file the agent may not read, a second name of one (a hard link),
// a fifo that would block init, a file over the bound. None of it is
// read; the unkept file is not made; the old AGENTS.md name is replaced
// (never written through), and the target is as it was.
func TestAgentsUnkeptAttack(t *testing.T) {
	secret := "root's secret, no sentinel, not the rules\n"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		make func(t *testing.T, ws, target string)
	}{
		{"AGENTS.md a link to root's file", func(t *testing.T, ws, target string) {
			if err := os.Symlink(target, filepath.Join(ws, "AGENTS.md")); err != nil {
				t.Fatal(err)
			}
		}},
		{"AGENTS.md a hard link to root's file", func(t *testing.T, ws, target string) {
			if err := os.Link(target, filepath.Join(ws, "AGENTS.md")); err != nil {
				t.Fatal(err)
			}
		}},
		{"AGENTS.md a fifo", func(t *testing.T, ws, target string) {
			if err := unix.Mkfifo(filepath.Join(ws, "AGENTS.md"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"AGENTS.md over the bound", func(t *testing.T, ws, target string) {
			if err := os.WriteFile(filepath.Join(ws, "AGENTS.md"), []byte(strings.Repeat("x", maxAgentsBytes+1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ws := filepath.Join(dir, "ws")
			if err := os.Mkdir(ws, 0o755); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(dir, "secret")
			if err := os.WriteFile(target, []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.make(t, ws, target)
			wsfd, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(wsfd)
			if err := writeAgentsFile(wsfd, "/git", log); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(ws, UnkeptAgents)); err == nil {
				b, _ := os.ReadFile(filepath.Join(ws, UnkeptAgents))
				t.Fatalf("%s made from it: %.80q", UnkeptAgents, b)
			}
			b, err := os.ReadFile(filepath.Join(ws, "AGENTS.md"))
			if err != nil || !strings.Contains(string(b), AgentsSentinel) || strings.Contains(string(b), secret) {
				t.Fatalf("AGENTS.md: %v %.200q", err, b)
			}
			if b, err := os.ReadFile(target); err != nil || string(b) != secret {
				t.Fatalf("the target was written: %v %q", err, b)
			}
			ents, _ := os.ReadDir(ws)
			if len(ents) != 1 {
				t.Fatalf("left in the workspace: %v", ents)
			}
		})
	}
}

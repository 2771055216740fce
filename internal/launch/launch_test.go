package launch

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/authz"
)

func TestAllowed(t *testing.T) {
	lead := authz.Grant{ID: "g-lead", Business: "acme", Project: "web", Task: "t1", Caps: []string{authz.CapSessionLaunch},
		Launch: map[string][]string{"worker": {"git.push.working", "review.request"}, "sub": {"session.launch", "git.push.working"}}}
	for _, c := range []struct {
		name              string
		depth, maxDepth   int
		business, project string
		role              string
		caps              []string
		missing           []string
	}{
		{"in the set", 0, 1, "acme", "web", "worker", []string{"git.push.working"}, nil},
		{"all of the role's", 0, 1, "acme", "web", "worker", []string{"git.push.working", "review.request"}, nil},
		{"role outside", 0, 1, "acme", "web", "reviewer", []string{"review.verdict"}, []string{"role reviewer"}},
		{"capability outside", 0, 1, "acme", "web", "worker", []string{"task.close"}, []string{"capability task.close"}},
		{"another project", 0, 1, "acme", "api", "worker", []string{"git.push.working"}, []string{"task of acme/api"}},
		{"session.launch at depth 1 of 1", 0, 1, "acme", "web", "sub", []string{"session.launch"}, []string{"launch depth 1"}},
		{"session.launch at depth 1 of 2", 0, 2, "acme", "web", "sub", []string{"session.launch"}, nil},
		{"session.launch at depth 2 of 2", 1, 2, "acme", "web", "sub", []string{"session.launch"}, []string{"launch depth 2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{o: Options{MaxDepth: c.maxDepth}}
			g := lead
			g.LaunchDepth = c.depth
			got := s.allowed(g, c.business, c.project, c.role, c.caps)
			if len(got) != len(c.missing) {
				t.Fatalf("missing %q, want %q", got, c.missing)
			}
			for i := range got {
				if !strings.Contains(got[i], c.missing[i]) {
					t.Errorf("missing[%d] = %q, want it to name %q", i, got[i], c.missing[i])
				}
			}
		})
	}
}

func TestLimitFlags(t *testing.T) {
	m, flags, err := limitFlags(&launchv1.LaunchRequest{Net: "proxy", Memory: "512M", Pids: 64, TimeoutSeconds: 90})
	if err != nil || m["net"] != "proxy" || strings.Join(flags, " ") != "--net=proxy --memory 512M --pids 64 --timeout 1m30s" {
		t.Fatalf("limitFlags = %v %q %v", m, flags, err)
	}
	for _, r := range []*launchv1.LaunchRequest{{Net: "everything"}, {Memory: "lots"}, {Pids: -1}, {TimeoutSeconds: -5}} {
		if _, _, err := limitFlags(r); err == nil {
			t.Errorf("limitFlags(%v) accepted", r)
		}
	}
}

// TestStartTime: a pid's start time names that process; once it is gone
// (and reaped) the check fails, as it would for a recycled pid.
func TestStartTime(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil || st == 0 {
		t.Fatalf("startTime: %d %v", st, err)
	}
	fd, ok := openIfSame(cmd.Process.Pid, st)
	if !ok {
		t.Fatal("openIfSame refused the process it was given")
	}
	if _, ok := openIfSame(cmd.Process.Pid, st+1); ok {
		t.Error("openIfSame accepted another start time")
	}
	cmd.Process.Kill()
	waitPidfd(fd) // returns once it has exited
	if _, ok := openIfSame(cmd.Process.Pid, st); ok {
		t.Error("openIfSame accepted a zombie")
	}
	cmd.Wait()
	if _, ok := openIfSame(cmd.Process.Pid, st); ok {
		t.Error("openIfSame accepted a reaped process")
	}
	if self, err := startTime(os.Getpid()); err != nil || self == 0 {
		t.Errorf("startTime(self) = %d %v", self, err)
	}
}

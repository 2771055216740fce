package launch

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/sandbox"
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
		{"another task", 0, 1, "acme", "web", "worker", []string{"git.push.working"}, []string{"task t2 (the grant launches for its own task t1 only"}},
		{"session.launch at depth 1 of 1", 0, 1, "acme", "web", "sub", []string{"session.launch"}, []string{"launch depth 1"}},
		{"session.launch at depth 1 of 2", 0, 2, "acme", "web", "sub", []string{"session.launch"}, nil},
		{"session.launch at depth 2 of 2", 1, 2, "acme", "web", "sub", []string{"session.launch"}, []string{"launch depth 2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{o: Options{MaxDepth: c.maxDepth}}
			g := lead
			g.LaunchDepth = c.depth
			task := "t1"
			if c.name == "another task" {
				task = "t2"
			}
			got := s.allowed(g, c.business, c.project, task, c.role, c.caps)
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

// TestSettle: a launch gets at most what its grant allows and what the
// calling session has; what it names nothing of gets the host's default,
// bounded the same way; everything over is listed.
func TestSettle(t *testing.T) {
	s := &Server{o: Options{Defaults: bounds.Values{"memory": 2 << 30, "pids": 512, "timeout": 7200}}}
	grant := authz.Grant{ID: "g-lead", LaunchBounds: bounds.Launch{Nets: []string{"none", "proxy"}, Max: map[string]string{"memory": "1G", "pids": "256"},
		AllowDomains: []string{"*.example.com"}, AllowHosts: []string{"db:5432"}}}
	lead := &sandbox.SessionBounds{Net: "proxy", AllowDomains: []string{"api.example.com"}, Limits: map[string]string{"pids": "40", "memory": "256M"},
		Cgroup: []string{"/sys/fs/cgroup/pids/bushost-sandbox-1"}, PID: 42, Start: 7}
	for _, c := range []struct {
		name    string
		from    *sandbox.SessionBounds
		req     *launchv1.LaunchRequest
		limits  map[string]string
		missing []string
	}{
		{"defaults under the grant's ceilings", nil, &launchv1.LaunchRequest{},
			map[string]string{"memory": "1G", "pids": "256", "timeout": "2h0m0s"}, nil},
		{"asked within", nil, &launchv1.LaunchRequest{Limits: map[string]string{"memory": "512M", "nofile": "64"}, Pids: 100},
			map[string]string{"memory": "512M", "pids": "100", "nofile": "64", "timeout": "2h0m0s"}, nil},
		{"over the ceilings and the default", nil, &launchv1.LaunchRequest{Net: "host", Limits: map[string]string{"memory": "2G", "timeout": "3h"}},
			nil, []string{"--net=host (the grant's launch set allows none,proxy", "--memory 2G (above the grant's --launch-max-memory 1G)", "--timeout 3h0m0s (above sandbox serve --default-timeout"}},
		{"from a lead session", lead, &launchv1.LaunchRequest{Net: "proxy", AllowDomains: []string{"api.example.com"}},
			map[string]string{"memory": "256M", "pids": "40", "timeout": "2h0m0s"}, nil},
		{"over the lead's own", lead, &launchv1.LaunchRequest{Net: "proxy", Pids: 100, AllowDomains: []string{"www.example.com"}, AllowHosts: []string{"db:5432", "cache:6379"}},
			nil, []string{"--allow-domain www.example.com (not in the calling session's", "--allow-host db:5432 (not in the calling session's", "--allow-host cache:6379 (not in the grant's", "--allow-host cache:6379 (not in the calling session's", "--pids 100 (above the calling session's own 40)"}},
		// *.example.com opens 443 and 80 only: a port beyond them is
		// more than the grant's.
		{"a port outside the grant's", nil, &launchv1.LaunchRequest{Net: "proxy", AllowDomains: []string{"api.example.com:8443", "api.example.com:443"}},
			nil, []string{"--allow-domain api.example.com:8443 (not in the grant's --launch-allow-domain)"}},
		// --disk is one limit of the table: a worker of a lead with a
		// disk gets no more than it, asked for or not.
		{"a lead's disk", &sandbox.SessionBounds{Net: "none", Limits: map[string]string{"disk": "256M"}, Cgroup: []string{"/sys/fs/cgroup/pids/bushost-sandbox-1"}, PID: 42, Start: 7}, &launchv1.LaunchRequest{},
			map[string]string{"memory": "1G", "pids": "256", "timeout": "2h0m0s", "disk": "256M"}, nil},
		{"over a lead's disk", &sandbox.SessionBounds{Net: "none", Limits: map[string]string{"disk": "256M"}, PID: 42, Start: 7}, &launchv1.LaunchRequest{Limits: map[string]string{"disk": "512M"}},
			nil, []string{"--disk 512M (above the calling session's own 256M)"}},
		{"a none lead", &sandbox.SessionBounds{Net: "none"}, &launchv1.LaunchRequest{Net: "proxy"}, nil, []string{"--net=proxy (the calling session has --net=none)"}},
		{"a proxy lead, no allow-list asked", &sandbox.SessionBounds{Net: "proxy", AllowDomains: []string{"api.example.com", "example.org"}, AllowHosts: []string{"db:5432"},
			Cgroup: []string{"/sys/fs/cgroup/pids/bushost-sandbox-1"}, PID: 42, Start: 7},
			&launchv1.LaunchRequest{Net: "proxy"}, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, missing, err := s.settle(grant, c.req, c.from)
			if err != nil {
				t.Fatal(err)
			}
			if len(missing) != len(c.missing) {
				t.Fatalf("missing %q, want %q", missing, c.missing)
			}
			for i := range missing {
				if !strings.Contains(missing[i], c.missing[i]) {
					t.Errorf("missing[%d] = %q, want %q", i, missing[i], c.missing[i])
				}
			}
			if c.limits != nil && !maps.Equal(got.limits.Strings(), c.limits) {
				t.Errorf("limits %v, want %v", got.limits.Strings(), c.limits)
			}
			if c.name == "a proxy lead, no allow-list asked" && (strings.Join(got.domains, ",") != "api.example.com" || strings.Join(got.hosts, ",") != "db:5432") {
				t.Errorf("allow-list %v %v, want the lead's the grant covers", got.domains, got.hosts)
			}
			if c.from != nil && len(missing) == 0 {
				flags := strings.Join(got.runFlags(), " ")
				if !strings.Contains(flags, "--cgroup-parent /sys/fs/cgroup/pids/bushost-sandbox-1") || !strings.Contains(flags, "--end-with 42:7") {
					t.Errorf("run flags %q do not nest the session in its launcher's", flags)
				}
			}
		})
	}
	for _, r := range []*launchv1.LaunchRequest{{Net: "everything"}, {Limits: map[string]string{"memory": "lots"}}, {Limits: map[string]string{"swap": "1G"}},
		{Pids: -1}, {Memory: "1G", Limits: map[string]string{"memory": "2G"}}, {Net: "none", AllowDomains: []string{"x.org"}}} {
		if _, _, err := s.settle(grant, r, nil); err == nil {
			t.Errorf("settle(%v) accepted", r)
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

// TestClipCommand: List shows at most listCommandBytes of a command, cut
// on a character, with "..." where something was left out.
func TestClipCommand(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes
	for _, c := range []struct {
		in, want []string
	}{
		{[]string{"sh", "-c", "true"}, []string{"sh", "-c", "true"}},
		{[]string{"sh", "-c", long}, []string{"sh", "-c", strings.Repeat("é", 254), "..."}},
		{[]string{long, "x"}, []string{strings.Repeat("é", 256), "..."}},
		{[]string{"x", long}, []string{"x", strings.Repeat("é", 255), "..."}},
	} {
		got := clipCommand(c.in, listCommandBytes)
		if !slices.Equal(got, c.want) {
			t.Errorf("clipCommand(%.20q...) = %.40q, want %.40q", c.in, got, c.want)
		}
		for _, a := range got {
			if !utf8.ValidString(a) {
				t.Errorf("clipCommand(%.20q...) cut a character: %q", c.in, a)
			}
		}
	}
}

// TestTailChunks: an answer carries at most a chunk, and says more is
// there until the reads from its offsets have reached the end.
func TestTailChunks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout")
	data := make([]byte, 100)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// The last 70 bytes, in chunks of 32.
	b, more, next, err := tail(path, 70, 32, false, 0)
	if err != nil || string(b) != string(data[30:62]) || !more || next != 62 {
		t.Fatalf("tail: %q %v %d %v", b, more, next, err)
	}
	var got []byte
	got = append(got, b...)
	for more {
		if b, more, next, err = tail(path, 70, 32, true, next); err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	if string(got) != string(data[30:]) || next != 100 {
		t.Errorf("the chunks read %q up to %d, want %q", got, next, data[30:])
	}
}

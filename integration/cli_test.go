package integration

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// jsonError is what bushost --json prints on stderr for an error.
type jsonError struct {
	Error struct {
		Code, Reason, Message string
		Metadata              map[string]string
	}
}

// parseJSONError requires stderr to be exactly one JSON error object.
func parseJSONError(t *testing.T, stderr string) jsonError {
	t.Helper()
	var e jsonError
	dec := json.NewDecoder(strings.NewReader(stderr))
	if err := dec.Decode(&e); err != nil || e.Error.Code == "" {
		t.Fatalf("stderr is not one JSON error object: %v\n%s", err, stderr)
	}
	if dec.More() {
		t.Fatalf("stderr has more than one JSON object:\n%s", stderr)
	}
	return e
}

// runBin runs a binary with args and returns its output and exit status.
func runBin(t *testing.T, path string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(cleanEnv(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %v: %v", path, args, err)
		}
		code = ee.ExitCode()
	}
	if strings.Contains(errb.String(), raceReport) || strings.Contains(errb.String(), "panic:") {
		t.Errorf("%s %v crashed or raced:\n%s", filepath.Base(path), args, errb.String())
	}
	return out.String(), errb.String(), code
}

// Without a daemon, every kind of call exits 3 without a panic, saying no
// bushostd serves on that home and how to start one: a home that does not
// exist, a home whose sockets are gone (a stopped daemon), and a socket
// nobody listens on (a stale socket of a killed daemon). push-working is
// the call that used to panic on a nil context.
func TestCLIWithoutDaemon(t *testing.T) {
	client := bin(t, "bushost")
	base := baseDir(t)
	repo := filepath.Join(base, "repo")
	os.MkdirAll(repo, 0o755)
	testGit(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a"), []byte("a\n"), 0o644)
	testGit(t, repo, "add", "a")
	testGit(t, repo, "commit", "-q", "-m", "a")
	tok := filepath.Join(base, "token")
	os.WriteFile(tok, []byte("sometoken\n"), 0o600)

	stopped := filepath.Join(base, "stopped")
	os.MkdirAll(stopped, 0o700)
	os.WriteFile(filepath.Join(stopped, "admin.token"), []byte("admin\n"), 0o600)
	stale := filepath.Join(base, "stale")
	os.MkdirAll(stale, 0o700)
	os.WriteFile(filepath.Join(stale, "admin.token"), []byte("admin\n"), 0o600)
	for _, s := range []string{"git.sock", "broker.sock"} {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(stale, s), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	for _, home := range []string{filepath.Join(base, "absent"), stopped, stale} {
		for _, args := range [][]string{
			{"--token-file", tok, "push-working", "--repo", repo},
			{"--token-file", tok, "fetch-main", "--repo", filepath.Join(base, "new")},
			{"task", "add", "--business", "a", "--project", "b", "--task", "c"},
			{"--token-file", tok, "events"},
		} {
			_, errs, code := runBin(t, client, nil, append([]string{"--home", home}, args...)...)
			if code != 3 || !strings.Contains(errs, "no bushostd serves on home "+home) || !strings.Contains(errs, "bushostd serve --home "+home) {
				t.Errorf("%s %v: exit %d, stderr %q", filepath.Base(home), args, code, errs)
			}
			_, errs, code = runBin(t, client, nil, append([]string{"--home", home, "--json"}, args...)...)
			if e := parseJSONError(t, errs); code != 3 || e.Error.Reason != "UNREACHABLE" || e.Error.Code != "Unavailable" {
				t.Errorf("%s %v --json: exit %d, %+v", filepath.Base(home), args, code, e)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(base, "new")); err == nil {
		t.Error("fetch-main left a repository behind with no daemon")
	}
	// $BUSHOST_HOME stands for --home.
	_, errs, code := runBin(t, client, []string{"BUSHOST_HOME=" + stopped}, "--token-file", tok, "events")
	if code != 3 || !strings.Contains(errs, "home "+stopped) {
		t.Errorf("BUSHOST_HOME: exit %d, %s", code, errs)
	}
}

// One refusal of each class, driven through the real daemon: the exit
// status is the class's, --json gives the reason as one object on stderr,
// and the refusal left no event behind.
func TestCLIRefusalClasses(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--max-bundle-bytes", "64K"}})
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "task.close", "event.record")
	reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	as := func(tok string, args ...string) []string { return append([]string{"--token-file", tok}, args...) }
	h.Must(t, as(worker, "fetch-main", "--repo", work)...)
	os.WriteFile(filepath.Join(work, "a"), []byte("a\n"), 0o644)
	testGit(t, work, "add", "a")
	testGit(t, work, "commit", "-q", "-m", "a")
	h.Must(t, as(worker, "push-working", "--repo", work)...)
	// A second history that does not descend from the push: non-fast-forward.
	other := filepath.Join(filepath.Dir(h.Home), "other")
	h.Must(t, as(worker, "fetch-main", "--repo", other)...)
	os.WriteFile(filepath.Join(other, "b"), []byte("b\n"), 0o644)
	testGit(t, other, "add", "b")
	testGit(t, other, "commit", "-q", "-m", "b")
	// A project whose repository lost its objects: the host fails.
	h.AddProject(t, "acme", "broken")
	h.Grant(t, "acme", "broken", "t1", "worker", "git.push.working")
	brokenTok := h.Grant(t, "acme", "broken", "t2", "worker", "git.push.working")
	brokenRepo := h.PoolRepo("acme", "broken")
	if err := os.RemoveAll(filepath.Join(brokenRepo, "objects")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(brokenRepo, "objects"), 0o755)

	big := strings.Repeat("x", 70<<10)
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		exit   int
		reason string
		hint   string
	}{
		{"rule: close without approval", as(worker, "task", "close"), nil, 1, "GATE_NO_APPROVAL", "approve"},
		{"usage", as(reviewer, "review", "verdict", "--request", "x"), nil, 2, "USAGE", "--approve"},
		{"unreachable", append([]string{"--home", filepath.Join(h.Home, "nothing")}, as(worker, "task", "close")...), nil, 3, "UNREACHABLE", "bushostd serve"},
		{"denied: capability", as(reviewer, "push-working", "--repo", work), nil, 4, "CAPABILITY_MISSING", "git.push.working"},
		{"denied: token a path in BUS_TOKEN", []string{"task", "close"}, []string{"BUS_TOKEN=" + worker}, 4, "TOKEN_UNKNOWN", "BUS_TOKEN_FILE"},
		{"conflict: non-fast-forward", as(worker, "push-working", "--repo", other), nil, 5, "NON_FAST_FORWARD", "rebase"},
		{"invalid: name", []string{"task", "add", "--business", "acme", "--project", "web", "--task", "Bad!"}, nil, 6, "NAME_INVALID", "must match"},
		{"invalid: task show of a path", []string{"task", "show", "--task", "../z"}, nil, 6, "NAME_INVALID", "must match"},
		{"invalid: task show of a scope", []string{"task", "show", "--business", "acme", "--project", "web", "--task", "a/b"}, nil, 6, "NAME_INVALID", "must match"},
		{"invalid: task show of a long name", []string{"task", "show", "--business", "acme", "--project", "web", "--task", strings.Repeat("z", 64)}, nil, 6, "NAME_INVALID", "must match"},
		{"invalid: task show of a bad project", as(worker, "task", "show", "--business", "acme", "--project", "../web"), nil, 6, "NAME_INVALID", "must match"},
		{"limit: event data", as(worker, "event", "record", "--type", "note", "--data", `{"x":"`+big+`"}`), nil, 7, "EVENT_DATA_TOO_LARGE", "at most"},
		{"host failed: objects gone", as(brokenTok, "fetch-main", "--repo", filepath.Join(filepath.Dir(h.Home), "broken")), nil, 8, "INTERNAL", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(allEvents(t, h))
			_, errs, code := h.Run(t, tc.env, tc.args...)
			if code != tc.exit || !strings.Contains(errs, tc.hint) {
				t.Fatalf("exit %d, want %d; stderr %q (want %q)", code, tc.exit, errs, tc.hint)
			}
			_, errs, code = h.Run(t, tc.env, append([]string{"--json"}, tc.args...)...)
			e := parseJSONError(t, errs)
			if code != tc.exit || e.Error.Reason != tc.reason || e.Error.Message == "" {
				t.Fatalf("--json: exit %d, %+v; want %d %s", code, e, tc.exit, tc.reason)
			}
			if after := len(allEvents(t, h)); after != before {
				t.Fatalf("the refusal left %d events behind", after-before)
			}
		})
	}
	// The reason's metadata carries the facts: the conflicting commit.
	_, errs, _ := h.Run(t, nil, append([]string{"--json"}, as(worker, "push-working", "--repo", other)...)...)
	if e := parseJSONError(t, errs); e.Error.Metadata["current"] != testGit(t, work, "rev-parse", "HEAD") {
		t.Fatalf("NON_FAST_FORWARD metadata: %+v", e.Error.Metadata)
	}
}

// A worker's repository that fetch-main did not make (a clone of the
// project's root) pushes its committed change; uncommitted changes are
// named on stderr, not silently left out; and an events filter that can
// match nothing is refused with what a task's name looks like.
func TestCLIPushFromAClone(t *testing.T) {
	h := startHost(t)
	root := h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	clone := filepath.Join(filepath.Dir(h.Home), "clone")
	testGit(t, filepath.Dir(h.Home), "clone", "-q", root, clone)
	os.WriteFile(filepath.Join(clone, "a"), []byte("a\n"), 0o644)
	testGit(t, clone, "add", "a")
	testGit(t, clone, "commit", "-q", "-m", "a")
	head := testGit(t, clone, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(clone, "README.md"), []byte("edited, not committed\n"), 0o644)
	os.WriteFile(filepath.Join(clone, "new-file"), []byte("untracked\n"), 0o644)
	out, errs, code := h.Run(t, nil, "--token-file", worker, "push-working", "--repo", clone)
	if code != 0 || strings.TrimSpace(out) != head {
		t.Fatalf("push from a clone: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if !strings.Contains(errs, "2 uncommitted change(s), not in this push") {
		t.Fatalf("uncommitted changes not named: %q", errs)
	}
	// Nothing new committed: nothing to push, said as such (exit 1).
	out, errs, code = h.Run(t, nil, "--token-file", worker, "push-working", "--repo", root)
	if code != 1 || !strings.Contains(errs, "commit your work, then push") {
		t.Fatalf("push of main itself: exit %d %q %q", code, out, errs)
	}
	_, errs, code = h.Run(t, nil, "events", "--task", "acme/web/t3")
	if code != 2 || !strings.Contains(errs, "--business acme --project web --task t3") {
		t.Fatalf("events --task acme/web/t3: exit %d %q", code, errs)
	}
}

// Every binary answers --help and --version with exit 0, every bushost
// command answers --help and `help WORDS`, a typo gets "did you mean"
// and exit 2, and the bash completion script loads.
func TestCLIHelpVersionCompletion(t *testing.T) {
	bins := map[string]string{}
	for _, b := range []string{"bushost", "bushostd", "sandbox", "supervisor"} {
		bins[b] = bin(t, b)
		out, errs, code := runBin(t, bins[b], nil, "--version")
		if code != 0 || !strings.Contains(out, "version") || !strings.Contains(out, "rev ") {
			t.Errorf("%s --version: exit %d %q %q", b, code, out, errs)
		}
		for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}} {
			if out, errs, code := runBin(t, bins[b], nil, args...); code != 0 || out == "" {
				t.Errorf("%s %v: exit %d %q", b, args, code, errs)
			}
		}
	}
	for b, cmds := range map[string][][]string{
		"bushostd":   {{"serve"}},
		"sandbox":    {{"probe"}, {"explain"}, {"run"}},
		"supervisor": {{"run"}, {"init"}, {"ack"}},
		"bushost": {{"push-working"}, {"fetch-main"}, {"fetch-review"}, {"project", "add"}, {"project", "sync"},
			{"task", "add"}, {"task", "close"}, {"grant"}, {"revoke"}, {"review", "request"}, {"review", "verdict"},
			{"event", "record"}, {"events"}, {"log", "verify"}, {"completion"}},
	} {
		for _, words := range cmds {
			out, errs, code := runBin(t, bins[b], nil, append(words, "--help")...)
			if code != 0 || (len(words) == 1 && words[0] != "completion" && words[0] != "probe" && !strings.Contains(out, "--")) {
				t.Errorf("%s %v --help: exit %d\n%s%s", b, words, code, out, errs)
			}
			out2, _, code := runBin(t, bins[b], nil, append([]string{"help"}, words...)...)
			if code != 0 || out2 == "" {
				t.Errorf("%s help %v: exit %d", b, words, code)
			}
		}
	}
	_, errs, code := runBin(t, bins["bushost"], nil, "reviw", "request")
	if code != 2 || !strings.Contains(errs, "Did you mean this?") || !strings.Contains(errs, "review") || strings.Count(errs, "\n") > 6 {
		t.Errorf("bushost reviw request: exit %d\n%s", code, errs)
	}
	_, errs, code = runBin(t, bins["bushost"], nil, "review", "verdict", "--aprove")
	if code != 2 || !strings.Contains(errs, "--approve") {
		t.Errorf("bushost review verdict --aprove: exit %d\n%s", code, errs)
	}
	// A mistyped flag says what was meant in every binary, before the
	// command does anything.
	for _, tc := range []struct {
		bin  string
		args []string
		want string
	}{
		{"bushostd", []string{"serve", "--hom", "x"}, "--home"},
		{"sandbox", []string{"run", "--run-dr", "x"}, "--run-dir"},
		{"sandbox", []string{"serve", "--max-session", "3"}, "--max-sessions"},
		{"supervisor", []string{"run", "--confg", "x"}, "--config"},
		{"supervisor", []string{"init", "--config", "x", "--sed", "y"}, "--seed"},
	} {
		_, errs, code := runBin(t, bins[tc.bin], nil, tc.args...)
		if code != 2 || !strings.Contains(errs, "Did you mean this?\n\t"+tc.want+"\n") {
			t.Errorf("%s %v: exit %d\n%s", tc.bin, tc.args, code, errs)
		}
	}
	for _, b := range []string{"bushostd", "sandbox", "supervisor"} {
		_, errs, code := runBin(t, bins[b], nil, "nosuchcommand")
		if code != 2 || !strings.Contains(errs, `unknown command "nosuchcommand"`) {
			t.Errorf("%s nosuchcommand: exit %d %q", b, code, errs)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, _, code := runBin(t, bins["bushost"], nil, "completion", shell)
		if code != 0 || !strings.Contains(out, "bushost") {
			t.Errorf("completion %s: exit %d", shell, code)
		}
	}
	cmd := exec.Command("bash", "-c", `source <("$BUSHOST" completion bash) && complete -p bushost`)
	cmd.Env = append(cleanEnv(), "BUSHOST="+bins["bushost"])
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "bushost") {
		t.Errorf("bash completion does not load: %v\n%s", err, out)
	}
}

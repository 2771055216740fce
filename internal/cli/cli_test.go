package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
)

func run(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := mainWith(args, strings.NewReader(""), &out, &errb, func(k string) string { return env[k] })
	return out.String(), errb.String(), code
}

// TestGlobalFlagsAnywhere: --home, --token-file and --json work before and
// after the command words, and $BUSHOST_HOME stands for --home. Each case
// points at a home with no daemon, so the message names the home used.
func TestGlobalFlagsAnywhere(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		home string
		json bool
	}{
		{[]string{"--home", dir + "/a", "events", "--json"}, nil, dir + "/a", true},
		{[]string{"events", "--task", "t1", "--home=" + dir + "/b"}, nil, dir + "/b", false},
		{[]string{"--json", "review", "request", "--home", dir + "/c"}, nil, dir + "/c", true},
		{[]string{"review", "request"}, map[string]string{"BUSHOST_HOME": dir + "/d"}, dir + "/d", false},
		{[]string{"--home", dir + "/e", "review", "request"}, map[string]string{"BUSHOST_HOME": dir + "/d"}, dir + "/e", false},
	} {
		_, errs, code := run(t, tc.env, tc.args...)
		if code != errdefs.ExitUnreachable || !strings.Contains(errs, tc.home) {
			t.Errorf("%v: exit %d, stderr %q; want 3 naming %s", tc.args, code, errs, tc.home)
		}
		if tc.json != strings.HasPrefix(errs, `{"error":`) {
			t.Errorf("%v: json %v, stderr %q", tc.args, tc.json, errs)
		}
	}
}

func TestHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}, {"help", "review", "verdict"}, {"review", "verdict", "--help"}, {"review", "--help"}, {"completion", "--help"}} {
		out, errs, code := run(t, nil, args...)
		if code != 0 || errs != "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
		if len(args) > 1 && args[1] == "review" && !strings.Contains(out, "--request") {
			t.Errorf("%v: no --request in\n%s", args, out)
		}
	}
	out, _, _ := run(t, nil, "--help")
	if !strings.Contains(out, "bushost push-working") || !strings.Contains(out, "bushost review verdict") {
		t.Fatalf("--help lists no commands:\n%s", out)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"reviw", "request"}, []string{`unknown command "reviw"`, "Did you mean this?", "review", "Run 'bushost --help' for usage."}},
		{[]string{"review", "requets"}, []string{`unknown command "requets"`, "request"}},
		{[]string{"review"}, []string{"needs a subcommand", "request", "verdict"}},
		{[]string{"review", "verdict", "--bogus"}, []string{"unknown flag: --bogus", "Run 'bushost review verdict --help'"}},
		{[]string{"review", "verdict", "--aprove"}, []string{"Did you mean this?", "--approve"}},
		{[]string{"task", "add", "stray"}, []string{"unknown command \"stray\""}},
		{[]string{"events", "--task", "acme/web/t3"}, []string{"like t3", "--business acme --project web --task t3"}},
		{[]string{"review", "verdict", "--request", "r1"}, []string{"exactly one of --approve and --reject"}},
		{nil, []string{"give a command"}},
	} {
		out, errs, code := run(t, nil, tc.args...)
		if code != errdefs.ExitUsage || out != "" {
			t.Errorf("%v: exit %d, stdout %q", tc.args, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: stderr %q lacks %q", tc.args, errs, w)
			}
		}
		if strings.Count(errs, "\n") > 6 {
			t.Errorf("%v: a usage error prints a hint, not the whole help:\n%s", tc.args, errs)
		}
	}
	// With --json a usage error is one JSON object too.
	_, errs, code := run(t, nil, "--json", "reviw")
	var obj struct {
		Error struct{ Code, Reason, Message string }
	}
	if code != 2 || json.Unmarshal([]byte(errs), &obj) != nil || obj.Error.Reason != "USAGE" || obj.Error.Code != "InvalidArgument" {
		t.Fatalf("--json usage error: exit %d %q", code, errs)
	}
}

func TestVersion(t *testing.T) {
	out, _, code := run(t, nil, "--version")
	if code != 0 || !strings.Contains(out, "rev ") {
		t.Fatalf("--version: exit %d %q", code, out)
	}
}

func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	f := filepath.Join(dir, "grant")
	os.WriteFile(f, []byte(" granted \n"), 0o600)
	f2 := filepath.Join(dir, "grant2")
	os.WriteFile(f2, []byte("fromfileenv\n"), 0o600)
	env := map[string]string{}
	e := &Env{Home: dir, Getenv: func(k string) string { return env[k] }}
	if tok, err := e.token(); err != nil || tok != "admin" {
		t.Fatalf("admin fallback: %q %v", tok, err)
	}
	env["BUS_TOKEN"] = "fromenv"
	if tok, _ := e.token(); tok != "fromenv" {
		t.Fatalf("BUS_TOKEN: %q", tok)
	}
	env["BUS_TOKEN_FILE"] = f2
	if tok, _ := e.token(); tok != "fromfileenv" {
		t.Fatalf("BUS_TOKEN_FILE before BUS_TOKEN: %q", tok)
	}
	e.TokenFile = f
	if tok, _ := e.token(); tok != "granted" {
		t.Fatalf("--token-file: %q", tok)
	}
	e.TokenFile = filepath.Join(dir, "missing")
	if _, err := e.token(); errdefs.ReasonOf(err) != errdefs.TokenMissing {
		t.Fatalf("missing token file: %v", err)
	}
	// No token anywhere, in a directory no daemon ever served: it is no
	// bus host's home, and the message says how to start one (or where a
	// token goes).
	e2 := &Env{Home: dir, Getenv: func(string) string { return "" }}
	os.Remove(filepath.Join(dir, "admin.token"))
	if _, err := e2.token(); errdefs.ReasonOf(err) != errdefs.Unreachable || !strings.Contains(err.Error(), "'bushostd serve --home "+dir+"'") ||
		!strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("no token, no daemon: %v", err)
	}
	// No token in a home a daemon serves (its socket is there): the
	// message says where to put one.
	l, err := net.Listen("unix", filepath.Join(dir, "git.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := e2.token(); err == nil || !strings.Contains(err.Error(), "--token-file") || errdefs.ExitCode(err) != errdefs.ExitDenied {
		t.Fatalf("no token: %v", err)
	}
}

// TestNoDaemonIsAClearError: a home with no daemon, or a socket nobody
// listens on (a daemon that died), exits 3 and says how to start one.
func TestNoDaemonIsAClearError(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	_, errs, code := run(t, nil, "--home", dir, "task", "add", "--business", "a", "--project", "b", "--task", "c")
	if code != errdefs.ExitUnreachable || !strings.Contains(errs, "no bushostd serves on home "+dir) || !strings.Contains(errs, "bushostd serve --home "+dir) {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, errs, code = run(t, nil, "--home", dir, "--json", "push-working", "--repo", dir)
	var obj struct {
		Error struct {
			Code, Reason, Message string
			Metadata              map[string]string
		}
	}
	if code != errdefs.ExitUnreachable || json.Unmarshal([]byte(errs), &obj) != nil || obj.Error.Reason != "UNREACHABLE" || obj.Error.Metadata["home"] != dir {
		t.Fatalf("--json: exit %d: %s", code, errs)
	}
	// The launcher's socket, missing or stale, names the launcher and how
	// to start it, not bushostd.
	for _, stale := range []bool{false, true} {
		if stale {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "launch.sock"), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}
		_, errs, code = run(t, nil, "--home", dir, "session", "list")
		if code != errdefs.ExitUnreachable || !strings.Contains(errs, "no launcher (sandbox serve) serves on home "+dir) ||
			!strings.Contains(errs, "'sandbox serve --home "+dir+"'") || strings.Contains(errs, "bushostd serve") {
			t.Fatalf("session list, launch.sock stale=%v: exit %d: %s", stale, code, errs)
		}
	}
}

// --help lists each command once, with its usage line and a short text of
// one line; a group's help lists its subcommands by those short texts.
func TestHelpListsEachCommandOnce(t *testing.T) {
	out, _, code := run(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for words, c := range commands {
		if c.short == "" || strings.ContainsAny(c.short, "\n") || len(c.short) > 60 {
			t.Errorf("%s: short text %q: want one line of at most 60 characters", words, c.short)
		}
		line := "  bushost " + c.usage + "\n      " + c.short + "\n"
		if n := strings.Count(out, line); n != 1 {
			t.Errorf("%s: listed %d times in --help", words, n)
		}
		if strings.Contains(out, c.help) && c.help != c.short {
			t.Errorf("%s: its whole help is in the command list", words)
		}
	}
	if strings.Contains(out, "Available Commands") {
		t.Errorf("--help lists the commands twice:\n%s", out)
	}
	out, _, _ = run(t, nil, "task", "--help")
	if !strings.Contains(out, "  show ") || !strings.Contains(out, commands["task show"].short) {
		t.Errorf("task --help lacks its subcommands:\n%s", out)
	}
}

// Completion offers the values of --state, --cap (each item of the list)
// and --role.
func TestCompletionValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		not  string
	}{
		{[]string{"task", "list", "--state", ""}, []string{"open", "closed", "landed"}, ""},
		{[]string{"grant", "--cap", ""}, []string{"git.push.working", "task.close", "session.launch"}, ""},
		{[]string{"grant", "--cap", "git.push.working,"}, []string{"git.push.working,review.request", "git.push.working,task.land"}, "git.push.working,git.push.working"},
		{[]string{"grant", "--role", ""}, []string{"worker", "reviewer", "lead"}, ""},
		{[]string{"session", "launch", "--caps", ""}, []string{"review.request"}, ""},
	} {
		out, _, code := run(t, nil, append([]string{"__complete"}, tc.args...)...)
		if code != 0 {
			t.Errorf("%v: exit %d", tc.args, code)
		}
		lines := strings.Split(out, "\n")
		for _, w := range tc.want {
			if !slices.Contains(lines, w) {
				t.Errorf("%v: %q not offered:\n%s", tc.args, w, out)
			}
		}
		if tc.not != "" && slices.Contains(lines, tc.not) {
			t.Errorf("%v: offered %q again", tc.args, tc.not)
		}
	}
}

// classify reports the bus host's answer as it sent it, with what the
// command wrapped around it; the client's own refusal keeps its message,
// and any other failure of its own is LOCAL_FAILED.
func TestClassify(t *testing.T) {
	e := &Env{Home: t.TempDir(), Getenv: func(string) string { return "" }}
	wire := grpcerr.FromStatus(grpcerr.ToStatus(errdefs.NotFound(errdefs.TaskNotFound, "no task t9").With("task", "t9")))
	if x := e.classify(fmt.Errorf("fetch main: %w", wire)); x.Kind != errdefs.KindNotFound || x.Reason != errdefs.TaskNotFound ||
		x.Message != "fetch main: no task t9" || x.Metadata["task"] != "t9" || wire.Message != "no task t9" {
		t.Errorf("wrapped answer: %+v", x)
	}
	own := errdefs.FailedPrecondition(errdefs.NothingToPush, "HEAD is main")
	if x := e.classify(fmt.Errorf("push: %w", own)); x != own {
		t.Errorf("own refusal: %+v", x)
	}
	if x := e.classify(errors.New("disk full")); x.Reason != errdefs.LocalFailed || x.Message != "disk full" || errdefs.ExitCode(x) != errdefs.ExitRefused {
		t.Errorf("local failure: %+v", x)
	}
}

// TestGrantOutLeftAloneWhenNothingIssued: grant --out makes its file before
// the call; when no grant is issued (here no bus host answers) the file is
// removed again, so that the same command succeeds once one does, and a
// file that was already there is never touched.
func TestGrantOutLeftAloneWhenNothingIssued(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	out := filepath.Join(dir, "worker.token")
	args := []string{"--home", dir, "grant", "--business", "a", "--project", "b", "--task", "c", "--role", "worker", "--cap", "git.push.working", "--out", out}
	_, errs, code := run(t, nil, args...)
	if code != errdefs.ExitUnreachable {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if _, err := os.Lstat(out); !os.IsNotExist(err) {
		t.Fatalf("a grant that was never issued left %s behind (%v)", out, err)
	}
	// Someone else's file at --out is refused and kept as it was.
	os.WriteFile(out, []byte("theirs\n"), 0o600)
	_, errs, code = run(t, nil, args...)
	if b, _ := os.ReadFile(out); code != errdefs.ExitUsage || string(b) != "theirs\n" || !strings.Contains(errs, "never overwritten") {
		t.Fatalf("exit %d, file %q: %s", code, b, errs)
	}
}

// TestPushWorkingRepoMissing: a --repo that is not there, or not a
// directory, is a usage error that names it, not git's "fork/exec" of a
// process that could not start in it; nothing is sent.
func TestPushWorkingRepoMissing(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "worker.token")
	os.WriteFile(tok, []byte("worker\n"), 0o600)
	// A bus host's socket that takes connections and is never asked.
	l, err := net.Listen("unix", filepath.Join(dir, "git.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, []byte("x\n"), 0o644)
	for repo, want := range map[string]string{
		filepath.Join(dir, "absent"): "no such directory",
		file:                         "not a directory",
	} {
		_, errs, code := run(t, nil, "--home", dir, "--token-file", tok, "push-working", "--repo", repo)
		if code != errdefs.ExitUsage || !strings.Contains(errs, "--repo "+repo+": "+want) || strings.Contains(errs, "fork/exec") {
			t.Fatalf("--repo %s: exit %d: %s", repo, code, errs)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "absent")); !os.IsNotExist(err) {
		t.Fatalf("the absent --repo was made: %v", err)
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGlobalFlagsAnywhere(t *testing.T) {
	cases := []struct {
		args      []string
		home, tok string
		json      bool
		rest      string
	}{
		{[]string{"--home", "/h", "events", "--json"}, "/h", "", true, "events"},
		{[]string{"events", "--task", "t1", "--home=/x", "--token-file", "/t"}, "/x", "/t", false, "events --task t1"},
		{[]string{"-json", "review", "verdict", "--request", "r1", "--approve"}, "./bus-host", "", true, "review verdict --request r1 --approve"},
		{[]string{"event", "record", "--", "--home", "kept"}, "./bus-host", "", false, "event record -- --home kept"},
	}
	for _, c := range cases {
		e := &Env{Home: "./bus-host"}
		rest, err := e.globalFlags(c.args)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if e.Home != c.home || e.TokenFile != c.tok || e.JSON != c.json || strings.Join(rest, " ") != c.rest {
			t.Errorf("%v: home %q token %q json %v rest %q", c.args, e.Home, e.TokenFile, e.JSON, rest)
		}
	}
	if _, err := (&Env{}).globalFlags([]string{"events", "--home"}); err == nil {
		t.Error("--home without a value accepted")
	}
}

func TestLookupLongestCommand(t *testing.T) {
	for _, words := range []string{"review request", "review verdict", "task close", "task add", "push-working", "project add", "log verify"} {
		c, rest := lookup(append(strings.Fields(words), "--x"))
		if c == nil || c.words != words || len(rest) != 1 {
			t.Errorf("lookup(%q) = %v, %v", words, c, rest)
		}
	}
	if c, _ := lookup([]string{"review"}); c != nil {
		t.Errorf("'review' alone matched %q", c.words)
	}
}

func run(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := mainWith(args, strings.NewReader(""), &out, &errb, func(k string) string { return env[k] })
	return out.String(), errb.String(), code
}

func TestExitCodesAndHelp(t *testing.T) {
	out, _, code := run(t, nil, "--help")
	if code != 0 || !strings.Contains(out, "bushost push-working") || !strings.Contains(out, "bushost review verdict") {
		t.Fatalf("--help: exit %d\n%s", code, out)
	}
	if _, errs, code := run(t, nil, "frobnicate"); code != 2 || !strings.Contains(errs, `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: exit %d %s", code, errs)
	}
	out, _, code = run(t, nil, "review", "verdict", "--help")
	if code != 0 || !strings.Contains(out, "-request") {
		t.Fatalf("review verdict --help: exit %d\n%s", code, out)
	}
	if _, errs, code := run(t, nil, "review", "verdict", "--bogus"); code != 2 || !strings.Contains(errs, "usage: bushost review verdict") {
		t.Fatalf("bad flag: exit %d %s", code, errs)
	}
}

func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	f := filepath.Join(dir, "grant")
	os.WriteFile(f, []byte(" granted \n"), 0o600)
	env := map[string]string{}
	e := &Env{Home: dir, Getenv: func(k string) string { return env[k] }}
	if tok, err := e.token(); err != nil || tok != "admin" {
		t.Fatalf("admin fallback: %q %v", tok, err)
	}
	env["BUS_TOKEN"] = "fromenv"
	if tok, _ := e.token(); tok != "fromenv" {
		t.Fatalf("BUS_TOKEN: %q", tok)
	}
	e.TokenFile = f
	if tok, _ := e.token(); tok != "granted" {
		t.Fatalf("--token-file: %q", tok)
	}
	e.TokenFile = filepath.Join(dir, "missing")
	if _, err := e.token(); err == nil {
		t.Fatal("missing token file accepted")
	}
	// No token anywhere: the message says where to put one.
	e2 := &Env{Home: filepath.Join(dir, "nohome"), Getenv: func(string) string { return "" }}
	if _, err := e2.token(); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("no token: %v", err)
	}
}

func TestNoDaemonIsAClearError(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	_, errs, code := run(t, nil, "--home", dir, "task", "add", "--business", "a", "--project", "b", "--task", "c")
	if code != 1 || !strings.Contains(errs, "is bushostd serving") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

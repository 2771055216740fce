package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRegenerateAgents(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	rules := []byte("# Rules\n\nDo not touch infra.\n")
	first := string(RegenerateAgents(rules, nil, false, now))
	if !strings.HasPrefix(first, "# Rules\n\nDo not touch infra.\n\n"+AgentsSentinel+"\n") || !strings.HasSuffix(first, agentsTemplate) {
		t.Fatalf("first boot:\n%s", first)
	}

	// The agent edits both halves; only its notes survive the next boot.
	edited := strings.Replace(first, "Do not touch infra.", "Touch anything.", 1) + "\n- the cache lives in src/.cache\n"
	second := string(RegenerateAgents([]byte("# Rules v2\n"), []byte(edited), true, now))
	want := "# Rules v2\n\n" + AgentsSentinel + "\n" + agentsTemplate + "\n- the cache lives in src/.cache\n"
	if second != want {
		t.Fatalf("second boot:\n%q\nwant\n%q", second, want)
	}
	if third := string(RegenerateAgents([]byte("# Rules v2\n"), []byte(second), true, now)); third != second {
		t.Errorf("not stable across boots:\n%s", third)
	}

	// Without the sentinel, a rules part cannot be told from the notes:
	// a forged one is never salvaged into the file, and the old content
	// is kept only if it starts with the rules unchanged.
	forged := "# Rules\n\nTouch anything, push to main.\nmy precious notes\n"
	regen := string(RegenerateAgents(rules, []byte(forged), true, now))
	head, notes, ok := strings.Cut(regen, AgentsSentinel+"\n")
	if !ok || !strings.Contains(head, "Do not touch infra.") || strings.Contains(regen, "Touch anything") || !strings.HasPrefix(notes, agentsTemplate) ||
		!strings.Contains(notes, "no sentinel line at the boot of 2026-01-02 03:04 UTC") {
		t.Errorf("a forged rules part without the sentinel:\n%s", regen)
	}
	if file, unkept := regenerateAgents(rules, []byte(forged), true, now); string(file) != regen || string(unkept) != forged || !strings.Contains(regen, UnkeptAgents) {
		t.Errorf("the content not kept in AGENTS.md: %q, want it whole for %s, named in the notes", unkept, UnkeptAgents)
	}
	if _, unkept := regenerateAgents(rules, []byte(regen), true, now); unkept != nil {
		t.Errorf("a file with its sentinel left content aside: %q", unkept)
	}
	lost := "# Rules\n\nDo not touch infra.\n\nmy precious notes\n"
	if got := string(RegenerateAgents(rules, []byte(lost), true, now)); got != "# Rules\n\nDo not touch infra.\n\n"+AgentsSentinel+"\nmy precious notes\n" {
		t.Errorf("the sentinel alone lost:\n%s", got)
	}

	// A sentinel smuggled into the rules cannot move the split.
	sneaky := string(RegenerateAgents([]byte("rules\n"+AgentsSentinel+"\nmore rules\n"), nil, false, now))
	if strings.Count(sneaky, AgentsSentinel) != 1 {
		t.Errorf("sentinel in rules kept:\n%s", sneaky)
	}
}

// TestRulesGuard: the guard writes back a rules part the agent changed,
// keeping the notes (those below the sentinel, or the last seen when the
// sentinel is gone), once, and leaves alone a file that is fine or one it
// was never given.
// guardedWorkspace is a workspace with infra/AGENTS.md, the AGENTS.md
// init writes from it (and a note), and a guard on it: the workspace,
// AGENTS.md's path, its content, the guard.
func guardedWorkspace(t *testing.T) (string, string, string, *rulesGuard) {
	ws := t.TempDir()
	rules := "# Rules\n\nDo not touch infra.\n"
	if err := os.MkdirAll(filepath.Join(ws, "infra"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "infra", "AGENTS.md"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	agents := filepath.Join(ws, "AGENTS.md")
	good := string(RegenerateAgents([]byte(rules), nil, false, time.Now())) + "- my note\n"
	if err := os.WriteFile(agents, []byte(good), 0o664); err != nil {
		t.Fatal(err)
	}
	g, err := newRulesGuard(ws, "/git")
	if err != nil || g == nil {
		t.Fatalf("newRulesGuard: %v %v", g, err)
	}
	t.Cleanup(g.close)
	return ws, agents, good, g
}

func TestRulesGuard(t *testing.T) {
	ws, agents, good, g := guardedWorkspace(t)
	// A change is acted on once it holds still for a look.
	check := func() (string, error) {
		if why, err := g.check(); why != "" || err != nil {
			return why, err
		}
		return g.check()
	}
	read := func() string {
		b, err := os.ReadFile(agents)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if why, err := check(); why != "" || err != nil {
		t.Fatalf("an unchanged file: %q %v", why, err)
	}
	// The agent's notes change: nothing to do.
	if err := os.WriteFile(agents, []byte(good+"- another note\n"), 0o664); err != nil {
		t.Fatal(err)
	}
	if why, err := check(); why != "" || err != nil || read() != good+"- another note\n" {
		t.Fatalf("an edit of the notes: %q %v\n%s", why, err, read())
	}
	// The rules part is rewritten: back, notes kept, once.
	if err := os.WriteFile(agents, []byte(strings.Replace(read(), "Do not touch infra.", "Push to main.", 1)), 0o664); err != nil {
		t.Fatal(err)
	}
	if why, err := check(); !strings.Contains(why, "not infra/AGENTS.md's rules") || err != nil || read() != good+"- another note\n" {
		t.Fatalf("a forged rules part: %q %v\n%s", why, err, read())
	}
	if why, err := check(); why != "" || err != nil {
		t.Fatalf("its own write seen as a change: %q %v", why, err)
	}
	// The sentinel is gone: the notes last seen come back.
	if err := os.WriteFile(agents, []byte("# My rules\n\nanything\n"), 0o664); err != nil {
		t.Fatal(err)
	}
	if why, err := check(); !strings.Contains(why, "sentinel line is gone") || err != nil || read() != good+"- another note\n" {
		t.Fatalf("no sentinel: %q %v\n%s", why, err, read())
	}

	// A workspace whose AGENTS.md is not one init wrote is not guarded.
	if err := os.WriteFile(agents, []byte("# This project's own AGENTS.md\n"), 0o664); err != nil {
		t.Fatal(err)
	}
	if g, err := newRulesGuard(ws, "/git"); g != nil || err != nil {
		t.Errorf("guarding a file init did not write: %v %v", g, err)
	}
}

// TestRulesGuardNeverQuiet: the agent forges the rules part and keeps
// rewriting the file, so that no look ever finds it holding still (a
// loop of `printf forged > AGENTS.md`). The guard must not wait for a
// quiet that never comes: the rules are back within two looks (one
// debounce), the notes kept.
func TestRulesGuardNeverQuiet(t *testing.T) {
	_, agents, good, g := guardedWorkspace(t)
	forged := strings.Replace(good, "Do not touch infra.", "Push to main.", 1)
	for look := 1; look <= 2; look++ {
		// Between two looks the agent has written the file again: a
		// size of its own each time, so that no look finds it still.
		if err := os.WriteFile(agents, []byte(forged+strings.Repeat(" ", look)), 0o664); err != nil {
			t.Fatal(err)
		}
		why, err := g.check()
		if err != nil {
			t.Fatal(err)
		}
		if why != "" {
			b, _ := os.ReadFile(agents)
			if string(b) != good+strings.Repeat(" ", look) {
				t.Fatalf("restored at look %d (%s), but the file is:\n%s", look, why, b)
			}
			return
		}
	}
	b, _ := os.ReadFile(agents)
	t.Fatalf("a file rewritten before every look is never restored: after two looks it is:\n%s", b)
}

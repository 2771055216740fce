package supervisor

import (
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

	// Without the sentinel, nothing is lost: the old file goes below it.
	old := "my precious notes\nline two\n"
	salvaged := string(RegenerateAgents(rules, []byte(old), true, now))
	head, notes, ok := strings.Cut(salvaged, AgentsSentinel+"\n")
	if !ok || !strings.Contains(head, "Do not touch infra.") || !strings.HasSuffix(notes, old) || !strings.Contains(notes, "Salvaged 2026-01-02 03:04 UTC") {
		t.Errorf("salvage:\n%s", salvaged)
	}

	// A sentinel smuggled into the rules cannot move the split.
	sneaky := string(RegenerateAgents([]byte("rules\n"+AgentsSentinel+"\nmore rules\n"), nil, false, now))
	if strings.Count(sneaky, AgentsSentinel) != 1 {
		t.Errorf("sentinel in rules kept:\n%s", sneaky)
	}
}

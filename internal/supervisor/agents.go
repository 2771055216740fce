package supervisor

import (
	"bytes"
	"fmt"
	"strings"
	"time"
)

// AgentsSentinel separates AGENTS.md's rules, rewritten at every boot from
// infra/AGENTS.md, from the agent's own notes below it, which are kept.
const AgentsSentinel = "<!-- bushost: everything above this line is rewritten from infra/AGENTS.md at every boot; keep your own notes below it -->"

// defaultRules stand in for a missing infra/AGENTS.md; {{git_dir}} becomes
// the supervisor's git dir.
const defaultRules = `# Rules of this workspace

- Edit only the watched source trees. Every edit you make there is committed
  in your name after a short pause, and the services that use it restart.
- If an edit leaves a service crash-looping, the supervisor reverts the tree
  to the last commit that was healthy and records that as its own commit.
  Read its history (yours to read, not to write) with
  ` + "`git --git-dir={{git_dir}} log`" + `; fix forward from there.
- infra/ and the supervisor's files are not yours to change.
`

// agentsTemplate starts the agent's notes on first boot.
const agentsTemplate = `# Notes

Write what you learn about this workspace here: how the services are built,
what broke and why, what to try next. This part survives every reboot.
`

// maxAgentsBytes bounds how much of an existing AGENTS.md init reads.
const maxAgentsBytes = 1 << 20

// RegenerateAgents returns the new AGENTS.md: rules, the sentinel line, then
// the agent's notes. The notes are what followed the sentinel in old; without
// a sentinel, all of old is kept below a salvage heading; with no old file,
// the template.
func RegenerateAgents(rules, old []byte, oldExists bool, now time.Time) []byte {
	var kept strings.Builder
	// A sentinel inside the rules would split the next boot's file there.
	for _, line := range strings.SplitAfter(string(rules), "\n") {
		if strings.TrimSpace(line) != AgentsSentinel {
			kept.WriteString(line)
		}
	}
	var b bytes.Buffer
	b.WriteString(strings.TrimRight(kept.String(), "\n \t"))
	b.WriteString("\n\n" + AgentsSentinel + "\n")
	notes := agentsTemplate
	if oldExists {
		if n, ok := notesBelowSentinel(old); ok {
			notes = n
		} else if len(bytes.TrimSpace(old)) > 0 {
			notes = fmt.Sprintf("## Salvaged %s: AGENTS.md had no sentinel line; its earlier content follows unchanged\n\n%s",
				now.UTC().Format("2006-01-02 15:04 UTC"), old)
		}
	}
	b.WriteString(notes)
	if !strings.HasSuffix(notes, "\n") {
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// notesBelowSentinel returns what follows the first sentinel line of old.
func notesBelowSentinel(old []byte) (string, bool) {
	s := string(old)
	pos := 0
	for pos <= len(s) {
		end := strings.IndexByte(s[pos:], '\n')
		line := s[pos:]
		next := len(s) + 1
		if end >= 0 {
			line = s[pos : pos+end]
			next = pos + end + 1
		}
		if strings.TrimSpace(line) == AgentsSentinel {
			if next > len(s) {
				return "", true
			}
			return s[next:], true
		}
		pos = next
	}
	return "", false
}

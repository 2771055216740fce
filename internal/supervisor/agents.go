package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
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

// hostRules reads the rules from infra/AGENTS.md under the workspace
// wsfd, following no link (readFileBeneath), or, without one, gives
// defaultRules.
func hostRules(wsfd int, gitDir string) ([]byte, error) {
	rules, exists, err := readFileBeneath(wsfd, "infra/AGENTS.md", maxAgentsBytes)
	if err != nil {
		return nil, fmt.Errorf("infra/AGENTS.md: %w", err)
	}
	if !exists {
		rules = []byte(strings.ReplaceAll(defaultRules, "{{git_dir}}", gitDir))
	}
	return rules, nil
}

// RegenerateAgents returns the new AGENTS.md: rules, the sentinel line, then
// the agent's notes. The notes are what followed the sentinel in old. A
// rules part the agent changed is never kept in the file: without a
// sentinel, the file's rules part cannot be told from its notes, so old is
// kept only below its rules part if that is the rules unchanged (the
// sentinel alone was lost); else the notes start afresh from the template,
// saying where old went (UnkeptAgents). With no old file, the template.
func RegenerateAgents(rules, old []byte, oldExists bool, now time.Time) []byte {
	file, _ := regenerateAgents(rules, old, oldExists, now)
	return file
}

// UnkeptAgents is the file, beside AGENTS.md, that holds an AGENTS.md init
// could not keep (no sentinel, and not the rules unchanged): the agent's
// words are not lost, and they are not rules.
const UnkeptAgents = "AGENTS.unkept.md"

// regenerateAgents is RegenerateAgents, and the old content it did not
// keep (nil when it kept it all).
func regenerateAgents(rules, old []byte, oldExists bool, now time.Time) (file, unkept []byte) {
	head := rulesPart(rules)
	notes := agentsTemplate
	if oldExists {
		if n, ok := notesBelowSentinel(old); ok {
			notes = n
		} else if rest, ok := bytes.CutPrefix(old, bytes.TrimSuffix(head, []byte(AgentsSentinel+"\n"))); ok {
			notes = string(rest)
		} else if len(bytes.TrimSpace(old)) > 0 {
			notes = fmt.Sprintf("%s\n_AGENTS.md had no sentinel line at the boot of %s, and its first part was not these rules: it was moved to %s, not kept here, since it could carry rules that are not the host's._\n",
				agentsTemplate, now.UTC().Format("2006-01-02 15:04 UTC"), UnkeptAgents)
			unkept = old
		}
	}
	b := bytes.NewBuffer(head)
	b.WriteString(notes)
	if notes != "" && !strings.HasSuffix(notes, "\n") {
		b.WriteByte('\n')
	}
	return b.Bytes(), unkept
}

// rulesPart is the part of AGENTS.md above the agent's notes: the rules,
// a blank line, the sentinel line.
func rulesPart(rules []byte) []byte {
	var kept strings.Builder
	// A sentinel inside the rules would split the next boot's file there.
	for _, line := range strings.SplitAfter(string(rules), "\n") {
		if strings.TrimSpace(line) != AgentsSentinel {
			kept.WriteString(line)
		}
	}
	return []byte(strings.TrimRight(kept.String(), "\n \t") + "\n\n" + AgentsSentinel + "\n")
}

// notesBelowSentinel returns what follows the first sentinel line of old.
func notesBelowSentinel(old []byte) (string, bool) {
	s, next := string(old), 0
	for line := range strings.Lines(s) {
		next += len(line)
		if strings.TrimSpace(line) == AgentsSentinel {
			return s[next:], true
		}
	}
	return "", false
}

// The notifications of the rules part of AGENTS.md: the agent changed it
// and the supervisor wrote it back, or could not (the agent made the file
// one the supervisor cannot write: init puts the rules back at the next
// boot).
const (
	EventRulesRestored      = "rules_restored"
	EventRulesRestoreFailed = "rules_restore_failed"
)

// rulesGuard keeps the rules part of AGENTS.md the host's while the
// supervisor runs: the agent may edit the file (its notes), and a change
// above the sentinel is undone within a debounce, the agent's notes
// kept. It acts only on a file that carried the host's rules when the
// supervisor started (init wrote it), never on a workspace's own
// AGENTS.md of some other kind.
type rulesGuard struct {
	wsfd int
	// head is the rules part the file must start with.
	head []byte
	// seen is the file as last checked; notes its agent's part then,
	// what a file that lost its sentinel gets back. quiet is the file as
	// the last look found it: a change is acted on once it holds still
	// for a look, so that a write in progress (a shell's `>` truncates,
	// then writes) is not taken for the file; moving counts the looks in
	// a row that found it changed again, and at the second it is acted
	// on all the same (a file rewritten without end never holds still).
	seen, quiet unix.Stat_t
	moving      int
	notes       string
	// failed is the last error logged, so that one that persists is
	// logged once.
	failed string
}

// rulesEvery is how often the guard looks at AGENTS.md: twice a
// debounce, so a change (seen at one look, still there at the next) is
// undone within one.
func rulesEvery(debounce time.Duration) time.Duration {
	return max(debounce/2, 10*time.Millisecond)
}

// newRulesGuard reads the rules as init does (infra/AGENTS.md, else the
// default) and AGENTS.md as it is now; nil if that file does not start
// with them.
func newRulesGuard(workspace, gitDir string) (*rulesGuard, error) {
	fd, err := unix.Open(workspace, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	rules, err := hostRules(fd, gitDir)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	g := &rulesGuard{wsfd: fd, head: rulesPart(rules)}
	data, f, err := g.open()
	if f != nil {
		f.Close()
	}
	if err != nil || !bytes.HasPrefix(data, g.head) {
		unix.Close(fd)
		return nil, err
	}
	g.notes = string(data[len(g.head):])
	return g, nil
}

func (g *rulesGuard) close() { unix.Close(g.wsfd) }

// open opens AGENTS.md beneath the workspace for writing, following no
// link, a single-link regular file, and reads it (at most
// maxAgentsBytes); nil for a file that is not there.
func (g *rulesGuard) open() ([]byte, *os.File, error) {
	fd, err := safepath.OpenBeneath(g.wsfd, "AGENTS.md", unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open AGENTS.md: %w", err)
	}
	f := os.NewFile(uintptr(fd), "AGENTS.md")
	if err := unix.Fstat(fd, &g.seen); err != nil {
		f.Close()
		return nil, nil, err
	}
	if g.seen.Mode&unix.S_IFMT != unix.S_IFREG || g.seen.Nlink != 1 {
		f.Close()
		return nil, nil, errors.New("AGENTS.md is not a single-link regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAgentsBytes))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return data, f, nil
}

// check looks at AGENTS.md if it changed since the last look, and writes
// the rules part back if the agent changed it: the notes below the
// sentinel kept, or, with no sentinel left, the notes as last seen. It
// reports whether it did, and why.
func (g *rulesGuard) check() (string, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(g.wsfd, "AGENTS.md", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
		return "", err
	}
	if sameFile(st, g.seen) {
		g.moving = 0
		return "", nil
	}
	if !sameFile(st, g.quiet) {
		g.quiet = st
		if g.moving++; g.moving < 2 {
			return "", nil
		}
	}
	g.moving = 0
	data, f, err := g.open()
	if f == nil || err != nil {
		return "", err
	}
	defer f.Close()
	if bytes.HasPrefix(data, g.head) {
		g.notes = string(data[len(g.head):])
		return "", nil
	}
	why := "the part above the sentinel line is not infra/AGENTS.md's rules"
	if n, ok := notesBelowSentinel(data); ok {
		g.notes = n
	} else {
		why = "the sentinel line is gone: the notes are put back as last seen"
	}
	out := append(slices.Clone(g.head), g.notes...)
	if _, err = f.WriteAt(out, 0); err == nil {
		err = f.Truncate(int64(len(out)))
	}
	if err != nil {
		return "", fmt.Errorf("write AGENTS.md back: %w", err)
	}
	// What this write made is what the next look compares with.
	if err := unix.Fstat(int(f.Fd()), &g.seen); err != nil {
		return "", err
	}
	return why, nil
}

// sameFile reports whether two looks at a file found it unchanged.
func sameFile(a, b unix.Stat_t) bool {
	return a.Ino == b.Ino && a.Size == b.Size && a.Mtim == b.Mtim && a.Ctim == b.Ctim
}

// guardRules runs the guard on the loop: a restore is logged and
// notified (rules_restored).
func (s *Supervisor) guardRules() {
	if s.rules == nil {
		return
	}
	why, err := s.rules.check()
	if err != nil {
		if err.Error() != s.rules.failed {
			s.rules.failed = err.Error()
			s.fail("keep the rules part of AGENTS.md", err)
			s.notify.send(Notification{Event: EventRulesRestoreFailed, Workspace: s.cfg.Workspace, Reason: "AGENTS.md could not be checked or written back", Error: err.Error(), Head: s.head, Good: s.good})
		}
		return
	}
	s.rules.failed = ""
	if why == "" {
		return
	}
	s.log.Warn("AGENTS.md's rules part was changed: written back from infra/AGENTS.md, the agent's notes kept", "why", why)
	s.notify.send(Notification{Event: EventRulesRestored, Workspace: s.cfg.Workspace, Reason: why, Head: s.head, Good: s.good})
}

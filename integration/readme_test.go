package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeLine is one command of the README's usage blocks and the role
// whose paragraph ("As the host", "As the worker", ...) it stands under.
type readmeLine struct {
	role string
	cmd  string
}

var (
	readmeComment = regexp.MustCompile(`\s+#.*$`)
	readmeRole    = regexp.MustCompile(`^As the (host|worker|reviewer|lead)\b`)
	readmeFlag    = regexp.MustCompile(`--[a-z][a-z-]*`)
	readmeSpan    = regexp.MustCompile("`(bushost [a-z -]+?)(?: --[a-z-]+)*`")
)

// readmeUsage reads README.md's indented command lines (continuations
// joined, comments dropped) and the bushost commands its prose names.
func readmeUsage(t *testing.T) (lines []readmeLine, prose []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	role := ""
	var cont string
	for _, l := range strings.Split(string(b), "\n") {
		if m := readmeRole.FindStringSubmatch(l); m != nil {
			role = m[1]
		}
		if !strings.HasPrefix(l, "    ") {
			for _, m := range readmeSpan.FindAllStringSubmatch(l, -1) {
				prose = append(prose, m[1])
			}
			continue
		}
		l = strings.TrimSpace(readmeComment.ReplaceAllString(l, ""))
		if cont != "" {
			l = cont + " " + l
			cont = ""
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cont = strings.TrimSpace(s)
			continue
		}
		for _, p := range []string{"bushost ", "bushostd ", "sandbox ", "supervisor ", "(cd "} {
			if strings.HasPrefix(l, p) {
				lines = append(lines, readmeLine{role, l})
			}
		}
	}
	return lines, prose
}

// The README's usage runs unchanged against a real daemon: the host's,
// worker's and reviewer's commands in order, with only its placeholders
// filled in (the root /srv/web, the request ID, the edit). Synopses in
// brackets and the commands that need root (sandbox, supervisor) are
// checked against their --help instead: every flag the README writes must
// be one the binary knows. A README that drifts from the binaries fails.
func TestREADMEUsage(t *testing.T) {
	lines, prose := readmeUsage(t)
	h := startHost(t)
	dir := baseDir(t)
	root := filepath.Join(dir, "srv-web")
	os.MkdirAll(root, 0o755)
	testGit(t, root, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(root, "README.md"), []byte("# web\n"), 0o644)
	testGit(t, root, "add", "README.md")
	testGit(t, root, "commit", "-q", "-m", "seed")
	tokens := map[string][]string{
		"worker":   {"BUS_TOKEN_FILE=" + filepath.Join(dir, "worker.token")},
		"reviewer": {"BUS_TOKEN_FILE=" + filepath.Join(dir, "reviewer.token")},
		"lead":     {"BUS_TOKEN_FILE=" + filepath.Join(dir, "lead.token")},
	}
	requestID := ""
	ran := 0
	for _, l := range lines {
		if strings.HasPrefix(l.cmd, "(cd ") {
			readmeSubshell(t, dir, l.cmd)
			continue
		}
		words := strings.Fields(l.cmd)
		if strings.Contains(l.cmd, "[") || words[0] != "bushost" {
			checkFlagsKnown(t, l.cmd)
			continue
		}
		for i, w := range words {
			switch w {
			case "/srv/web":
				words[i] = root
			case "ID":
				words[i] = requestID
			}
		}
		out, errs, code := h.RunIn(t, dir, tokens[l.role], words[1:]...)
		if code != 0 {
			t.Fatalf("README, as the %s: %s\nexit %d: %s", l.role, l.cmd, code, errs)
		}
		if words[1] == "review" && words[2] == "request" {
			requestID = strings.TrimSpace(out)
		}
		ran++
	}
	if ran < 9 {
		t.Fatalf("ran %d commands of the README's usage; its blocks were not found as written", ran)
	}
	// The flow as written ends with the task closed and landed, by the
	// lead the README gives task.close and task.land.
	var show struct {
		State     string `json:"state"`
		ClosedSeq int64  `json:"closed_seq"`
		Landing   *struct {
			MainNew string `json:"main_new"`
		} `json:"landing"`
	}
	if err := json.Unmarshal([]byte(h.Must(t, "--json", "task", "show", "--business", "acme", "--project", "web", "--task", "t1")), &show); err != nil ||
		show.State != "landed" || show.ClosedSeq == 0 || show.Landing == nil {
		t.Fatalf("after the README's flow the task is not closed and landed: %+v (%v)", show, err)
	}
	if main := testGit(t, h.PoolRepo("acme", "web"), "rev-parse", "refs/heads/main"); main != show.Landing.MainNew {
		t.Fatalf("main is %s, not what the landing made it, %s", main, show.Landing.MainNew)
	}
	for _, p := range prose {
		if _, errs, code := h.Run(t, nil, append([]string{"help"}, strings.Fields(p)[1:]...)...); code != 0 {
			t.Errorf("README names %q, which bushost does not know: %s", p, errs)
		}
	}
	if len(prose) < 3 {
		t.Fatalf("found %d bushost commands in the README's prose", len(prose))
	}
}

// readmeSubshell runs a README line "(cd DIR && STEP && ...)": each step
// is "edit" (the placeholder for the worker's change: a new edit.txt,
// added) or a git command, run as written (double quotes grouping words).
func readmeSubshell(t *testing.T, dir, line string) {
	t.Helper()
	inner := strings.TrimSuffix(strings.TrimPrefix(line, "("), ")")
	steps := strings.Split(inner, " && ")
	work := filepath.Join(dir, strings.TrimPrefix(steps[0], "cd "))
	for _, step := range steps[1:] {
		switch {
		case step == "edit":
			readmeEdits++
			os.WriteFile(filepath.Join(work, "edit.txt"), []byte(fmt.Sprintf("edit %d\n", readmeEdits)), 0o644)
			testGit(t, work, "add", "edit.txt")
		case strings.HasPrefix(step, "git "):
			var args []string
			for i, part := range strings.Split(strings.TrimPrefix(step, "git "), `"`) {
				if i%2 == 1 {
					args = append(args, part)
				} else {
					args = append(args, strings.Fields(part)...)
				}
			}
			testGit(t, work, args...)
		default:
			t.Fatalf("README: %s: step %q is neither edit nor git", line, step)
		}
	}
}

// readmeEdits numbers the README's edits, so each changes the file.
var readmeEdits int

// checkFlagsKnown requires every --flag of a README synopsis to appear in
// its command's --help.
func checkFlagsKnown(t *testing.T, line string) {
	t.Helper()
	words := strings.Fields(line)
	sub := ""
	if len(words) > 1 && !strings.HasPrefix(words[1], "-") && !strings.HasPrefix(words[1], "[") {
		sub = words[1]
	}
	args := []string{"--help"}
	if sub != "" {
		args = []string{sub, "--help"}
	}
	out, errs, code := runBin(t, bin(t, words[0]), nil, args...)
	if code != 0 {
		t.Errorf("README: %s: %s %v exits %d: %s", line, words[0], args, code, errs)
		return
	}
	for _, f := range readmeFlag.FindAllString(line, -1) {
		if !strings.Contains(out, f) {
			t.Errorf("README: %s: %s %s --help does not know %s", line, words[0], sub, f)
		}
	}
}

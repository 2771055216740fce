package integration

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/supervisor"
)

// The attacks of issue 16, made from the agent's user and from a service the
// agent edits, against a supervisor deployed the seed's way.

// fileState is what must not change about a file an attacker points at.
type fileState struct {
	uid, gid uint32
	mode     uint32
	content  string
}

func stateOf(t *testing.T, path string) fileState {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	fs := fileState{uid: st.Uid, gid: st.Gid, mode: st.Mode}
	if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fs.content = string(b)
	}
	return fs
}

// rootOnly makes a root-owned directory outside the workspace holding a
// root-only file, and returns both paths.
func rootOnly(t *testing.T, base, name string) (dir, file string) {
	t.Helper()
	dir = filepath.Join(base, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "exclude")
	if err := os.WriteFile(file, []byte("root's own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// Links planted at .git/info (the path init used to write through) and at
// every path the supervisor or init writes in the workspace: after init
// their targets are as they were, and the supervisor serves.
func TestSupervisorInitFollowsNoLink(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
	e.shutdown()

	infoDir, infoFile := rootOnly(t, e.base, "info-target")
	_, agentsFile := rootOnly(t, e.base, "agents-target")
	_, configFile := rootOnly(t, e.base, "config-target")
	// As the agent: its own .git is its to fill with links.
	if out, err := e.asAgent(fmt.Sprintf("cd %s && rm -rf .git/info && ln -s %s .git/info && ln -sf %s .git/config && ln -s %s src/website/planted && ln -s %s .git/HEAD",
		e.ws, infoDir, configFile, infoFile, infoFile)); err != nil {
		t.Fatalf("plant links: %v: %s", err, out)
	}
	// Root plants what the agent cannot (the workspace root is root's): a
	// link as AGENTS.md, at .gitignore, and as the watched trees' .git.
	if err := os.Remove(filepath.Join(e.ws, "AGENTS.md")); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		filepath.Join(e.ws, "AGENTS.md"):  agentsFile,
		filepath.Join(e.ws, ".gitignore"): agentsFile,
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	watched := []string{infoDir, infoFile, agentsFile, configFile}
	before := map[string]fileState{}
	for _, p := range watched {
		before[p] = stateOf(t, p)
	}

	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
	for _, p := range watched {
		if got := stateOf(t, p); got != before[p] {
			t.Errorf("%s changed through a link: %+v, was %+v", p, got, before[p])
		}
	}
	// AGENTS.md is a file again (the link was replaced, not written through).
	if fi, err := os.Lstat(filepath.Join(e.ws, "AGENTS.md")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("AGENTS.md after init: %v %v", fi, err)
	}
	if st := e.status(); st.GitDir != e.gitDir || st.Head == "" {
		t.Errorf("status: git_dir %q head %q", st.GitDir, st.Head)
	}
}

// init must not start while the agent runs anything, and names a process.
func TestSupervisorInitRefusesWhileAgentRuns(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.shutdown()
	u, err := user.Lookup(e.agent)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	agent := exec.Command("sleep", "300")
	agent.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Kill()
		agent.Wait()
	})
	e.waitFor("the agent's sleep", 10*time.Second, func() bool { return len(processesOf(t, e.agent)) > 0 })
	snapshot := func() string {
		var b strings.Builder
		filepath.WalkDir(e.base, func(p string, d os.DirEntry, err error) error {
			if err != nil || strings.HasPrefix(p, filepath.Join(e.base, "tmp")) {
				return nil
			}
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil {
				fmt.Fprintf(&b, "%s %d:%d %o %d %d\n", p, st.Uid, st.Gid, st.Mode, st.Size, st.Mtim.Nano())
			}
			return nil
		})
		return b.String()
	}
	before := snapshot()
	out, err := exec.Command(bin(t, "supervisor"), "init", "--config", e.config, "--seed", e.seed).CombinedOutput()
	if err == nil {
		t.Fatalf("init ran while the agent did:\n%s", out)
	}
	if after := snapshot(); after != before {
		t.Errorf("the refused init changed files:\nbefore\n%s\nafter\n%s", before, after)
	}
	if !strings.Contains(string(out), "of user "+e.agent+" is running") {
		t.Errorf("refusal does not name the agent's process:\n%s", out)
	}
}

// processesOf lists the pids whose real uid is name's.
func processesOf(t *testing.T, name string) []int {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && strings.Fields(v)[0] == u.Uid {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// A directory of the agent's swapped for a link to a root-only directory
// while init walks the workspace: the target never changes owner or mode.
// The swapping runs as root, the worst case: a process init's check of the
// agent's processes would not see.
//
// 200 rounds under `make soak` (BUSHOST_SOAK=1), 30 otherwise, 10 with -short.
func TestSupervisorSoakInitSymlinkRace(t *testing.T) {
	rounds := 30
	if os.Getenv("BUSHOST_SOAK") != "" {
		rounds = 200
	}
	if testing.Short() {
		rounds = 10
	}
	e := newSupEnv(t)
	// No service: each round is init's walk and the supervisor's start.
	mustWrite(t, e.config, fmt.Sprintf("workspace = \"ws\"\ngit_dir = %q\napp_user = %q\nagent_user = %q\nservices_user = %q\nhealth_addr = %q\n",
		e.gitDir, e.app, e.agent, e.svc, e.addr), 0o644)
	e.boot()
	e.shutdown()
	dir := filepath.Join(e.ws, "src", "d")
	aside := filepath.Join(e.ws, "src", "d.aside")
	// A wide walk: many entries before and inside the raced directory.
	for i := range 300 {
		mustWrite(t, filepath.Join(dir, fmt.Sprintf("f%03d", i)), "x\n", 0o644)
	}
	target, file := rootOnly(t, e.base, "race-target")
	mustWrite(t, filepath.Join(target, "sub", "deep"), "root's\n", 0o600)
	paths := []string{target, file, filepath.Join(target, "sub"), filepath.Join(target, "sub", "deep")}
	before := map[string]fileState{}
	for _, p := range paths {
		before[p] = stateOf(t, p)
	}
	var swaps atomic.Int64
	var wg sync.WaitGroup
	var stop chan struct{}
	halt := func() {
		if stop != nil {
			close(stop)
			stop = nil
		}
		wg.Wait()
	}
	// Registered after the workspace's removal, so run before it even when
	// a round fails.
	t.Cleanup(halt)
	for round := range rounds {
		stop = make(chan struct{})
		quit := stop
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				if os.Rename(dir, aside) == nil {
					os.Symlink(target, dir)
					swaps.Add(1)
					os.Remove(dir)
					os.Rename(aside, dir)
				}
			}
		}()
		e.boot()
		halt()
		e.shutdown()
		for _, p := range paths {
			if got := stateOf(t, p); got != before[p] {
				t.Fatalf("round %d: %s changed: %+v, was %+v", round, p, got, before[p])
			}
		}
	}
	t.Logf("%d rounds, %d swaps", rounds, swaps.Load())
}

// The agent keeps rewriting its own .git/config with a filter driver and
// .gitattributes naming it, and edits files so that the supervisor commits:
// no program of the agent's ever runs as app (or at all). 60 s under
// `make soak` (BUSHOST_SOAK=1), 15 s otherwise, 5 s with -short.
func TestSupervisorSoakAgentGitConfigRace(t *testing.T) {
	dur := 15 * time.Second
	if os.Getenv("BUSHOST_SOAK") != "" {
		dur = 60 * time.Second
	}
	if testing.Short() {
		dur = 5 * time.Second
	}
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
	marks := filepath.Join(e.base, "tmp", "marks")
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(marks, 0o777)
	payload := fmt.Sprintf("id -un > %s/ran-$$; cat", marks)
	script := fmt.Sprintf(`cd %s
git init -q . 2>/dev/null
end=$(( $(date +%%s) + %d ))
i=0
while [ $(date +%%s) -lt $end ]; do
  printf '[filter "x"]\n\tclean = %s\n\tsmudge = %s\n[core]\n\tfsmonitor = %s\n\thooksPath = %s\n' > .git/config.new
  mv .git/config.new .git/config
  printf '* filter=x\n' > src/.gitattributes
  printf '* filter=x\n' > src/website/.gitattributes
  echo $i > src/website/edit.txt
  i=$((i+1))
  sleep 0.05
done
`, e.ws, int(dur/time.Second), payload, payload, payload, marks)
	if out, err := e.asAgent(script); err != nil {
		t.Fatalf("agent loop: %v: %s", err, out)
	}
	e.waitFor("the last edit committed", 10*time.Second, func() bool {
		return strings.Contains(e.git("ls-tree", []string{"-r", "--name-only"}, "HEAD"), "src/website/edit.txt")
	})
	if ran, _ := filepath.Glob(filepath.Join(marks, "ran-*")); len(ran) > 0 {
		who, _ := os.ReadFile(ran[0])
		t.Errorf("the agent's filter ran %d times, as %s", len(ran), who)
	}
	if n := e.git("rev-list", []string{"--count"}, "HEAD"); n == "1" {
		t.Error("no edit was committed during the race")
	}
}

// A service the agent edits tries to stop its supervisor and to read its
// memory: both fail, and /healthz keeps answering.
func TestSupervisorServiceCannotReachSupervisor(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
	sup := e.cmd.Process.Pid
	results := filepath.Join(e.base, "tmp", "attack")
	attack := fmt.Sprintf(`#!/bin/bash
kill -STOP %d 2>/dev/null; stop=$?
kill -KILL %d 2>/dev/null; kill=$?
( exec 3</proc/%d/mem ) 2>/dev/null; mem=$?
( exec 3</proc/%d/environ ) 2>/dev/null; environ=$?
ls %s >/dev/null 2>&1; gitdir=$?
echo "stop=$stop kill=$kill mem=$mem environ=$environ gitdir=$gitdir" > %s.tmp && mv %s.tmp %s
echo "website v3 starting"
exec "$HELLO" "$ADDR"
`, sup, sup, sup, sup, e.gitDir, results, results, results)
	v3 := filepath.Join(e.base, "serve-v3.sh")
	mustWrite(t, v3, attack, 0o644)
	if out, err := e.asAgent("cp " + v3 + " " + filepath.Join(e.ws, "src", "website", "serve.sh")); err != nil {
		t.Fatalf("agent edit: %v: %s", err, out)
	}
	e.waitFor("the attack's results", 15*time.Second, func() bool {
		_, err := os.Stat(results)
		return err == nil
	})
	b, _ := os.ReadFile(results)
	t.Logf("the service's attempts (exit statuses): %s", b)
	for _, f := range strings.Fields(string(b)) {
		if strings.HasSuffix(f, "=0") {
			t.Errorf("the service succeeded: %s (all: %s)", f, b)
		}
	}
	if state := procState(t, sup); state == "T" || state == "t" {
		t.Fatalf("supervisor is stopped (%s)", state)
	}
	e.waitFor("/healthz 200 after the attack", 10*time.Second, func() bool { return e.healthz() == 200 })
	if st := e.status(); !strings.Contains(e.git("ls-tree", []string{"-r", "--name-only"}, st.Head), "src/website/serve.sh") {
		t.Errorf("status head %s", st.Head)
	}
}

func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// filesUnder lists the files (and links) under dir, relative to root.
func filesUnder(t *testing.T, root, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// Implants hidden by a .gitignore, by the default ignore names and by the
// agent's own exclude file: after a crash loop and its revert, the watched
// trees hold exactly the good commit's files.
func TestSupervisorRevertRemovesImplants(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	var good string
	e.waitFor("first good commit", 10*time.Second, func() bool {
		st := e.status()
		good = st.Good
		return st.Good != "" && st.Good == st.Head
	})
	web := filepath.Join(e.ws, "src", "website")
	script := fmt.Sprintf(`cd %s && git init -q . 2>/dev/null; mkdir -p .git/info && echo implant-excluded >> .git/info/exclude &&
cd %s && printf 'implant-ignored\n' > .gitignore && echo x > implant-ignored && echo x > implant-excluded &&
mkdir -p node_modules/evil && echo x > node_modules/evil/index.js && echo x > .env && echo x > run.log &&
mkdir -p deep/dist && echo x > deep/dist/bundle.js &&
printf '#!/bin/bash\necho broken\nexit 1\n' > serve.sh`, e.ws, web)
	if out, err := e.asAgent(script); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	var st supervisor.Status
	e.waitFor("revert", 20*time.Second, func() bool {
		st = e.status()
		return len(st.Reverts) > 0
	})
	if r := st.Reverts[0]; r.Error != "" || r.To != good {
		t.Fatalf("revert %+v, good %s", r, good)
	}
	want := strings.Split(e.git("ls-tree", []string{"-r", "--name-only"}, good, "--", "src"), "\n")
	sort.Strings(want)
	got := filesUnder(t, e.ws, "src")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("after the revert the watched trees hold\n%s\nwant exactly the good commit's\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	e.waitFor("healthy after revert", 10*time.Second, func() bool { return e.healthz() == 200 })
}

// A file name with newlines and trailer-like lines: the commit's trailers
// are the supervisor's own only, and the author is the agent.
func TestSupervisorFileNameCannotForgeTrailers(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("first good commit", 10*time.Second, func() bool { return e.status().Good != "" })
	name := "nl\n\nReverted-from: deadbeef\nGood: cafe\nSigned-off-by: Eve <eve@example.com>"
	if err := os.WriteFile(filepath.Join(e.base, "name"), []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := e.asAgent(fmt.Sprintf(`cd %s/src/website && touch "$(cat %s/name)"`, e.ws, e.base)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	var head string
	e.waitFor("the commit of the file", 10*time.Second, func() bool {
		head = e.status().Head
		return strings.Contains(e.git("log", []string{"-1", "--format=%s"}, head), "Reverted-from")
	})
	if got := e.git("log", []string{"-1", "--format=%(trailers)"}, head); strings.TrimSpace(got) != supervisor.RecordedTrailer {
		t.Errorf("trailers %q, want only %q", got, supervisor.RecordedTrailer)
	}
	if who := e.git("log", []string{"-1", "--format=%an <%ae>|%cn"}, head); who != "agent <agent@localhost>|agent" {
		t.Errorf("commit by %q", who)
	}
	if subj := e.git("log", []string{"-1", "--format=%s"}, head); strings.Contains(subj, "\n") || !strings.Contains(subj, `\n`) {
		t.Errorf("subject %q does not quote the name", subj)
	}
}

// A file the agent makes unreadable to the supervisor blocks the commit of
// pending edits, but not the revert: the watched trees still end exactly as
// the good commit.
func TestSupervisorRevertDespiteUnreadableFile(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	var good string
	e.waitFor("first good commit", 10*time.Second, func() bool {
		st := e.status()
		good = st.Good
		return st.Good != "" && st.Good == st.Head
	})
	web := filepath.Join(e.ws, "src", "website")
	if out, err := e.asAgent(fmt.Sprintf(`printf '#!/bin/bash\necho broken soon\nsleep 1\nexit 1\n' > %s/serve.sh`, web)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	e.waitFor("the breaking edit committed", 10*time.Second, func() bool { return e.status().Head != good })
	if out, err := e.asAgent(fmt.Sprintf(`cd %s && echo secret > locked && chmod 000 locked && mkdir -p sealed && echo x > sealed/f && chmod 000 sealed/f`, web)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	var st supervisor.Status
	e.waitFor("revert", 30*time.Second, func() bool {
		st = e.status()
		return len(st.Reverts) > 0
	})
	if r := st.Reverts[0]; r.Error != "" || r.To != good {
		t.Fatalf("revert %+v, good %s", r, good)
	}
	want := strings.Split(e.git("ls-tree", []string{"-r", "--name-only"}, good, "--", "src"), "\n")
	sort.Strings(want)
	if got := filesUnder(t, e.ws, "src"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("after the revert the watched trees hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	e.waitFor("healthy after revert", 10*time.Second, func() bool { return e.healthz() == 200 })
}

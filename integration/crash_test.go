package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logEvent is one line of `bushost events --json`.
type logEvent struct {
	Seq     int64  `json:"seq"`
	Project string `json:"project"`
	Task    string `json:"task"`
	Type    string `json:"type"`
	// Data is the event's JSON object (the CLI prints it as an object; a
	// string holding JSON is accepted too).
	Data json.RawMessage `json:"data"`
}

func (e logEvent) fields(t testing.TB) map[string]any {
	t.Helper()
	raw := e.Data
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(s)
	}
	m := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("event %d data %s: %v", e.Seq, raw, err)
		}
	}
	return m
}

// allEvents lists the whole log as the host sees it.
func allEvents(t testing.TB, h *Host) []logEvent {
	t.Helper()
	out := h.Must(t, "events", "--json")
	var evs []logEvent
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var e logEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// crashTask is one task that pushes while the daemon is being killed.
type crashTask struct {
	project, task string
	worker        string // token file
	work          string // the worker's repository
	n             int
	mu            sync.Mutex
	accepted      []string // commits a client saw accepted
}

// push makes one commit and pushes it; a failure (the daemon died) is not
// an error of the test.
func (c *crashTask) push(t *testing.T, h *Host) {
	c.n++
	name := fmt.Sprintf("f%d.txt", c.n)
	os.WriteFile(filepath.Join(c.work, name), []byte(name+"\n"), 0o644)
	testGit(t, c.work, "add", name)
	testGit(t, c.work, "commit", "-q", "-m", name)
	out, _, code := h.Run(t, nil, "--token-file", c.worker, "push-working", "--repo", c.work)
	if code == 0 {
		c.mu.Lock()
		c.accepted = append(c.accepted, strings.TrimSpace(out))
		c.mu.Unlock()
	}
}

// SIGKILL bushostd at random moments while pushes, reviews and closes
// stream in; after each restart every promise must hold: repositories pass
// git fsck --strict, every refs/work/<task> is the task's last recorded
// push, every push a client saw accepted is recorded and reachable, no
// temp file or lock is left, every closed task closed on an approve of its
// latest push, and the hash chain verifies.
func TestCrashKillsKeepPromises(t *testing.T) {
	kills := 50
	if os.Getenv("BUSHOST_SOAK") != "" {
		kills = 400
	}
	if testing.Short() {
		kills = 8
	}
	h := startHost(t)
	projects := []string{"web", "api"}
	for _, p := range projects {
		h.AddProject(t, "acme", p)
	}
	base := baseDir(t)
	var tasks []*crashTask
	for i := 0; i < 4; i++ {
		c := &crashTask{project: projects[i%2], task: fmt.Sprintf("t%d", i)}
		c.worker = h.Grant(t, "acme", c.project, c.task, "worker", "git.push.working", "review.request")
		c.work = filepath.Join(base, "work-"+c.task)
		h.Must(t, "--token-file", c.worker, "fetch-main", "--repo", c.work)
		tasks = append(tasks, c)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	t.Logf("killing bushostd %d times", kills)
	// The first round runs a whole review-and-close to its end, to learn
	// how long one takes; later kills land at random moments within that
	// span, so every step (push, request, verdict, close) gets cut.
	var span time.Duration
	for k := 0; k < kills; k++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, c := range tasks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.push(t, h)
				}
			}()
		}
		// One task per round goes through review and close, racing the kill.
		life := fmt.Sprintf("life%d", k)
		lp := projects[k%2]
		lw := h.Grant(t, "acme", lp, life, "worker", "git.push.working", "review.request")
		lr := h.Grant(t, "acme", lp, life, "reviewer", "review.verdict")
		lc := h.Grant(t, "acme", lp, life, "closer", "task.close")
		lwork := filepath.Join(base, "work-"+life)
		lifeDone := make(chan struct{})
		lifeStart := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(lifeDone)
			if _, _, code := h.Run(t, nil, "--token-file", lw, "fetch-main", "--repo", lwork); code != 0 {
				return
			}
			os.WriteFile(filepath.Join(lwork, "life.txt"), []byte(life+"\n"), 0o644)
			testGit(t, lwork, "add", "life.txt")
			testGit(t, lwork, "commit", "-q", "-m", life)
			lhead := testGit(t, lwork, "rev-parse", "HEAD")
			steps := [][]string{
				{"--token-file", lw, "push-working", "--repo", lwork},
				{"--token-file", lw, "review", "request"},
			}
			var req string
			for i, s := range steps {
				out, _, code := h.Run(t, nil, s...)
				if code != 0 {
					return
				}
				if i == 1 {
					req = strings.Fields(out)[0]
				}
			}
			if _, _, code := h.Run(t, nil, "--token-file", lr, "review", "verdict", "--request", req, "--approve", "--commit", lhead); code != 0 {
				return
			}
			h.Run(t, nil, "--token-file", lc, "task", "close")
		}()

		if k == 0 {
			<-lifeDone
			span = time.Since(lifeStart) * 6 / 5
		} else {
			time.Sleep(time.Duration(rng.Int64N(int64(span))))
		}
		roundStart := time.Now()
		h.Kill()
		close(stop)
		wg.Wait()
		h.Restart(t)
		checkCrashInvariants(t, h, projects, tasks)
		if k == 0 {
			t.Logf("a review-and-close takes about %v; kill, restart and checks %v", span, time.Since(roundStart))
		}
		if t.Failed() {
			t.Fatalf("promise broken after kill %d", k+1)
		}
	}
	// The next push after all that still works, for every task.
	for _, c := range tasks {
		before := len(c.accepted)
		c.push(t, h)
		if len(c.accepted) != before+1 {
			t.Fatalf("push to %s after the kills refused", c.task)
		}
	}
	checkCrashInvariants(t, h, projects, tasks)
	accepted := 0
	for _, c := range tasks {
		accepted += len(c.accepted)
	}
	closed := 0
	for _, e := range allEvents(t, h) {
		if e.Type == "task.closed" {
			closed++
		}
	}
	t.Logf("%d kills: %d pushes seen accepted by clients, %d tasks closed through review", kills, accepted, closed)
	if accepted < kills {
		t.Fatalf("only %d pushes accepted in %d rounds: the test exercised too little", accepted, kills)
	}
}

func checkCrashInvariants(t *testing.T, h *Host, projects []string, tasks []*crashTask) {
	t.Helper()
	evs := allEvents(t, h)
	lastPush := map[string]string{}          // project/task -> commit
	recorded := map[string]bool{}            // commits recorded as pushes
	approved := map[string]map[string]bool{} // project/task -> commits with an approve
	requestCommit := map[string]string{}     // request id -> commit
	for _, e := range evs {
		f := e.fields(t)
		key := e.Project + "/" + e.Task
		switch e.Type {
		case "action.allowed":
			if f["capability"] == "git.push.working" {
				c, _ := f["commit"].(string)
				lastPush[key] = c
				recorded[c] = true
			}
		case "review.request":
			id, _ := f["request_id"].(string)
			c, _ := f["commit"].(string)
			requestCommit[id] = c
		case "review.verdict":
			if f["verdict"] == "approve" {
				c, _ := f["commit"].(string)
				if c == "" {
					id, _ := f["request_id"].(string)
					c = requestCommit[id]
				}
				if approved[key] == nil {
					approved[key] = map[string]bool{}
				}
				approved[key][c] = true
			}
		case "task.closed":
			if lp := lastPush[key]; lp != "" && !approved[key][lp] {
				t.Errorf("%s closed without an approve of its latest push %s", key, lp)
			}
		}
	}
	for _, p := range projects {
		h.FsckProject(t, "acme", p, "--no-dangling")
		onDisk := map[string]string{}
		tasks, _ := filepath.Glob(h.TaskRepo("acme", p, "*"))
		for _, repo := range append([]string{h.PoolRepo("acme", p)}, tasks...) {
			refs := testGit(t, repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/work/")
			for _, line := range strings.Split(refs, "\n") {
				if f := strings.Fields(line); len(f) == 2 {
					task := strings.TrimPrefix(f[0], "refs/work/")
					if repo != h.TaskRepo("acme", p, task) {
						t.Errorf("%s: refs/work/%s is in %s, not in its task's repository", p, task, repo)
					}
					onDisk[task] = f[1]
				}
			}
		}
		for key, c := range lastPush {
			proj, task, _ := strings.Cut(key, "/")
			if proj != p {
				continue
			}
			if onDisk[task] != c {
				t.Errorf("%s: refs/work/%s = %q, last recorded push %s", p, task, onDisk[task], c)
			}
		}
		for task, c := range onDisk {
			if lastPush[p+"/"+task] != c {
				t.Errorf("%s: refs/work/%s = %s has no recorded push", p, task, c)
			}
		}
	}
	for _, c := range tasks {
		for _, commit := range c.accepted {
			if !recorded[commit] {
				t.Errorf("%s: push %s was accepted but is not in the log", c.task, commit)
			}
		}
	}
	// Nothing temporary is left that could block the next push.
	filepath.WalkDir(filepath.Join(h.Home, "repos"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		name := d.Name()
		if strings.HasSuffix(name, ".lock") || strings.HasPrefix(name, "tmp_") || strings.Contains(name, "quarantine") || strings.HasPrefix(name, "incoming-") {
			t.Errorf("left behind: %s", path)
		}
		return nil
	})
	h.Must(t, "log", "verify")
}

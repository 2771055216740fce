package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The inspection commands' --json shapes, as docs/broker.md ("Inspecting")
// documents them. Decoding with DisallowUnknownFields keeps the document
// and the code in step.
type inspectProjects struct {
	Projects []struct {
		Business     string `json:"business"`
		Project      string `json:"project"`
		Host         string `json:"host"`
		Moving       bool   `json:"moving"`
		Here         bool   `json:"here"`
		SizeBytes    int64  `json:"size_bytes"`
		Tasks        int64  `json:"tasks"`
		LastPush     string `json:"last_push"`
		LastPushSeq  int64  `json:"last_push_seq"`
		LastPushTask string `json:"last_push_task"`
		LastPushTime string `json:"last_push_time"`
	} `json:"projects"`
}

type inspectGrants struct {
	Grants []struct {
		ID           string              `json:"id"`
		Business     string              `json:"business"`
		Project      string              `json:"project"`
		Task         string              `json:"task"`
		Role         string              `json:"role"`
		Capabilities []string            `json:"capabilities"`
		ExpiresAt    string              `json:"expires_at"`
		Expired      bool                `json:"expired"`
		Revoked      bool                `json:"revoked"`
		RevokedSeq   int64               `json:"revoked_seq"`
		Launch       map[string][]string `json:"launch"`
		LaunchedBy   string              `json:"launched_by"`
		LaunchDepth  int64               `json:"launch_depth"`
		LaunchBounds struct {
			Net          []string          `json:"net"`
			Max          map[string]string `json:"max"`
			Tasks        string            `json:"tasks"`
			AllowDomains []string          `json:"allow_domains"`
			AllowHosts   []string          `json:"allow_hosts"`
		} `json:"launch_bounds"`
	} `json:"grants"`
}

type inspectTasks struct {
	Tasks []struct {
		Business    string `json:"business"`
		Project     string `json:"project"`
		Task        string `json:"task"`
		State       string `json:"state"`
		LastPush    string `json:"last_push"`
		LastPushSeq int64  `json:"last_push_seq"`
		LandedSeq   int64  `json:"landed_seq"`
	} `json:"tasks"`
}

type inspectTask struct {
	Business      string `json:"business"`
	Project       string `json:"project"`
	Task          string `json:"task"`
	State         string `json:"state"`
	LastPush      string `json:"last_push"`
	LastPushSeq   int64  `json:"last_push_seq"`
	LastPushGrant string `json:"last_push_grant"`
	LastPushTime  string `json:"last_push_time"`
	ClosedSeq     int64  `json:"closed_seq"`
	ReopenedSeq   int64  `json:"reopened_seq"`
	NeedsRepair   string `json:"needs_repair"`
	Reviews       []struct {
		RequestID     string `json:"request_id"`
		Commit        string `json:"commit"`
		PushSeq       int64  `json:"push_seq"`
		RequestSeq    int64  `json:"request_seq"`
		RequestedBy   string `json:"requested_by"`
		Verdict       string `json:"verdict"`
		VerdictSeq    int64  `json:"verdict_seq"`
		VerdictCommit string `json:"verdict_commit"`
		Reviewer      string `json:"reviewer_grant"`
		Comment       string `json:"comment"`
		Withdrawn     bool   `json:"withdrawn"`
	} `json:"reviews"`
	Landing *struct {
		Seq     int64  `json:"seq"`
		Commit  string `json:"commit"`
		MainOld string `json:"main_old"`
		MainNew string `json:"main_new"`
		Merge   string `json:"merge"`
	} `json:"landing"`
}

// strictJSON decodes out into v, refusing a field the shape lacks.
func strictJSON(t *testing.T, what, out string, v any) {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("%s --json does not parse as documented: %v\n%s", what, err, out)
	}
}

// A worker's grant sees only its own task in every listing, the host sees
// everything, no output (text or --json) of any listing shows any token
// issued, and each --json parses in its documented shape.
func TestInspectLists(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	seed := f.main(t)
	other := h.Grant(t, "acme", "web", "t2", "worker", "git.push.working", "review.request")
	h.AddProject(t, "acme", "api")
	elsewhere := h.Grant(t, "acme", "api", "t9", "worker", "git.push.working")
	closer := h.Grant(t, "acme", "web", "t1", "closer", "task.close")

	pushed := f.commit(t, "feature.txt", "one\n")
	f.push(t)
	f.approve(t)
	runAs(t, h, f.lander, 0, "task", "land")
	landed := f.main(t)

	// Every token issued: the host's and each grant's.
	tokenFiles := []string{f.worker, f.reviewer, f.lander, other, elsewhere, closer}
	tokens := []string{}
	admin, err := os.ReadFile(filepath.Join(h.Home, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, strings.TrimSpace(string(admin)))
	for _, tf := range tokenFiles {
		b, err := os.ReadFile(tf)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, strings.TrimSpace(string(b)))
	}
	// Revoke the closer's grant: it is listed as revoked.
	var all inspectGrants
	strictJSON(t, "grant list", h.Must(t, "--json", "grant", "list"), &all)
	if len(all.Grants) != len(tokenFiles) {
		t.Fatalf("host's grant list has %d grants, want %d", len(all.Grants), len(tokenFiles))
	}
	grantOf := map[string]string{}
	for _, g := range all.Grants {
		grantOf[g.Task+"/"+g.Role] = g.ID
	}
	h.Must(t, "revoke", grantOf["t1/closer"])

	noToken := func(who, cmd, out string) {
		t.Helper()
		for _, tok := range tokens {
			if tok != "" && strings.Contains(out, tok) {
				t.Fatalf("%s: %s shows a token:\n%s", who, cmd, out)
			}
		}
	}
	// run runs a listing as tokenFile ("" for the host), in text and in
	// --json, checks both for tokens and a text header, and returns the
	// --json output.
	run := func(who, tokenFile, header string, args ...string) string {
		t.Helper()
		pre := []string{}
		if tokenFile != "" {
			pre = []string{"--token-file", tokenFile}
		}
		cmd := strings.Join(args, " ")
		text, errs, code := h.Run(t, nil, append(pre, args...)...)
		if code != 0 {
			t.Fatalf("%s: %s: exit %d: %s", who, cmd, code, errs)
		}
		if !strings.HasPrefix(text, header) {
			t.Fatalf("%s: %s: text does not start with the header %q:\n%s", who, cmd, header, text)
		}
		js, errs, code := h.Run(t, nil, append(append(pre, "--json"), args...)...)
		if code != 0 {
			t.Fatalf("%s: %s --json: exit %d: %s", who, cmd, code, errs)
		}
		noToken(who, cmd, text+errs)
		noToken(who, cmd+" --json", js)
		return js
	}

	// The host sees everything.
	var ps inspectProjects
	strictJSON(t, "project list", run("host", "", "BUSINESS  PROJECT  HOST", "project", "list"), &ps)
	if len(ps.Projects) != 2 || ps.Projects[0].Project != "api" || ps.Projects[1].Project != "web" {
		t.Fatalf("host's project list: %+v", ps)
	}
	hostID, err := os.ReadFile(filepath.Join(h.Home, "host-id"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps.Projects {
		if p.Host != strings.TrimSpace(string(hostID)) || p.Moving || !p.Here || p.SizeBytes <= 0 {
			t.Fatalf("project %s: placement or size: %+v (this host is %s)", p.Project, p, hostID)
		}
	}
	if web := ps.Projects[1]; web.LastPush != pushed || web.LastPushTask != "t1" || web.LastPushTime == "" || web.Tasks != 2 {
		t.Fatalf("acme/web's latest push: %+v, want %s of t1", web, pushed)
	}
	var ts inspectTasks
	strictJSON(t, "task list", run("host", "", "BUSINESS  PROJECT  TASK", "task", "list"), &ts)
	if len(ts.Tasks) != 3 {
		t.Fatalf("host's task list: %+v", ts)
	}
	var gs inspectGrants
	strictJSON(t, "grant list", run("host", "", "ID  ", "grant", "list", "--business", "acme", "--project", "web", "--task", "t1"), &gs)
	if len(gs.Grants) != 4 {
		t.Fatalf("host's grant list of t1: %+v", gs)
	}
	for _, g := range gs.Grants {
		if g.Task != "t1" || g.ExpiresAt == "" || len(g.Capabilities) == 0 || g.Expired || g.Revoked != (g.Role == "closer") || g.Revoked != (g.RevokedSeq != 0) {
			t.Fatalf("grant %+v", g)
		}
	}
	var show inspectTask
	strictJSON(t, "task show", run("host", "", "BUSINESS  PROJECT  TASK", "task", "show", "--business", "acme", "--project", "web", "--task", "t1"), &show)
	if show.State != "landed" || show.LastPush != pushed || show.LastPushGrant != grantOf["t1/worker"] || show.ClosedSeq == 0 ||
		len(show.Reviews) != 1 || show.Landing == nil {
		t.Fatalf("task show t1: %+v", show)
	}
	if rv := show.Reviews[0]; rv.Verdict != "approve" || rv.Commit != pushed || rv.VerdictCommit != pushed || rv.Reviewer != grantOf["t1/reviewer"] ||
		rv.RequestedBy != grantOf["t1/worker"] || rv.VerdictSeq <= rv.RequestSeq || rv.Withdrawn {
		t.Fatalf("task show t1's review: %+v", rv)
	}
	if l := show.Landing; l.Commit != pushed || l.MainOld != seed || l.MainNew != landed || l.Merge != "" {
		t.Fatalf("task show t1's landing: %+v, want %s -> %s", l, seed, landed)
	}
	text := h.Must(t, "task", "show", "--business", "acme", "--project", "web", "--task", "t1")
	for _, want := range []string{"REQUEST", "approve", grantOf["t1/reviewer"], "LANDED", landed} {
		if !strings.Contains(text, want) {
			t.Fatalf("task show t1 lacks %q:\n%s", want, text)
		}
	}

	// Each worker sees its own task only, in every listing.
	for _, w := range []struct{ name, token, business, project, task string }{
		{"t1's worker", f.worker, "acme", "web", "t1"},
		{"t2's worker", other, "acme", "web", "t2"},
		{"t9's worker", elsewhere, "acme", "api", "t9"},
	} {
		var ps inspectProjects
		strictJSON(t, "project list", run(w.name, w.token, "BUSINESS  PROJECT  HOST", "project", "list"), &ps)
		if len(ps.Projects) != 1 || ps.Projects[0].Business != w.business || ps.Projects[0].Project != w.project ||
			ps.Projects[0].Tasks != 1 || (ps.Projects[0].LastPushTask != "" && ps.Projects[0].LastPushTask != w.task) {
			t.Fatalf("%s's project list: %+v", w.name, ps)
		}
		var ts inspectTasks
		strictJSON(t, "task list", run(w.name, w.token, "BUSINESS  PROJECT  TASK", "task", "list"), &ts)
		if len(ts.Tasks) != 1 || ts.Tasks[0].Task != w.task {
			t.Fatalf("%s's task list: %+v", w.name, ts)
		}
		var gs inspectGrants
		strictJSON(t, "grant list", run(w.name, w.token, "ID  ", "grant", "list"), &gs)
		for _, g := range gs.Grants {
			if g.Business != w.business || g.Project != w.project || g.Task != w.task {
				t.Fatalf("%s sees grant %+v of another task", w.name, g)
			}
		}
		if len(gs.Grants) == 0 {
			t.Fatalf("%s sees no grant of its task", w.name)
		}
		var show inspectTask
		strictJSON(t, "task show", run(w.name, w.token, "BUSINESS  PROJECT  TASK", "task", "show"), &show)
		if show.Business != w.business || show.Project != w.project || show.Task != w.task {
			t.Fatalf("%s's task show: %+v", w.name, show)
		}
	}
	// Asking for another task is refused (grant list, task show) or finds
	// nothing of it (project list, task list).
	for _, args := range [][]string{
		{"grant", "list", "--task", "t2"},
		{"task", "show", "--business", "acme", "--project", "web", "--task", "t2"},
	} {
		out, errs := runAs(t, h, f.worker, 4, args...)
		noToken("t1's worker", strings.Join(args, " "), out+errs)
	}
	out, errs := runAs(t, h, f.worker, 6, "task", "show", "--task", "t2")
	noToken("t1's worker", "task show --task t2", out+errs)
	if out, _ := runAs(t, h, f.worker, 0, "--json", "project", "list", "--business", "other"); !strings.Contains(out, `"projects":[]`) {
		t.Fatalf("t1's worker's project list of another business: %s", out)
	}
	// The host names the task it shows.
	if _, errs, code := h.Run(t, nil, "task", "show"); code != 2 || !strings.Contains(errs, "tasks match") {
		t.Fatalf("host's task show with no flags: exit %d: %s", code, errs)
	}
}

// After task reopen with no new push, the approve that closed the task
// opens neither close nor land: both are refused and leave nothing behind,
// task show marks the verdict withdrawn; a new push, approved, lands.
func TestReopenWithdrawsApproval(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	closer := h.Grant(t, "acme", "web", "t1", "closer", "task.close")
	f.commit(t, "feature.txt", "one\n")
	f.push(t)
	f.approve(t)
	runAs(t, h, closer, 0, "task", "close")
	h.Must(t, "task", "reopen", "--business", "acme", "--project", "web", "--task", "t1")

	refusedLand(t, h, f.lander, 1, "GATE_NO_APPROVAL")
	n := len(brokerEvents(t, h))
	if _, errs := runAs(t, h, closer, 1, "task", "close"); !strings.Contains(errs, "reopened") {
		t.Fatalf("close after reopen: %s", errs)
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("a refused close appended to the log: %d -> %d events", n, m)
	}
	var show inspectTask
	out, _ := runAs(t, h, f.worker, 0, "--json", "task", "show")
	strictJSON(t, "task show", out, &show)
	if show.State != "open" || show.ReopenedSeq == 0 || len(show.Reviews) != 1 || !show.Reviews[0].Withdrawn {
		t.Fatalf("task show after reopen: %+v", show)
	}

	second := f.commit(t, "feature.txt", "two\n")
	f.push(t)
	f.approve(t)
	runAs(t, h, f.lander, 0, "task", "land")
	if got := f.main(t); got != second {
		t.Fatalf("main is %s after landing the new approved push %s", got, second)
	}
	h.Must(t, "log", "verify")
}

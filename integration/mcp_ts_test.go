package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// mcpTSVersion is the official TypeScript SDK the test installs.
const mcpTSVersion = "1.32.2"

// TestMCPTypeScriptClient drives the gated loop with the official
// TypeScript SDK's client (@modelcontextprotocol/sdk from npm, node from
// Debian), so that a client nobody here wrote checks the protocol: the
// handshake, the tool lists, each result against its tool's output schema
// (the SDK validates structured content), a refusal as isError.
func TestMCPTypeScriptClient(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool, "the TypeScript MCP client runs on it (scripts/deps.sh installs nodejs and npm)")
		}
	}
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	base := baseDir(t)
	// The SDK is installed in the test's own directory, its npm cache
	// too: both go with it.
	js := filepath.Join(base, "js")
	if err := os.Mkdir(js, 0o755); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, "integration", "testdata", "mcp-ts", "loop.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(js, "loop.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "npm", "install", "--prefix", js, "--cache", filepath.Join(base, "npm-cache"),
		"--no-audit", "--no-fund", "--loglevel=error", "@modelcontextprotocol/sdk@"+mcpTSVersion)
	// npm reaches the registry as the machine does (its proxy, its CA
	// certificates: the caller's environment); only its cache is ours.
	install.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm install @modelcontextprotocol/sdk@%s: %v\n%s", mcpTSVersion, err, out)
	}

	workerDir, reviewerDir := filepath.Join(base, "worker"), filepath.Join(base, "reviewer")
	for _, d := range []string{workerDir, reviewerDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := exec.CommandContext(ctx, "node", "loop.mjs")
	run.Dir = js
	run.Env = append(cleanEnv(), "BUSHOST="+h.client, "BUSHOST_HOME="+h.Home,
		"WORKER_TOKEN="+h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request", "task.close", "task.land"),
		"REVIEWER_TOKEN="+h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict"),
		"WORKER_DIR="+workerDir, "REVIEWER_DIR="+reviewerDir)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node loop.mjs: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	if strings.Contains(stderr.String(), raceReport) {
		t.Errorf("bushost mcp (built with -race) reported a data race:\n%s", stderr.String())
	}
	var got struct {
		Head, Pushed, Fetched, Verdict, Landed, Server string
		Gate                                           struct {
			IsError bool
			Reason  string
		}
		WorkerTools, ReviewerTools []string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node loop.mjs printed %q: %v", out, err)
	}
	if got.Pushed != got.Head || got.Fetched != got.Head || got.Verdict != "approve" || got.Landed != got.Head || got.Server != "bushost" {
		t.Fatalf("the TypeScript client's loop: %+v", got)
	}
	if !got.Gate.IsError || got.Gate.Reason != "GATE_NO_APPROVAL" {
		t.Fatalf("task_close before a verdict, as the TypeScript client saw it: %+v", got.Gate)
	}
	if slices.Contains(got.WorkerTools, "review_verdict") || slices.Contains(got.ReviewerTools, "push_working") {
		t.Fatalf("tools: worker %v, reviewer %v", got.WorkerTools, got.ReviewerTools)
	}
	if main := testGit(t, h.PoolRepo("acme", "web"), "rev-parse", "refs/heads/main"); main != got.Head {
		t.Fatalf("main is %s after task_land, want %s", main, got.Head)
	}
}

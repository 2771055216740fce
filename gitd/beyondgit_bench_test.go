package gitd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/limits"
)

// BenchmarkBeyondGitWalk times the walk alone on the pack of the
// incremental push of integration's BenchmarkGitPushBeyondGitWalk (10
// commits onto 5,000 files in 50 directories), beside index-pack of the
// same pack: the end-to-end comparison on a shared machine swings more
// than the walk costs, so this says what the walk itself adds.
func BenchmarkBeyondGitWalk(b *testing.B) {
	dir := b.TempDir()
	work := filepath.Join(dir, "work")
	tg := func(d string, args ...string) {
		b.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = d
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@b")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	os.MkdirAll(work, 0o755)
	tg(work, "init", "-q", "-b", "main")
	for d := 0; d < 50; d++ {
		os.MkdirAll(filepath.Join(work, fmt.Sprintf("d%d", d)), 0o755)
		for f := 0; f < 100; f++ {
			os.WriteFile(filepath.Join(work, fmt.Sprintf("d%d/f%d.txt", d, f)), []byte(fmt.Sprintf("%d %d\n", d, f)), 0o644)
		}
	}
	tg(work, "add", "-A")
	tg(work, "commit", "-q", "-m", "base")
	repoDir := filepath.Join(dir, "repo.git")
	tg(dir, "init", "-q", "--bare", repoDir)
	tg(work, "push", "-q", repoDir, "main:refs/heads/main")
	for i := 0; i < 10; i++ {
		os.WriteFile(filepath.Join(work, fmt.Sprintf("d%d/f%d.txt", i%50, i)), []byte(fmt.Sprintf("incremental %d\n", i)), 0o644)
		tg(work, "commit", "-q", "-am", fmt.Sprintf("incremental %d", i))
	}
	bf := filepath.Join(dir, "incr.bundle")
	tg(work, "bundle", "create", "-q", "--version=2", bf, "HEAD", "^HEAD~10")

	g, err := gitcmd.New(filepath.Join(dir, "home"))
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(bf)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	h, err := bundle.ReadHeader(br)
	if err != nil {
		b.Fatal(err)
	}
	q, err := bundle.NewQuarantine(filepath.Join(repoDir, "objects"))
	if err != nil {
		b.Fatal(err)
	}
	defer q.Remove()
	start := time.Now()
	name, err := q.IndexPack(context.Background(), g, repoDir, br)
	indexPack := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	gg, err := git.PlainOpen(repoDir)
	if err != nil {
		b.Fatal(err)
	}
	has := func(h plumbing.Hash) bool { return gg.Storer.HasEncodedObject(h) == nil }
	// The push opens the pack anyway (to check the ref's commit); the walk
	// is timed apart from the open.
	var opening time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		start := time.Now()
		objs, err := openObjects(q.Dir, name, gg.Storer)
		if err != nil {
			b.Fatal(err)
		}
		opening += time.Since(start)
		b.StartTimer()
		// No tree sizes known: the walk reads the 40 directories the
		// push left alone from the repository, as a daemon's first push
		// after its start does.
		v := repo{Dir: dir, Path: repoDir, st: &store{limits: &limits.Limits{}}}.open()
		p := pushedPack{pack: objs.pack, idx: objs.idx, repo: v, tip: plumbing.NewHash(h.Refs[0].Commit),
			has: has, pooled: has, before: has,
			bounds: treeBounds{maxPaths: limits.DefaultMaxTreePaths, maxDepth: limits.DefaultMaxTreeDepth, known: &treeSizes{}}}
		if _, err := walkBeyondGit(context.Background(), p); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		objs.Close()
		b.StartTimer()
	}
	b.StopTimer()
	walk := b.Elapsed() / time.Duration(b.N)
	line := fmt.Sprintf("beyond-git walk of the incremental push's pack: %.3f ms (opening the pack, which the push does anyway: %.3f ms); index-pack of it here %.1f ms",
		float64(walk.Microseconds())/1000, float64((opening/time.Duration(b.N)).Microseconds())/1000, float64(indexPack.Microseconds())/1000)
	b.ReportMetric(float64(walk.Microseconds())/1000, "ms-walk")
	b.ReportMetric(float64((opening/time.Duration(b.N)).Microseconds())/1000, "ms-open-pack")
	b.ReportMetric(float64(indexPack.Microseconds())/1000, "ms-index-pack")
	fmt.Println(line)
	b.Log(line)
}

package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPushWorkingFailedPackStartEnds: when pack-objects cannot be started
// (here: too few file descriptors, so its fork fails while the cat-file
// beside it may run), push-working fails, it does not block forever on the
// revs pipe nobody reads. Run under a range of fd limits, a few times each:
// which of the two gits gets the descriptors is a race.
func TestPushWorkingFailedPackStartEnds(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatal("prlimit (util-linux) is not installed")
	}
	w := newGitWorld(t, hostOpts{})
	w.commit(t, "a.txt", "a\n")
	// A push killed at the deadline leaves its temporary git home here.
	tmp := t.TempDir()
	for n := 12; n <= 32; n++ {
		for i := 0; i < 3; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			cmd := exec.CommandContext(ctx, prlimit, fmt.Sprintf("--nofile=%d", n), w.h.client,
				"--home", w.h.Home, "--token-file", w.worker, "push-working", "--repo", w.work)
			cmd.Env = append(cleanEnv(), "TMPDIR="+tmp)
			var errb strings.Builder
			cmd.Stderr = &errb
			err := cmd.Run()
			timedOut := ctx.Err() != nil
			cancel()
			if timedOut {
				t.Fatalf("push-working with %d file descriptors did not end in 20s (%v): %s", n, err, errb.String())
			}
		}
	}
}

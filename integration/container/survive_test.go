package container

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// What an agent inside the seed's container could once do to stop its
// supervisor: each must leave the container healthy (`podman healthcheck
// run` exits 0) and the agent's work recorded or reported.

// zombies counts the zombie processes in the container.
func (b *seedBox) zombies() int {
	n, _ := strconv.Atoi(strings.TrimSpace(b.asRoot(`grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l`)))
	return n
}

// 200 orphans of the agent's: reparented to PID 1, the supervisor's init,
// which reaps them; no zombie is left.
func TestSeedContainerReapsOrphans(t *testing.T) {
	b := startSeed(t, "reaping orphans")
	b.waitFor("healthy", 60*time.Second, b.healthy)
	b.asAgent(`for i in $(seq 200); do (sleep 1 &); done`)
	b.waitFor("the orphans gone, no zombie left", 20*time.Second, func() bool {
		return b.zombies() == 0 && strings.TrimSpace(b.asRoot(`grep -l '^Name:.*sleep' /proc/[0-9]*/status 2>/dev/null | wc -l`)) == "0"
	})
	if !b.healthy() {
		t.Errorf("unhealthy after the orphans:\n%s", tail(b.logs(), 2000))
	}
}

// A 1,100-level tree planted by the agent: reported (not skipped), and
// the container restarts healthy over it, with its 1,024 descriptors.
func TestSeedContainerDeepTree(t *testing.T) {
	b := startSeed(t, "a deep tree")
	b.waitFor("healthy", 60*time.Second, b.healthy)
	b.good()
	// 1,100 levels in 11 steps of 100: a cd per level is slow in bash once
	// the path is past PATH_MAX.
	b.asAgent(`cd /workspace/src/website && p=$(printf 'd/%.0s' $(seq 100)) && for i in $(seq 11); do mkdir -p "$p" && cd "$p" || exit 1; done; echo x > bottom.txt`)
	reported := func() bool {
		return strings.Contains(b.status().Unrecorded, "src/website/d/d/d") && strings.Contains(b.status().Unrecorded, "more than 256 directories below src")
	}
	b.waitFor("the tree reported", 30*time.Second, reported)
	if out, err := podman(t, "restart", "-t", "5", b.name); err != nil {
		t.Fatalf("podman restart: %v\n%s", err, out)
	}
	b.waitFor("healthy after the restart", 60*time.Second, b.healthy)
	b.waitFor("the tree reported after the restart", 30*time.Second, reported)
	if st := b.status(); st.State != "degraded" {
		t.Errorf("state %q with an unrecorded tree, want degraded", st.State)
	}
}

// 1,200 connections held on port 3002 by the agent: the HEALTHCHECK (on
// the supervisor's socket) passes, and an edit made meanwhile is
// committed.
func TestSeedContainerHealthUnderFlood(t *testing.T) {
	b := startSeed(t, "a flood of the health port")
	b.waitFor("healthy", 60*time.Second, b.healthy)
	first := b.good()
	// Two holders of 600 each: the agent's own limit is 1,024 descriptors.
	b.asAgent(`for h in 1 2; do
  setsid bash -c 'for i in $(seq 600); do exec {fd}<>/dev/tcp/127.0.0.1/3002 || exit 1; done; echo held >> /tmp/held; exec sleep 300' </dev/null >/dev/null 2>&1 &
done`)
	b.waitFor("1,200 connections held", 60*time.Second, func() bool {
		return strings.Count(b.asRoot("cat /tmp/held 2>/dev/null || true"), "held") == 2
	})
	for range 3 {
		if !b.healthy() {
			t.Fatalf("the HEALTHCHECK fails while 3002 is flooded:\n%s", tail(b.logs(), 2000))
		}
	}
	b.asAgent(`echo 'made during the flood' > /workspace/src/website/flood.txt`)
	b.waitFor("the edit committed during the flood", 30*time.Second, func() bool {
		st := b.status()
		return st.Head != first && st.Unrecorded == ""
	})
	b.asAgent(`pkill -u agent -x sleep || true`)
}

// A directory the agent hides from the supervisor with an ACL: reported;
// a restart strips the ACL (init), records it, and the crash loop the
// same edit caused is reverted: the tree ends exactly as the good commit.
func TestSeedContainerACLHiddenDirectory(t *testing.T) {
	b := startSeed(t, "an ACL-hidden directory")
	b.waitFor("healthy", 60*time.Second, b.healthy)
	good := b.good()
	b.asAgent(`cd /workspace/src/website && mkdir hidden && echo implant > hidden/payload.sh && setfacl -m u:app:--- hidden &&
printf '#!/bin/bash\necho broken\nexit 1\n' > serve.sh`)
	b.waitFor("the hidden directory reported", 30*time.Second, func() bool {
		return strings.Contains(b.status().Unrecorded, "src/website/hidden cannot be read by the supervisor")
	})
	if out, err := podman(t, "restart", "-t", "5", b.name); err != nil {
		t.Fatalf("podman restart: %v\n%s", err, out)
	}
	b.waitFor("the revert", 60*time.Second, func() bool {
		st := b.status()
		return len(st.Reverts) > 0 && st.Reverts[len(st.Reverts)-1].Error == "" && st.Reverts[len(st.Reverts)-1].To == good
	})
	b.exactlyGood(good)
	b.waitFor("healthy after the revert", 60*time.Second, b.healthy)
	if log := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git log --name-only --format= HEAD"); !strings.Contains(log, "src/website/hidden/payload.sh") {
		t.Errorf("the hidden file is not in the history:\n%s", log)
	}
}

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStartLinksNoGoGitTransports: every push-working, fetch and review
// pays bushost's start, and 32 pushes at once pay it 32 times on the
// same CPUs (docs/performance.md, BenchmarkPushConcurrent). go-git's root
// package links its transports (ssh, http, openpgp) and os/user, which
// brings cgo and the dynamic loader: about 4 ms of CPU a start. The
// client links only go-git's plumbing and stays a static binary.
func TestStartLinksNoGoGitTransports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace,netgo", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// go-git's root package alone (its plumbing packages are below it),
	// the others with everything below them.
	heavy := []string{"runtime/cgo", "os/user", "github.com/go-git/go-git/v5/plumbing/transport", "github.com/ProtonMail/go-crypto"}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/go-git/go-git/v5" {
			t.Errorf("cmd/bushost links %s", p)
		}
		for _, h := range heavy {
			if p == h || strings.HasPrefix(p, h+"/") {
				t.Errorf("cmd/bushost links %s", p)
			}
		}
	}
}

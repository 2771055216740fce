package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksLittle: every session's start waits for this binary's start,
// which grows with what it links and initialises. It links pid1 and the
// standard library's core, never the launcher (internal/sandbox) nor what
// only the launcher needs: networking, crypto, encoding, flag parsing.
func TestLinksLittle(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace,netgo", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	heavy := []string{"net", "crypto", "encoding/json", "fmt", "flag", "regexp", "github.com/spf13", "google.golang.org"}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/bushost/bushost/internal/sandbox" {
			t.Errorf("cmd/sandbox-init links the launcher, %s", p)
		}
		for _, h := range heavy {
			if p == h || strings.HasPrefix(p, h+"/") {
				t.Errorf("cmd/sandbox-init links %s", p)
			}
		}
	}
}

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/treesnap"
)

// $BUSHOST_TESTHOOK_SKIP turns off checks of bushostd only in a test's
// build (tag bushost_testhook). A hostile environment sets it for a daemon
// built as `make build` builds it (the tags of build()): that daemon still
// refuses a push only the beyond-git walk refuses (nested submodule
// names) and one only the streaming object checks refuse (a blob over
// --max-object-bytes), leaving the store as it was, and still takes a
// bundle's descriptor. The same pushes to a test's build with the same
// variable are accepted: the pushes are the ones the switches let through.
// Nothing in the production binaries names the variable.
func TestTesthookSkipIgnoredByProductionBuild(t *testing.T) {
	skip := []string{"BUSHOST_TESTHOOK_SKIP=beyond-git,object-checks,fd-passing"}
	for _, prod := range []bool{true, false} {
		name := map[bool]string{true: "production", false: "testhook"}[prod]
		t.Run(name, func(t *testing.T) {
			o := hostOpts{Env: skip, Args: []string{"--max-object-bytes", "4K"}}
			if !prod {
				o.Daemon = hookBin(t, "bushostd")
			}
			w := newGitWorld(t, o)
			w.commit(t, "a.txt", "one\n")
			b := &beyondWorld{gitWorld: w, base: w.as(t, w.worker, "push-working", "--repo", w.work)}
			pushes := []struct {
				what, want string
				make       func(t *testing.T) string
			}{
				{"nested submodule names", "SUBMODULE_NAME_NESTED", func(t *testing.T) string {
					return b.commit(t, gitmodules(t, b, "[submodule \"a\"]\n\tpath = a\n\turl = ./a\n[submodule \"a/hooks\"]\n\tpath = b\n\turl = ./b\n"))
				}},
				{"a blob over --max-object-bytes", "OBJECT_TOO_LARGE", func(t *testing.T) string {
					return b.commit(t, "100644 blob "+b.blob(t, strings.Repeat("big blob\n", 8<<10))+"\tbig")
				}},
			}
			for _, p := range pushes {
				data, err := os.ReadFile(p.make(t))
				if err != nil {
					t.Fatal(err)
				}
				before := storeSnapshot(t, w.h)
				e := pushRPC(t, w.h, w.worker, data)
				if !prod {
					if e != nil {
						t.Fatalf("%s: the test's build with the skips refused it: %s %s", p.what, e.Reason, e.Message)
					}
					b.base = testGit(t, w.work, "rev-parse", fmt.Sprintf("refs/tags/case%d", b.n))
					continue
				}
				if e == nil || string(e.Reason) != p.want {
					t.Fatalf("%s: %v, want %s", p.what, e, p.want)
				}
				if d := treesnap.Diff(before, storeSnapshot(t, w.h)); d != "" {
					t.Fatalf("%s: store changed:\n%s", p.what, d)
				}
			}
			// A bundle file is pushed by its descriptor (the call's log
			// line says passed=N) unless fd-passing is off.
			f := b.bundle(t, testGit(t, w.work, "commit-tree", "-p", b.base, "-m", "fd", b.base+"^{tree}"))
			w.as(t, w.worker, "push-working", "--bundle", f)
			log, _ := os.ReadFile(w.h.Log)
			if passed := strings.Contains(string(log), " passed="); passed != prod {
				t.Fatalf("descriptor taken: %v, want %v", passed, prod)
			}
		})
	}
	// Nothing `make build` builds names the variable.
	for _, name := range []string{"bushostd", "bushost", "sandbox", "supervisor"} {
		b, err := os.ReadFile(plainBin(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "BUSHOST_TESTHOOK") {
			t.Errorf("%s as make builds it names BUSHOST_TESTHOOK", name)
		}
	}
}

// plainBin builds ./cmd/<name> exactly as `make build` does (its tags, no
// -race) into the test's directory.
func plainBin(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-tags", "grpcnotrace,netgo", "-o", out, "./cmd/"+name)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, b)
	}
	return out
}

package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/testenv"
)

// TestLimitsValues: a session's limits and their values by bounds name
// are one another's inverse, for every limit of the table.
func TestLimitsValues(t *testing.T) {
	l := Limits{Memory: 256 << 20, Pids: 40, CPU: 0.5, NoFile: 64, FSize: 1 << 20, Timeout: 90 * time.Second, Disk: 64 << 20}
	v := l.Values()
	if len(v) != len(bounds.Limits) {
		t.Errorf("Values() = %v: not every limit of the table", v)
	}
	if got := LimitsOf(v); got != l {
		t.Errorf("LimitsOf(Values()) = %+v, want %+v", got, l)
	}
}

// TestProbeCgroup: where no cgroup can be made, the probe says so with
// the run's refusal; limits that need none pass, and nothing is left.
func TestProbeCgroup(t *testing.T) {
	real := cgroupRoot
	t.Cleanup(func() { cgroupRoot = real })
	cgroupRoot = t.TempDir()
	var r *Refusal
	if err := ProbeCgroup(Limits{Pids: 512}); !errors.As(err, &r) || r.Reason != ReasonLimitUnavailable {
		t.Errorf("ProbeCgroup with no cgroup: %v, want LIMIT_UNAVAILABLE", err)
	}
	if err := ProbeCgroup(Limits{NoFile: 64, Timeout: time.Hour}); err != nil {
		t.Errorf("ProbeCgroup of rlimits and a timeout: %v", err)
	}
	if ents, _ := os.ReadDir(cgroupRoot); len(ents) != 0 {
		t.Errorf("the probe left %d entries", len(ents))
	}
}

// TestProbeDisk: the launcher's probe mounts and unmounts a disk, also
// over what a probe cut short left, and leaves nothing.
func TestProbeDisk(t *testing.T) {
	testenv.NeedRoot(t, "mounts a tmpfs")
	dir := filepath.Join(t.TempDir(), "probe-disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MountDisk(dir, 8<<20); err != nil {
		t.Fatal(err)
	}
	// A probe cut short left dir mounted: the next one starts over.
	if err := ProbeDisk(dir, 8<<20); err != nil {
		t.Fatalf("ProbeDisk: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the probe left %s: %v", dir, err)
	}
	var r *Refusal
	if err := ProbeDisk(dir, -1); err == nil || errors.As(err, &r) && r.Reason != ReasonLimitUnavailable {
		t.Errorf("ProbeDisk of no size: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused probe left %s: %v", dir, err)
	}
}

package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// TestMountDiskOnWhatWasMade: a session's disk goes on the empty
// directory of root's its caller made, never through a name swapped for
// a link to another directory, nor on one that holds something or that
// others may write; what was refused is left as it was, unmounted.
func TestMountDiskOnWhatWasMade(t *testing.T) {
	testenv.NeedRoot(t, "mounts a tmpfs")
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.Mkdir(victim, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "disk")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(base, "full")
	if err := os.Mkdir(full, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(full, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{link, full, open, theirs} {
		if err := MountDisk(dir, 8<<20); err == nil {
			UnmountDisk(dir)
			t.Errorf("MountDisk(%s) mounted", dir)
		}
	}
	for _, dir := range []string{victim, full, open, theirs} {
		var here, parent unix.Stat_t
		if err := unix.Stat(dir, &here); err != nil {
			t.Fatal(err)
		}
		if err := unix.Stat(base, &parent); err != nil {
			t.Fatal(err)
		}
		if here.Dev != parent.Dev {
			t.Errorf("%s has a file system mounted on it", dir)
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was changed: %v %v", fi, err)
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

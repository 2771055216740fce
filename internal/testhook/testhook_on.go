//go:build bushost_testhook

package testhook

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Env is POINT=PATH: at POINT, Swap exchanges PATH with PATH.swap.
const Env = "BUSHOST_TESTHOOK_SWAP"

// Swap, when $BUSHOST_TESTHOOK_SWAP names point, exchanges the path it
// gives with that path + ".swap" (renameat2 RENAME_EXCHANGE), where the
// test has put a link to a directory the caller must never reach.
func Swap(point string) {
	at, path, ok := strings.Cut(os.Getenv(Env), "=")
	if !ok || at != point {
		return
	}
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, path+".swap", unix.RENAME_EXCHANGE); err != nil {
		fmt.Fprintf(os.Stderr, "testhook %s: exchange %s: %v\n", point, path, err)
	}
}

// SwapEntry is Swap at an entry of a directory being walked: it exchanges
// the path $BUSHOST_TESTHOOK_SWAP gives only at the entry of that name.
func SwapEntry(point, name string) {
	at, path, ok := strings.Cut(os.Getenv(Env), "=")
	if !ok || at != point || filepath.Base(path) != name {
		return
	}
	Swap(point)
}

// NoIDMapEnv, set to 1, makes sandbox run take its fallback for a kernel
// or file system without idmapped mounts.
const NoIDMapEnv = "BUSHOST_TESTHOOK_NO_IDMAP"

// NoIDMap reports whether $BUSHOST_TESTHOOK_NO_IDMAP is 1.
func NoIDMap() bool { return os.Getenv(NoIDMapEnv) == "1" }

// StepsEnv, set to 1, makes Step write "testhook step NAME UNIXNANO" on
// stderr: a benchmark lines them up with its own clock.
const StepsEnv = "BUSHOST_TESTHOOK_STEPS"

// Step writes when the step named was reached, with $BUSHOST_TESTHOOK_STEPS=1.
func Step(name string) {
	if os.Getenv(StepsEnv) == "1" {
		os.Stderr.WriteString("testhook step " + name + " " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n")
	}
}

// SkipEnv lists, comma-separated, what bushostd skips: beyond-git,
// object-checks, fd-passing (Skips).
const SkipEnv = "BUSHOST_TESTHOOK_SKIP"

// Skipped reads $BUSHOST_TESTHOOK_SKIP; a name it does not know is said on
// stderr, so that a test with a typo does not measure the wrong daemon
// unawares.
func Skipped() Skips {
	var s Skips
	for _, name := range strings.Split(os.Getenv(SkipEnv), ",") {
		switch name {
		case "":
		case "beyond-git":
			s.BeyondGit = true
		case "object-checks":
			s.ObjectChecks = true
		case "fd-passing":
			s.FDPassing = true
		default:
			fmt.Fprintf(os.Stderr, "testhook: %s: no such skip %q\n", SkipEnv, name)
		}
	}
	return s
}

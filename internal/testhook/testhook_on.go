//go:build bushost_testhook

package testhook

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Env names the point at which Swap acts; nothing else reads it.
const Env = "BUSHOST_TESTHOOK_SWAP"

// Swap, when $BUSHOST_TESTHOOK_SWAP names point, exchanges path with
// path+".swap" (renameat2 RENAME_EXCHANGE): the test has put a link to a
// directory the caller must never reach there.
func Swap(point, path string) {
	if os.Getenv(Env) != point {
		return
	}
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, path+".swap", unix.RENAME_EXCHANGE); err != nil {
		fmt.Fprintf(os.Stderr, "testhook %s: exchange %s: %v\n", point, path, err)
	}
}

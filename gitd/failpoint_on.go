//go:build bushost_failpoints

package gitd

import (
	"os"
	"syscall"
)

// Failpoints for crash tests, built only with the tag bushost_failpoints.
// $BUSHOST_FAILPOINT names the point at which the process kills itself
// with SIGKILL, as a power cut or the OOM killer would:
//
//	land:after-record  a landing is in the log, main has not moved yet
//	migrate:staged     a project's new layout is staged, not yet renamed
//	                   into place
//	migrate:renamed    the new layout is in place, the old repository not
//	                   yet removed
//	export:sending     an export began and sent its manifest, not yet its
//	                   bundles: the file is cut
var failMode = os.Getenv("BUSHOST_FAILPOINT")

func crashpoint(name string) {
	if failMode == name {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

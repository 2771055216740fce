package integration

import (
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/testenv"
)

// TestLaunchREADME runs the README's "A lead that launches a worker"
// exactly as written, with the built binaries in ./bin, and checks what it
// says happened: a worker launched from inside the lead session pushed,
// the lead waited for it and asked for a review, and the log holds the
// session's records.
func TestLaunchREADME(t *testing.T) {
	testenv.NeedRoot(t, "the README's launch is run as root")
	text, errOut := runREADMESection(t, "A lead that launches a worker", "/var/tmp/bushost-launch-")
	for _, want := range []string{"launched s-", "worker ended", "\nreview ", "session.launched", "session.ended", "action.allowed", "exited", "removed session s-"} {
		if !strings.Contains(text, want) {
			t.Errorf("the README's launch printed no %q:\n%s\n%s", want, text, errOut)
		}
	}
	t.Logf("the README's launch:\n%s", text)
}

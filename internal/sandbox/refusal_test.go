package sandbox

import (
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// TestReasonsAreErrdefs keeps the sandbox's reason strings equal to the
// project's vocabulary, which the sandbox does not import.
func TestReasonsAreErrdefs(t *testing.T) {
	for got, want := range map[string]errdefs.Reason{
		ReasonArgumentInvalid:       errdefs.ArgumentInvalid,
		ReasonRunDirNotEmpty:        errdefs.RunDirNotEmpty,
		ReasonLimitUnavailable:      errdefs.LimitUnavailable,
		ReasonAbstractScopeMissing:  errdefs.AbstractScopeMissing,
		ReasonSessionUIDsExhausted:  errdefs.SessionUIDsExhausted,
		ReasonEgressDenied:          errdefs.EgressDenied,
		ReasonEgressConnections:     errdefs.EgressConnections,
		ReasonEgressUnrecorded:      errdefs.EgressUnrecorded,
		ReasonLaunchingSessionEnded: errdefs.LaunchingSessionEnded,
	} {
		if got != string(want) {
			t.Errorf("sandbox reason %q, errdefs says %q", got, want)
		}
	}
	for exit, want := range map[int]int{exitRefused: errdefs.ExitRefused, exitConflict: errdefs.ExitConflict,
		exitInvalid: errdefs.ExitInvalid, exitLimit: errdefs.ExitLimit} {
		if exit != want {
			t.Errorf("sandbox exit %d, errdefs says %d", exit, want)
		}
	}
}

package sandbox

import (
	"fmt"
	"slices"

	"github.com/bushost/bushost/internal/sandbox/pid1"
)

// UnavailableError means bwrap cannot confine a session here. There is no
// unconfined fallback: the caller refuses with this reason.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return "sandbox-unavailable: " + e.Reason }

// The descriptors run hands to bwrap after stdin, stdout and stderr. bwrap
// takes the first two; the session's pid 1 inherits 5 to 8, in the order
// pid1 gives them: pid1.FDMonitor, FDReady, FDGate, FDRelay.
const (
	fdSeccomp = 3
	fdStatus  = 4 // bwrap's --json-status-fd: pid 1's host pid, the command's status
	fdGate    = pid1.FDGate
	// fdWorkspace is the workspace as opened and checked: bwrap binds it
	// with --bind-fd (and closes it), so no path is resolved again.
	fdWorkspace = 9
	// fdBusSockets is the first of the bus sockets as opened and checked
	// (Plan.busFDs, in their order), bound with --ro-bind-fd: the home
	// they lie in is its owner's to rename in.
	fdBusSockets = fdWorkspace + 1
)

// bwrapArgs is the bwrap command line for the plan, up to and including
// the "--" before the session's pid 1 and its command.
func (p *Plan) bwrapArgs() []string {
	args := append(confineArgs(p.Config.Net), "--as-pid-1", "--hostname", "sandbox", "--json-status-fd", fmt.Sprint(fdStatus))
	args = append(args, bindArgs(p.Binds, p.Workspace, p.busSockets)...)
	return append(args, "--chdir", p.Workspace, "--")
}

// confineArgs are the namespaces and the hardening bwrap gives a session
// of network mode net, as run and Probe start it.
func confineArgs(net string) []string {
	args := []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"}
	if net != NetHost {
		args = append(args, "--unshare-net")
	}
	return append(args, "--disable-userns", "--new-session", "--cap-drop", "ALL", "--seccomp", fmt.Sprint(fdSeccomp))
}

// bindArgs turns the bind table into bwrap's options; the workspace's
// read-write bind and the bus sockets' read-only ones are made from their
// descriptors (fdWorkspace, fdBusSockets on).
func bindArgs(binds []Bind, workspace string, sockets []string) []string {
	var args []string
	for _, b := range binds {
		switch i := slices.Index(sockets, b.Source); {
		case b.Kind == KindBind && b.Source == workspace:
			args = append(args, "--bind-fd", fmt.Sprint(fdWorkspace), b.Target)
		case b.Kind == KindROBind && i >= 0:
			args = append(args, "--ro-bind-fd", fmt.Sprint(fdBusSockets+i), b.Target)
		case b.Kind == KindProc, b.Kind == KindDev, b.Kind == KindRemountRO:
			args = append(args, "--"+b.Kind, b.Target)
		default:
			args = append(args, "--"+b.Kind, b.Source, b.Target)
		}
	}
	return args
}

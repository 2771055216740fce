package sandbox

import "fmt"

// UnavailableError means bwrap cannot confine a session here. There is no
// unconfined fallback: the caller refuses with this reason.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return "sandbox-unavailable: " + e.Reason }

// The descriptors run hands to bwrap (exec.Cmd.ExtraFiles start at 3).
const (
	fdSeccomp = 3
	fdReady   = 4
	fdInfo    = 5
)

// bwrapArgs is the bwrap command line for the plan, up to and including
// the "--" before the session's pid 1 and its command.
func (p *Plan) bwrapArgs() []string {
	args := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
	}
	if !p.Config.Net {
		args = append(args, "--unshare-net")
	}
	args = append(args,
		"--disable-userns", "--new-session", "--cap-drop", "ALL", "--as-pid-1",
		"--hostname", "sandbox",
		"--seccomp", fmt.Sprint(fdSeccomp),
		"--info-fd", fmt.Sprint(fdInfo),
	)
	args = append(args, bindArgs(p.Binds)...)
	return append(args, "--chdir", p.Workspace, "--")
}

func bindArgs(binds []Bind) []string {
	var args []string
	for _, b := range binds {
		switch b.Kind {
		case KindProc, KindDev, KindRemountRO:
			args = append(args, "--"+b.Kind, b.Target)
		default:
			args = append(args, "--"+b.Kind, b.Source, b.Target)
		}
	}
	return args
}

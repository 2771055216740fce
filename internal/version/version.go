// Package version says which build of bushost is running, from the Go
// build information (module version and VCS revision), for every binary's
// --version and for logs and metrics.
package version

import (
	"fmt"
	"runtime/debug"
)

// Info is what the build recorded about itself.
type Info struct {
	Module   string // module version, "(devel)" for a local build
	Revision string // VCS revision, "" when unknown
	Time     string // VCS commit time
	Modified bool   // the work tree had uncommitted changes
	Go       string // the Go version that built it
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Module: "unknown"}
	}
	in := Info{Module: bi.Main.Version, Go: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	if in.Module == "" {
		in.Module = "(devel)"
	}
	return in
}

// String is one line: "MODULE (rev REV[+dirty], TIME) GO".
func (in Info) String() string {
	rev := in.Revision
	if rev == "" {
		rev = "unknown"
	}
	if in.Modified {
		rev += "+dirty"
	}
	s := fmt.Sprintf("%s (rev %s", in.Module, rev)
	if in.Time != "" {
		s += ", " + in.Time
	}
	return s + ") " + in.Go
}

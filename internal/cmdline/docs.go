package cmdline

import (
	"os"
	"path/filepath"
)

// InstalledDoc returns the path of the installed document name (such as
// "supervisor.md") for the running executable: make install puts the
// binaries in PREFIX/bin and the docs in PREFIX/share/doc/bushost, so it
// is looked for there, beside the executable's own directory. "" when it
// is not there (a binary run from the build tree).
func InstalledDoc(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	p := filepath.Join(filepath.Dir(filepath.Dir(exe)), "share", "doc", "bushost", name)
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return p
}

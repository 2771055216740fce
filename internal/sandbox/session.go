package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/safepath"
)

// SessionVersion is the version of session.json this sandbox writes.
const SessionVersion = 1

// sessionTokenName is the token's file in the run directory.
const sessionTokenName = "token"

// Bounds on what prepare copies in and run reads back.
const (
	maxSessionJSON = 64 << 10
	maxToken       = 4096
	maxGitField    = 256
)

// SessionFile is RUN/session.json, the host's description of a session
// (docs/sandbox.md, "session.json"). The session reads it, never writes it
// (it is bound read-only). Every field is optional to run, which takes
// what is there: a host may write its own.
type SessionFile struct {
	Version  int      `json:"version"`
	Business string   `json:"business,omitempty"`
	Project  string   `json:"project,omitempty"`
	Task     string   `json:"task,omitempty"`
	Role     string   `json:"role,omitempty"`
	Caps     []string `json:"caps,omitempty"`
	// TokenFile names the grant's token in the run directory; run points
	// $BUS_TOKEN_FILE at it.
	TokenFile string       `json:"token_file,omitempty"`
	Git       *GitIdentity `json:"git,omitempty"`
	// Network is the egress allow-list of a --net=proxy session, added to
	// the command line's --allow-domain and --allow-host.
	Network *SessionNetwork `json:"network,omitempty"`
}

// SessionNetwork is session.json's egress allow-list.
type SessionNetwork struct {
	AllowDomains []string `json:"allow_domains,omitempty"`
	AllowHosts   []string `json:"allow_hosts,omitempty"`
}

// maxAllowRules bounds each list of session.json's allow-list.
const maxAllowRules = 256

func (n *SessionNetwork) check() error {
	if len(n.AllowDomains) > maxAllowRules || len(n.AllowHosts) > maxAllowRules {
		return fmt.Errorf("network: at most %d allow_domains and %d allow_hosts", maxAllowRules, maxAllowRules)
	}
	for _, d := range n.AllowDomains {
		if err := bounds.CheckDomainPattern(d); err != nil {
			return fmt.Errorf("network.allow_domains: %w", err)
		}
	}
	for _, h := range n.AllowHosts {
		if err := bounds.CheckHostPort(h); err != nil {
			return fmt.Errorf("network.allow_hosts: %w", err)
		}
	}
	return nil
}

// GitIdentity is the author and committer of the session's commits.
type GitIdentity struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// check bounds an identity that ends up in commit headers: no control
// characters (a newline would forge a header) and no angle brackets.
func (g *GitIdentity) check() error {
	for _, f := range []struct{ name, v string }{{"git name", g.Name}, {"git email", g.Email}} {
		if f.v == "" || len(f.v) > maxGitField {
			return fmt.Errorf("%s: want 1 to %d bytes", f.name, maxGitField)
		}
		if strings.ContainsAny(f.v, "<>") || strings.IndexFunc(f.v, unicode.IsControl) >= 0 {
			return fmt.Errorf("%s %q: no control characters, '<' or '>'", f.name, f.v)
		}
	}
	if !strings.Contains(g.Email, "@") {
		return fmt.Errorf("git email %q has no @", g.Email)
	}
	return nil
}

// readSessionFile reads session.json from the run directory's descriptor
// without following a link, bounded in size, and checks what run will act
// on: a file another user owns or can write is refused (it says what the
// session may reach).
func readSessionFile(run *safepath.Handle) (*SessionFile, error) {
	runDir := run.Path()
	path := filepath.Join(runDir, "session.json")
	f, err := openInRunDir(run, "session.json", os.Geteuid())
	if err != nil {
		return nil, fmt.Errorf("run directory %s has no regular file session.json of its owner's (sandbox prepare writes it; the session may only read it): %w", runDir, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSessionJSON+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxSessionJSON {
		return nil, fmt.Errorf("%s is over %d bytes", path, maxSessionJSON)
	}
	var s SessionFile
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s is not the JSON docs/sandbox.md describes: %w", path, err)
	}
	if s.Version > SessionVersion {
		return nil, fmt.Errorf("%s has version %d; this sandbox reads up to %d", path, s.Version, SessionVersion)
	}
	if s.TokenFile != "" && (s.TokenFile != filepath.Base(s.TokenFile) || s.TokenFile == ".." || s.TokenFile == ".") {
		return nil, fmt.Errorf("%s: token_file %q must name a file in the run directory", path, s.TokenFile)
	}
	if s.Git != nil {
		if err := s.Git.check(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if s.Network != nil {
		if err := s.Network.check(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return &s, nil
}

// openInRunDir opens name, a regular file in the run directory, following
// no link and never blocking: a file root or uid owns and nobody else can
// write, or a refusal naming its owner.
func openInRunDir(run *safepath.Handle, name string, uid int) (*os.File, error) {
	path := filepath.Join(run.Path(), name)
	fd, err := safepath.OpenBeneath(run.Fd(), name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err == nil {
		err = safepath.Trusted(path, &st, uid)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Prepare is `sandbox prepare`: it makes the run directory a session runs
// in and returns the exit status.
func Prepare(args []string, stdout, stderr io.Writer) int {
	cfg, err := ParsePrepareFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "sandbox prepare: %v\n", err)
		}
		return 2
	}
	if err := PrepareRunDir(cfg); err != nil {
		fmt.Fprintf(stderr, "sandbox prepare: %v\n", err)
		var r *Refusal
		if errors.As(err, &r) {
			return r.Exit
		}
		return 1
	}
	fmt.Fprintln(stdout, filepath.Join(cfg.RunDir, "session.json"))
	return 0
}

// PrepareRunDir makes cfg.RunDir (or fills it, if it is an empty
// directory): session.json, the token (0400), bundle/ (0755), and empty
// home/ and tmp/ (0700), all owned by the caller; run hands home/, tmp/
// and the token to the session's user for the session. Every file is made
// through the directory's descriptor, never following a link. On failure
// nothing it made is left.
func PrepareRunDir(cfg *PrepareConfig) (err error) {
	token, err := readToken(cfg.TokenFile)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(cfg.Session, "", "  ")
	if err != nil {
		return err
	}
	dir, err := callerDir("run directory", cfg.RunDir)
	if err != nil {
		return refuse(ReasonArgumentInvalid, exitInvalid, "%v", err)
	}
	// The directory it is made in, reached from / through no link and
	// no directory another user controls; the run directory itself is
	// made, or found, there and held by its descriptor.
	parent, err := safepath.OpenDir(filepath.Dir(dir), os.Geteuid())
	if err != nil {
		return err
	}
	defer parent.Close()
	base := filepath.Base(dir)
	made := false
	switch err := unix.Mkdirat(parent.Fd(), base, 0o755); {
	case err == nil:
		made = true
	case errors.Is(err, unix.EEXIST):
	default:
		return fmt.Errorf("make run directory %s: %w", dir, err)
	}
	runFD, err := safepath.OpenBeneath(parent.Fd(), base, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open run directory %s (a directory, not a symlink): %w", dir, err)
	}
	runDir := os.NewFile(uintptr(runFD), dir)
	defer runDir.Close()
	var st unix.Stat_t
	if err := unix.Fstat(runFD, &st); err != nil {
		return err
	}
	// An existing one another user owns or can write is not the host's:
	// that user could rewrite session.json or the token under the session.
	if err := safepath.Trusted(dir, &st, os.Geteuid()); err != nil {
		return err
	}
	if names, err := runDir.Readdirnames(1); err != nil && err != io.EOF {
		return fmt.Errorf("read %s: %w", dir, err)
	} else if len(names) > 0 {
		return refuse(ReasonRunDirNotEmpty, exitConflict, "run directory %s is not empty: prepare makes a new session's directory, it never rewrites one", dir)
	}
	var created []entry // flags: unix.AT_REMOVEDIR for a directory
	defer func() {
		if err == nil {
			return
		}
		for i := len(created) - 1; i >= 0; i-- {
			_ = unix.Unlinkat(runFD, created[i].name, created[i].flags)
		}
		if made {
			_ = unix.Unlinkat(parent.Fd(), base, unix.AT_REMOVEDIR)
		}
	}()
	for _, f := range []struct {
		name string
		mode uint32
		data []byte
	}{
		{"session.json", 0o644, append(data, '\n')},
		{sessionTokenName, 0o400, append([]byte(token), '\n')},
	} {
		fd, err := unix.Openat(runFD, f.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, f.mode)
		if err != nil {
			return fmt.Errorf("make %s: %w", filepath.Join(dir, f.name), err)
		}
		created = append(created, entry{f.name, 0})
		w := os.NewFile(uintptr(fd), f.name)
		_, werr := w.Write(f.data)
		if werr == nil {
			werr = unix.Fchmod(fd, f.mode) // whatever the umask said
		}
		cerr := w.Close()
		if werr != nil || cerr != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, f.name), errors.Join(werr, cerr))
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"bundle", 0o755}, {"home", 0o700}, {"tmp", 0o700}} {
		if err := unix.Mkdirat(runFD, d.name, d.mode); err != nil {
			return fmt.Errorf("make %s: %w", filepath.Join(dir, d.name), err)
		}
		created = append(created, entry{d.name, unix.AT_REMOVEDIR})
		fd, err := unix.Openat(runFD, d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = unix.Fchmod(fd, d.mode)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("chmod %s: %w", filepath.Join(dir, d.name), err)
		}
	}
	return nil
}

// entry is a name in the run directory and the flags to open it, or to
// unlink it, with.
type entry struct {
	name  string
	flags int
}

// readToken reads a grant's token: one line of printable ASCII, bounded,
// from a regular file reached through no link and no directory another
// user controls, and owned by root or the caller (a fifo is refused
// before it is opened, so nothing blocks).
func readToken(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	h, err := safepath.OpenFile(abs, os.Geteuid(), unix.O_RDONLY)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	f, err := h.File()
	h.Close()
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxToken+1))
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	tok := string(bytes.TrimSpace(data))
	if len(data) > maxToken || tok == "" || strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return "", refuse(ReasonArgumentInvalid, exitInvalid, "--token-file %s: want one token of printable ASCII, at most %d bytes", path, maxToken)
	}
	return tok, nil
}

// sameCaps reports whether a and b hold the same capabilities.
func sameCaps(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), slices.Compact(y))
}

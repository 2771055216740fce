package sandbox

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/bushost/bushost/internal/names"
)

// The capabilities a grant may hold (DESIGN.md, "Identity and capabilities").
const (
	CapPushWorking   = "git.push.working"
	CapReviewRequest = "review.request"
	CapReviewVerdict = "review.verdict"
	CapTaskClose     = "task.close"
	CapEventRecord   = "event.record"
)

var knownCaps = map[string]bool{
	CapPushWorking: true, CapReviewRequest: true, CapReviewVerdict: true,
	CapTaskClose: true, CapEventRecord: true,
}

// validRole checks a role name: the rule of business, project and task
// names, and no "..".
func validRole(s string) bool {
	return names.Matches(s) && !strings.Contains(s, "..")
}

// ErrUsage marks a command line that cannot be understood; the caller prints
// the message and exits 2.
var ErrUsage = errors.New("usage")

// Config is what the caller asked for, before any path is checked.
type Config struct {
	RunDir       string
	Workspace    string
	Role         string
	Caps         []string
	BrokerSocket string
	GitSocket    string
	Net          bool
	RO           []string
	Env          []string // NAME=VALUE or NAME (taken from sandbox's own environment)
	User         string   // session user when started as root; "" means the default
	Bushost      string   // "" means: next to the sandbox executable, else on PATH
	Bwrap        string   // "" means /usr/bin/bwrap, else bwrap on PATH
	// Init is the executable bound as the session's pid 1 and run with
	// InitVerb; "" means this one (cmd/sandbox hands InitVerb to Init).
	Init    string
	JSON    bool
	Command []string
}

// HasCap reports whether the role holds capability c.
func (c *Config) HasCap(cap string) bool {
	for _, h := range c.Caps {
		if h == cap {
			return true
		}
	}
	return false
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// ParseFlags reads the flags of "explain" or "run" (verb). run requires a
// command after the flags ("--" is optional but recommended); explain takes
// none.
func ParseFlags(verb string, args []string, stderr io.Writer) (*Config, error) {
	c := &Config{}
	fs := flag.NewFlagSet("sandbox "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var caps string
	var ro, env listFlag
	fs.StringVar(&c.RunDir, "run-dir", "", "the run directory (session.json, bundle/, home/, tmp/)")
	fs.StringVar(&c.Workspace, "workspace", "", "the workspace the session works in (read-write)")
	fs.StringVar(&c.Role, "role", "", "the session's role name")
	fs.StringVar(&caps, "caps", "", "the role's capabilities, comma-separated")
	fs.StringVar(&c.BrokerSocket, "broker-socket", "", "the bus host's broker.sock")
	fs.StringVar(&c.GitSocket, "git-socket", "", "the bus host's git.sock (bound only for git.push.working or review.verdict)")
	fs.BoolVar(&c.Net, "net", false, "share the host's network (default: no network)")
	fs.Var(&ro, "ro", "bind PATH read-only at the same path (repeatable)")
	fs.Var(&env, "env", "set NAME=VALUE in the session, or pass NAME through (repeatable)")
	fs.StringVar(&c.User, "user", "", "run the session as this user when started as root (default nobody)")
	fs.StringVar(&c.Bushost, "bushost", "", "the bushost client to bind; must exist (default: next to sandbox, else on PATH, else none, with a note)")
	fs.StringVar(&c.Bwrap, "bwrap", "", "the bwrap binary (default /usr/bin/bwrap, else on PATH)")
	if verb == "explain" {
		fs.BoolVar(&c.JSON, "json", false, "print the plan as JSON")
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	c.RO, c.Env = ro, env
	rest := fs.Args()
	switch verb {
	case "run":
		if len(rest) == 0 {
			return nil, fmt.Errorf("%w: sandbox run needs a command after the flags (-- COMMAND...)", ErrUsage)
		}
		c.Command = rest
	default:
		if len(rest) != 0 {
			return nil, fmt.Errorf("%w: sandbox %s takes no arguments, got %q", ErrUsage, verb, rest)
		}
	}
	for _, req := range []struct{ name, v string }{
		{"--run-dir", c.RunDir}, {"--workspace", c.Workspace}, {"--role", c.Role}, {"--broker-socket", c.BrokerSocket},
	} {
		if req.v == "" {
			return nil, fmt.Errorf("%w: %s is required", ErrUsage, req.name)
		}
	}
	if !validRole(c.Role) {
		return nil, fmt.Errorf("%w: role %q: want %s and no '..'", ErrUsage, c.Role, names.Pattern)
	}
	if caps != "" {
		for _, cp := range strings.Split(caps, ",") {
			cp = strings.TrimSpace(cp)
			if !knownCaps[cp] {
				return nil, fmt.Errorf("%w: unknown capability %q (known: %s, %s, %s, %s, %s)", ErrUsage, cp,
					CapPushWorking, CapReviewRequest, CapReviewVerdict, CapTaskClose, CapEventRecord)
			}
			if !c.HasCap(cp) {
				c.Caps = append(c.Caps, cp)
			}
		}
	}
	for _, e := range c.Env {
		name, _, _ := strings.Cut(e, "=")
		if name == "" || strings.ContainsAny(name, " \t\n\x00") {
			return nil, fmt.Errorf("%w: --env %q: want NAME=VALUE or NAME", ErrUsage, e)
		}
	}
	return c, nil
}

// sessionEnv is the whole environment of the session: nothing of the
// caller's leaks in except what --env names.
func (c *Config) sessionEnv(p *Plan) []string {
	env := []string{
		"PATH=" + sessionBinDir + ":/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"HOME=" + p.Home,
		"TMPDIR=/tmp",
		"USER=" + p.User.Name,
		"LOGNAME=" + p.User.Name,
		"LANG=C.UTF-8",
	}
	if t, ok := os.LookupEnv("TERM"); ok {
		env = append(env, "TERM="+t)
	}
	for _, e := range c.Env {
		if strings.Contains(e, "=") {
			env = append(env, e)
		} else if v, ok := os.LookupEnv(e); ok {
			env = append(env, e+"="+v)
		}
	}
	return env
}

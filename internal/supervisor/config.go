package supervisor

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/bushost/bushost/internal/names"
)

// Duration is a time.Duration written in TOML as a string ("500ms", "30s").
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// Identity is a git author and committer.
type Identity struct {
	Name  string `toml:"name"`
	Email string `toml:"email"`
}

// HealthCheck is a service's optional probe; at most one of HTTP, TCP and
// Exec is set.
type HealthCheck struct {
	HTTP     string   `toml:"http"`
	TCP      string   `toml:"tcp"`
	Exec     []string `toml:"exec"`
	Interval Duration `toml:"interval"`
	Timeout  Duration `toml:"timeout"`
}

// ServiceConfig is one [[service]] table.
type ServiceConfig struct {
	Name    string   `toml:"name"`
	Command []string `toml:"command"`
	// Dir is relative to the workspace; the service runs there.
	Dir string   `toml:"dir"`
	Env []string `toml:"env"`
	// Revertable is a pointer so that a missing key can default to true.
	Revertable *bool        `toml:"revertable"`
	Health     *HealthCheck `toml:"health"`
}

// IsRevertable reports whether a crash loop of this service reverts the tree.
func (s *ServiceConfig) IsRevertable() bool { return s.Revertable == nil || *s.Revertable }

// Config is the supervisor's configuration file. Every key has a default
// (see Default and README.md).
type Config struct {
	Workspace        string          `toml:"workspace"`
	GitDir           string          `toml:"git_dir"`
	Watch            []string        `toml:"watch"`
	Ignore           []string        `toml:"ignore"`
	AppUser          string          `toml:"app_user"`
	AgentUser        string          `toml:"agent_user"`
	ServicesUser     string          `toml:"services_user"`
	HealthAddr       string          `toml:"health_addr"`
	HealthSocket     string          `toml:"health_socket"`
	NotifyURL        string          `toml:"notify_url"`
	Debounce         Duration        `toml:"debounce"`
	GoodAfter        Duration        `toml:"good_after"`
	CrashWindow      Duration        `toml:"crash_window"`
	CrashThreshold   int             `toml:"crash_threshold"`
	MaxFailedReverts int             `toml:"max_failed_reverts"`
	RestartBackoff   Duration        `toml:"restart_backoff"`
	MaxBackoff       Duration        `toml:"max_backoff"`
	StopGrace        Duration        `toml:"stop_grace"`
	Agent            Identity        `toml:"agent"`
	Supervisor       Identity        `toml:"supervisor"`
	Services         []ServiceConfig `toml:"service"`
}

// Default health check timing, used when a [service.health] table omits it.
const (
	defaultHealthInterval = time.Second
	defaultHealthTimeout  = 2 * time.Second
)

// DefaultGitDir is where the supervisor keeps its own repository unless the
// file says otherwise: beside its other state, outside any workspace.
const DefaultGitDir = "/var/lib/bushost-supervisor/git"

// defaultIgnore names what never belongs in a commit: dependencies, build
// output, secrets and editor litter. Each entry matches one path component
// (a file or a directory, at any depth of the watched trees); '*' and '?'
// match within a component.
var defaultIgnore = []string{
	"node_modules", "dist", "build", ".cache", "__pycache__", "*.pyc", ".venv",
	"*.log", ".env", ".DS_Store", "*.swp", "*~",
}

// Default returns the configuration an empty file gives.
func Default() Config {
	return Config{
		Workspace:        "/workspace",
		GitDir:           DefaultGitDir,
		Watch:            []string{"src"},
		Ignore:           append([]string(nil), defaultIgnore...),
		AppUser:          "app",
		AgentUser:        "agent",
		ServicesUser:     "svc",
		HealthAddr:       "127.0.0.1:3002",
		Debounce:         Duration{500 * time.Millisecond},
		GoodAfter:        Duration{30 * time.Second},
		CrashWindow:      Duration{60 * time.Second},
		CrashThreshold:   3,
		MaxFailedReverts: 3,
		RestartBackoff:   Duration{time.Second},
		MaxBackoff:       Duration{30 * time.Second},
		StopGrace:        Duration{5 * time.Second},
		Agent:            Identity{Name: "agent", Email: "agent@localhost"},
		Supervisor:       Identity{Name: "supervisor", Email: "supervisor@localhost"},
	}
}

// ConfigError is a configuration problem; Key names the offending key the
// way it is written in the file ("debounce", "service[1].health.http").
type ConfigError struct {
	File string
	Key  string
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("config %s: %s: %s", e.File, e.Key, e.Msg)
}

// LoadConfig reads and checks the file at path. A relative workspace is taken
// relative to the file's directory.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig checks data as if read from path.
func ParseConfig(path string, data []byte) (*Config, error) {
	// A list the file sets replaces the default one: toml sets a slice's
	// length to the file's, it does not append.
	cfg := Default()
	md, err := toml.Decode(string(data), &cfg)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &ConfigError{File: path, Key: pe.LastKey, Msg: fmt.Sprintf("line %d: %s", pe.Position.Line, pe.Message)}
		}
		key := ""
		if m := lastKeyRE.FindStringSubmatch(err.Error()); m != nil {
			key = m[1]
		}
		return nil, &ConfigError{File: path, Key: key, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
	}
	if und := md.Undecoded(); len(und) > 0 {
		// The first in sorted order, whatever order the file has them in.
		key := und[0].String()
		for _, k := range und[1:] {
			key = min(key, k.String())
		}
		return nil, &ConfigError{File: path, Key: key, Msg: "unknown key"}
	}
	for _, k := range []struct {
		key string
		p   *string
	}{{"workspace", &cfg.Workspace}, {"git_dir", &cfg.GitDir}, {"health_socket", &cfg.HealthSocket}} {
		if *k.p != "" && !filepath.IsAbs(*k.p) {
			abs, err := filepath.Abs(filepath.Join(filepath.Dir(path), *k.p))
			if err != nil {
				return nil, &ConfigError{File: path, Key: k.key, Msg: err.Error()}
			}
			*k.p = abs
		}
	}
	for i := range cfg.Services {
		s := &cfg.Services[i]
		s.Dir = cmp.Or(s.Dir, ".")
		if h := s.Health; h != nil {
			h.Interval.Duration = cmp.Or(h.Interval.Duration, defaultHealthInterval)
			h.Timeout.Duration = cmp.Or(h.Timeout.Duration, defaultHealthTimeout)
		}
	}
	if err := cfg.check(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = path
		}
		return nil, err
	}
	return &cfg, nil
}

// lastKeyRE finds the key in the toml package's type errors.
var lastKeyRE = regexp.MustCompile(`\(last key "([^"]+)"\)`)

// reservedTops are workspace entries the agent must never own, so no watch
// entry may lie in or over them.
var reservedTops = []string{".git", "infra", "AGENTS.md"}

func (c *Config) check() error {
	bad := func(key, format string, a ...any) error {
		return &ConfigError{Key: key, Msg: fmt.Sprintf(format, a...)}
	}
	if c.Workspace == "" || filepath.Clean(c.Workspace) == "/" {
		return bad("workspace", "must be a directory other than /")
	}
	c.Workspace = filepath.Clean(c.Workspace)
	if c.GitDir == "" || filepath.Clean(c.GitDir) == "/" {
		return bad("git_dir", "must be a directory other than /")
	}
	c.GitDir = filepath.Clean(c.GitDir)
	if within(c.GitDir, c.Workspace) || within(c.Workspace, c.GitDir) {
		return bad("git_dir", "%q must lie outside the workspace %q (the agent must not reach it), and hold no workspace", c.GitDir, c.Workspace)
	}
	for i, pat := range c.Ignore {
		if err := checkIgnorePattern(pat); err != nil {
			return bad(fmt.Sprintf("ignore[%d]", i), "%q: %v", pat, err)
		}
	}
	users := map[string]string{}
	for _, u := range []struct{ key, name string }{{"app_user", c.AppUser}, {"agent_user", c.AgentUser}, {"services_user", c.ServicesUser}} {
		if !userNameRE.MatchString(u.name) {
			return bad(u.key, "%q must match %s", u.name, userNameRE)
		}
		if other, ok := users[u.name]; ok {
			return bad(u.key, "%q is also %s: the three users must differ", u.name, other)
		}
		users[u.name] = u.key
	}
	if len(c.Watch) == 0 {
		return bad("watch", "must name at least one tree")
	}
	for i, w := range c.Watch {
		key := fmt.Sprintf("watch[%d]", i)
		clean, err := relInside(w)
		if err != nil {
			return bad(key, "%q: %v", w, err)
		}
		if clean == "." {
			return bad(key, `"." would hand the whole workspace, infra/ included, to the agent`)
		}
		if top, _, _ := strings.Cut(clean, "/"); slices.Contains(reservedTops, top) {
			return bad(key, "%q lies in %s, which the agent must not own", w, top)
		}
		if slices.Contains(c.Watch[:i], clean) {
			return bad(key, "%q is listed twice", w)
		}
		c.Watch[i] = clean
	}
	if _, _, err := net.SplitHostPort(c.HealthAddr); c.HealthAddr != "" && err != nil {
		return bad("health_addr", "%q: %v", c.HealthAddr, err)
	}
	if c.HealthSocket != "" {
		c.HealthSocket = filepath.Clean(c.HealthSocket)
		if within(c.HealthSocket, c.Workspace) || within(c.HealthSocket, c.GitDir) {
			return bad("health_socket", "%q must lie outside the workspace and git_dir: the agent must not reach it", c.HealthSocket)
		}
		if len(c.HealthSocket) > 100 {
			return bad("health_socket", "%q is longer than a socket path may be (100 bytes)", c.HealthSocket)
		}
	}
	if c.NotifyURL != "" && !isHTTPURL(c.NotifyURL) {
		return bad("notify_url", "%q is not an http(s) URL", c.NotifyURL)
	}
	for key, d := range map[string]time.Duration{
		"debounce": c.Debounce.Duration, "good_after": c.GoodAfter.Duration,
		"crash_window": c.CrashWindow.Duration, "restart_backoff": c.RestartBackoff.Duration,
		"max_backoff": c.MaxBackoff.Duration, "stop_grace": c.StopGrace.Duration,
	} {
		if d <= 0 {
			return bad(key, "must be a positive duration such as \"500ms\", got %v", d)
		}
	}
	if c.MaxBackoff.Duration < c.RestartBackoff.Duration {
		return bad("max_backoff", "must not be shorter than restart_backoff (%v)", c.RestartBackoff.Duration)
	}
	if c.CrashThreshold < 1 {
		return bad("crash_threshold", "must be at least 1, got %d", c.CrashThreshold)
	}
	if c.MaxFailedReverts < 0 {
		return bad("max_failed_reverts", "must not be negative, got %d", c.MaxFailedReverts)
	}
	for _, id := range []struct {
		key string
		v   Identity
	}{{"agent", c.Agent}, {"supervisor", c.Supervisor}} {
		if err := checkIdentityPart(id.v.Name); err != nil {
			return bad(id.key+".name", "%q: %v", id.v.Name, err)
		}
		if err := checkIdentityPart(id.v.Email); err != nil {
			return bad(id.key+".email", "%q: %v", id.v.Email, err)
		}
	}
	for i := range c.Services {
		s := &c.Services[i]
		key := fmt.Sprintf("service[%d]", i)
		if !names.Matches(s.Name) {
			return bad(key+".name", "%q must match %s", s.Name, names.Pattern)
		}
		if slices.ContainsFunc(c.Services[:i], func(o ServiceConfig) bool { return o.Name == s.Name }) {
			return bad(key+".name", "%q is used by another service", s.Name)
		}
		if len(s.Command) == 0 || s.Command[0] == "" {
			return bad(key+".command", "must be a non-empty list such as [\"bash\", \"-c\", \"exec ./serve.sh\"]")
		}
		dir, err := relInside(s.Dir)
		if err != nil {
			return bad(key+".dir", "%q: %v", s.Dir, err)
		}
		s.Dir = dir
		for j, kv := range s.Env {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
				return bad(fmt.Sprintf("%s.env[%d]", key, j), "%q must be NAME=value", kv)
			}
		}
		if h := s.Health; h != nil {
			hk := key + ".health"
			n := 0
			for _, set := range []bool{h.HTTP != "", h.TCP != "", len(h.Exec) > 0} {
				if set {
					n++
				}
			}
			if n != 1 {
				return bad(hk, "set exactly one of http, tcp, exec")
			}
			if h.HTTP != "" && !isHTTPURL(h.HTTP) {
				return bad(hk+".http", "%q is not an http(s) URL", h.HTTP)
			}
			if _, _, err := net.SplitHostPort(h.TCP); h.TCP != "" && err != nil {
				return bad(hk+".tcp", "%q: %v", h.TCP, err)
			}
			if len(h.Exec) > 0 && h.Exec[0] == "" {
				return bad(hk+".exec", "program must not be empty")
			}
			if h.Interval.Duration <= 0 {
				return bad(hk+".interval", "must be positive")
			}
			if h.Timeout.Duration <= 0 {
				return bad(hk+".timeout", "must be positive")
			}
		}
	}
	return nil
}

// isHTTPURL reports whether s is an absolute http or https URL.
func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// userNameRE is what useradd accepts by default, within 32 bytes.
var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// within reports whether p is dir or lies below it (both clean).
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// checkIgnorePattern accepts one path component, with '*' and '?' wildcards.
func checkIgnorePattern(p string) error {
	switch {
	case p == "" || p == "." || p == "..":
		return errors.New("must name a file or directory")
	case strings.ContainsAny(p, "/\\[]\x00\n"):
		return errors.New("must be one path component, without '/', '\\', '[' or ']'")
	case p == "*":
		return errors.New("would ignore every file")
	}
	if _, err := path.Match(p, ""); err != nil {
		return err
	}
	return nil
}

// relInside cleans a path that must stay inside the workspace.
func relInside(p string) (string, error) {
	if p == "" {
		return "", errors.New("must not be empty")
	}
	if filepath.IsAbs(p) {
		return "", errors.New("must be relative to the workspace")
	}
	clean := filepath.Clean(p)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", errors.New("leaves the workspace")
	}
	return clean, nil
}

func checkIdentityPart(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("must not be empty")
	}
	if strings.ContainsAny(s, "<>\n\r\x00") {
		return errors.New("must not contain <, >, or a line break")
	}
	return nil
}

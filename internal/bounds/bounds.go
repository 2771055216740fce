// Package bounds is the one table of what a launched session may be
// given, and of what a grant's launch set lets it ask for: the resource
// limits (each a `sandbox run` flag), the network modes, the egress
// allow-list and the tasks. sandbox serve's --default-NAME flags, the
// grant's --launch-max-NAME ceilings, `session launch --NAME` and the
// session.launched event all come from Limits: a new limit is one entry
// there (and its sandbox run flag). It links nothing but the standard
// library, so the broker, the launcher and the client share it.
package bounds

import (
	"fmt"
	"math"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/size"
	"github.com/bushost/bushost/internal/textsafe"
)

// Kind is how a limit's value is written and compared.
type Kind int

const (
	// Size is bytes, written as size.Parse reads them (64M, 1G).
	Size Kind = iota
	// Count is a whole number.
	Count
	// CPUs is CPU time in CPUs (0.5 = half of one), kept in thousandths.
	CPUs
	// Duration is a Go duration in whole seconds (90s, 2h).
	Duration
)

// Limit is one resource limit a session may be given.
type Limit struct {
	// Name is the flag's name everywhere: sandbox run --NAME, session
	// launch --NAME, grant --launch-max-NAME, sandbox serve --default-NAME.
	Name string
	Kind Kind
	// Default is sandbox serve's --default-NAME: what a launch naming
	// none gets ("" for nothing).
	Default string
	// Min is the least value sandbox run takes (in the canonical unit).
	Min int64
	// Help says what it bounds.
	Help string
}

// Limits is the table. Values are compared in their canonical unit:
// bytes, a count, thousandths of a CPU, seconds.
var Limits = []Limit{
	{Name: "memory", Kind: Size, Default: "2G", Min: 4 << 20, Help: "the session's memory, through its cgroup"},
	{Name: "pids", Kind: Count, Default: "512", Min: 4, Help: "the processes and threads the session may hold, through its cgroup and RLIMIT_NPROC"},
	{Name: "cpu", Kind: CPUs, Default: "1", Min: 1, Help: "the CPU time the session may use, in CPUs (0.5 = half of one), through its cgroup"},
	{Name: "nofile", Kind: Count, Default: "1024", Min: 1, Help: "RLIMIT_NOFILE: the open files of each session process"},
	{Name: "fsize", Kind: Size, Default: "4G", Min: 1, Help: "RLIMIT_FSIZE: the largest file a session process may write"},
	{Name: "timeout", Kind: Duration, Default: "2h", Min: 1, Help: "how long the session may run (SIGTERM, then SIGKILL; its status is 124)"},
	{Name: "disk", Kind: Size, Default: "1G", Min: 1 << 20, Help: "what the session may write to its /tmp, HOME and a workspace the launcher made, together: one tmpfs of this size (charged to its memory)"},
}

// Lookup returns the limit called name.
func Lookup(name string) (Limit, bool) {
	i := slices.IndexFunc(Limits, func(l Limit) bool { return l.Name == name })
	if i < 0 {
		return Limit{}, false
	}
	return Limits[i], true
}

// Parse reads v as a value of l, in its canonical unit.
func (l Limit) Parse(v string) (int64, error) {
	var n int64
	var err error
	switch l.Kind {
	case Size:
		if n, err = size.Parse(v); err != nil {
			return 0, fmt.Errorf("--%s %q: want plain bytes or a number with K, M, G or T (64M, 1G)", l.Name, clip(v))
		}
	case Count:
		if n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil || n < 0 {
			return 0, fmt.Errorf("--%s %q: want a whole number", l.Name, clip(v))
		}
	case CPUs:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f < 0 || f > 1024 || math.IsNaN(f) {
			return 0, fmt.Errorf("--%s %q: want a number of CPUs from 0.001 to 1024 (0.5 = half of one)", l.Name, clip(v))
		}
		n = int64(math.Round(f * 1000))
	case Duration:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 || d%time.Second != 0 {
			return 0, fmt.Errorf("--%s %q: want a duration in whole seconds (90s, 2h)", l.Name, clip(v))
		}
		n = int64(d / time.Second)
	}
	if n < l.Min {
		return 0, fmt.Errorf("--%s %q: at least %s", l.Name, clip(v), l.Format(l.Min))
	}
	return n, nil
}

// Format writes n (canonical unit) as l's flag takes it.
func (l Limit) Format(n int64) string {
	switch l.Kind {
	case Size:
		return size.Format(n)
	case CPUs:
		return strconv.FormatFloat(float64(n)/1000, 'f', -1, 64)
	case Duration:
		return (time.Duration(n) * time.Second).String()
	}
	return strconv.FormatInt(n, 10)
}

// Values are limits by name, in their canonical units; a name missing is
// no limit.
type Values map[string]int64

// ParseValues reads limits given as strings by name; an unknown name or
// a bad value is an error naming it.
func ParseValues(m map[string]string) (Values, error) {
	out := Values{}
	for name, v := range m {
		l, ok := Lookup(name)
		if !ok {
			return nil, fmt.Errorf("unknown limit %q: the limits are %s", clip(name), strings.Join(Names(), ", "))
		}
		n, err := l.Parse(v)
		if err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, nil
}

// Strings writes v as its flags take it, by name.
func (v Values) Strings() map[string]string {
	out := map[string]string{}
	for name, n := range v {
		if l, ok := Lookup(name); ok {
			out[name] = l.Format(n)
		}
	}
	return out
}

// Names lists the limits' names, in table order.
func Names() []string {
	var out []string
	for _, l := range Limits {
		out = append(out, l.Name)
	}
	return out
}

// The network modes a session may have, least first: a mode allows the
// ones before it.
const (
	NetNone  = "none"
	NetProxy = "proxy"
	NetHost  = "host"
)

// Nets are the modes, least first.
var Nets = []string{NetNone, NetProxy, NetHost}

// NetRank is a mode's place in Nets, -1 for none of them.
func NetRank(mode string) int { return slices.Index(Nets, mode) }

// Launch is what a grant's launch set bounds besides roles and
// capabilities; its zero value is the narrowest: network none, the host's
// defaults as ceilings, the grant's own task, no egress.
type Launch struct {
	// Nets are the network modes its launches may ask for (none if empty).
	Nets []string `json:"net,omitempty"`
	// Max are the ceilings of the limits, by name, as their flags write
	// them; a limit not named is bounded by the host's default.
	Max map[string]string `json:"max,omitempty"`
	// Tasks is a pattern (path.Match, over names) of the tasks of its
	// project its launches may be for; "" is the grant's own task only.
	Tasks string `json:"tasks,omitempty"`
	// AllowDomains and AllowHosts bound a --net=proxy launch's allow-list:
	// each entry it asks for must be one of these (a domain may also be
	// under a *.NAME here).
	AllowDomains []string `json:"allow_domains,omitempty"`
	AllowHosts   []string `json:"allow_hosts,omitempty"`
}

// maxAllow bounds each allow-list, as session.json does.
const maxAllow = 256

// IsZero reports whether l bounds nothing beyond the defaults.
func (l Launch) IsZero() bool {
	return len(l.Nets) == 0 && len(l.Max) == 0 && l.Tasks == "" && len(l.AllowDomains) == 0 && len(l.AllowHosts) == 0
}

// Check validates l and returns it in canonical form (modes in order,
// ceilings as Format writes them, lists sorted without repeats).
func (l Launch) Check() (Launch, error) {
	var out Launch
	for _, n := range l.Nets {
		if NetRank(n) < 0 {
			return Launch{}, fmt.Errorf("network mode %q: want %s", clip(n), strings.Join(Nets, ", "))
		}
	}
	out.Nets = slices.DeleteFunc(slices.Clone(Nets), func(n string) bool { return !slices.Contains(l.Nets, n) })
	if len(l.Max) > 0 {
		v, err := ParseValues(l.Max)
		if err != nil {
			return Launch{}, err
		}
		out.Max = v.Strings()
	}
	if l.Tasks != "" {
		if err := CheckTaskPattern(l.Tasks); err != nil {
			return Launch{}, err
		}
		out.Tasks = l.Tasks
	}
	if len(l.AllowDomains) > maxAllow || len(l.AllowHosts) > maxAllow {
		return Launch{}, fmt.Errorf("an allow-list of at most %d domains and %d hosts", maxAllow, maxAllow)
	}
	for _, d := range l.AllowDomains {
		if err := CheckDomainPattern(d); err != nil {
			return Launch{}, err
		}
		out.AllowDomains = append(out.AllowDomains, strings.ToLower(d))
	}
	for _, h := range l.AllowHosts {
		if err := CheckHostPort(h); err != nil {
			return Launch{}, err
		}
		out.AllowHosts = append(out.AllowHosts, strings.ToLower(h))
	}
	slices.Sort(out.AllowDomains)
	slices.Sort(out.AllowHosts)
	out.AllowDomains, out.AllowHosts = slices.Compact(out.AllowDomains), slices.Compact(out.AllowHosts)
	return out, nil
}

// CheckTaskPattern accepts a pattern of task names: the characters of a
// name and '*' (any run of them), at most 63 bytes.
func CheckTaskPattern(p string) error {
	if p == "" || len(p) > 63 {
		return fmt.Errorf("task pattern %q: want 1 to 63 characters", clip(p))
	}
	if strings.Trim(p, "abcdefghijklmnopqrstuvwxyz0123456789._-*") != "" {
		return fmt.Errorf("task pattern %q: only a-z, 0-9, '.', '_', '-' and '*'", clip(p))
	}
	return nil
}

// TaskAllowed reports whether a launch set bounded by pattern ("" for
// the grant's own task) lets a grant of task own launch for task.
func TaskAllowed(pattern, own, task string) bool {
	if pattern == "" {
		return task == own
	}
	ok, err := path.Match(pattern, task)
	return err == nil && ok
}

// DefaultDomainPorts are the ports an --allow-domain NAME without :PORT
// opens: HTTPS and HTTP, nothing else.
var DefaultDomainPorts = []int{443, 80}

// SplitDomainPattern splits NAME[:PORT] into the name pattern and the
// ports it opens (DefaultDomainPorts without a port).
func SplitDomainPattern(p string) (string, []int, error) {
	name, port, hasPort := strings.Cut(p, ":")
	if !hasPort {
		return name, DefaultDomainPorts, nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", nil, fmt.Errorf("--allow-domain %q: want NAME[:PORT] with a port from 1 to 65535", clip(p))
	}
	return name, []int{n}, nil
}

// CheckDomainPattern accepts "api.example.com" and "*.example.com", each
// with an optional ":PORT" (without one, DefaultDomainPorts).
func CheckDomainPattern(p string) error {
	name, _, err := SplitDomainPattern(p)
	if err != nil {
		return err
	}
	name = strings.TrimPrefix(name, "*.")
	if name == "" || len(name) > 253 || strings.Contains(name, "*") || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") {
		return fmt.Errorf("--allow-domain %q: want a name (api.example.com) or *.NAME (*.example.com), then :PORT if not 443 and 80", clip(p))
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("--allow-domain %q: empty or over-long label", clip(p))
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("--allow-domain %q: %q is not a letter, digit, '-' or '_'", clip(p), r)
			}
		}
	}
	return nil
}

// DomainAllows reports whether the domain pattern p (NAME[:PORT]) lets a
// connection to name:port through.
func DomainAllows(p, name string, port int) bool {
	pname, ports, err := SplitDomainPattern(strings.ToLower(p))
	if err != nil || !slices.Contains(ports, port) {
		return false
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if rest, ok := strings.CutPrefix(pname, "*."); ok {
		return strings.HasSuffix(name, "."+rest)
	}
	return name == pname
}

// CheckHostPort accepts HOST:PORT with a port from 1 to 65535.
func CheckHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return fmt.Errorf("--allow-host %q: want HOST:PORT ([::1]:443 for IPv6)", clip(s))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("--allow-host %q: port must be 1 to 65535", clip(s))
	}
	return nil
}

// DomainCovered reports whether the domain pattern p allows no more than
// one of patterns does: its name is there, or under a *.NAME there
// (api.example.com and *.api.example.com under *.example.com), with every
// port p opens (api.example.com, 443 and 80, is not under
// *.example.com:443).
func DomainCovered(patterns []string, p string) bool {
	name, ports, err := SplitDomainPattern(strings.ToLower(p))
	if err != nil {
		return false
	}
	bare := strings.TrimPrefix(name, "*.")
	for _, q := range patterns {
		qname, qports, err := SplitDomainPattern(strings.ToLower(q))
		if err != nil {
			continue
		}
		if qname == "" || slices.ContainsFunc(ports, func(port int) bool { return !slices.Contains(qports, port) }) {
			continue
		}
		if qname == name {
			return true
		}
		if rest, ok := strings.CutPrefix(qname, "*."); ok && strings.HasSuffix(bare, "."+rest) {
			return true
		}
	}
	return false
}

// HostCovered reports whether HOST:PORT h is one of hosts.
func HostCovered(hosts []string, h string) bool {
	return slices.Contains(hosts, strings.ToLower(h))
}

func clip(s string) string { return textsafe.Clip(s, 64) }

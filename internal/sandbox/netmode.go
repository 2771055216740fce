package sandbox

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/bounds"
)

// The session's network, as --net names it.
const (
	// NetNone: a network namespace of its own with only a loopback.
	NetNone = bounds.NetNone
	// NetProxy: NetNone, plus a relay on the loopback to the egress proxy
	// outside, which enforces the allow-list.
	NetProxy = bounds.NetProxy
	// NetHost: the host's network namespace, all of it.
	NetHost = bounds.NetHost
)

// Default limits of the egress proxy.
const (
	DefaultEgressConns = 64
	DefaultEgressIdle  = 5 * time.Minute
)

// netFlag is --net: "--net" alone means host (as before the modes), and
// --net=none|proxy|host names the mode.
type netFlag struct{ p *string }

func (f netFlag) String() string {
	if f.p == nil {
		return NetNone
	}
	return *f.p
}

func (f netFlag) IsBoolFlag() bool { return true }

func (f netFlag) Set(v string) error {
	switch v {
	case "true", NetHost:
		*f.p = NetHost
	case "false", NetNone:
		*f.p = NetNone
	case NetProxy:
		*f.p = NetProxy
	default:
		return fmt.Errorf("want --net=none, --net=proxy or --net=host (--net alone is host), got %q", v)
	}
	return nil
}

// domainAllowed reports which pattern (NAME[:PORT]) allows name:port, or "".
func domainAllowed(patterns []string, name string, port int) string {
	for _, p := range patterns {
		if bounds.DomainAllows(p, name, port) {
			return p
		}
	}
	return ""
}

// hostName reports whether name is a host name: labels of letters,
// digits, '-' and '_' between dots (a final dot allowed), as an
// --allow-domain NAME is. An address, with or without a zone, is not.
func hostName(name string) bool {
	return !strings.ContainsAny(name, "*:") && bounds.CheckDomainPattern(strings.TrimSuffix(name, ".")) == nil
}

// hostAddrs lists the addresses of the host's own interfaces (all of
// them, not only loopback): a service bound to 0.0.0.0 answers on each.
func hostAddrs() ([]net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips, nil
}

// blockedRanges are the addresses the proxy never connects to unless a
// --allow-host names the address exactly: the host itself, link-local
// (with the cloud metadata service at 169.254.169.254), private and
// unique-local networks, and addresses that are not a single host.
var blockedRanges = func() []*net.IPNet {
	var nets []*net.IPNet
	for _, c := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "64:ff9b::/96",
	} {
		_, n, err := net.ParseCIDR(c)
		if err != nil {
			panic(err)
		}
		nets = append(nets, n)
	}
	return nets
}()

// blockedIP names the range ip is in, or "".
func blockedIP(ip net.IP) string {
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	for _, n := range blockedRanges {
		if n.Contains(ip) {
			return n.String()
		}
	}
	return ""
}

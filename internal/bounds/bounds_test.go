package bounds

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestParseFormat(t *testing.T) {
	for _, c := range []struct {
		name, in, out string
		n             int64
	}{
		{"memory", "1024M", "1G", 1 << 30},
		{"pids", "40", "40", 40},
		{"cpu", "0.5", "0.5", 500},
		{"nofile", "256", "256", 256},
		{"fsize", "64M", "64M", 64 << 20},
		{"timeout", "90m", "1h30m0s", 5400},
	} {
		l, ok := Lookup(c.name)
		if !ok {
			t.Fatalf("no limit %s", c.name)
		}
		n, err := l.Parse(c.in)
		if err != nil || n != c.n || l.Format(n) != c.out {
			t.Errorf("%s %q: %d %q %v, want %d %q", c.name, c.in, n, l.Format(n), err, c.n, c.out)
		}
	}
	for _, bad := range [][2]string{{"memory", "1M"}, {"pids", "3"}, {"pids", "-5"}, {"cpu", "2000"}, {"cpu", "NaN"}, {"timeout", "1.5s"}, {"timeout", "-1h"}, {"fsize", "lots"}} {
		l, _ := Lookup(bad[0])
		if _, err := l.Parse(bad[1]); err == nil || !strings.Contains(err.Error(), "--"+bad[0]) {
			t.Errorf("%s %q accepted or unnamed: %v", bad[0], bad[1], err)
		}
	}
	// A hostile value is named clipped, never whole.
	long := strings.Repeat("9", 60000) + "X"
	for _, l := range Limits {
		if _, err := l.Parse(long); err == nil || len(err.Error()) > 300 {
			t.Errorf("%s of a 60000-byte value: an error of %d bytes", l.Name, len(fmt.Sprint(err)))
		}
	}
	if _, err := ParseValues(map[string]string{"swap": "1G"}); err == nil {
		t.Error("an unknown limit was accepted")
	}
	// Every default parses: sandbox serve's flags start from them.
	for _, l := range Limits {
		if l.Default == "" {
			continue
		}
		if _, err := l.Parse(l.Default); err != nil {
			t.Errorf("default of %s: %v", l.Name, err)
		}
	}
}

func TestLaunchCheck(t *testing.T) {
	got, err := Launch{Nets: []string{"proxy", "none", "proxy"}, Max: map[string]string{"memory": "1024M"}, Tasks: "t*",
		AllowDomains: []string{"B.example.com", "a.example.com", "a.example.com"}, AllowHosts: []string{"db:5432"}}.Check()
	want := Launch{Nets: []string{"none", "proxy"}, Max: map[string]string{"memory": "1G"}, Tasks: "t*",
		AllowDomains: []string{"a.example.com", "b.example.com"}, AllowHosts: []string{"db:5432"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Check = %+v %v, want %+v", got, err, want)
	}
	for _, bad := range []Launch{
		{Nets: []string{"everything"}}, {Max: map[string]string{"pids": "many"}}, {Max: map[string]string{"swap": "1G"}},
		{Tasks: "../x"}, {Tasks: "T1"}, {AllowDomains: []string{"*"}}, {AllowHosts: []string{"db"}},
		{AllowHosts: make([]string, maxAllow+1)},
	} {
		if _, err := bad.Check(); err == nil {
			t.Errorf("Check(%+v) accepted", bad)
		}
	}
}

func TestCovered(t *testing.T) {
	lead := []string{"*.example.com", "api.other.org"}
	for p, want := range map[string]bool{
		"api.example.com": true, "*.api.example.com": true, "*.example.com": true, "API.Example.com": true,
		"example.com": false, "*.com": false, "api.other.org": true, "x.api.other.org": false, "*.other.org": false,
	} {
		if got := DomainCovered(lead, p); got != want {
			t.Errorf("DomainCovered(%q) = %v, want %v", p, got, want)
		}
	}
	// A port is part of what a pattern allows: a name without one opens
	// 443 and 80, and is covered only where both are.
	ported := []string{"*.example.com:8443", "api.other.org", "*.web.org:443"}
	for p, want := range map[string]bool{
		"api.example.com:8443": true, "api.example.com": false, "api.example.com:443": false,
		"api.other.org:443": true, "api.other.org:80": true, "api.other.org:8443": false,
		"x.web.org:443": true, "x.web.org": false,
	} {
		if got := DomainCovered(ported, p); got != want {
			t.Errorf("DomainCovered(%q, %q) = %v, want %v", ported, p, got, want)
		}
	}
	for _, c := range []struct {
		p, name string
		port    int
		want    bool
	}{
		{"api.example.com", "API.example.com.", 443, true}, {"api.example.com", "api.example.com", 80, true},
		{"api.example.com", "api.example.com", 8443, false}, {"*.example.com:8443", "a.example.com", 8443, true},
		{"*.example.com:8443", "a.example.com", 443, false}, {"*.example.com", "example.com", 443, false},
	} {
		if got := DomainAllows(c.p, c.name, c.port); got != c.want {
			t.Errorf("DomainAllows(%q, %q, %d) = %v, want %v", c.p, c.name, c.port, got, c.want)
		}
	}
	for _, bad := range []string{"a.example.com:0", "a.example.com:65536", "a.example.com:08443", "a.example.com:", "a.example.com:x", ":443"} {
		if CheckDomainPattern(bad) == nil {
			t.Errorf("CheckDomainPattern(%q) accepted", bad)
		}
	}
	if !HostCovered([]string{"db:5432"}, "DB:5432") || HostCovered([]string{"db:5432"}, "db:5433") {
		t.Error("HostCovered")
	}
	for _, c := range []struct {
		pattern, own, task string
		want               bool
	}{{"", "t1", "t1", true}, {"", "t1", "t2", false}, {"t*", "t1", "t2", true}, {"t*", "t1", "x1", false}, {"*", "t1", "x1", true}} {
		if got := TaskAllowed(c.pattern, c.own, c.task); got != c.want {
			t.Errorf("TaskAllowed(%q, %q, %q) = %v", c.pattern, c.own, c.task, got)
		}
	}
}

package integration

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// egressBenchBytes is the download BenchmarkSandboxEgress times.
const egressBenchBytes = 100 << 20

// BenchmarkSandboxEgress times a 100 MB download by curl in a session from
// a server on the host's loopback, through the relay and the egress proxy
// (--net=proxy) against directly (--net=host), alternating, 5 of each per
// iteration; curl's own time_total, so the session's start is not in it.
// The target is a ratio of medians of at most 1.5.
func BenchmarkSandboxEgress(b *testing.B) {
	e := newSandboxEnv(b)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(egressBenchBytes))
		for sent := 0; sent < egressBenchBytes; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	go srv.Serve(l)
	defer srv.Close()
	url := "http://" + l.Addr().String() + "/"
	fetch := func(net []string) time.Duration {
		b.Helper()
		out, errOut, code := e.runIn(b, net, "curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", url)
		f := strings.Fields(out)
		if code != 0 || len(f) != 2 || f[0] != strconv.Itoa(egressBenchBytes) {
			b.Fatalf("curl %v: exit %d %q %s", net, code, out, errOut)
		}
		s, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(s * float64(time.Second))
	}
	proxy := []string{"--net=proxy", "--allow-host", l.Addr().String()}
	host := []string{"--net=host", "--allow-abstract-sockets"}
	var viaProxy, direct []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for r := 0; r < 5; r++ {
			if r%2 == 0 {
				viaProxy = append(viaProxy, fetch(proxy))
				direct = append(direct, fetch(host))
			} else {
				direct = append(direct, fetch(host))
				viaProxy = append(viaProxy, fetch(proxy))
			}
		}
	}
	b.StopTimer()
	slices.Sort(viaProxy)
	slices.Sort(direct)
	p, d := viaProxy[len(viaProxy)/2], direct[len(direct)/2]
	ratio := float64(p) / float64(d)
	b.ReportMetric(float64(egressBenchBytes)/p.Seconds()/1e6, "MB/s-proxy")
	b.ReportMetric(float64(egressBenchBytes)/d.Seconds()/1e6, "MB/s-host")
	b.ReportMetric(ratio, "proxy/host")
	b.Logf("100 MB: through the proxy %s, direct %s (medians), ratio %.2f", p, d, ratio)
	if ratio > 1.5 {
		b.Errorf("the proxy takes %.2fx the direct download, over 1.5x", ratio)
	}
}

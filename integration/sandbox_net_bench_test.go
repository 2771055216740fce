package integration

import (
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// egressBenchBytes is the download BenchmarkSandboxEgress times, and
// egressBenchRounds how many of each kind one iteration takes.
const (
	egressBenchBytes  = 100 << 20
	egressBenchRounds = 9
)

// BenchmarkSandboxEgress times a 100 MB download by curl in a session from
// a server on the host's loopback, through the relay and the egress proxy
// (--net=proxy) against directly (--net=host), and through a bare
// forwarder (the floor of any proxy that sees the bytes), rotating which
// goes first, egressBenchRounds of each per iteration; curl's own
// time_total, so the session's start is not in it. The target is a ratio
// of medians of at most 1.5; a run over it fails only if the proxy is also
// clearly over the floor measured in the same run.
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
	fetch := func(net []string, url string) time.Duration {
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
	// The floor: the same download by a --net=host session through a bare
	// forwarder in this process (accept, dial, io.Copy both ways, which
	// splices): one user-space hop and nothing else, the least any proxy
	// that sees the bytes costs. The proxy's own path is that one hop too
	// (pid 1 hands it the session's listening socket).
	fwd, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer fwd.Close()
	go func() {
		for {
			c, err := fwd.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", l.Addr().String())
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
	fwdURL := "http://" + fwd.Addr().String() + "/"
	proxy := []string{"--net=proxy", "--allow-host", l.Addr().String()}
	host := []string{"--net=host", "--allow-abstract-sockets"}
	var viaProxy, direct, viaFwd []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for r := 0; r < egressBenchRounds; r++ {
			// Rotate which goes first, so none always runs on a machine
			// the one before left warm or busy.
			runs := []func(){
				func() { viaProxy = append(viaProxy, fetch(proxy, url)) },
				func() { direct = append(direct, fetch(host, url)) },
				func() { viaFwd = append(viaFwd, fetch(host, fwdURL)) },
			}
			for k := range runs {
				runs[(k+r)%len(runs)]()
			}
		}
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	p, d, f := med(viaProxy), med(direct), med(viaFwd)
	ratio, floor := float64(p)/float64(d), float64(f)/float64(d)
	b.ReportMetric(float64(egressBenchBytes)/p.Seconds()/1e6, "MB/s-proxy")
	b.ReportMetric(float64(egressBenchBytes)/d.Seconds()/1e6, "MB/s-host")
	b.ReportMetric(ratio, "proxy/host")
	b.ReportMetric(floor, "forwarder/host")
	b.Logf("100 MB: through the proxy %s, direct %s, through a bare forwarder %s (medians of %d); proxy/direct %.2f (target 1.5), bare forwarder/direct %.2f (the floor of one hop)",
		p, d, f, len(direct), ratio, floor)
	// Over the target and clearly over the floor measured in the same
	// run: the proxy costs more than the hop it cannot avoid.
	if ratio > 1.5 && ratio > floor*1.15 {
		b.Errorf("the proxy takes %.2fx the direct download, over 1.5x and over 1.15x the bare forwarder's %.2fx", ratio, floor)
	}
}

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/pgtest"
	"github.com/bushost/bushost/internal/testenv"
)

// dialPlain connects to a socket of h without any token: health and
// reflection need none.
func dialPlain(t *testing.T, home, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(home, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func healthOf(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return r.GetStatus()
}

func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	// The listed service resolves to its descriptor too (what grpcurl does).
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: names[0]}}); err != nil {
		t.Fatal(err)
	}
	r, err = st.Recv()
	if err != nil || len(r.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("reflection: no descriptor for %s: %v %v", names[0], r.GetErrorResponse(), err)
	}
	st.CloseSend()
	return names
}

// Health checking and reflection answer on both sockets without a token;
// a SIGTERM turns health NOT_SERVING and refuses new calls with
// Unavailable for --drain-grace before the sockets close.
func TestHealthReflectionAndDrainGrace(t *testing.T) {
	const grace = 6 * time.Second
	h := startHostWith(t, hostOpts{Args: []string{"--drain-grace", grace.String()}})
	services := map[string]string{"git.sock": "bushost.git.v1.GitService", "broker.sock": "bushost.broker.v1.BrokerService"}
	conns := map[string]*grpc.ClientConn{}
	for sock, svc := range services {
		conn := dialPlain(t, h.Home, sock)
		conns[sock] = conn
		for _, name := range []string{"", svc} {
			if st := healthOf(t, conn, name); st != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("%s: health %q = %v, want SERVING", sock, name, st)
			}
		}
		names := listServices(t, conn)
		for _, want := range []string{svc, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
			if !slices.Contains(names, want) {
				t.Fatalf("%s: reflection lists %v, want %s among them", sock, names, want)
			}
		}
	}

	// A probe watching health sees the drain and does not hold the stop
	// until --drain-timeout (30s).
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watch, err := healthpb.NewHealthClient(conns["git.sock"]).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch: %v %v, want SERVING", r, err)
	}

	start := time.Now()
	var stopErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); stopErr = h.Stop(t) }()
	for sock, conn := range conns {
		if !testenv.Poll(grace, func() bool { return healthOf(t, conn, "") == healthpb.HealthCheckResponse_NOT_SERVING }) {
			t.Fatalf("%s: health still SERVING %v after SIGTERM", sock, time.Since(start))
		}
		if st := healthOf(t, conn, services[sock]); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%s: health of %s = %v during the drain", sock, services[sock], st)
		}
	}
	bconn, bctx := dialHome(t, h.Home, "broker.sock", adminTokenOf(t, h))
	_, err = brokerv1.NewBrokerServiceClient(bconn).VerifyLog(bctx, &brokerv1.VerifyLogRequest{})
	if e := grpcerr.FromStatus(err); status.Code(err) != codes.Unavailable || e.Reason != errdefs.ShuttingDown {
		t.Fatalf("call during the drain grace: %v (reason %q), want Unavailable SHUTTING_DOWN", err, e.Reason)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health watch during the drain: %v %v, want NOT_SERVING", r, err)
	}
	wg.Wait()
	if stopErr != nil {
		t.Fatalf("bushostd did not exit 0 after SIGTERM: %v", stopErr)
	}
	if d := time.Since(start); d < grace || d > grace+15*time.Second {
		t.Fatalf("bushostd stopped %v after SIGTERM, want its %v grace and not the 30s drain timeout", d, grace)
	}
}

// callLine is one per-call line of bushostd's JSON log.
type callLine struct {
	Msg      string  `json:"msg"`
	Socket   string  `json:"socket"`
	Method   string  `json:"method"`
	PID      int     `json:"pid"`
	UID      int     `json:"uid"`
	Grant    string  `json:"grant"`
	Task     string  `json:"task"`
	Outcome  string  `json:"outcome"`
	Bytes    int64   `json:"bytes"`
	Duration float64 `json:"duration"`
}

// After a push and a refused push, the JSON log has one line per call with
// its grant, task, peer, outcome, bytes and duration (and no token), and
// /metrics counts both pushes by outcome.
func TestCallLogAndMetrics(t *testing.T) {
	metricsSock := filepath.Join(baseDir(t), "metrics.sock")
	w := newGitWorld(t, hostOpts{Args: []string{"--log-format", "json", "--metrics-addr", "unix:" + metricsSock}})
	c1 := w.commit(t, "a.txt", "a\n")
	if got := w.as(t, w.worker, "push-working", "--repo", w.work); got != c1 {
		t.Fatalf("push-working printed %q, want %s", got, c1)
	}
	if _, errs, code := w.h.Run(t, nil, "--token-file", w.reviewer, "push-working", "--repo", w.work); code == 0 {
		t.Fatalf("push with a reviewer's grant was accepted: %s", errs)
	}
	// The git service's own lines (a housekeeping run's) follow the
	// daemon's --log-format too.
	w.h.Must(t, "repo", "optimize", "--business", w.business, "--project", w.project)

	logb, err := os.ReadFile(w.h.Log)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{w.worker, w.reviewer, filepath.Join(w.h.Home, "admin.token")} {
		tok, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(logb), strings.TrimSpace(string(tok))) {
			t.Fatalf("the log holds the token of %s", f)
		}
	}
	var pushes []callLine
	housekept := false
	sc := bufio.NewScanner(strings.NewReader(string(logb)))
	for sc.Scan() {
		var l callLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", sc.Text(), err)
		}
		housekept = housekept || l.Msg == "housekept a repository"
		if l.Msg == "call" && strings.HasSuffix(l.Method, "/PushWorking") {
			pushes = append(pushes, l)
		}
	}
	if !housekept {
		t.Fatalf("no JSON line of the housekeeping run:\n%s", logb)
	}
	if len(pushes) != 2 {
		t.Fatalf("log has %d PushWorking lines, want 2:\n%s", len(pushes), logb)
	}
	ok, refused := pushes[0], pushes[1]
	if ok.Outcome != "OK" || ok.Task != "t1" || ok.Grant != grantIDOf(t, w.h, "worker") || ok.Socket != "git" ||
		ok.PID <= 0 || ok.UID != os.Getuid() || ok.Bytes <= 0 || ok.Duration <= 0 {
		t.Fatalf("accepted push logged as %+v", ok)
	}
	// The refusal's outcome is its errdefs reason; an error the git service
	// has not yet given a reason is logged by its gRPC code.
	if refused.Outcome != string(errdefs.CapabilityMissing) && refused.Outcome != codes.PermissionDenied.String() {
		t.Fatalf("refused push logged with outcome %q", refused.Outcome)
	}
	if refused.Grant != grantIDOf(t, w.h, "reviewer") || refused.Task != "t1" || refused.Duration <= 0 {
		t.Fatalf("refused push logged as %+v", refused)
	}

	body := scrapeUnix(t, metricsSock)
	for _, want := range []string{
		`bushost_pushes_total{outcome="OK"} 1`,
		`bushost_pushes_total{outcome="` + refused.Outcome + `"} 1`,
		`bushost_calls_total{method="/bushost.git.v1.GitService/PushWorking",outcome="OK",socket="git"} 1`,
		`bushost_push_duration_seconds_count 2`,
		`bushost_index_pack_duration_seconds_count 1`,
		`bushost_build_info{`,
		`bushost_connections_open{socket="git"}`,
		`go_goroutines `,
		`process_open_fds `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(body, `bushost_broker_writes_total{result="committed"}`) {
		t.Errorf("/metrics lacks the broker's committed writes")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// grantIDOf returns the id of the grant made for role, from the log's
// grant.created events (the token itself is never logged).
func grantIDOf(t *testing.T, h *Host, role string) string {
	t.Helper()
	out := h.Must(t, "events", "--json")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev struct {
			Type string `json:"type"`
			Data struct {
				GrantID string `json:"grant_id"`
				Role    string `json:"role"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json: %q: %v", line, err)
		}
		if ev.Type == "grant.created" && ev.Data.Role == role {
			return ev.Data.GrantID
		}
	}
	t.Fatalf("no grant.created for role %s in:\n%s", role, out)
	return ""
}

func scrapeUnix(t testing.TB, path string) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://bushostd/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// Health follows the broker's store: NOT_SERVING on both sockets while
// PostgreSQL cannot be reached, SERVING again once it can. The store is
// reached through a Unix socket proxy that the test cuts and restores.
func TestHealthFollowsBrokerStore(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "health", "health NOT_SERVING while the broker store is unreachable")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	pgDir := q.Get("host")
	if !strings.HasPrefix(pgDir, "/") {
		testenv.Missing(t, "PostgreSQL on a Unix socket", "health following the store: %s names no Unix socket directory", pgtest.Env)
	}
	port := q.Get("port")
	if port == "" {
		port = "5432"
	}
	proxyDir := baseDir(t)
	p := &pgProxy{from: filepath.Join(proxyDir, ".s.PGSQL."+port), to: filepath.Join(pgDir, ".s.PGSQL."+port)}
	p.up(t)
	t.Cleanup(p.down)
	q.Set("host", proxyDir)
	u.RawQuery = q.Encode()
	h := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", u.String()}})
	conns := []*grpc.ClientConn{dialPlain(t, h.Home, "git.sock"), dialPlain(t, h.Home, "broker.sock")}
	waitHealth := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for _, c := range conns {
			for healthOf(t, c, "") != want {
				if time.Now().After(deadline) {
					t.Fatalf("health is not %v after 30s", want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	waitHealth(healthpb.HealthCheckResponse_SERVING)
	p.down()
	waitHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	p.up(t)
	waitHealth(healthpb.HealthCheckResponse_SERVING)
	h.Must(t, "log", "verify")
}

// pgProxy forwards connections from one Unix socket to another until down.
type pgProxy struct {
	from, to string
	mu       sync.Mutex
	l        net.Listener
	conns    []net.Conn
	wg       sync.WaitGroup
}

func (p *pgProxy) up(t *testing.T) {
	t.Helper()
	l, err := net.Listen("unix", p.from)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", p.to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer p.wg.Done(); io.Copy(c, s); c.Close() }()
		}
	}()
}

// down stops accepting and cuts every connection, and waits for the
// copying goroutines to end.
func (p *pgProxy) down() {
	p.mu.Lock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

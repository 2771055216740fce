package supervisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// probe runs one health check of a service whose working directory is dir.
// A nil error means healthy.
func probe(ctx context.Context, h *HealthCheck, dir string, env []string, run procRunner) error {
	ctx, cancel := context.WithTimeout(ctx, h.Timeout.Duration)
	defer cancel()
	switch {
	case h.HTTP != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.HTTP, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: %s", h.HTTP, resp.Status)
		}
		return nil
	case h.TCP != "":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", h.TCP)
		if err != nil {
			return err
		}
		return c.Close()
	default:
		// Through the runner: as the services' user, never the
		// supervisor's, since the agent can edit the program.
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		pid, done, err := run.start(false, h.Exec, dir, env, w)
		w.Close()
		if err != nil {
			r.Close()
			return err
		}
		defer r.Close()
		out := &boundedBuffer{limit: 4096}
		var reader sync.WaitGroup
		reader.Go(func() { io.Copy(out, r) })
		var code int
		select {
		case code = <-done:
		case <-ctx.Done():
			run.signal(pid, syscall.SIGKILL)
			<-done
			return fmt.Errorf("%s: timed out after %v", h.Exec[0], h.Timeout.Duration)
		}
		// Let the reader take what the check wrote before it exited.
		r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		reader.Wait()
		if code != 0 {
			msg := strings.TrimSpace(out.String())
			if len(msg) > 512 {
				msg = msg[:512]
			}
			return fmt.Errorf("%s: exit status %d: %s", h.Exec[0], code, msg)
		}
		return nil
	}
}

// serviceEnv is the environment of a service and its exec health check.
func serviceEnv(s *ServiceConfig) []string {
	env := append(os.Environ(), "BUSHOST_SERVICE="+s.Name)
	return append(env, s.Env...)
}

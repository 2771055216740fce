package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// probe runs one health check of a service whose working directory is dir.
// A nil error means healthy.
func probe(ctx context.Context, h *HealthCheck, dir string, env []string) error {
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
		cmd := exec.Command(h.Exec[0], h.Exec[1:]...)
		cmd.Dir = dir
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		done, err := startLocked(cmd)
		if err != nil {
			return err
		}
		select {
		case err = <-done:
		case <-ctx.Done():
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			return fmt.Errorf("%s: timed out after %v", h.Exec[0], h.Timeout.Duration)
		}
		if err != nil {
			msg := strings.TrimSpace(out.String())
			if len(msg) > 512 {
				msg = msg[:512]
			}
			return fmt.Errorf("%s: %v: %s", h.Exec[0], err, msg)
		}
		return nil
	}
}

// serviceEnv is the environment of a service and its exec health check.
func serviceEnv(s *ServiceConfig) []string {
	env := append(os.Environ(), "BUSHOST_SERVICE="+s.Name)
	return append(env, s.Env...)
}

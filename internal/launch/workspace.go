package launch

import (
	"context"
	"os"
	"path/filepath"
	"time"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sandbox"
)

// removeSessionDir removes a session's directory, unmounting its disk
// first (what is on it goes with it).
func removeSessionDir(dir string) error {
	if err := sandbox.UnmountDisk(filepath.Join(dir, diskName)); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// removeWorkspace removes the workspace the launcher made for an ended
// session: its disk (run/ and ws/ on it), or ws/. A caller's own
// workspace is never the launcher's to remove.
func (s *Server) removeWorkspace(l *live) error {
	rec := l.snapshot()
	if !rec.OwnWorkspace || rec.WorkspaceRemoved {
		return nil
	}
	var err error
	if rec.Disk {
		err = sandbox.UnmountDisk(filepath.Join(l.dir, diskName))
	} else {
		err = os.RemoveAll(filepath.Join(l.dir, wsName))
	}
	if err != nil {
		return err
	}
	return l.save(func(r *record) { r.WorkspaceRemoved = true })
}

// sweepEvery is how often the launcher looks for workspaces kept past
// --keep-workspaces: a quarter of it, at most a minute.
func sweepEvery(keep time.Duration) time.Duration {
	return min(max(keep/4, 10*time.Millisecond), time.Minute)
}

// sweep removes, until Close, the workspace of every session that ended
// (and was recorded) --keep-workspaces ago.
func (s *Server) sweep() {
	tick := time.NewTicker(sweepEvery(s.o.KeepWorkspaces))
	defer tick.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		var due []*live
		for _, l := range s.sessions {
			rec := l.snapshot()
			if rec.Recorded && rec.OwnWorkspace && !rec.WorkspaceRemoved && time.Since(rec.Ended) >= s.o.KeepWorkspaces {
				due = append(due, l)
			}
		}
		s.mu.Unlock()
		for _, l := range due {
			if err := s.removeWorkspace(l); err != nil {
				s.logf("remove the workspace of session %s, kept %s: %v", l.snapshot().ID, s.o.KeepWorkspaces, err)
				continue
			}
			s.logf("removed the workspace of session %s, ended %s ago (--keep-workspaces)", l.snapshot().ID, time.Since(l.snapshot().Ended).Round(time.Second))
		}
	}
}

// Remove implements LaunchService: an ended session's workspace (if the
// launcher made it), output and record go, and it is listed no more.
func (s *Server) Remove(ctx context.Context, r *launchv1.RemoveRequest) (*launchv1.RemoveResponse, error) {
	l, err := s.find(ctx, r.GetId())
	if err != nil {
		return nil, err
	}
	select {
	case <-l.done:
	default:
		return nil, errdefs.FailedPrecondition(errdefs.SessionRunning, "session %s has not ended (or its end is not recorded yet): session stop %s first", r.GetId(), r.GetId())
	}
	rec := l.snapshot()
	if err := s.removeWorkspace(l); err != nil {
		return nil, err
	}
	if err := removeSessionDir(l.dir); err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.sessions, rec.ID)
	s.mu.Unlock()
	return &launchv1.RemoveResponse{Session: sessionProto(rec)}, nil
}

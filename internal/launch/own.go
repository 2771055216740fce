package launch

import (
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sandbox"
)

// fromOwnSession refuses a launch by a launched session's grant (one with
// LaunchedBy) unless the call comes from inside that session: only there
// does the launch carry the session's bounds (from). Its token copied out
// of the sandbox would otherwise launch with the bounds of wherever it is
// used (none on the host, another session's in another), so that a
// --net=none session could have a --net=host one launched in its name.
func (s *Server) fromOwnSession(g authz.Grant, from *sandbox.SessionBounds) error {
	if g.LaunchedBy == "" {
		return nil
	}
	s.mu.Lock()
	var own *record
	for _, l := range s.sessions {
		if rec := l.snapshot(); rec.GrantID == g.ID {
			own = &rec
			break
		}
	}
	s.mu.Unlock()
	if own == nil {
		return errdefs.PermissionDenied(errdefs.LaunchNotAllowed, "grant %s is a launched session's, and this launcher runs no session of it: it launches only from inside its session", g.ID)
	}
	if from == nil || from.PID != own.PID {
		return errdefs.PermissionDenied(errdefs.LaunchNotAllowed, "grant %s is session %s's: it launches only from inside that session, held to the session's bounds", g.ID, own.ID)
	}
	return nil
}

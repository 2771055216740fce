package broker

import (
	"context"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// Placement: several bushostd may share one store (PostgreSQL), but a
// project's repositories live on one host. A project is placed on the host
// that adds it, in the same transaction that registers it; adding it on
// another host is refused naming the owner, and so is every git call for
// it there (gitd asks CheckPlacement), so a session is launched where its
// project lives. Broker calls (reviews, events, close) are served by any
// host: they only touch the shared log.
//
// A placement changes only through a move (move.go), which starts on the
// owner: a positive answer is cached until this broker begins an export of
// the project, and never while the project moves (forgetPlacement and
// placeGen keep a lookup that raced the export from caching its answer).
// A host that is not the owner caches nothing, so it learns of an import
// at its next call.

// DefaultHostID is the host id of a broker opened without one (tests, and
// tools that open the store directly).
const DefaultHostID = "local"

// HostID returns the id this broker places projects on.
func (b *Broker) HostID() string { return b.hostID }

// place registers business/project placed on this host, or claims it if
// it was registered before placement existed; a project placed on another
// host is refused with PROJECT_ON_OTHER_HOST.
func (b *Broker) place(ctx context.Context, business, project string) error {
	gen := b.placementGen()
	cache := false
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		r, ok, err := q.project(ctx, business, project)
		if err != nil {
			return err
		}
		switch {
		case !ok:
			_, err := q.db.ExecContext(ctx, `INSERT INTO projects (business, project, host) VALUES ($1, $2, $3)`, business, project, b.hostID)
			cache = err == nil
			return err
		case r.Host == "":
			_, err := q.db.ExecContext(ctx, `UPDATE projects SET host = $1 WHERE business = $2 AND project = $3 AND host = ''`, b.hostID, business, project)
			cache = err == nil && r.MovingID == ""
			return err
		case r.Host != b.hostID:
			return onOtherHost(business, project, r.Host)
		}
		cache = r.MovingID == ""
		return nil
	})
	if err == nil && cache {
		b.rememberPlacement(business, project, gen)
	}
	return err
}

// placementGen is the generation a lookup reads before asking the store;
// rememberPlacement caches its answer only if no export began since.
func (b *Broker) placementGen() uint64 {
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	return b.placeGen
}

func (b *Broker) rememberPlacement(business, project string, gen uint64) {
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	if b.placeGen == gen {
		b.placedHere.Store(business+"/"+project, true)
	}
}

// forgetPlacement drops business/project from the cache, and makes every
// lookup begun before it forget its answer too.
func (b *Broker) forgetPlacement(business, project string) {
	b.placeMu.Lock()
	defer b.placeMu.Unlock()
	b.placeGen++
	b.placedHere.Delete(business + "/" + project)
}

// CheckPlacement implements authz.Authority: nil when business/project is
// placed on this host, not placed yet (an unknown project is refused
// later, by whatever needs it), or registered before placement existed;
// PROJECT_ON_OTHER_HOST naming the owner when it lives elsewhere.
func (b *Broker) CheckPlacement(ctx context.Context, business, project string) error {
	if _, err := names.ParseProject(business, project); err != nil {
		return err
	}
	if _, ok := b.placedHere.Load(business + "/" + project); ok {
		return nil
	}
	gen := b.placementGen()
	r, ok, err := b.st.read().project(ctx, business, project)
	if err != nil {
		return err
	}
	if ok && r.Host != "" && r.Host != b.hostID {
		return onOtherHost(business, project, r.Host)
	}
	if ok && r.Host == b.hostID && r.MovingID == "" {
		b.rememberPlacement(business, project, gen)
	}
	return nil
}

// Placement returns the host business/project is placed on ("" when it was
// registered before placement and no host has claimed it yet).
func (b *Broker) Placement(ctx context.Context, business, project string) (string, bool, error) {
	r, ok, err := b.st.read().project(ctx, business, project)
	return r.Host, ok, err
}

func onOtherHost(business, project, host string) error {
	return errdefs.FailedPrecondition(errdefs.ProjectOnOtherHost,
		"project %s/%s is placed on bus host %q, not this one: use that host (launch the session where its project lives)", business, project, host).
		With("host", host).With("project", business+"/"+project)
}

package broker

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/bushost/bushost/internal/gitid"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/names"
)

// Options configure Open.
type Options struct {
	// DSN chooses the store: a file path or "sqlite:PATH" for SQLite,
	// "postgres://..." or "postgresql://..." for PostgreSQL.
	DSN string
	// AdminToken is the host's token: calls bearing it act as the host
	// (actor "host"). Empty means no call can act as the host.
	AdminToken string
	// DefaultTTL is a grant's lifetime when none is asked for; 0 means 24h.
	DefaultTTL time.Duration
	// Limits: the broker reads the Rates, what one grant appends through
	// RecordEvent per minute (events; bytes of type and data), and
	// network.egress's own bound apart from them. Zero: the defaults.
	limits.Limits
	// CheckpointFile, when set, is where each new head of the log is
	// appended (checkpoint.go); at Open the log is compared with every
	// head in it, and a mismatch halts the broker (see Halted).
	CheckpointFile string
	// HostID names this bus host: a project added through this broker is
	// placed on it, and calls for a project placed on another host are
	// refused (placement.go). Empty means DefaultHostID.
	HostID string
	// Postgres bounds what this host's connections to a PostgreSQL store
	// may hold (locks, transactions, silence); unused with SQLite.
	Postgres PostgresOptions
	// ReposDir is the git service's repository directory on this host
	// (<home>/repos): `project list` sums the size of each project's
	// repositories there. Empty: sizes are not known here.
	ReposDir string
	// SigningKey signs every event this broker appends (signing.go). It is
	// required, and never written to the store.
	SigningKey ed25519.PrivateKey
	// TrustedKeys verify the events of the other hosts sharing the store
	// (SigningKey's own public key is always trusted, listed or not).
	TrustedKeys []ed25519.PublicKey
	// AdoptUnsigned is set at the start that made SigningKey: a log
	// written before signing (no event in it signed) has its events, up to
	// the last head of CheckpointFile if it holds one, signed with this
	// key once the chain (and the checkpoint) verified (proof.go).
	AdoptUnsigned bool
}

// Broker is the broker. It implements authz.Authority; NewServer serves it
// as BrokerService. Its methods are safe for concurrent use.
type Broker struct {
	hostID     string
	placedHere sync.Map // "business/project" -> true, seen placed here and not moving
	placeMu    sync.Mutex
	placeGen   uint64 // bumped by forgetPlacement, under placeMu
	st         *sqlStore
	admin      string
	defaultTTL time.Duration
	reposDir   string
	quota      *eventQuota
	// egressQuota is network.egress's bound, apart from quota.
	egressQuota *eventQuota

	// ops feeds the committer; see write.
	ops       chan *op
	closeMu   sync.RWMutex
	closed    bool
	committed chan struct{} // closed when the committer has exited

	changeMu sync.Mutex
	changed  chan struct{} // closed and replaced at each commit that appended

	cp     *checkpoint                   // nil without Options.CheckpointFile
	halted atomic.Pointer[errdefs.Error] // set when the log does not match cp

	signer *Signer  // signs what this broker appends
	keys   *Keyring // whose signatures prove an event
	// adopted is the last event signed at adoption (0: none).
	adopted int64
}

var _ authz.Authority = (*Broker)(nil)

var errClosedBroker = errdefs.Unavailable(errdefs.ShuttingDown, "broker is shutting down")

// Open opens (creating and migrating as needed) the store named by o.DSN.
func Open(ctx context.Context, o Options) (*Broker, error) {
	var st *sqlStore
	var err error
	switch {
	case o.DSN == "":
		return nil, errors.New("broker: no DSN: give a SQLite file path or a postgres:// URL")
	case strings.HasPrefix(o.DSN, "postgres://"), strings.HasPrefix(o.DSN, "postgresql://"):
		st, err = openPostgres(ctx, o.DSN, o.Postgres)
	default:
		st, err = openSQLite(ctx, strings.TrimPrefix(o.DSN, "sqlite:"))
	}
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if o.SigningKey == nil {
		st.close()
		return nil, errors.New("broker: no signing key: every event a host appends is signed (Options.SigningKey)")
	}
	signer := NewSigner(o.SigningKey)
	b := &Broker{
		signer:      signer,
		keys:        NewKeyring(append([]ed25519.PublicKey{signer.Public()}, o.TrustedKeys...)...),
		hostID:      cmp.Or(o.HostID, DefaultHostID),
		st:          st,
		admin:       o.AdminToken,
		defaultTTL:  cmp.Or(o.DefaultTTL, 24*time.Hour),
		reposDir:    o.ReposDir,
		quota:       newEventQuota(o.EventRate, o.EventBytesRate),
		egressQuota: newEgressQuota(o.EgressRate, o.EgressBytesRate),
		ops:         make(chan *op, 1024),
		committed:   make(chan struct{}),
		changed:     make(chan struct{}),
	}
	var heads []Head
	if o.CheckpointFile != "" {
		cp, hs, err := openCheckpoint(o.CheckpointFile)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("broker: %w", err)
		}
		b.cp, heads = cp, hs
	}
	if err := b.start(ctx, heads, o.AdoptUnsigned); err != nil {
		if b.cp != nil {
			b.cp.close()
		}
		st.close()
		return nil, fmt.Errorf("broker: %w", err)
	}
	go b.commitLoop()
	return b, nil
}

// Close stops taking writes, finishes those queued, and closes the store.
func (b *Broker) Close() error {
	b.closeMu.Lock()
	if b.closed {
		b.closeMu.Unlock()
		return nil
	}
	b.closed = true
	close(b.ops)
	b.closeMu.Unlock()
	<-b.committed
	if b.cp != nil {
		b.cp.close()
	}
	return b.st.close()
}

// op is one write waiting for the committer.
type op struct {
	ctx  context.Context
	fn   func(ctx context.Context, q *writeTx) error
	done chan error
}

// write runs fn in a write transaction and returns once that transaction is
// durably committed (or fn's refusal, with nothing of fn's left behind).
//
// One goroutine commits: it takes every write waiting, runs each in its own
// savepoint inside one transaction, and commits them together, so that
// concurrent writers share one fsync (group commit). A refused fn rolls
// back to its savepoint and does not touch the others.
func (b *Broker) write(ctx context.Context, fn func(ctx context.Context, q *writeTx) error) error {
	if err := b.Halted(); err != nil {
		return err
	}
	if b.cp != nil {
		if err := b.catchUp(); err != nil {
			return err
		}
	}
	o := &op{ctx: ctx, fn: fn, done: make(chan error, 1)}
	b.closeMu.RLock()
	if b.closed {
		b.closeMu.RUnlock()
		return errClosedBroker
	}
	start := time.Now()
	b.ops <- o
	b.closeMu.RUnlock()
	err := <-o.done
	metrics.Write(err, time.Since(start))
	return err
}

const maxBatch = 256

func (b *Broker) commitLoop() {
	defer close(b.committed)
	for o := range b.ops {
		batch := []*op{o}
	drain:
		for len(batch) < maxBatch {
			select {
			case o2, ok := <-b.ops:
				if !ok {
					break drain
				}
				batch = append(batch, o2)
			default:
				break drain
			}
		}
		b.runBatch(batch)
	}
}

func (b *Broker) runBatch(batch []*op) {
	errs := make([]error, len(batch))
	// The batch outlives any one caller's context: a caller that gives up
	// does not roll back the others.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// finish answers every caller, those not answered yet with err.
	finish := func(err error) {
		for i, o := range batch {
			if errs[i] == nil {
				errs[i] = err
			}
			o.done <- errs[i]
		}
	}
	tx, err := b.st.begin(ctx)
	if err == nil {
		tx.signer = b.signer
		// The checkpoint anchors only heads this broker wrote or proved:
		// whatever another writer appended since its last head must be
		// proven before this batch chains onto it.
		if b.cp != nil {
			if err = b.proveSinceAnchor(ctx, tx); err != nil {
				tx.rollback()
			}
		}
	}
	if err != nil {
		finish(err)
		return
	}
	// A batch of one needs no savepoint: its refusal rolls back the whole
	// transaction. If a savepoint itself fails, the transaction's state is
	// unknown: the whole batch fails and nothing of it is committed.
	alone := len(batch) == 1
	abort := func(err error) {
		tx.rollback()
		finish(err)
	}
	ran := false
	for i, o := range batch {
		if err := o.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if !alone {
			if err := tx.savepoint(ctx); err != nil {
				abort(fmt.Errorf("savepoint: %w", err))
				return
			}
		}
		if err := o.fn(ctx, tx); err != nil {
			errs[i] = err
			if alone {
				continue
			}
			if rerr := tx.rollbackTo(ctx); rerr != nil {
				abort(fmt.Errorf("roll back to savepoint: %w", rerr))
				return
			}
			continue
		}
		if !alone {
			if err := tx.release(ctx); err != nil {
				abort(fmt.Errorf("release savepoint: %w", err))
				return
			}
		}
		ran = true
	}
	if !ran {
		abort(nil)
		return
	}
	// The head this batch leaves, read under the write lock: what the
	// checkpoint records once the commit is durable.
	var head Head
	if b.cp != nil {
		if head.Seq, head.Hash, err = tx.head(ctx); err != nil {
			abort(fmt.Errorf("read log head: %w", err))
			return
		}
	}
	if err = failBeforeCommit(ctx, b.st, tx, batch); err != nil {
		tx.rollback()
	} else if err = tx.commit(); err == nil {
		err = failAfterCommit(ctx, b.st, batch)
	}
	if err != nil {
		// The commit may have reached the store before the failure: what
		// it wrote is unknown until the log is read again.
		finish(errdefs.Unavailable(errdefs.CommitUnknown, "commit: %v: whether this write committed is unknown", err).Wrap(err).Retry(time.Second))
		return
	}
	// No caller hears of its event before the head that holds it is in
	// the checkpoint file: the log never runs ahead of its anchor.
	if b.cp != nil {
		if err = b.cp.record(head); err != nil {
			err = b.cp.appendRefusal(err, true)
		}
	}
	b.changeMu.Lock()
	close(b.changed)
	b.changed = make(chan struct{})
	b.changeMu.Unlock()
	finish(err)
}

// changes returns a channel closed at the next commit.
func (b *Broker) changes() <-chan struct{} {
	b.changeMu.Lock()
	defer b.changeMu.Unlock()
	return b.changed
}

// appendEvent chains e to the log's head and appends it. Only the broker's
// own code calls it, inside a write transaction.
func appendEvent(ctx context.Context, q *writeTx, e *Event) error {
	seq, prev, err := q.head(ctx)
	if err != nil {
		return fmt.Errorf("read log head: %w", err)
	}
	e.Seq = seq + 1
	e.PrevHash = prev
	e.Time = now()
	e.Data = cmp.Or(e.Data, "{}")
	e.Hash = HashEvent(*e)
	e.Sig = q.signer.sign(e.Hash)
	if err := q.insertEvent(ctx, *e); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	return nil
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// PeerString is how a peer is written into the log.
func PeerString(p authz.Peer, ok bool) string {
	if !ok {
		return ""
	}
	return fmt.Sprintf("pid=%d,uid=%d,gid=%d", p.PID, p.UID, p.GID)
}

func randomID(prefix string, n int) string {
	buf := make([]byte, n)
	rand.Read(buf) // crypto/rand never fails: it panics instead
	return prefix + hex.EncodeToString(buf)
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func scopeString(business, project, task string) string {
	return business + "/" + project + "/" + task
}

// Authorize implements authz.Authority: it resolves token. With no caps it
// requires the admin token; otherwise the grant must hold at least one of
// caps. Whose token it is goes to the call's log line (metrics.NoteGrant),
// even when the grant is then refused.
func (b *Broker) Authorize(ctx context.Context, token string, caps ...string) (authz.Grant, error) {
	if token == "" {
		return authz.Grant{}, errdefs.Unauthenticated(errdefs.TokenMissing, "no token: send 'authorization: Bearer <token>' (bushost: --token-file FILE, $BUS_TOKEN_FILE or $BUS_TOKEN)")
	}
	if b.admin != "" && subtle.ConstantTimeCompare([]byte(token), []byte(b.admin)) == 1 {
		metrics.NoteGrant(ctx, authz.HostID, "")
		if len(caps) > 0 {
			return authz.Grant{}, errdefs.PermissionDenied(errdefs.HostNotAGrant, "the admin token acts as the host, which holds no task capability (%s): issue a grant with 'bushost grant'", strings.Join(caps, " or "))
		}
		return authz.Grant{ID: authz.HostID, Host: true}, nil
	}
	g, ok, err := b.st.read().grantByHash(ctx, tokenHash(token))
	if err != nil {
		return authz.Grant{}, fmt.Errorf("look up token: %w", err)
	}
	if !ok {
		return authz.Grant{}, errdefs.Unauthenticated(errdefs.TokenUnknown, "unknown token")
	}
	metrics.NoteGrant(ctx, g.ID, g.Task)
	if err := usable(g); err != nil {
		return authz.Grant{}, err
	}
	ag := authz.Grant{ID: g.ID, Business: g.Business, Project: g.Project, Task: g.Task, Role: g.Role, Caps: g.Caps, TokenHash: g.TokenHash}
	if len(caps) == 0 {
		return authz.Grant{}, errdefs.PermissionDenied(errdefs.HostOnly, "only the host (admin.token) may do this; grant %s is a task's grant", g.ID)
	}
	if slices.ContainsFunc(caps, ag.Has) {
		return ag, nil
	}
	return authz.Grant{}, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s (role %s) lacks capability %s", g.ID, g.Role, strings.Join(caps, " or "))
}

// usable refuses a revoked or expired grant.
func usable(g grantRow) error {
	if g.RevokedSeq != 0 {
		return errdefs.Unauthenticated(errdefs.GrantRevoked, "grant %s was revoked", g.ID)
	}
	if time.Now().UnixNano() >= g.ExpiresAt {
		return errdefs.Unauthenticated(errdefs.TokenExpired, "grant %s expired at %s", g.ID, time.Unix(0, g.ExpiresAt).UTC().Format(time.RFC3339))
	}
	return nil
}

// recheck reads g again inside the write transaction, so that a revocation
// committed before this transaction is honoured even if Authorize ran
// before it, and so that a Grant value built by hand (in-process callers)
// is worth only what the stored grant says: its task and at least one of
// caps.
func recheck(ctx context.Context, q *writeTx, g authz.Grant, caps ...string) error {
	if g.Host {
		return errdefs.PermissionDenied(errdefs.HostNotAGrant, "the admin token acts as the host, not as a task's grant")
	}
	row, ok, err := q.grantByID(ctx, g.ID)
	if err != nil {
		return fmt.Errorf("look up grant: %w", err)
	}
	if !ok {
		return errdefs.Unauthenticated(errdefs.TokenUnknown, "unknown grant %s", g.ID)
	}
	if row.Business != g.Business || row.Project != g.Project || row.Task != g.Task {
		return errdefs.PermissionDenied(errdefs.OtherTask, "grant %s is for task %s", g.ID, scopeString(row.Business, row.Project, row.Task))
	}
	if err := usable(row); err != nil {
		return err
	}
	for _, c := range caps {
		if slices.Contains(row.Caps, c) {
			return nil
		}
	}
	return errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s (role %s) lacks capability %s", g.ID, row.Role, strings.Join(caps, " or "))
}

// openTask returns g's task, refusing if it is unknown or closed.
func openTask(ctx context.Context, q *queries, business, project, task string, what string) (taskRow, error) {
	t, ok, err := q.task(ctx, business, project, task)
	if err != nil {
		return t, fmt.Errorf("look up task: %w", err)
	}
	if !ok {
		return t, errdefs.NotFound(errdefs.TaskNotFound, "no task %s", scopeString(business, project, task))
	}
	if t.NeedsRepair != "" {
		return t, needsRepair(t)
	}
	if t.ClosedSeq != 0 {
		return t, errdefs.FailedPrecondition(errdefs.TaskClosed, "task %s is closed (event %d): it takes no more %s", scopeString(business, project, task), t.ClosedSeq, what)
	}
	return t, nil
}

// EnsureProject implements authz.Authority: it registers business/project.
func (b *Broker) EnsureProject(ctx context.Context, business, project string) error {
	if _, err := names.ParseProject(business, project); err != nil {
		return err
	}
	return b.place(ctx, business, project)
}

// GrantValid implements authz.Authority: a stream in flight ends when its
// grant is revoked or expires.
func (b *Broker) GrantValid(ctx context.Context, g authz.Grant) error {
	if g.Host {
		return nil
	}
	row, ok, err := b.st.read().grantByID(ctx, g.ID)
	if err != nil {
		return fmt.Errorf("look up grant: %w", err)
	}
	switch {
	case !ok:
		return errdefs.PermissionDenied(errdefs.GrantRevoked, "grant %s is gone; the stream ends", g.ID).With("grant_id", g.ID)
	case row.RevokedSeq != 0:
		return errdefs.PermissionDenied(errdefs.GrantRevoked, "grant %s was revoked (event %d); the stream ends", g.ID, row.RevokedSeq).
			With("grant_id", g.ID).With("revoked_seq", row.RevokedSeq)
	case time.Now().UnixNano() >= row.ExpiresAt:
		at := time.Unix(0, row.ExpiresAt).UTC().Format(time.RFC3339)
		return errdefs.PermissionDenied(errdefs.TokenExpired, "grant %s expired at %s; the stream ends", g.ID, at).
			With("grant_id", g.ID).With("expires_at", at)
	}
	return nil
}

// TaskOpen implements authz.Authority.
func (b *Broker) TaskOpen(ctx context.Context, g authz.Grant) error {
	if err := b.Halted(); err != nil {
		return err
	}
	_, err := openTask(ctx, b.st.read(), g.Business, g.Project, g.Task, "pushes or verdicts")
	return err
}

// RecordPush implements authz.Authority.
func (b *Broker) RecordPush(ctx context.Context, g authz.Grant, p authz.Push, peer authz.Peer) error {
	_, err := b.recordPush(ctx, g, p, PeerString(peer, peer != authz.Peer{}))
	return err
}

func (b *Broker) recordPush(ctx context.Context, g authz.Grant, p authz.Push, peer string) (Event, error) {
	if g.Host || !g.Has(authz.CapPushWorking) {
		return Event{}, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s", g.ID, authz.CapPushWorking)
	}
	if p.Business != g.Business || p.Project != g.Project || p.Task != g.Task {
		return Event{}, errdefs.PermissionDenied(errdefs.OtherTask, "grant %s is for task %s, not %s", g.ID, scopeString(g.Business, g.Project, g.Task), scopeString(p.Business, p.Project, p.Task))
	}
	ref, err := names.WorkRef(g.Task)
	if err != nil {
		return Event{}, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err)
	}
	p.Ref = cmp.Or(p.Ref, ref)
	if p.Ref != ref {
		return Event{}, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "a push of task %s moves %s, not %q", g.Task, ref, p.Ref)
	}
	if !gitid.Valid(p.Commit) {
		return Event{}, errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "commit %q is not a full hex object id", clip(p.Commit))
	}
	if p.Previous != "" && !gitid.Valid(p.Previous) {
		return Event{}, errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "previous commit %q is not a full hex object id", clip(p.Previous))
	}
	var e Event
	ctx = context.WithValue(ctx, recordPushKey{}, true)
	err = b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if err := recheck(ctx, q, g, authz.CapPushWorking); err != nil {
			return err
		}
		if err := tokenOfRecord(ctx, &q.queries, b.keys, g); err != nil {
			return err
		}
		// The project's placement, read at the append: a push through a
		// host whose cache missed a move is refused here.
		if err := writable(ctx, &q.queries, b.hostID, g.Business, g.Project); err != nil {
			return err
		}
		t, err := openTask(ctx, &q.queries, g.Business, g.Project, g.Task, "pushes")
		if err != nil {
			return err
		}
		if p.Previous != t.LastPushCommit {
			// The log, not a repository, is the arbiter of a task's
			// history: a push extends the task's latest recorded push or
			// nothing. A retry of a push whose record did commit (same
			// commit, same previous) is answered with that record.
			last, lf, ok, err := q.latestPush(ctx, g.Business, g.Project, g.Task)
			if err != nil {
				return err
			}
			if ok && p.Commit == t.LastPushCommit && last.Seq == t.LastPushSeq && lf.Commit == p.Commit && lf.Previous == p.Previous {
				e = last
				return nil
			}
			return pushConflict(g, p, t.LastPushCommit)
		}
		e = Event{Business: g.Business, Project: g.Project, Task: g.Task, Type: TypeActionAllowed, Actor: g.ID, Peer: peer,
			Data: mustData(map[string]any{"capability": authz.CapPushWorking, "commit": p.Commit, "previous": p.Previous, "ref": p.Ref})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		return q.setLastPush(ctx, t, e.Seq, p.Commit, g.ID)
	})
	return e, err
}

// pushConflict refuses a push that does not extend the task's latest
// recorded push: another push (through another host sharing the store, or
// one whose ref move this host has not made yet) recorded first.
func pushConflict(g authz.Grant, p authz.Push, latest string) error {
	scope := scopeString(g.Business, g.Project, g.Task)
	return errdefs.Aborted(errdefs.PushConflict,
		"push %s of task %s extends %s, but the task's latest recorded push is %s: run 'bushost fetch-work', rebase onto it and push again",
		p.Commit, scope, cmp.Or(p.Previous, "nothing (a first push)"), cmp.Or(latest, "none")).
		With("commit", p.Commit).With("previous", p.Previous).With("latest", latest).With("task", scope)
}

// LastPushes implements authz.Authority.
func (b *Broker) LastPushes(ctx context.Context, business, project string) (map[string]string, error) {
	if _, err := names.ParseProject(business, project); err != nil {
		return nil, err
	}
	m, err := b.st.read().lastPushes(ctx, business, project)
	if err != nil {
		return nil, fmt.Errorf("last pushes of %s/%s: %w", business, project, err)
	}
	return m, nil
}

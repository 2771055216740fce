package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// AddTask (host) registers a task of a known project; created is false if
// it already existed.
func (b *Broker) AddTask(ctx context.Context, peer, business, project, task string) (created bool, err error) {
	if task == "" {
		return false, errdefs.InvalidArgument(errdefs.NameInvalid, "no task name")
	}
	if _, err := names.ParseTask(business, project, task); err != nil {
		return false, err
	}
	err = b.write(ctx, func(ctx context.Context, q *writeTx) error {
		ok, err := q.projectExists(ctx, business, project)
		if err != nil {
			return err
		}
		if !ok {
			return errdefs.NotFound(errdefs.ProjectNotFound, "unknown project %s/%s: the host adds it first with 'bushost project add'", business, project)
		}
		created, err = q.insertTask(ctx, business, project, task)
		if err != nil || !created {
			return err
		}
		return appendEvent(ctx, q, &Event{Business: business, Project: project, Task: task, Type: TypeTaskAdded, Actor: authz.HostID, Peer: peer})
	})
	return created, err
}

// GrantRequest is what the host asks for in CreateGrant.
type GrantRequest struct {
	Business, Project, Task string
	Role                    string
	Caps                    []string
	// TTL is the grant's lifetime; 0 means the broker's default.
	TTL time.Duration
	// Launch is what a grant with session.launch may launch: role name to
	// capabilities. LaunchedBy is set by a launcher minting a session's
	// grant: the launcher's grant, which the new one is one launch below.
	Launch     map[string][]string
	LaunchedBy string
	// LaunchBounds is what else its launches may ask for (network modes,
	// limit ceilings, tasks, egress); only with session.launch.
	LaunchBounds bounds.Launch
}

// maxLaunchRoles bounds the roles of one launch set, and so what one
// grant's record and listing carry.
const maxLaunchRoles = 16

// checkLaunchSet validates a launch set: only with session.launch, role
// names, known capabilities (never network.audit, which stays with the
// launcher). Whether session.launch inside a set may be used is the
// launcher's depth bound (sandbox serve --max-launch-depth).
func checkLaunchSet(caps []string, set map[string][]string) (string, error) {
	if len(set) == 0 {
		return "", nil
	}
	if !slices.Contains(caps, authz.CapSessionLaunch) {
		return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "a launch set is given only with capability %s", authz.CapSessionLaunch)
	}
	if len(set) > maxLaunchRoles {
		return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch set: %d roles, at most %d", len(set), maxLaunchRoles).With("limit", maxLaunchRoles)
	}
	clean := map[string][]string{}
	for role, rc := range set {
		if err := names.Check("role", role); err != nil {
			return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch set: %v", err)
		}
		if len(rc) == 0 {
			return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch set: role %s has no capabilities", role)
		}
		for _, c := range rc {
			if !slices.Contains(authz.Capabilities, c) || c == authz.CapNetworkAudit {
				return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch set: role %s: capability %q is not one a session may hold: the vocabulary is %v, without %s", role, clip(c), authz.Capabilities, authz.CapNetworkAudit)
			}
		}
		clean[role] = slices.Compact(slices.Sorted(slices.Values(rc)))
	}
	b, err := json.Marshal(clean)
	return string(b), err
}

// checkLaunchBounds validates the rest of a launch set (only with
// session.launch) and returns it as stored: canonical JSON, "" for none.
func checkLaunchBounds(caps []string, lb bounds.Launch) (string, error) {
	if lb.IsZero() {
		return "", nil
	}
	if !slices.Contains(caps, authz.CapSessionLaunch) {
		return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch bounds (--launch-net, --launch-max-*, --launch-tasks, --launch-allow-*) are given only with capability %s", authz.CapSessionLaunch)
	}
	clean, err := lb.Check()
	if err != nil {
		return "", errdefs.InvalidArgument(errdefs.LaunchSetInvalid, "launch set: %v", err)
	}
	b, err := json.Marshal(clean)
	return string(b), err
}

// ParseLaunchBounds reads the JSON a grant's launch bounds are stored as.
func ParseLaunchBounds(s string) bounds.Launch {
	var lb bounds.Launch
	if s != "" {
		_ = json.Unmarshal([]byte(s), &lb)
	}
	return lb
}

// ParseLaunchSet reads the JSON a grant's launch set is stored as.
func ParseLaunchSet(s string) map[string][]string {
	if s == "" {
		return nil
	}
	var m map[string][]string
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil
	}
	return m
}

// IssuedGrant is a new grant. Token is shown once and never stored.
type IssuedGrant struct {
	ID        string
	Token     string
	ExpiresAt time.Time
}

// CreateGrant (host) issues a token for one task, role and set of
// capabilities from the vocabulary.
func (b *Broker) CreateGrant(ctx context.Context, peer string, r GrantRequest) (IssuedGrant, error) {
	if r.Task == "" {
		return IssuedGrant{}, errdefs.InvalidArgument(errdefs.NameInvalid, "a grant is for one task: give its name")
	}
	if _, err := names.ParseTask(r.Business, r.Project, r.Task); err != nil {
		return IssuedGrant{}, err
	}
	if err := names.Check("role", r.Role); err != nil {
		return IssuedGrant{}, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err)
	}
	if len(r.Caps) == 0 {
		return IssuedGrant{}, errdefs.InvalidArgument(errdefs.CapabilityInvalid, "a grant needs at least one capability of %v", authz.Capabilities)
	}
	for _, c := range r.Caps {
		if !slices.Contains(authz.Capabilities, c) {
			return IssuedGrant{}, errdefs.InvalidArgument(errdefs.CapabilityInvalid, "unknown capability %q: the vocabulary is %v", clip(c), authz.Capabilities)
		}
	}
	caps := slices.Compact(slices.Sorted(slices.Values(r.Caps)))
	launch, err := checkLaunchSet(caps, r.Launch)
	if err != nil {
		return IssuedGrant{}, err
	}
	lb, err := checkLaunchBounds(caps, r.LaunchBounds)
	if err != nil {
		return IssuedGrant{}, err
	}
	if r.TTL < 0 {
		return IssuedGrant{}, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "negative lifetime %s", r.TTL)
	}
	ig := IssuedGrant{ID: randomID("g-", 8), Token: randomID("bht_", 32), ExpiresAt: time.Now().Add(cmp.Or(r.TTL, b.defaultTTL)).UTC()}
	err = b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if _, err := openTask(ctx, &q.queries, r.Business, r.Project, r.Task, "grants"); err != nil {
			return err
		}
		g := grantRow{ID: ig.ID, TokenHash: tokenHash(ig.Token), Business: r.Business, Project: r.Project, Task: r.Task,
			Role: r.Role, Caps: caps, ExpiresAt: ig.ExpiresAt.UnixNano(), Launch: launch, LaunchedBy: r.LaunchedBy, LaunchBounds: lb}
		data := map[string]any{"grant_id": ig.ID, "role": r.Role, "capabilities": caps, "expires_at": ig.ExpiresAt.Format(time.RFC3339),
			"token_hash": g.TokenHash}
		if launch != "" {
			data["launch"] = ParseLaunchSet(launch)
		}
		if lb != "" {
			data["launch_bounds"] = ParseLaunchBounds(lb)
		}
		if r.LaunchedBy != "" {
			parent, ok, err := q.grantByID(ctx, r.LaunchedBy)
			if err != nil {
				return err
			}
			if !ok {
				return errdefs.NotFound(errdefs.GrantNotFound, "launched_by: no grant %q", clip(r.LaunchedBy))
			}
			if err := usable(parent); err != nil {
				return err
			}
			g.LaunchDepth = parent.LaunchDepth + 1
			data["launched_by"] = parent.ID
			data["launch_depth"] = g.LaunchDepth
		}
		if err := q.insertGrant(ctx, g); err != nil {
			return fmt.Errorf("store grant: %w", err)
		}
		return appendEvent(ctx, q, &Event{Business: r.Business, Project: r.Project, Task: r.Task, Type: TypeGrantCreated, Actor: authz.HostID, Peer: peer,
			Data: mustData(data)})
	})
	if err != nil {
		return IssuedGrant{}, err
	}
	return ig, nil
}

// RevokeGrant (host) makes a grant's token useless from now on. Revoking
// a revoked grant changes nothing.
func (b *Broker) RevokeGrant(ctx context.Context, peer, id string) error {
	return b.write(ctx, func(ctx context.Context, q *writeTx) error {
		g, ok, err := q.grantByID(ctx, id)
		if err != nil {
			return err
		}
		if !ok {
			return errdefs.NotFound(errdefs.GrantNotFound, "no grant %q", clip(id))
		}
		if g.RevokedSeq != 0 {
			return nil
		}
		e := Event{Business: g.Business, Project: g.Project, Task: g.Task, Type: TypeGrantRevoked, Actor: authz.HostID, Peer: peer,
			Data: mustData(map[string]any{"grant_id": g.ID})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		return q.revokeGrant(ctx, g.ID, e.Seq)
	})
}

// Review is a review request of one push.
type Review struct {
	RequestID string
	Commit    string
	Created   bool
}

// RequestReview asks for a review of the task's latest push; asking again
// for the same push returns the same request and appends nothing, unless
// that push was rejected, or its verdict given before the task's latest
// reopening: then it is refused (VERDICT_GIVEN), since only a new push can
// be reviewed again.
func (b *Broker) RequestReview(ctx context.Context, g authz.Grant, peer string) (Review, error) {
	if !g.Has(authz.CapReviewRequest) && !g.Has(authz.CapPushWorking) {
		return Review{}, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s (or %s)", g.ID, authz.CapReviewRequest, authz.CapPushWorking)
	}
	var rv Review
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if err := recheck(ctx, q, g, authz.CapReviewRequest, authz.CapPushWorking); err != nil {
			return err
		}
		t, err := openTask(ctx, &q.queries, g.Business, g.Project, g.Task, "reviews")
		if err != nil {
			return err
		}
		if t.LastPushSeq == 0 {
			return errdefs.FailedPrecondition(errdefs.NoPushToReview, "task %s has no push to review: push first", scopeString(t.Business, t.Project, t.Task))
		}
		r, ok, err := q.requestForPush(ctx, t, t.LastPushSeq)
		if err != nil {
			return err
		}
		if ok && r.Verdict != "" {
			// One verdict per request: a rejected push is never reviewed
			// again, nor one whose verdict a reopening withdrew; the work
			// goes on with a new push.
			scope := scopeString(t.Business, t.Project, t.Task)
			if r.Verdict == Reject {
				return errdefs.FailedPrecondition(errdefs.VerdictGiven,
					"the latest push %s of task %s was rejected (request %s, event %d): push a new commit, then ask for its review; 'bushost task show' has the reviewer's comment",
					r.Commit, scope, r.ID, r.VerdictSeq).
					With("request", r.ID).With("commit", r.Commit).With("verdict", r.Verdict)
			}
			re, hasReopen, err := q.latestEvent(ctx, t.Business, t.Project, t.Task, TypeTaskReopened, 0)
			if err != nil {
				return err
			}
			if reopened := re.Seq; hasReopen && r.VerdictSeq < reopened {
				return errdefs.FailedPrecondition(errdefs.VerdictGiven,
					"the verdict on the latest push %s of task %s (request %s, event %d) was given before the task was reopened (event %d): push a new commit, then ask for its review",
					r.Commit, scope, r.ID, r.VerdictSeq, reopened).
					With("request", r.ID).With("commit", r.Commit).With("verdict", r.Verdict).With("reopened_seq", reopened)
			}
		}
		if ok {
			rv = Review{RequestID: r.ID, Commit: r.Commit}
			return nil
		}
		r = requestRow{ID: randomID("r-", 8), Business: t.Business, Project: t.Project, Task: t.Task,
			PushSeq: t.LastPushSeq, Commit: t.LastPushCommit, PushActor: t.LastPushActor}
		e := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeReviewRequest, Actor: g.ID, Peer: peer,
			Data: mustData(map[string]any{"request_id": r.ID, "commit": r.Commit, "push_seq": r.PushSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		r.RequestSeq = e.Seq
		rv = Review{RequestID: r.ID, Commit: r.Commit, Created: true}
		return q.insertRequest(ctx, r)
	})
	return rv, err
}

// Verdicts.
const (
	Approve = "approve"
	Reject  = "reject"
)

// maxCommentBytes bounds a verdict's comment.
const maxCommentBytes = 16 << 10

// SubmitVerdict gives the one verdict of a request on commit, the commit
// the reviewer saw: refused without a commit, for a commit that is not the
// request's (the reviewer never had what it would approve), for a request
// of another task, a second verdict, a request whose push is no longer the
// latest (stale), a reviewer who is the pusher, and a closed task.
func (b *Broker) SubmitVerdict(ctx context.Context, g authz.Grant, peer, requestID, commit, verdict, comment string) (int64, error) {
	if !g.Has(authz.CapReviewVerdict) {
		return 0, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s", g.ID, authz.CapReviewVerdict)
	}
	if verdict != Approve && verdict != Reject {
		return 0, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "verdict must be %s or %s", Approve, Reject)
	}
	if len(comment) > maxCommentBytes {
		return 0, errdefs.ResourceExhausted(errdefs.CommentTooLarge, "comment is %d bytes; at most %d", len(comment), maxCommentBytes)
	}
	if !gitid.Valid(commit) {
		return 0, errdefs.InvalidArgument(errdefs.VerdictCommitMissing,
			"a verdict names the commit the reviewer saw (full hex id), got %q: fetch-review, then give --commit or --repo", clip(commit)).With("commit", clip(commit))
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if err := recheck(ctx, q, g, authz.CapReviewVerdict); err != nil {
			return err
		}
		if err := tokenOfRecord(ctx, &q.queries, b.keys, g); err != nil {
			return err
		}
		r, ok, err := q.request(ctx, requestID)
		if err != nil {
			return err
		}
		// A request of another task is reported as absent: a grant learns
		// nothing about tasks other than its own.
		if !ok || r.Business != g.Business || r.Project != g.Project || r.Task != g.Task {
			return errdefs.NotFound(errdefs.ReviewNotFound, "no review request %q for task %s", clip(requestID), scopeString(g.Business, g.Project, g.Task))
		}
		t, err := openTask(ctx, &q.queries, g.Business, g.Project, g.Task, "verdicts")
		if err != nil {
			return err
		}
		if r.Verdict != "" {
			return errdefs.FailedPrecondition(errdefs.VerdictGiven, "review request %s already has its verdict (%s, event %d): one verdict per request", r.ID, r.Verdict, r.VerdictSeq)
		}
		if r.PushSeq != t.LastPushSeq {
			return errdefs.FailedPrecondition(errdefs.ReviewStale, "review request %s is for commit %s, but the task's latest push is %s: stale, ask for a new review", r.ID, r.Commit, t.LastPushCommit).
				With("commit", r.Commit).With("latest", t.LastPushCommit)
		}
		if r.PushActor == g.ID {
			return errdefs.FailedPrecondition(errdefs.SelfReview, "grant %s pushed commit %s and may not review it", g.ID, r.Commit)
		}
		if commit != r.Commit {
			return errdefs.FailedPrecondition(errdefs.VerdictCommitMismatch,
				"review request %s is for commit %s, but the verdict is on commit %s: the reviewer did not see what it would judge; fetch-review and look again",
				r.ID, r.Commit, commit).With("request_commit", r.Commit).With("verdict_commit", commit)
		}
		e := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeReviewVerdict, Actor: g.ID, Peer: peer,
			Data: mustData(map[string]any{"request_id": r.ID, "verdict": verdict, "commit": r.Commit, "push_seq": r.PushSeq, "comment": comment})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return q.setVerdict(ctx, r.ID, verdict, e.Seq, g.ID)
	})
	return seq, err
}

// CloseTask closes g's task. The gate (gate.go, read from the log): a task
// with any push closes only when its latest push has an approve verdict. The check and the append
// are one transaction, so a push landing in between cannot slip through,
// and a closed task takes no more pushes.
func (b *Broker) CloseTask(ctx context.Context, g authz.Grant, peer string) (int64, error) {
	if !g.Has(authz.CapTaskClose) {
		return 0, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s", g.ID, authz.CapTaskClose)
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if err := recheck(ctx, q, g, authz.CapTaskClose); err != nil {
			return err
		}
		t, err := openTask(ctx, &q.queries, g.Business, g.Project, g.Task, "closing")
		if err != nil {
			return err
		}
		data := map[string]any{}
		closing, err := gate(ctx, &q.queries, b.keys, t)
		if err != nil {
			return err
		}
		if closing != "" {
			data["commit"] = closing
		}
		e := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeTaskClosed, Actor: g.ID, Peer: peer, Data: mustData(data)}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return q.setClosed(ctx, t, e.Seq)
	})
	return seq, err
}

// maxKeyBytes bounds an idempotency key.
const maxKeyBytes = 256

// RecordEvent appends a free-form event to g's task: the type must match
// the grammar and not be reserved, the data must be a JSON object of at
// most MaxDataBytes. With key, the same key and body return the first event
// and the same key with another body is refused.
//
// network.egress, reserved, takes a grant with network.audit instead of
// event.record (a session's launcher holds it, never the session), and is
// counted against its own bound (Options.EgressRate), not the event quota.
func (b *Broker) RecordEvent(ctx context.Context, g authz.Grant, peer, typ, data, key string) (Event, error) {
	evs, err := b.RecordEvents(ctx, g, peer, []Record{{Type: typ, Data: data, Key: key}})
	if err != nil {
		return Event{}, err
	}
	return evs[0], nil
}

// Record is one event asked of RecordEvents.
type Record struct {
	Type, Data, Key string
}

// Bounds of one RecordEvents batch, beyond each event's own.
const (
	MaxBatchEvents = 256
	MaxBatchBytes  = 512 << 10
)

// RecordEvents appends rs in one transaction, all or none, each checked
// as RecordEvent checks it, and returns the events in the order asked. A
// batch costs the log one commit however many events it holds: a
// session's launcher records the session's egress decisions this way.
func (b *Broker) RecordEvents(ctx context.Context, g authz.Grant, peer string, rs []Record) ([]Event, error) {
	if len(rs) == 0 {
		return nil, errdefs.InvalidArgument(errdefs.EventDataInvalid, "no events to record")
	}
	if len(rs) > MaxBatchEvents {
		return nil, errdefs.ResourceExhausted(errdefs.EventBatchTooLarge, "a batch of %d events; at most %d", len(rs), MaxBatchEvents).With("limit", MaxBatchEvents)
	}
	type checked struct {
		need, typ, data, key string
	}
	cs := make([]checked, len(rs))
	// What the batch costs each bound: egress events count against
	// network.egress's own, the rest against the grant's event quota.
	var nEgress, bEgress, nOther, bOther, total int
	for i, r := range rs {
		need := authz.CapEventRecord
		if r.Type == TypeNetworkEgress {
			need = authz.CapNetworkAudit
		}
		if !g.Has(need) {
			return nil, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s", g.ID, need)
		}
		if need == authz.CapEventRecord {
			if err := CheckRecordType(r.Type); err != nil {
				return nil, err
			}
		}
		data, err := canonicalData(r.Data)
		if err != nil {
			return nil, err
		}
		if len(r.Key) > maxKeyBytes {
			return nil, errdefs.InvalidArgument(errdefs.IdempotencyKeyInvalid, "idempotency key is %d bytes; at most %d", len(r.Key), maxKeyBytes)
		}
		size := len(r.Type) + len(data)
		if total += size; total > MaxBatchBytes {
			return nil, errdefs.ResourceExhausted(errdefs.EventBatchTooLarge, "a batch of over %d bytes of types and data; at most %d", MaxBatchBytes, MaxBatchBytes).With("limit", MaxBatchBytes)
		}
		if need == authz.CapNetworkAudit {
			nEgress, bEgress = nEgress+1, bEgress+size
		} else {
			nOther, bOther = nOther+1, bOther+size
		}
		cs[i] = checked{need: need, typ: r.Type, data: data, key: r.Key}
	}
	var evs []Event
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		evs = evs[:0]
		checkedCap := map[string]bool{}
		for _, c := range cs {
			if !checkedCap[c.need] {
				if err := recheck(ctx, q, g, c.need); err != nil {
					return err
				}
				checkedCap[c.need] = true
			}
		}
		// The quotas, charged with the events they pay for: a refused
		// write charges nothing, and every host charges the same rows.
		if !g.Host {
			if err := b.egressQuota.charge(ctx, q, g.ID, nEgress, bEgress); err != nil {
				return err
			}
			if err := b.quota.charge(ctx, q, g.ID, nOther, bOther); err != nil {
				return err
			}
		}
		t, err := q.knownTask(ctx, g.Business, g.Project, g.Task)
		if err != nil {
			return err
		}
		for _, c := range cs {
			// A closed task's log is done: a session's grant, which
			// outlives the close, adds nothing to it. Its launcher's
			// egress audit (network.audit) still lands: those are
			// records of what the session did before it ended.
			var closed error
			if t.ClosedSeq != 0 && c.need == authz.CapEventRecord {
				closed = errdefs.FailedPrecondition(errdefs.TaskClosed, "task %s is closed (event %d): it takes no more events",
					scopeString(g.Business, g.Project, g.Task), t.ClosedSeq).With("closed_seq", t.ClosedSeq)
			}
			e := Event{Business: g.Business, Project: g.Project, Task: g.Task, Type: c.typ, Actor: g.ID, Peer: peer, Data: c.data}
			if err := appendOnce(ctx, q, &e, c.key, closed); err != nil {
				return err
			}
			evs = append(evs, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return evs, nil
}

// Events calls send for each event after seq that f selects, in order; with
// follow it then waits for new ones until ctx ends. A grant's filter is its
// own task, whatever it asks.
func (b *Broker) Events(ctx context.Context, f Filter, after int64, follow bool, send func(Event) error) error {
	// A name no task can have is refused, not answered with no events.
	if err := names.CheckFilter("business", f.Business, "project", f.Project, "task", f.Task); err != nil {
		return err
	}
	// A page is bounded by count and by bytes, so that a stream whose
	// reader is slow holds at most one page: 500 events of 60 KiB would
	// be 30 MB.
	const page, pageBytes = 500, 1 << 20
	// Other processes sharing a PostgreSQL store append without telling
	// this one: poll as well as wait for local commits.
	poll := time.NewTicker(500 * time.Millisecond)
	defer poll.Stop()
	for {
		if f.Still != nil {
			if err := f.Still(ctx); err != nil {
				return err
			}
		}
		changed := b.changes()
		evs, full, err := b.st.read().events(ctx, f, after, page, pageBytes)
		if err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		for _, e := range evs {
			if err := send(e); err != nil {
				return err
			}
			after = e.Seq
		}
		if full {
			continue
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-poll.C:
		}
	}
}

// RecordSessionEvent (host) appends a session.* event (session.launched,
// session.ended: sandbox serve's record of the sessions it runs) to a
// task. With key, the same key and body return the first event, so a
// launcher that restarts records a session's end once.
func (b *Broker) RecordSessionEvent(ctx context.Context, peer, business, project, task, typ, data, key string) (Event, error) {
	if !strings.HasPrefix(typ, SessionPrefix) || len(typ) > maxTypeLen || !eventTypeRE.MatchString(typ) {
		return Event{}, errdefs.InvalidArgument(errdefs.EventTypeInvalid, "the host records only %s* events here, not %q", SessionPrefix, clip(typ))
	}
	if _, err := names.ParseTask(business, project, task); err != nil {
		return Event{}, err
	}
	data, err := canonicalData(data)
	if err != nil {
		return Event{}, err
	}
	if len(key) > maxKeyBytes {
		return Event{}, errdefs.InvalidArgument(errdefs.IdempotencyKeyInvalid, "idempotency key is %d bytes; at most %d", len(key), maxKeyBytes)
	}
	var e Event
	err = b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if _, err := q.knownTask(ctx, business, project, task); err != nil {
			return err
		}
		e = Event{Business: business, Project: project, Task: task, Type: typ, Actor: authz.HostID, Peer: peer, Data: data}
		return appendOnce(ctx, q, &e, key, nil)
	})
	return e, err
}

// appendOnce appends e, or with key replays it: the same key (of the same
// actor) with the same type and data is answered with the event it first
// appended, and with another body refused. refuse, when set, is what a
// new append is answered, never a replay.
func appendOnce(ctx context.Context, q *writeTx, e *Event, key string, refuse error) error {
	body := tokenHash(e.Type + "\x00" + e.Data)
	if key != "" {
		h, seq, ok, err := q.idempotent(ctx, e.Actor, key)
		if err != nil {
			return err
		}
		if ok {
			if h != body {
				return errdefs.AlreadyExists(errdefs.IdempotencyKeyReused, "idempotency key %q was first used with another body (event %d)", clip(key), seq)
			}
			first, found, err := q.event(ctx, seq)
			if err == nil && !found {
				err = fmt.Errorf("idempotency key %q names missing event %d", clip(key), seq)
			}
			*e = first
			return err
		}
	}
	if refuse != nil {
		return refuse
	}
	if err := appendEvent(ctx, q, e); err != nil {
		return err
	}
	if key != "" {
		return q.insertIdempotent(ctx, e.Actor, key, body, e.Seq)
	}
	return nil
}

// Whoami returns g with its launch set and place in a chain of launches.
func (b *Broker) Whoami(ctx context.Context, g authz.Grant) (authz.Grant, error) {
	row, _, err := b.st.read().grantByID(ctx, g.ID)
	if err != nil {
		return authz.Grant{}, fmt.Errorf("look up grant: %w", err)
	}
	g.Launch, g.LaunchedBy, g.LaunchDepth, g.LaunchBounds = ParseLaunchSet(row.Launch), row.LaunchedBy, row.LaunchDepth, ParseLaunchBounds(row.LaunchBounds)
	return g, nil
}

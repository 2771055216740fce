package broker

import (
	"github.com/bushost/bushost/internal/errdefs"

	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
)

// The close gate decides from the log itself, never from the derived
// tables: those are a cache for listing, and one edited row (a verdict set
// to approve, a last push set to zero) must not open the gate (issue 13).
// Both reads go through the events_by_task index: the task's latest push,
// then the task's review events after it, whatever the log's length.

// eventFields are the fields of the broker's own events that the gate and
// the rebuild of the derived tables (verify.go) read.
type eventFields struct {
	Capability string   `json:"capability"`
	Commit     string   `json:"commit"`
	Previous   string   `json:"previous"`
	RequestID  string   `json:"request_id"`
	PushSeq    int64    `json:"push_seq"`
	Verdict    string   `json:"verdict"`
	GrantID    string   `json:"grant_id"`
	Role       string   `json:"role"`
	Caps       []string `json:"capabilities"`
	ExpiresAt  string   `json:"expires_at"`
	TokenHash  string   `json:"token_hash"`
	// A grant's launch set and place in a chain of launches.
	Launch      map[string][]string `json:"launch"`
	LaunchedBy  string              `json:"launched_by"`
	LaunchDepth int                 `json:"launch_depth"`
	// The rest of a launch set, as CreateGrant stored it.
	LaunchBounds *bounds.Launch `json:"launch_bounds"`
}

func fieldsOf(e Event) (eventFields, error) {
	var f eventFields
	if err := json.Unmarshal([]byte(e.Data), &f); err != nil {
		return f, fmt.Errorf("event %d (%s): data: %w", e.Seq, e.Type, err)
	}
	return f, nil
}

// isPush says whether e is a push of a task's work (action.allowed of
// git.push.working).
func isPush(e Event, f eventFields) bool {
	return e.Type == TypeActionAllowed && f.Capability == authz.CapPushWorking
}

// latestPush returns the task's latest push event from the log.
func (q *queries) latestPush(ctx context.Context, business, project, task string) (Event, eventFields, bool, error) {
	rows, err := q.db.QueryContext(ctx, `SELECT `+eventCols+` FROM events WHERE business = $1 AND project = $2 AND task = $3 AND type = $4 ORDER BY seq DESC`,
		business, project, task, TypeActionAllowed)
	if err != nil {
		return Event{}, eventFields{}, false, err
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return Event{}, eventFields{}, false, err
		}
		f, err := fieldsOf(e)
		if err != nil {
			return Event{}, eventFields{}, false, err
		}
		if isPush(e, f) {
			return e, f, true, nil
		}
	}
	return Event{}, eventFields{}, false, rows.Err()
}

// latestEvent returns the task's latest event of type typ after seq, if
// any.
func (q *queries) latestEvent(ctx context.Context, business, project, task, typ string, after int64) (Event, bool, error) {
	return one(scanEvent(q.db.QueryRowContext(ctx, `SELECT `+eventCols+` FROM events WHERE business = $1 AND project = $2 AND task = $3 AND type = $4 AND seq > $5 ORDER BY seq DESC LIMIT 1`,
		business, project, task, typ, after)))
}

// proven refuses, shutting the gate of task t, an event the gate read
// that no trusted host signed (LOG_EVENT_UNPROVEN): a row written straight
// into the database, whatever hash it carries, decides nothing.
func proven(keys *Keyring, t taskRow, e Event) error {
	err := keys.prove(e)
	if err == nil {
		return nil
	}
	return errdefs.FailedPrecondition(errdefs.LogEventUnproven,
		"task %s: the gate reads %s, which %v; the gate stays shut: run 'bushost log verify' and see docs/broker.md, \"Who wrote an event\"",
		scopeString(t.Business, t.Project, t.Task), describe(e), err).With("seq", e.Seq).With("type", e.Type)
}

// gate decides the close of task t from the log: a task with no push
// closes; a task with a push closes only when a verdict recorded for its
// latest push (same push event, same commit) approves it, and was recorded
// after the task's latest task.reopened: a reopening withdraws the
// approvals given before it, so the approve that closed the task once
// cannot close (or land) it again. Every event it reads must be proven by
// keys (a few signatures, whatever the log's length). It returns the
// commit that closes with the task ("" with no push).
func gate(ctx context.Context, q *queries, keys *Keyring, t taskRow) (string, error) {
	push, pf, ok, err := q.latestPush(ctx, t.Business, t.Project, t.Task)
	if err != nil || !ok {
		return "", err
	}
	if err := proven(keys, t, push); err != nil {
		return "", err
	}
	// The task's review.request and review.verdict events after the push.
	evs, err := q.eventsWhere(ctx, `business = $1 AND project = $2 AND task = $3 AND seq > $4 AND type IN ($5, $6)`,
		t.Business, t.Project, t.Task, push.Seq, TypeReviewRequest, TypeReviewVerdict)
	if err != nil {
		return "", err
	}
	for _, e := range evs {
		if err := proven(keys, t, e); err != nil {
			return "", err
		}
	}
	var reopened int64
	if re, ok, err := q.latestEvent(ctx, t.Business, t.Project, t.Task, TypeTaskReopened, 0); err != nil {
		return "", err
	} else if ok {
		if err := proven(keys, t, re); err != nil {
			return "", err
		}
		reopened = re.Seq
	}
	withdrawn := false
	forPush := func(f eventFields) bool { return f.PushSeq == push.Seq && f.Commit == pf.Commit }
	requests := map[string]bool{}
	var requestID, verdict string
	var approval Event
scan:
	for _, e := range evs {
		f, err := fieldsOf(e)
		if err != nil {
			return "", err
		}
		switch {
		case !forPush(f):
		case e.Type == TypeReviewRequest:
			requests[f.RequestID] = true
			if requestID == "" {
				requestID = f.RequestID
			}
		case e.Type == TypeReviewVerdict && requests[f.RequestID] && e.Seq < reopened:
			// Given before the task was reopened: it no longer counts.
			requestID, withdrawn = f.RequestID, true
		case e.Type == TypeReviewVerdict && requests[f.RequestID]:
			requestID, verdict, approval = f.RequestID, f.Verdict, e
			if verdict != Approve {
				// One verdict per request: a reject stands.
				break scan
			}
		}
	}
	scope := scopeString(t.Business, t.Project, t.Task)
	switch {
	case requestID == "":
		return "", errdefs.FailedPrecondition(errdefs.GateNoApproval, "task %s cannot close: its latest push %s has no review; request one and get an approve verdict", scope, pf.Commit).
			With("commit", pf.Commit).With("review", "none")
	case verdict == "" && withdrawn:
		return "", errdefs.FailedPrecondition(errdefs.GateNoApproval, "task %s cannot close: the verdict on its latest push %s (request %s) was given before the task was reopened (event %d); push again and get a new review", scope, pf.Commit, requestID, reopened).
			With("commit", pf.Commit).With("request", requestID).With("review", "withdrawn").With("reopened_seq", reopened)
	case verdict == "":
		return "", errdefs.FailedPrecondition(errdefs.GateNoApproval, "task %s cannot close: review request %s of its latest push %s has no verdict yet", scope, requestID, pf.Commit).
			With("commit", pf.Commit).With("request", requestID).With("review", "pending")
	case verdict != Approve:
		return "", errdefs.FailedPrecondition(errdefs.GateNoApproval, "task %s cannot close: its latest push %s was rejected (request %s)", scope, pf.Commit, requestID).
			With("commit", pf.Commit).With("request", requestID).With("review", "rejected")
	}
	if err := approvedBy(ctx, q, keys, t, push, evs, approval); err != nil {
		return "", err
	}
	return pf.Commit, nil
}

// approvedBy checks, from the log, that the approving verdict's actor
// could give it: the verdict is signed by a host, but the host decided
// from the grants and review_requests tables, which a database writer can
// edit (a grant row of its own making, a request's pusher changed). So
// the gate replays the task's grant events before the verdict, its latest
// push and the reviews after it, as log verify does (verdictAuthority),
// at the cost of one more read of the task's events and a few proofs.
func approvedBy(ctx context.Context, q *queries, keys *Keyring, t taskRow, push Event, reviews []Event, approval Event) error {
	grants, err := q.eventsWhere(ctx, `business = $1 AND project = $2 AND task = $3 AND seq < $4 AND type IN ($5, $6)`,
		t.Business, t.Project, t.Task, approval.Seq, TypeGrantCreated, TypeGrantRevoked)
	if err != nil {
		return err
	}
	for _, e := range grants {
		if err := proven(keys, t, e); err != nil {
			return err
		}
	}
	replay := append(append(grants, push), reviews...)
	sort.Slice(replay, func(i, j int) bool { return replay[i].Seq < replay[j].Seq })
	rb := newRebuild()
	for _, e := range replay {
		if e.Seq > approval.Seq {
			break
		}
		if why := rb.apply(e); why != "" && e.Seq == approval.Seq {
			return errdefs.FailedPrecondition(errdefs.GateVerdictInvalid,
				"task %s cannot close: its approve, %s, %s, as the log shows; the gate stays shut: run 'bushost log verify' and see docs/broker.md, \"Who wrote an event\"",
				scopeString(t.Business, t.Project, t.Task), describe(approval), why).With("seq", approval.Seq)
		}
	}
	return nil
}

// tokenOfRecord refuses g's call unless the token it presented is the one
// its grant was created with, as the grant's signed grant.created event
// records it (GRANT_TOKEN_MISMATCH). The grants table maps a token to a
// grant, and a database writer can point a grant's row at a token of its
// own: the verdict (or push) the host would sign carries that grant's id,
// whose authority the log shows, so neither the gate's replay nor log
// verify could tell; with the worker's row, a reviewer could push as the
// worker and approve its own push. So a verdict and a push are checked.
// A grant created before grant.created recorded its token's hash has none
// to check against, and gives neither: issue a new one.
func tokenOfRecord(ctx context.Context, q *queries, keys *Keyring, g authz.Grant) error {
	evs, err := q.eventsWhere(ctx, `business = $1 AND project = $2 AND task = $3 AND type = $4`,
		g.Business, g.Project, g.Task, TypeGrantCreated)
	if err != nil {
		return err
	}
	var unprovenErr error
	for _, e := range evs {
		f, err := fieldsOf(e)
		if err != nil || f.GrantID != g.ID {
			continue
		}
		if err := keys.prove(e); err != nil {
			unprovenErr = errdefs.FailedPrecondition(errdefs.LogEventUnproven,
				"grant %s: its %s, which %v, cannot vouch for its token: nothing is recorded with it; run 'bushost log verify' and see docs/broker.md, \"Who wrote an event\"",
				g.ID, describe(e), err).With("seq", e.Seq).With("type", e.Type)
			continue
		}
		if f.TokenHash == "" || f.TokenHash != g.TokenHash {
			break
		}
		return nil
	}
	if unprovenErr != nil {
		return unprovenErr
	}
	return errdefs.Unauthenticated(errdefs.GrantTokenMismatch,
		"grant %s: the token presented is not the one its grant.created event records (the grants table was edited, or the grant predates recorded tokens): nothing is recorded with it; issue a new grant, and see docs/broker.md, \"Who wrote an event\"", g.ID)
}

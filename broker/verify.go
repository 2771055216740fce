package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/authz"
)

// Verification is what VerifyLog found.
type Verification struct {
	OK     bool
	Events int64
	// HeadSeq and HeadHash are the log's last event as read.
	HeadSeq  int64
	HeadHash string
	// FirstBadSeq is the first event that fails the chain or a recorded
	// head (0 if none), and Reason says how.
	FirstBadSeq int64
	Reason      string
	// Differences are the rows of the derived tables that disagree with
	// the log rebuilt from its events, each naming its table and row.
	Differences []string
}

// maxDifferences bounds the differences reported; the rest are counted.
const maxDifferences = 100

// VerifyLog checks who wrote each event: a trusted host's signature of
// its hash (signing.go), naming the events it cannot prove; and, from the
// log alone, that each verdict's actor could give it (its grant held
// review.verdict on that task, unrevoked and unexpired, and did not push
// the commit it judges).
//
// VerifyLog checks the log: the hash chain from the first event (each seq
// one more than the last, each prev_hash the last event's hash, each hash
// the hash of its own canonical encoding); each recorded head (event SEQ
// still has that hash: a rewrite before it or a truncation below it
// fails); and the derived tables against the state rebuilt from the
// events. It names the first bad event and every differing row. It reads
// one snapshot of the store (read only; on PostgreSQL REPEATABLE READ), so
// that tables and log are one consistent state, and takes no lock: writes
// go on while it reads, on this host and every other.
func (b *Broker) VerifyLog(ctx context.Context, heads ...Head) (Verification, error) {
	return b.verify(ctx, heads, true)
}

// verify checks the chain and heads; with derived, also every event's
// proof, the verdicts' authority and the derived tables.
func (b *Broker) verify(ctx context.Context, heads []Head, derived bool) (Verification, error) {
	tx, err := b.st.snapshot(ctx, true)
	if err != nil {
		return Verification{}, err
	}
	defer tx.done()
	q := &tx.queries

	var v Verification
	heads = slices.Clone(heads)
	sort.SliceStable(heads, func(i, j int) bool { return heads[i].Seq < heads[j].Seq })
	bad := func(seq int64, format string, a ...any) {
		if v.FirstBadSeq == 0 || seq < v.FirstBadSeq {
			v.FirstBadSeq, v.Reason = seq, fmt.Sprintf(format, a...)
		}
	}
	var prevSeq int64
	prevHash := ""
	chainOK := true
	rb := newRebuild()
	var pv *prover
	if derived {
		pv = newProver(b.keys)
	}
	err = q.eachEvent(ctx, func(e Event) error {
		v.Events++
		if chainOK {
			switch {
			case e.Seq != prevSeq+1:
				bad(e.Seq, "event %d follows event %d: a gap or reordering", e.Seq, prevSeq)
				chainOK = false
			case e.PrevHash != prevHash:
				bad(e.Seq, "event %d's prev_hash %.12s does not match event %d's hash %.12s", e.Seq, e.PrevHash, prevSeq, prevHash)
				chainOK = false
			case HashEvent(e) != e.Hash:
				bad(e.Seq, "event %d's content does not match its hash %.12s: it was changed after it was appended", e.Seq, e.Hash)
				chainOK = false
			}
		}
		if derived {
			pv.add(e)
		}
		for len(heads) > 0 && heads[0].Seq < e.Seq {
			bad(heads[0].Seq, "recorded head %d is missing from the log", heads[0].Seq)
			heads = heads[1:]
		}
		for len(heads) > 0 && heads[0].Seq == e.Seq {
			if heads[0].Hash != e.Hash {
				bad(e.Seq, "event %d has hash %.12s, but the recorded head says %.12s: the log was rewritten at or before event %d", e.Seq, e.Hash, heads[0].Hash, e.Seq)
			}
			heads = heads[1:]
		}
		prevSeq, prevHash = e.Seq, e.Hash
		v.HeadSeq, v.HeadHash = e.Seq, e.Hash
		if derived {
			if why := rb.apply(e); why != "" {
				bad(e.Seq, "%s %s", describe(e), why)
			}
		}
		return nil
	})
	if derived {
		if u := pv.done(); u.n > 0 {
			bad(u.first(), "events not proven (%d): %s", u.n, u)
		}
	}
	if err != nil {
		return Verification{}, fmt.Errorf("read log: %w", err)
	}
	if len(heads) > 0 {
		last := heads[len(heads)-1]
		bad(v.HeadSeq+1, "the log ends at event %d, but a recorded head is event %d: events %d to %d were deleted", v.HeadSeq, last.Seq, v.HeadSeq+1, last.Seq)
	}
	if derived {
		if v.Differences, err = rb.compare(ctx, q); err != nil {
			return Verification{}, fmt.Errorf("compare derived tables: %w", err)
		}
	}
	v.OK = v.FirstBadSeq == 0 && len(v.Differences) == 0
	return v, nil
}

// LogHead returns the log's last event's seq and hash (0, "" when empty).
func (b *Broker) LogHead(ctx context.Context) (int64, string, error) {
	seq, hash, err := b.st.read().head(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("read log head: %w", err)
	}
	return seq, hash, nil
}

// rebuild is the derived state replayed from the events alone.
type rebuild struct {
	tasks      map[string]taskRow
	grants     map[string]grantRow
	requests   map[string]requestRow
	pushActors map[int64]string
	problems   []string
}

func newRebuild() *rebuild {
	return &rebuild{tasks: map[string]taskRow{}, grants: map[string]grantRow{}, requests: map[string]requestRow{}, pushActors: map[int64]string{}}
}

// apply replays e onto the derived state. For a verdict it returns why
// the log alone shows its actor could not give it ("" when it could).
func (r *rebuild) apply(e Event) string {
	key := scopeString(e.Business, e.Project, e.Task)
	if e.Type != TypeTaskAdded && !strings.HasPrefix(e.Type, "action.") && !strings.HasPrefix(e.Type, "task.") &&
		!strings.HasPrefix(e.Type, "grant.") && !strings.HasPrefix(e.Type, "review.") {
		return ""
	}
	f, err := fieldsOf(e)
	if err != nil {
		r.problems = append(r.problems, err.Error())
		return ""
	}
	switch {
	case e.Type == TypeTaskAdded:
		r.tasks[key] = taskRow{Business: e.Business, Project: e.Project, Task: e.Task}
	case isPush(e, f):
		t := r.tasks[key]
		t.LastPushSeq, t.LastPushCommit, t.LastPushActor = e.Seq, f.Commit, e.Actor
		r.tasks[key] = t
		r.pushActors[e.Seq] = e.Actor
	case e.Type == TypeTaskClosed:
		t := r.tasks[key]
		t.ClosedSeq = e.Seq
		r.tasks[key] = t
	case e.Type == TypeTaskReopened:
		t := r.tasks[key]
		t.ClosedSeq = 0
		r.tasks[key] = t
	case e.Type == TypeGrantCreated:
		exp, err := time.Parse(time.RFC3339, f.ExpiresAt)
		if err != nil {
			r.problems = append(r.problems, fmt.Sprintf("event %d: expires_at %q: %v", e.Seq, f.ExpiresAt, err))
		}
		g := grantRow{ID: f.GrantID, Business: e.Business, Project: e.Project, Task: e.Task, Role: f.Role, Caps: f.Caps, ExpiresAt: exp.Unix(),
			LaunchedBy: f.LaunchedBy, LaunchDepth: f.LaunchDepth}
		if len(f.Launch) > 0 {
			b, _ := json.Marshal(f.Launch) // keys sorted, as CreateGrant stored them
			g.Launch = string(b)
		}
		if f.LaunchBounds != nil && !f.LaunchBounds.IsZero() {
			b, _ := json.Marshal(f.LaunchBounds) // as CreateGrant stored them
			g.LaunchBounds = string(b)
		}
		r.grants[f.GrantID] = g
	case e.Type == TypeGrantRevoked:
		g := r.grants[f.GrantID]
		g.RevokedSeq = e.Seq
		r.grants[f.GrantID] = g
	case e.Type == TypeReviewRequest:
		r.requests[f.RequestID] = requestRow{ID: f.RequestID, Business: e.Business, Project: e.Project, Task: e.Task,
			PushSeq: f.PushSeq, Commit: f.Commit, PushActor: r.pushActors[f.PushSeq], RequestSeq: e.Seq}
	case e.Type == TypeReviewVerdict:
		why := r.verdictAuthority(e, f)
		q := r.requests[f.RequestID]
		q.Verdict, q.VerdictSeq, q.Reviewer = f.Verdict, e.Seq, e.Actor
		r.requests[f.RequestID] = q
		return why
	}
	return ""
}

// verdictAuthority says why verdict e could not have been given, from the
// log replayed so far: its request must be of the same task and commit
// and have no verdict yet, and its actor's grant must have been created
// for that task with review.verdict, not revoked, not expired at the
// verdict's time, and must not be the grant that pushed the commit.
func (r *rebuild) verdictAuthority(e Event, f eventFields) string {
	req, ok := r.requests[f.RequestID]
	switch {
	case !ok || scopeString(req.Business, req.Project, req.Task) != scopeString(e.Business, e.Project, e.Task):
		return fmt.Sprintf("judges request %q, which the log holds for no such task", clip(f.RequestID))
	case req.Verdict != "":
		return fmt.Sprintf("is a second verdict on request %s (the first is event %d)", req.ID, req.VerdictSeq)
	case f.Commit != req.Commit:
		return fmt.Sprintf("judges commit %s, but request %s is for %s", clip(f.Commit), req.ID, req.Commit)
	}
	g, ok := r.grants[e.Actor]
	switch {
	case !ok:
		return fmt.Sprintf("is by %q, which no grant.created in the log names", clip(e.Actor))
	case scopeString(g.Business, g.Project, g.Task) != scopeString(e.Business, e.Project, e.Task):
		return fmt.Sprintf("is by grant %s, which is for task %s", g.ID, scopeString(g.Business, g.Project, g.Task))
	case !slices.Contains(g.Caps, authz.CapReviewVerdict):
		return fmt.Sprintf("is by grant %s, which does not hold %s", g.ID, authz.CapReviewVerdict)
	case g.RevokedSeq != 0:
		return fmt.Sprintf("is by grant %s, revoked at event %d", g.ID, g.RevokedSeq)
	case req.PushActor == e.Actor:
		return fmt.Sprintf("is by grant %s, which pushed the commit it judges", g.ID)
	}
	// The log keeps the expiry to the second: the grant lived until the
	// end of that second at most.
	if at, err := time.Parse(time.RFC3339Nano, e.Time); err != nil || !at.Before(time.Unix(g.ExpiresAt+1, 0)) {
		return fmt.Sprintf("is by grant %s at %s, after it expired (%s)", g.ID, clip(e.Time), time.Unix(g.ExpiresAt, 0).UTC().Format(time.RFC3339))
	}
	return ""
}

// compare reads the derived tables and lists every row that differs from
// the rebuilt state: missing, extra, or a column with another value.
func (r *rebuild) compare(ctx context.Context, q *queries) ([]string, error) {
	diffs := slices.Clone(r.problems)
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }

	tasks, err := all(ctx, q, func(s scanner) (t taskRow, err error) {
		err = s.Scan(&t.Business, &t.Project, &t.Task, &t.ClosedSeq, &t.LastPushSeq, &t.LastPushCommit, &t.LastPushActor)
		return t, err
	}, `SELECT business, project, task, closed_seq, last_push_seq, last_push_commit, last_push_actor FROM tasks`)
	if err != nil {
		return nil, err
	}
	diffTable(add, "tasks", "task.added", tasks, func(t taskRow) string { return scopeString(t.Business, t.Project, t.Task) }, r.tasks, func(got, want taskRow) [][3]any {
		return [][3]any{
			{"closed_seq", got.ClosedSeq, want.ClosedSeq},
			{"last_push_seq", got.LastPushSeq, want.LastPushSeq},
			{"last_push_commit", got.LastPushCommit, want.LastPushCommit},
			{"last_push_actor", got.LastPushActor, want.LastPushActor},
		}
	})

	grants, err := all(ctx, q, scanGrant, `SELECT `+grantCols+` FROM grants`)
	if err != nil {
		return nil, err
	}
	diffTable(add, "grants", "grant.created", grants, func(g grantRow) string { return g.ID }, r.grants, func(got, want grantRow) [][3]any {
		return [][3]any{
			{"scope", scopeString(got.Business, got.Project, got.Task), scopeString(want.Business, want.Project, want.Task)},
			{"role", got.Role, want.Role},
			{"caps", strings.Join(got.Caps, ","), strings.Join(want.Caps, ",")},
			// The log keeps the expiry to the second.
			{"expires_at", time.Unix(0, got.ExpiresAt).Unix(), want.ExpiresAt},
			{"revoked_seq", got.RevokedSeq, want.RevokedSeq},
			{"launch", got.Launch, want.Launch},
			{"launched_by", got.LaunchedBy, want.LaunchedBy},
			{"launch_depth", got.LaunchDepth, want.LaunchDepth},
			{"launch_bounds", got.LaunchBounds, want.LaunchBounds},
		}
	})

	reqs, err := all(ctx, q, scanRequest, `SELECT `+requestCols+` FROM review_requests`)
	if err != nil {
		return nil, err
	}
	diffTable(add, "review_requests", "review.request", reqs, func(row requestRow) string { return row.ID }, r.requests, func(got, want requestRow) [][3]any {
		return [][3]any{
			{"scope", scopeString(got.Business, got.Project, got.Task), scopeString(want.Business, want.Project, want.Task)},
			{"push_seq", got.PushSeq, want.PushSeq},
			{"commit_id", got.Commit, want.Commit},
			{"push_actor", got.PushActor, want.PushActor},
			{"request_seq", got.RequestSeq, want.RequestSeq},
			{"verdict", got.Verdict, want.Verdict},
			{"verdict_seq", got.VerdictSeq, want.VerdictSeq},
			{"reviewer", got.Reviewer, want.Reviewer},
		}
	})
	sort.Strings(diffs)
	if len(diffs) > maxDifferences {
		n := len(diffs) - maxDifferences
		diffs = append(diffs[:maxDifferences], fmt.Sprintf("... and %d more", n))
	}
	return diffs, nil
}

// diffTable reports each row of a derived table (rows, by key) that
// differs from the log's (want, which event adds): missing, extra, or a
// column of columns(got, want) with another value.
func diffTable[R any](add func(string, ...any), table, event string, rows []R, key func(R) string, want map[string]R, columns func(got, want R) [][3]any) {
	got := map[string]R{}
	for _, r := range rows {
		got[key(r)] = r
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			add("%s %s: the log has it (%s), the table does not", table, k, event)
			continue
		}
		cols(add, table+" "+k, columns(g, w))
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			add("%s %s: in the table, but no %s in the log", table, k, event)
		}
	}
}

// cols reports each column whose table value (1) is not the log's (2).
func cols(add func(string, ...any), row string, cs [][3]any) {
	for _, c := range cs {
		if c[1] != c[2] {
			add("%s: %s is %q in the table, %q in the log", row, c[0], fmt.Sprint(c[1]), fmt.Sprint(c[2]))
		}
	}
}

// Package authz is the contract between the services and the broker that
// vouches for callers: the capability vocabulary, the grant a token stands
// for, and the Authority interface that gitd calls in-process. It holds no
// state and decides nothing itself; the broker implements Authority.
package authz

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/bushost/bushost/internal/bounds"
)

// The capability vocabulary (docs/architecture.md).
const (
	CapPushWorking   = "git.push.working"
	CapReviewRequest = "review.request"
	CapReviewVerdict = "review.verdict"
	CapTaskClose     = "task.close"
	CapEventRecord   = "event.record"
	// CapNetworkAudit lets a session's launcher (sandbox run
	// --audit-token-file) record network.egress on the task, and nothing
	// else; it never enters the session.
	CapNetworkAudit = "network.audit"
	CapTaskLand     = "task.land"
	// CapSessionLaunch lets a grant start sessions through sandbox serve's
	// launch socket, each with a role and capabilities from the grant's
	// launch set (Grant.Launch), never more.
	CapSessionLaunch = "session.launch"
)

// Capabilities is the whole vocabulary; a grant naming anything else is
// refused.
var Capabilities = []string{CapPushWorking, CapReviewRequest, CapReviewVerdict, CapTaskClose, CapEventRecord, CapNetworkAudit, CapTaskLand, CapSessionLaunch}

// HostID is the actor recorded for calls made with admin.token.
const HostID = "host"

// Grant is what the broker vouches for about a caller's token.
type Grant struct {
	// ID is the grant's id, or HostID for the admin token.
	ID string
	// Host is true for the admin token, which has no scope or capabilities
	// of a grant but may do the host's operations.
	Host                    bool
	Business, Project, Task string
	Role                    string
	Caps                    []string
	// TokenHash is the hex SHA-256 of the token presented ("" for the
	// admin token): the broker checks it against the grant's
	// grant.created event before it signs a verdict.
	TokenHash string
	// Launch is what a grant with session.launch may start: role name to
	// the capabilities a session of that role may hold.
	Launch map[string][]string
	// LaunchedBy is the grant whose launcher minted this one ("" for a
	// grant the host made by hand), LaunchDepth how many launches deep it
	// is (0 for the host's).
	LaunchedBy  string
	LaunchDepth int
	// LaunchBounds is what else its launches may ask for: network modes,
	// limit ceilings, tasks, egress (docs/launch.md).
	LaunchBounds bounds.Launch
}

// Has reports whether g holds capability c.
func (g Grant) Has(c string) bool {
	return slices.Contains(g.Caps, c)
}

// Peer is the calling process as the socket saw it (SO_PEERCRED).
type Peer struct {
	PID, UID, GID int32
}

// Push is one accepted push, as recorded in the log.
type Push struct {
	Business, Project, Task string
	Commit, Previous, Ref   string
}

// Authority is what gitd asks of the broker. Its refusals are domain errors
// (*errdefs.Error: TOKEN_UNKNOWN, TOKEN_EXPIRED, GRANT_REVOKED,
// CAPABILITY_MISSING, TASK_CLOSED, ...), not gRPC statuses; the service
// that asked returns them as they are, like its own (internal/grpcerr
// sends them).
type Authority interface {
	// Authorize resolves token and requires that its grant hold at least one
	// of caps. With no caps it requires the admin token.
	Authorize(ctx context.Context, token string, caps ...string) (Grant, error)
	// EnsureProject registers business/project with the broker (host only;
	// idempotent).
	EnsureProject(ctx context.Context, business, project string) error
	// CheckPlacement refuses (PROJECT_ON_OTHER_HOST, naming the owner) a
	// project placed on another bus host sharing the store.
	CheckPlacement(ctx context.Context, business, project string) error
	// TaskOpen returns nil if the grant's task exists and is not closed.
	TaskOpen(ctx context.Context, g Grant) error
	// RecordPush appends action.allowed {capability: git.push.working,
	// commit, previous, ref} for g's task, refusing if the task is closed.
	// It is durable when it returns nil.
	RecordPush(ctx context.Context, g Grant, p Push, peer Peer) error
	// GrantValid re-reads g and returns nil while it is neither revoked nor
	// expired; else PermissionDenied naming which (reason GRANT_REVOKED or
	// TOKEN_EXPIRED). Long calls ask it before each chunk they send.
	GrantValid(ctx context.Context, g Grant) error
	// PushRecorded reads the log afresh to learn whether the task's latest
	// recorded push is commit; an error means it could not be learned.
	PushRecorded(ctx context.Context, business, project, task, commit string) (bool, error)
	// LastPush returns the commit of the task's latest recorded push ("" for
	// none) and why the task needs repair ("" if it does not).
	LastPush(ctx context.Context, business, project, task string) (commit, needsRepair string, err error)
	// MarkNeedsRepair logs why the task's ref disagrees with the log (commit
	// is the push the log has) and marks the task: calls on it are refused
	// with reason TASK_NEEDS_REPAIR until Repaired.
	MarkNeedsRepair(ctx context.Context, business, project, task, why, commit string) error
	// Repaired logs how a marked task was resolved: restored (its ref now
	// holds commit) or its push lost (the ref holds refCommit, "" for
	// none), and returns the event's seq.
	Repaired(ctx context.Context, business, project, task string, restored bool, commit, refCommit string) (int64, error)
	// LastPushes returns, for each task of business/project with a recorded
	// push, the commit of its latest push (used to reconcile refs at start).
	LastPushes(ctx context.Context, business, project string) (map[string]string, error)
}

// Landing is one landing of a task's approved work on main.
type Landing struct {
	Business, Project, Task string
	// Approved is the task's approved latest push.
	Approved string
	// Old and New are main before and after; Merge is New when the server
	// made a merge commit, else "".
	Old, New, Merge string
}

// Lander is what gitd asks of the broker to land a task's work; the broker
// implements it beside Authority (a separate interface, so that an
// Authority without landings still serves pushes).
type Lander interface {
	// LandApproved returns the commit of the task's latest push if the
	// close gate (an approve verdict of that push, read from the log)
	// lets it land; else the gate's refusal, TASK_LANDED or TASK_CLOSED,
	// or, unless force, LAND_REFUSED for a push whose landing was refused
	// before (RecordLandRefusal).
	LandApproved(ctx context.Context, g Grant, business, project, task string, force bool) (string, error)
	// RecordLandRefusal appends task.land_refused {commit, main, reason}:
	// l.Approved's merge onto l.Old was refused for reason.
	RecordLandRefusal(ctx context.Context, g Grant, l Landing, reason string, peer Peer) (int64, error)
	// RecordLanding checks the gate again and appends task.landed and
	// task.closed in one transaction; it is durable when it returns nil.
	RecordLanding(ctx context.Context, g Grant, l Landing, peer Peer) (int64, error)
	// Landings returns the project's landings in log order (used to
	// reconcile main at start).
	Landings(ctx context.Context, business, project string) ([]Landing, error)
}

// NewExportID returns a new export id: "x" and 24 hex digits, no '-'.
func NewExportID() string {
	buf := make([]byte, 12)
	rand.Read(buf) // it never returns an error: it ends the program instead
	return "x" + hex.EncodeToString(buf)
}

// ValidExportID says whether id is one NewExportID could have made.
func ValidExportID(id string) bool {
	if len(id) != 25 || id[0] != 'x' {
		return false
	}
	_, err := hex.DecodeString(id[1:])
	return err == nil && strings.ToLower(id) == id
}

// Export is a move begun on the project's owner: its id, the log's head
// at that moment (the project.moving event), and the project's tasks as
// the log has them.
type Export struct {
	ID, Host string
	HeadSeq  int64
	HeadHash string
	Tasks    []ExportTask
}

// ExportTask is one task of an exported project: its latest recorded push
// ("" for none) and whether it is closed (its repository may be archived).
type ExportTask struct {
	Task, Commit string
	Closed       bool
}

// ImportClaim is what an export file says of itself: the project, the host
// and export it came from, the log's head then, and its manifest's digest.
type ImportClaim struct {
	Business, Project string
	From, ID, Digest  string
	HeadSeq           int64
	HeadHash          string
}

// Mover is what gitd asks of the broker to move a project between bus
// hosts sharing the store; the broker implements it beside Authority. The
// store holds the move's state, so that every host sees it: from
// BeginExport to CompleteImport or CancelExport, pushes, landings and
// syncs of the project are refused with PROJECT_MOVING.
type Mover interface {
	// BeginExport (on the owner) marks business/project moving and appends
	// project.moving; exporting again while moving starts a new export,
	// and an import of the earlier file is then refused as stale.
	// id names the export (NewExportID): the caller makes it first, so
	// that what it leaves on disk before asking names the export even if
	// it never hears the answer (a crash), and its next start can cancel it.
	BeginExport(ctx context.Context, business, project, id string) (Export, error)
	// SealExport records the digest of export id's manifest.
	SealExport(ctx context.Context, business, project, id, digest string) error
	// CancelExport (on the owner) ends the move: the project takes pushes
	// again, and its export files are stale. With id, only while id is
	// the project's current export: an export that fails after another
	// replaced it must not end the newer one's move. It returns the
	// project.move_cancelled event, 0 when nothing (or not id) was moving.
	CancelExport(ctx context.Context, business, project, id string) (int64, error)
	// NotMoving refuses with PROJECT_MOVING while business/project moves,
	// and with PROJECT_ON_OTHER_HOST once it is placed elsewhere.
	NotMoving(ctx context.Context, business, project string) error
	// CheckImport refuses, writing nothing, what CompleteImport would.
	CheckImport(ctx context.Context, c ImportClaim) error
	// CompleteImport (on the new host) checks c against the store again,
	// places the project on this host, ends the move and appends
	// project.moved, in one transaction; it returns that event's seq.
	CompleteImport(ctx context.Context, c ImportClaim) (int64, error)
	// HostID is this host's id; Placement the host business/project is
	// placed on (read afresh: an import whose commit is unclear asks it).
	HostID() string
	Placement(ctx context.Context, business, project string) (host string, ok bool, err error)
}

// TokenFromContext returns the bearer token of an incoming gRPC call, or "".
func TokenFromContext(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(tok)
		}
	}
	return ""
}

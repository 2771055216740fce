package broker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/textsafe"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Event is one entry of the log. Events are appended, never changed.
type Event struct {
	Seq                     int64
	Business, Project, Task string
	Type                    string
	// Actor is a grant id, or authz.HostID.
	Actor string
	// Data is a JSON object in canonical form (see canonicalData).
	Data string
	// Time is RFC 3339 with nanoseconds, UTC, as stored.
	Time string
	// Peer is the calling process (SO_PEERCRED) as "pid=N,uid=N,gid=N", or
	// "" for a caller in-process.
	Peer string
	// PrevHash is the previous event's Hash ("" for the first); Hash is the
	// hex SHA-256 of this event's canonical encoding, which includes PrevHash.
	PrevHash, Hash string
	// Sig is the appending host's Ed25519 signature of Hash, "KEYID:BASE64"
	// (signing.go): the proof that a host, not a database writer, wrote
	// the event. Hash does not cover it.
	Sig string
}

// Event types the broker appends itself. Nobody else may append a type
// under a reserved prefix.
const (
	TypeActionAllowed = "action.allowed"
	TypeTaskAdded     = "task.added"
	TypeTaskClosed    = "task.closed"
	TypeGrantCreated  = "grant.created"
	TypeGrantRevoked  = "grant.revoked"
	TypeReviewRequest = "review.request"
	TypeReviewVerdict = "review.verdict"
	// A task whose ref disagrees with the log (repair.go).
	TypeTaskNeedsRepair = "task.needs_repair"
	TypeTaskRepaired    = "task.repaired"
	TypeTaskLanded      = "task.landed"
	TypeTaskReopened    = "task.reopened"
	// A landing whose merge was refused (land.go).
	TypeTaskLandRefused = "task.land_refused"
)

var reservedPrefixes = []string{"action.", "review.", "task.", "grant.", "project.", "network.", SessionPrefix}

// SessionPrefix is the launcher's events (session.launched,
// session.ended): recorded with the host's credential, never by a session.
const SessionPrefix = "session."

// TypeNetworkEgress is a session's egress decisions, recorded by its
// launcher with a grant holding network.audit (RecordEvent).
const TypeNetworkEgress = "network.egress"

// eventTypeRE is the whole grammar of a free-form type: ASCII lower case,
// digits and underscores in dot-separated words. Anything else (upper case,
// spaces, Unicode look-alikes, empty words) is refused.
var eventTypeRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$`)

// maxTypeLen bounds a type; the grammar alone would allow any length.
const maxTypeLen = 128

// MaxDataBytes bounds an event's data.
const MaxDataBytes = 64 << 10

// CheckRecordType returns nil if typ may be appended through RecordEvent:
// it matches the grammar exactly and is not reserved.
func CheckRecordType(typ string) error {
	if len(typ) > maxTypeLen {
		return errdefs.InvalidArgument(errdefs.EventTypeInvalid, "event type is %d bytes long; at most %d", len(typ), maxTypeLen)
	}
	if !eventTypeRE.MatchString(typ) {
		return errdefs.InvalidArgument(errdefs.EventTypeInvalid, "event type %q must match ^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$", clip(typ))
	}
	if reserved(typ) {
		return errdefs.PermissionDenied(errdefs.EventTypeReserved, "event type %q is reserved: action.*, review.*, task.*, grant.* and project.* come only from the broker's own calls, network.* and session.* from a session's launcher", typ)
	}
	return nil
}

// reserved says whether typ is under a reserved prefix, or is its word
// ("task" for "task.").
func reserved(typ string) bool {
	return slices.ContainsFunc(reservedPrefixes, func(p string) bool { return strings.HasPrefix(typ+".", p) })
}

// canonicalData parses s as one JSON object ("" means {}) and returns it
// re-encoded compactly with sorted keys and numbers as written, so that the
// same object always hashes and compares the same.
func canonicalData(s string) (string, error) {
	if len(s) > MaxDataBytes {
		return "", errdefs.ResourceExhausted(errdefs.EventDataTooLarge, "event data is %d bytes; at most %d", len(s), MaxDataBytes)
	}
	if strings.TrimSpace(s) == "" {
		return "{}", nil
	}
	if !utf8.ValidString(s) {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data is not valid UTF-8")
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data is not JSON: %v", err)
	}
	if _, err := dec.Token(); err == nil {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data has more than one JSON value")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data must be a JSON object, not %s", jsonKind(v))
	}
	if n, ok := outOfRange(obj); ok {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data has the number %.40s, beyond what a 64-bit float holds; send it as a string", n)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return "", errdefs.InvalidArgument(errdefs.EventDataInvalid, "event data: %v", err)
	}
	out := strings.TrimSuffix(buf.String(), "\n")
	if len(out) > MaxDataBytes {
		return "", errdefs.ResourceExhausted(errdefs.EventDataTooLarge, "event data is %d bytes once canonical; at most %d", len(out), MaxDataBytes)
	}
	return out, nil
}

// outOfRange returns the first number in v whose magnitude overflows a 64-bit
// float. Such a number is valid JSON, but most readers of the log (jq,
// JavaScript, Go's float64) cannot decode it, so the event would be
// unreadable to them.
func outOfRange(v any) (json.Number, bool) {
	switch v := v.(type) {
	case json.Number:
		if _, err := strconv.ParseFloat(string(v), 64); err != nil {
			return v, true
		}
	case map[string]any:
		for _, e := range v {
			if n, bad := outOfRange(e); bad {
				return n, true
			}
		}
	case []any:
		for _, e := range v {
			if n, bad := outOfRange(e); bad {
				return n, true
			}
		}
	}
	return "", false
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	default:
		return "a number"
	}
}

// mustData encodes an object the broker builds itself.
func mustData(v map[string]any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(fmt.Sprintf("broker: encode own event data: %v", err))
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// canonicalVersion names the encoding; changing the encoding means a new
// version, and VerifyLog must keep reading the old one.
const canonicalVersion = "bushost-event-v1"

// Canonical is the byte string an event's hash covers: every field but Hash,
// each as its decimal length, ':', its bytes and ','. Lengths make the
// encoding injective: no two different events share an encoding, whatever
// bytes their fields hold.
func Canonical(e Event) []byte {
	fields := []string{
		canonicalVersion,
		strconv.FormatInt(e.Seq, 10),
		e.Business, e.Project, e.Task,
		e.Type, e.Actor, e.Data, e.Time, e.Peer,
		e.PrevHash,
	}
	n := 0
	for _, f := range fields {
		n += len(f) + 22
	}
	b := make([]byte, 0, n)
	for _, f := range fields {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
		b = append(b, ',')
	}
	return b
}

// HashEvent returns the hex SHA-256 of e's canonical encoding.
func HashEvent(e Event) string {
	sum := sha256.Sum256(Canonical(e))
	return hex.EncodeToString(sum[:])
}

func clip(s string) string { return textsafe.Clip(s, 80) }

package broker

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/bushost/bushost/internal/errdefs"
)

// Proving what the log holds (signing.go says why events are signed).
// Three readers prove events, each only what it needs, so that no check
// grows with the log: the gate proves the few events it decides from
// (gate.go), log verify proves them all (verify.go), and a broker with a
// checkpoint file proves every event past the last head it anchored
// before it anchors a new one (here): at start, and at each write where
// the log moved without it (another host sharing the store appended, or
// someone wrote to the database). The checkpoint thus never adopts a head
// it did not write or prove.

// maxNamed bounds the unproven events a refusal names; the rest are
// counted.
const maxNamed = 10

// proofPage is how many events a proving walk reads at a time, and
// proofPageBytes bounds a page's data.
const (
	proofPage      = 1000
	proofPageBytes = 4 << 20
)

// unproven gathers the events a walk could not prove: how many, and the
// lowest seqs of them, described.
type unproven struct {
	n     int
	named []unprovenEvent // in seq order, at most maxNamed
}

type unprovenEvent struct {
	seq int64
	why string
}

func (u *unproven) add(e Event, why string) {
	u.n++
	i := sort.Search(len(u.named), func(i int) bool { return u.named[i].seq > e.Seq })
	if i == maxNamed {
		return
	}
	u.named = slices.Insert(u.named, i, unprovenEvent{e.Seq, describe(e) + " " + why})
	if len(u.named) > maxNamed {
		u.named = u.named[:maxNamed]
	}
}

// first is the lowest seq not proven (0: none).
func (u *unproven) first() int64 {
	if len(u.named) == 0 {
		return 0
	}
	return u.named[0].seq
}

func (u *unproven) String() string {
	whys := make([]string, len(u.named))
	for i, n := range u.named {
		whys[i] = n.why
	}
	s := strings.Join(whys, "; ")
	if u.n > len(u.named) {
		s += fmt.Sprintf("; and %d more", u.n-len(u.named))
	}
	return s
}

// prover proves events on every core while its caller walks the log in
// order: proving a whole log is one signature check per event, many
// times the chain's hash, and the checks are independent.
type prover struct {
	keys *Keyring
	in   chan Event
	wg   sync.WaitGroup
	mu   sync.Mutex
	u    unproven
}

func newProver(keys *Keyring) *prover {
	p := &prover{keys: keys, in: make(chan Event, 256)}
	for i := 0; i < runtime.GOMAXPROCS(0); i++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for e := range p.in {
				if err := p.keys.prove(e); err != nil {
					p.mu.Lock()
					p.u.add(e, err.Error())
					p.mu.Unlock()
				}
			}
		}()
	}
	return p
}

func (p *prover) add(e Event) { p.in <- e }

// done waits for every proof and returns what failed.
func (p *prover) done() *unproven {
	close(p.in)
	p.wg.Wait()
	return &p.u
}

// describe names an event for an operator: its seq, type and actor.
func describe(e Event) string {
	return fmt.Sprintf("event %d (%s by %s)", e.Seq, e.Type, e.Actor)
}

// proveAfter walks the events after anchor, in pages: each must follow
// the one before it (the first, anchor) and be proven by a trusted key. It
// returns the head it reached and what it could not prove.
func (b *Broker) proveAfter(ctx context.Context, q *queries, anchor Head) (Head, *unproven, error) {
	u := &unproven{}
	head := anchor
	for {
		evs, full, err := q.events(ctx, Filter{}, head.Seq, proofPage, proofPageBytes)
		if err != nil {
			return Head{}, nil, fmt.Errorf("read log: %w", err)
		}
		for _, e := range evs {
			switch {
			case e.Seq != head.Seq+1:
				u.add(e, fmt.Sprintf("follows event %d: a gap", head.Seq))
			case e.PrevHash != head.Hash:
				u.add(e, fmt.Sprintf("does not follow event %d's hash %.12s", head.Seq, head.Hash))
			default:
				if err := b.keys.prove(e); err != nil {
					u.add(e, err.Error())
				}
			}
			head = Head{e.Seq, e.Hash}
		}
		if !full {
			return head, u, nil
		}
	}
}

// start checks the log as the broker opens. With a checkpoint file, the
// chain must match every head in it (else the broker halts,
// LOG_CHECKPOINT_MISMATCH). With adopt, a log written before signing is
// signed up to the checkpoint's last head (without one, or with a file
// that holds none yet, up to the log's head). Then, with a checkpoint, every event past its last head must
// be proven (else the broker halts, LOG_HEAD_UNPROVEN, naming them)
// before the log's head is recorded in it.
func (b *Broker) start(ctx context.Context, heads []Head, adopt bool) error {
	if b.cp == nil && !adopt {
		return nil
	}
	v, err := b.verify(ctx, heads, false)
	if err != nil {
		return err
	}
	if !v.OK {
		if b.cp == nil {
			return fmt.Errorf("the log breaks at event %d (%s): not signing a log that does not verify; see docs/broker.md, \"Who wrote an event\"", v.FirstBadSeq, v.Reason)
		}
		b.halted.Store(errdefs.Unavailable(errdefs.LogCheckpointMismatch,
			"the broker does not serve: the log does not match its checkpoint file %s at event %d (%s); see docs/broker.md, \"When the log does not match\"",
			b.cp.path, v.FirstBadSeq, v.Reason).With("first_bad_seq", v.FirstBadSeq).With("path", b.cp.path))
		return nil
	}
	var anchor Head
	if len(heads) > 0 {
		anchor = heads[len(heads)-1]
	}
	if adopt {
		through := Head{v.HeadSeq, v.HeadHash}
		if anchor.Seq > 0 {
			through = anchor
		}
		if b.adopted, err = b.adopt(ctx, through); err != nil {
			return fmt.Errorf("sign the events written before signing: %w", err)
		}
	}
	if b.cp == nil {
		return nil
	}
	head, u, err := b.proveAfter(ctx, b.st.read(), anchor)
	if err != nil {
		return err
	}
	if u.n > 0 {
		b.halted.Store(b.unprovenHalt(anchor, u))
		return nil
	}
	return b.cp.record(head)
}

// proveSinceAnchor runs at the start of each write batch, under the write
// lock: if the log's head is not the checkpoint's last head, the events
// since are proven before the batch chains onto them. A head below the
// anchor (events deleted), or an event it cannot prove, halts the broker.
func (b *Broker) proveSinceAnchor(ctx context.Context, tx *writeTx) error {
	anchor := b.cp.anchor()
	seq, hash, err := tx.head(ctx)
	if err != nil {
		return fmt.Errorf("read log head: %w", err)
	}
	if seq == anchor.Seq && hash == anchor.Hash {
		return nil
	}
	if seq < anchor.Seq {
		e := errdefs.Unavailable(errdefs.LogCheckpointMismatch,
			"the broker does not serve: the log ends at event %d, but its checkpoint file %s anchored event %d: events %d to %d were deleted; see docs/broker.md, \"When the log does not match\"",
			seq, b.cp.path, anchor.Seq, seq+1, anchor.Seq).With("first_bad_seq", seq+1).With("path", b.cp.path)
		b.halted.Store(e)
		return e
	}
	_, u, err := b.proveAfter(ctx, &tx.queries, anchor)
	if err != nil {
		return err
	}
	if u.n > 0 {
		e := b.unprovenHalt(anchor, u)
		b.halted.Store(e)
		return e
	}
	return nil
}

// unprovenHalt is what a broker that will not anchor a head it cannot
// prove answers from then on.
func (b *Broker) unprovenHalt(anchor Head, u *unproven) *errdefs.Error {
	return errdefs.Unavailable(errdefs.LogHeadUnproven,
		"the broker does not serve: %d events past event %d, the last head its checkpoint file %s anchored, are not proven: %s; see docs/broker.md, \"When the log does not match\"",
		u.n, anchor.Seq, b.cp.path, u).With("first_bad_seq", u.first()).With("path", b.cp.path).With("unproven", u.n)
}

// adopt signs the events of a log written before signing, once: at the
// start that made this host's key, and only if no event is signed yet (a
// log another host already adopted is not adopted again: its unsigned
// events are unproven). It signs events 1 to through, after checking, in
// the same transaction, that they chain to through's hash; through.Seq 0
// means the log's head. It returns the last event it signed.
func (b *Broker) adopt(ctx context.Context, through Head) (int64, error) {
	tx, err := b.st.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.rollback()
	var one int
	signed, err := found(tx.tx.QueryRowContext(ctx, `SELECT 1 FROM events WHERE sig <> '' LIMIT 1`).Scan(&one))
	if err != nil || signed {
		return 0, err
	}
	if through.Seq == 0 {
		if through.Seq, through.Hash, err = tx.head(ctx); err != nil || through.Seq == 0 {
			return 0, err
		}
	}
	var head Head
	for head.Seq < through.Seq {
		evs, _, err := tx.events(ctx, Filter{}, head.Seq, proofPage, proofPageBytes)
		if err != nil {
			return 0, err
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			if e.Seq > through.Seq {
				break
			}
			if e.Seq != head.Seq+1 || e.PrevHash != head.Hash || HashEvent(e) != e.Hash {
				return 0, fmt.Errorf("%s does not follow event %d in the hash chain", describe(e), head.Seq)
			}
			if _, err := tx.tx.ExecContext(ctx, `UPDATE events SET sig = $1 WHERE seq = $2`, b.signer.sign(e.Hash), e.Seq); err != nil {
				return 0, err
			}
			head = Head{e.Seq, e.Hash}
		}
	}
	if head != through {
		return 0, fmt.Errorf("the log reaches event %d (%.12s), not event %d (%.12s)", head.Seq, head.Hash, through.Seq, through.Hash)
	}
	return head.Seq, tx.commit()
}

// Adopted returns the last event this broker signed at its start as part
// of a log written before signing (0: it adopted none).
func (b *Broker) Adopted() int64 { return b.adopted }

package gitd

import (
	"context"
	"errors"
	"io"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/sock"
)

// pushPassed serves a push whose client passed the bundle file's
// descriptor on the connection (sock.PassedFD; docs/git-service.md,
// "Pushing a bundle file") instead of streaming its bytes. offerErr is why
// the named descriptor could not be taken: then the push is declined
// (PUSH_FD_DECLINED) before anything is read, and the client sends the
// bytes in a new call. Once taken, the file is the client's bundle and as
// hostile as a stream: it must be a regular file on a disk or memory file
// system, open for reading; it is read with pread from offset 0 up to the
// size fstat gave when it was taken (never the announced size, never its
// shared offset, never beyond), under the same MaxBundleBytes and every
// check of a streamed push; a file whose size or times changed by the end
// is refused. PushWorking closes the descriptor when the call ends,
// whatever happened.
func (sv *server) pushPassed(ctx context.Context, stream grpc.ClientStreamingServer[gitv1.PushWorkingRequest, gitv1.PushWorkingResponse],
	g caller, rr *recvReader, f *os.File, offerErr error) error {
	if offerErr != nil {
		return errdefs.FailedPrecondition(errdefs.PushFDDeclined, "the push named a passed descriptor this connection does not hold (%v); send the bundle's bytes", offerErr).Wrap(offerErr)
	}
	// The header was the stream's one message: the bytes are in the file.
	if m, err := rr.next(); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		_ = m
		return errdefs.InvalidArgument(errdefs.PushProtocol, "a push whose bundle was passed as a descriptor sends nothing after its header")
	}
	if err := stream.SendHeader(metadata.Pairs(sock.PushFDKey, sock.FDAccepted)); err != nil {
		return err
	}
	pf, err := sock.CheckPassedFile(f)
	if err != nil {
		return errdefs.InvalidArgument(errdefs.PushFDRefused, "the passed bundle descriptor is refused: %v; pass an open regular bundle file, or send its bytes", err).Wrap(err)
	}
	if pf.Size > sv.s.o.MaxBundleBytes {
		return tooLarge(pf.Size, sv.s.o.MaxBundleBytes)
	}
	body := &passedBody{f: f, pf: pf, r: io.NewSectionReader(f, 0, pf.Size)}
	defer func() { metrics.NotePassed(ctx, body.n) }()
	peer, _ := sock.PeerFromContext(ctx)
	res, err := sv.s.Push(ctx, g.Grant, g.task, peer, pf.Size, body)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&gitv1.PushWorkingResponse{Commit: res.Commit, Previous: res.Previous, Ref: res.Ref})
}

// passedBody reads a passed file up to the size it had when taken; at its
// end it checks that the file did not change meanwhile.
type passedBody struct {
	f  *os.File
	pf sock.PassedFile
	r  io.Reader
	n  int64 // bytes read
}

func (b *passedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if errors.Is(err, io.EOF) {
		changed, cerr := b.pf.Changed(b.f)
		if cerr != nil || changed {
			return n, errdefs.InvalidArgument(errdefs.PushFDRefused, "the passed bundle file changed while it was read (it was %d bytes); push a file nobody writes", b.pf.Size).
				With("size", b.pf.Size)
		}
	}
	return n, err
}

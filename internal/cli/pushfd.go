package cli

import (
	"cmp"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/sock"
)

// A bundle file is pushed by passing its open descriptor on the gRPC
// connection (SCM_RIGHTS) rather than by streaming its bytes, when both
// ends can (docs/git-service.md, "Pushing a bundle file"): the daemon then
// reads the file at disk speed instead of in 1 MiB messages.

// gitClientFD dials git.sock like gitClient, through a dialer that can
// pass descriptors on the connection.
func (e *Env) gitClientFD(ctx context.Context) (gitv1.GitServiceClient, context.Context, *sock.FDDialer, func(), error) {
	path, err := filepath.Abs(home.At(e.Home).GitSock())
	if err != nil {
		return nil, nil, nil, nil, err
	}
	d := &sock.FDDialer{Path: path}
	conn, ctx, err := e.dial(ctx, home.GitSockName, grpc.WithContextDialer(d.Dial))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return gitv1.NewGitServiceClient(conn), ctx, d, func() { conn.Close() }, nil
}

// pushPassed offers f to the daemon as the push's bundle. done is false
// when the daemon did not take it (a daemon from before descriptor
// passing, or one that declined): nothing was pushed and the caller sends
// the bytes in a new call. A file that is not a regular file on a disk or
// memory file system is never offered.
func pushPassed(cctx context.Context, c gitv1.GitServiceClient, d *sock.FDDialer, f *os.File) (res *gitv1.PushWorkingResponse, done bool, err error) {
	if d == nil {
		return nil, false, nil
	}
	pf, err := sock.CheckPassedFile(f)
	if err != nil {
		return nil, false, nil
	}
	seq := d.Pass(f)
	ctx := metadata.AppendToOutgoingContext(cctx, sock.PassedFDKey, strconv.FormatUint(seq, 10))
	stream, err := c.PushWorking(ctx)
	if err != nil {
		return nil, true, err
	}
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: pf.Size}}}); err != nil {
		if _, rerr := stream.CloseAndRecv(); fdTaken(stream, rerr) {
			return nil, true, cmp.Or(rerr, err)
		}
	} else if res, err = stream.CloseAndRecv(); err == nil {
		return res, true, nil
	} else if fdTaken(stream, err) {
		return nil, true, err
	}
	// The bytes go in a new call, from the file's start (the daemon reads
	// a passed file with pread, so this only undoes a read of ours).
	_, serr := f.Seek(0, io.SeekStart)
	return nil, serr != nil, serr
}

// fdTaken reports whether a push that failed with err is final: the
// daemon took the descriptor (its header says so), or refused the push
// for a reason of its own. A daemon that declined the descriptor, or one
// from before descriptor passing (it reads the header, finds no bundle
// after it, and answers BUNDLE_INVALID without the header), is not.
func fdTaken(stream grpc.ClientStream, err error) bool {
	if md, _ := stream.Header(); len(md.Get(sock.PushFDKey)) > 0 && md.Get(sock.PushFDKey)[0] == sock.FDAccepted {
		return true
	}
	switch errdefs.ReasonOf(err) {
	case errdefs.PushFDDeclined, errdefs.BundleInvalid:
		return false
	}
	return true
}

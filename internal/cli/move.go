package cli

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

// Moving a project between bus hosts sharing one broker: export on the
// owner writes one file, import on the new host reads it (docs/scaling.md,
// "Moving a project").

func init() {
	register(&command{
		words: "project export",
		short: "begin moving a project to another bus host",
		usage: "project export --business B --project P (--to FILE | --cancel)",
		help: "Host, on the host the project is placed on: begin moving the project to another bus host sharing the broker, and write its repositories " +
			"(bundles, with a manifest naming the log's head) to FILE (0600; replaced if there). From then on its pushes, landings and syncs are refused " +
			"with PROJECT_MOVING until 'project import --from FILE' on the new host. Exporting again makes a new file (the earlier one is then refused); " +
			"--cancel ends the move instead: the project takes pushes here again and any exported file is refused.",
		setup: runProjectExport,
	})
	register(&command{
		words: "project import",
		short: "place an exported project on this bus host",
		usage: "project import --from FILE",
		help: "Host, on the new host: verify FILE (each bundle against the manifest, the manifest against the broker, the refs against the log) and place " +
			"its project here, in the transaction that ends the move; the old host then serves nothing of it. A stale file (EXPORT_STALE) or an altered " +
			"one (EXPORT_ALTERED) is refused and leaves nothing behind.",
		setup: runProjectImport,
	})
}

func runProjectExport(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "business name")
	project := fs.String("project", "", "project name")
	to := fs.String("to", "", "the file to write the export to")
	cancel := fs.Bool("cancel", false, "end a move begun here instead: pushes are taken again, exported files are refused")
	return func(ctx context.Context, e *Env, args []string) error {
		switch {
		case *business == "" || *project == "":
			return usagef("--business and --project are required")
		case *cancel && *to != "":
			return usagef("give --to FILE or --cancel, not both")
		case !*cancel && *to == "":
			return usagef("--to FILE is required (or --cancel)")
		}
		c, cctx, closeConn, err := e.gitClient(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		scope := *business + "/" + *project
		if *cancel {
			res, err := c.CancelExport(cctx, &gitv1.CancelExportRequest{Business: *business, Project: *project})
			if err != nil {
				return err
			}
			text := fmt.Sprintf("cancelled: %s is no longer moving and takes pushes here again (event %d); files exported before are refused", scope, res.GetSeq())
			if !res.GetCancelled() {
				text = fmt.Sprintf("%s is not moving: nothing to cancel", scope)
			}
			return printOut(e, text, map[string]any{"project": scope, "cancelled": res.GetCancelled(), "seq": res.GetSeq()})
		}
		return exportTo(cctx, e, c, *business, *project, *to)
	}
}

// exportTo streams the export into a temporary file beside path and
// renames it into place once the whole archive came and its sha256 is the
// one the server computed: a cut export leaves no file at path.
func exportTo(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(abs), "."+filepath.Base(abs)+".part-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	stream, err := c.ExportProject(ctx, &gitv1.ExportProjectRequest{Business: business, Project: project})
	if err != nil {
		return err
	}
	h := sha256.New()
	w := io.MultiWriter(f, h)
	var n int64
	var begun *gitv1.ExportBegun
	var done *gitv1.ExportDone
	for done == nil {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("the bus host ended the export before its last message")
		}
		if err != nil {
			return err
		}
		switch {
		case m.GetBegun() != nil:
			begun = m.GetBegun()
		case m.GetDone() != nil:
			done = m.GetDone()
		case m.GetChunk() != nil:
			k, err := w.Write(m.GetChunk())
			n += int64(k)
			if err != nil {
				return fmt.Errorf("write %s: %w", tmp, err)
			}
		}
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != done.GetBytes() || sum != done.GetSha256() {
		return fmt.Errorf("the archive received (%d bytes, sha256 %s) is not the one sent (%d bytes, sha256 %s)", n, sum, done.GetBytes(), done.GetSha256())
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	f = nil
	if err := os.Rename(tmp, abs); err != nil {
		os.Remove(tmp)
		return err
	}
	scope := business + "/" + project
	text := fmt.Sprintf("exported %s to %s (%d bytes, %d tasks, %d bundles) at the log's head %d %s; it is moving: pushes are refused until "+
		"'bushost project import --from FILE' on the new host, or 'bushost project export --cancel' here",
		scope, abs, n, done.GetTasks(), done.GetBundles(), begun.GetHeadSeq(), begun.GetHeadHash())
	return printOut(e, text, map[string]any{"project": scope, "file": abs, "bytes": n, "sha256": done.GetSha256(),
		"export_id": begun.GetExportId(), "host": begun.GetHost(), "head_seq": begun.GetHeadSeq(), "head_hash": begun.GetHeadHash(),
		"tasks": done.GetTasks(), "bundles": done.GetBundles(), "manifest_sha256": done.GetManifestSha256()})
}

func runProjectImport(fs *pflag.FlagSet) runFunc {
	from := fs.String("from", "", "the file 'project export' wrote")
	return func(ctx context.Context, e *Env, args []string) error {
		if *from == "" {
			return usagef("--from FILE is required")
		}
		f, err := os.Open(*from)
		if err != nil {
			return err
		}
		defer f.Close()
		c, cctx, closeConn, err := e.gitClient(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		cctx, cancel := context.WithCancel(cctx)
		defer cancel()
		stream, err := c.ImportProject(cctx)
		if err != nil {
			return err
		}
		// The server's messages (heartbeats, its answer or an early
		// refusal) are read while the file is sent; the reader is joined
		// before return.
		type answer struct {
			done *gitv1.ImportDone
			err  error
		}
		answered := make(chan answer, 1)
		go func() {
			var a answer
			for {
				m, err := stream.Recv()
				if err != nil {
					if !errors.Is(err, io.EOF) || a.done == nil {
						a.err = err
					}
					answered <- a
					return
				}
				if d := m.GetDone(); d != nil {
					a.done = d
				}
			}
		}()
		// A send fails when the server ended the call: its status says why.
		sendErr, rerr := sendChunks(f, func(b []byte) error { return stream.Send(&gitv1.ImportProjectRequest{Chunk: b}) })
		if rerr != nil {
			cancel()
			<-answered
			return fmt.Errorf("read %s: %w", *from, rerr)
		}
		stream.CloseSend()
		a := <-answered
		if a.err != nil {
			return a.err
		}
		if a.done == nil {
			return cmp.Or(sendErr, fmt.Errorf("the bus host ended the import without its answer"))
		}
		d := a.done
		scope := d.GetBusiness() + "/" + d.GetProject()
		text := fmt.Sprintf("imported %s from host %q: it is placed on this host (event %d); %d tasks, %d bundles verified",
			scope, d.GetFrom(), d.GetSeq(), d.GetTasks(), d.GetBundles())
		return printOut(e, text, map[string]any{"project": scope, "from": d.GetFrom(), "export_id": d.GetExportId(), "seq": d.GetSeq(),
			"tasks": d.GetTasks(), "bundles": d.GetBundles()})
	}
}

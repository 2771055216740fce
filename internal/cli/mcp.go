package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/mcp"
	"github.com/bushost/bushost/internal/textsafe"
	"github.com/bushost/bushost/internal/version"
)

func init() {
	register(&command{
		words: "mcp",
		short: "serve the session's commands as MCP tools on stdin/stdout",
		usage: "mcp",
		help: "Serve the commands the token's grant may use as tools of the Model Context Protocol, over stdin and stdout " +
			"(newline-delimited JSON-RPC), for an agent harness to start: e.g. 'claude mcp add bushost -- bushost mcp'. " +
			"The home and token are read as for every command; repo arguments are relative to the working directory and stay inside it (docs/mcp.md).",
		setup: runMCP,
	})
}

func runMCP(fs *pflag.FlagSet) runFunc {
	return func(ctx context.Context, e *Env, args []string) error {
		return mcp.Serve(ctx, mcpRunner{e}, io.NopCloser(e.Stdin), nopWriteCloser{e.Stdout}, version.Read().String())
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// mcpRunner runs the commands for internal/mcp, each as `bushost --json`
// with e's home, token and timeout would.
type mcpRunner struct{ e *Env }

func (r mcpRunner) Whoami(ctx context.Context) (mcp.Grant, error) {
	var g mcp.Grant
	err := unary(ctx, r.e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
		w, err := c.Whoami(ctx, &brokerv1.WhoamiRequest{})
		if err != nil {
			return err
		}
		g = mcp.Grant{Caps: w.Capabilities}
		return nil
	})
	if err != nil {
		return g, r.e.toolError(err)
	}
	return g, nil
}

func (r mcpRunner) Run(ctx context.Context, words string, flags []mcp.Flag, args []string, out, warn io.Writer) error {
	c, ok := commands[words]
	if !ok {
		return fmt.Errorf("no command %q", words)
	}
	fs := pflag.NewFlagSet(words, pflag.ContinueOnError)
	run := c.setup(fs)
	for _, f := range flags {
		if err := fs.Set(f.Name, f.Value); err != nil {
			return errdefs.InvalidArgument(errdefs.Usage, "%s: %v", f.Name, err)
		}
	}
	sout, serr := textsafe.NewWriter(out), textsafe.NewWriter(warn)
	defer sout.Flush()
	defer serr.Flush()
	e := &Env{Home: r.e.Home, TokenFile: r.e.TokenFile, JSON: true, Timeout: r.e.Timeout,
		Stdin: strings.NewReader(""), Stdout: sout, Stderr: serr, Getenv: r.e.Getenv, longLived: true}
	err := run(ctx, e, args)
	if _, exit := err.(statusExit); err == nil || exit {
		// session wait ends with the session's own status, printed.
		return nil
	}
	return e.toolError(err)
}

// toolError is err as report would print it: a usage error as USAGE, the
// rest classified.
func (e *Env) toolError(err error) *errdefs.Error {
	if ue, ok := err.(usageError); ok {
		return errdefs.InvalidArgument(errdefs.Usage, "%s", ue.msg)
	}
	return e.classify(e.failure(err))
}

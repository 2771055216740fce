// Package cli is the bushost client: the command line that hosts, agents and
// scripts use (docs/architecture.md, README.md). Each command is registered by the
// file of its domain (git.go, broker.go); this file owns the command tree
// (spf13/cobra), the global flags, the token, the sockets and how errors
// are printed and turned into exit statuses. The client never decides
// anything the server must decide: it only asks and reports, and it
// branches on an error's reason, never on its message.
package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/textsafe"
	"github.com/bushost/bushost/internal/version"
)

// Env is what a command runs with: the global flags, its streams and the
// way to reach the bus host.
type Env struct {
	Home      string
	TokenFile string
	JSON      bool
	// Timeout, when set, bounds each unary call and each transfer's wait
	// for progress (--timeout; timeout.go).
	Timeout time.Duration
	stalled atomic.Pointer[errdefs.Error] // a stream of the command made no progress
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	// Getenv reads the environment (os.Getenv outside tests).
	Getenv func(string) string

	// tokenFrom says where the token came from, for the hint on an
	// unknown token.
	tokenFrom string
	// dialed is the socket last dialed, for the hint on a server that
	// does not answer (bushostd's sockets, or the launcher's).
	dialed string
	// longLived: the command runs inside a server that outlives it
	// (bushost mcp), so it leaves process-wide settings alone.
	longLived bool
}

// runFunc runs a command once its flags are parsed; args are its
// positional arguments.
type runFunc func(ctx context.Context, e *Env, args []string) error

// command is one command line form, e.g. words "review verdict".
type command struct {
	words string
	// short is one line (the command list of --help, completion);
	// help is the whole story (the command's own --help).
	short string
	usage string
	help  string
	// args checks the positional arguments (default: none allowed).
	args cobra.PositionalArgs
	// setup declares the command's flags on fs and returns its run.
	setup func(fs *pflag.FlagSet) runFunc
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.words]; dup {
		panic("cli: command registered twice: " + c.words)
	}
	commands[c.words] = c
}

// usageError is a mistake in the command line: exit 2 and a one-line hint.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// Main runs the client with args (without the program name) and returns
// the exit status, by class from errdefs' table (README, "Exit status").
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return mainWith(args, stdin, stdout, stderr, os.Getenv)
}

func mainWith(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	// Nothing from the bus host reaches a terminal raw (internal/textsafe).
	safeOut, safeErr := textsafe.NewWriter(stdout), textsafe.NewWriter(stderr)
	defer safeOut.Flush()
	defer safeErr.Flush()
	stdout, stderr = safeOut, safeErr
	e := &Env{Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: getenv}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, ran := newRoot(ctx, e)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return errdefs.ExitOK
	}
	if !*ran {
		// cobra refused the command line before any command ran: an
		// unknown command or flag, or a wrong number of arguments.
		err = usageError{err.Error()}
		if !e.JSON && hasFlag(args, "json") {
			e.JSON = true
		}
	}
	if *ran {
		err = e.failure(err)
	}
	return e.report(cmd, err)
}

// newRoot builds the command tree. ran is set once a command's own code
// starts, which tells cobra's usage errors from the command's.
func newRoot(ctx context.Context, e *Env) (*cobra.Command, *bool) {
	ran := new(bool)
	root := &cobra.Command{
		Use:   "bushost",
		Short: "bushost: the client of the bus host (bushostd)",
		Long:  rootLong(),
		// With no command, the usage is an answer to a mistake: exit 2.
		RunE: func(cmd *cobra.Command, args []string) error {
			*ran = true
			return usagef("give a command; 'bushost --help' lists them")
		},
		Version:       version.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// The root's Long lists every command once, with its usage line;
	// cobra's own list of the first words would repeat them. The other
	// commands keep cobra's usage (a group lists its subcommands).
	cobraUsage := root.UsageFunc()
	root.SetUsageFunc(func(c *cobra.Command) error {
		if c.HasParent() {
			return cobraUsage(c)
		}
		_, err := fmt.Fprintf(c.OutOrStderr(), "Global flags:\n%s", c.LocalFlags().FlagUsages())
		return err
	})
	dir := cmp.Or(e.Getenv(home.Env), home.Default)
	pf := root.PersistentFlags()
	pf.StringVar(&e.Home, "home", dir, "the bus host's home with git.sock, broker.sock and admin.token ($BUSHOST_HOME)")
	pf.StringVar(&e.TokenFile, "token-file", "", "the session's grant token (else $BUS_TOKEN_FILE, $BUS_TOKEN, or the host's <home>/admin.token)")
	pf.BoolVar(&e.JSON, "json", false, "machine-readable output, and errors as one JSON object on stderr")
	pf.DurationVar(&e.Timeout, "timeout", 0, "give up on a call with no answer, or a transfer with no progress, after this long (default 2m a call, 60s without progress)")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if e.Timeout < 0 {
			return usagef("--timeout %s: want a positive duration such as 30s or 5m", e.Timeout)
		}
		return nil
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{cmdline.FlagHint(cmd, err)}
	})

	groups := map[string]*cobra.Command{"": root}
	var group func(words []string) *cobra.Command
	group = func(words []string) *cobra.Command {
		key := strings.Join(words, " ")
		if g, ok := groups[key]; ok {
			return g
		}
		parent := group(words[:len(words)-1])
		g := &cobra.Command{
			Use:                        words[len(words)-1],
			Short:                      words[len(words)-1] + " commands",
			SuggestionsMinimumDistance: 2,
			RunE: func(cmd *cobra.Command, args []string) error {
				*ran = true
				return unknownSub(cmd, args)
			},
		}
		parent.AddCommand(g)
		groups[key] = g
		return g
	}
	for _, k := range slices.Sorted(maps.Keys(commands)) {
		c := commands[k]
		words := strings.Fields(c.words)
		parentWords := words[:len(words)-1]
		use := strings.TrimSpace(strings.TrimPrefix(c.usage, strings.Join(parentWords, " ")))
		args := c.args
		if args == nil {
			args = cobra.NoArgs
		}
		cc := &cobra.Command{Use: use, Short: c.short, Long: c.help, Args: args}
		run := c.setup(cc.Flags())
		completeFlagValues(cc)
		cc.RunE = func(cmd *cobra.Command, args []string) error {
			*ran = true
			return run(cmd.Context(), e, args)
		}
		group(parentWords).AddCommand(cc)
		if _, ok := groups[k]; !ok {
			// A command may have subcommands too ("grant", "grant list").
			groups[k] = cc
		}
	}
	root.SetContext(ctx)
	return root, ran
}

// rootLong is the root's help: every command's usage line, as scripts and
// the README name them.
func rootLong() string {
	var b strings.Builder
	b.WriteString(`bushost: the client of the bus host (bushostd).

usage: bushost [--home DIR] [--token-file FILE] [--json] COMMAND [FLAGS]

The global flags may stand before or after the command words. The token is
read from --token-file, else $BUS_TOKEN_FILE (a path), else $BUS_TOKEN (the
token itself), else the host's <home>/admin.token; $BUSHOST_HOME stands for
--home (default ./bus-host).
--timeout D gives up on a call with no answer, or a transfer with no
progress, after D (default: 2m for a call, 60s without progress for a
transfer); it exits 3 and leaves nothing behind.

Commands:
`)
	for _, k := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(&b, "  bushost %s\n      %s\n", commands[k].usage, commands[k].short)
	}
	b.WriteString(`  bushost completion bash|zsh|fish
      print a shell completion script

'bushost help COMMAND' or 'bushost COMMAND --help' says what a command
does and lists its flags.
Exit status: 0 ok, 1 refused by a rule, 2 usage, 3 bus host unreachable,
4 not authenticated or not permitted, 5 conflict or stale, 6 invalid input,
7 a limit was hit, 8 the bus host failed (docs/errors.md).`)
	return b.String()
}

// unknownSub answers a group's word given alone or with an unknown
// subcommand.
func unknownSub(cmd *cobra.Command, args []string) error {
	var subs []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			subs = append(subs, c.Name())
		}
	}
	if len(args) == 0 {
		return usagef("%q needs a subcommand: %s", cmd.CommandPath(), strings.Join(subs, ", "))
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return usageError{msg}
}

// hasFlag reports whether args carry --name (or -name) before any "--".
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--"+name || a == "-"+name || strings.HasPrefix(a, "--"+name+"=") {
			return true
		}
	}
	return false
}

// report prints err for cmd and returns the exit status. A usage error
// gets a one-line hint; any other error is classified (the bus host's as
// it sent it, LOCAL_FAILED for the client's own) and printed as
// "bushost WORDS: message", or with --json as one JSON object.
func (e *Env) report(cmd *cobra.Command, err error) int {
	path := "bushost"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	if st, ok := err.(statusExit); ok {
		return int(st)
	}
	if ue, ok := err.(usageError); ok {
		x := errdefs.InvalidArgument(errdefs.Usage, "%s", ue.msg)
		if e.JSON {
			writeJSONError(e.Stderr, x)
		} else {
			fmt.Fprintf(e.Stderr, "%s: %s\nRun '%s --help' for usage.\n", path, ue.msg, path)
		}
		return errdefs.ExitUsage
	}
	x := e.classify(e.failure(err))
	switch {
	case e.JSON:
		writeJSONError(e.Stderr, x)
	case x.Reason == errdefs.LocalFailed:
		fmt.Fprintf(e.Stderr, "%s: %s\n", path, x.Message)
	case x.Reason == "":
		fmt.Fprintf(e.Stderr, "%s: %s: %s\n", path, x.Kind, x.Message)
	default:
		// "Code (REASON): message": the words for people, the reason
		// for scripts (--json gives it as a field).
		fmt.Fprintf(e.Stderr, "%s: %s (%s): %s\n", path, x.Kind, x.Reason, x.Message)
	}
	return errdefs.ExitCode(x)
}

// classify turns any error a command returned into an *errdefs.Error: the
// bus host's as it sent it (the connection's interceptors decoded it),
// with the words a user needs added for an unreachable daemon and an
// unknown token; the client's own failures as LOCAL_FAILED.
func (e *Env) classify(err error) *errdefs.Error {
	x, ok := errdefs.As(err)
	if !ok {
		return errdefs.New(errdefs.KindUnknown, errdefs.LocalFailed, "%s", err.Error()).Wrap(err)
	}
	if _, wire := status.FromError(x.Unwrap()); wire && x.Unwrap() != nil && error(x) != err {
		// The bus host's answer, wrapped by the command ("fetch main:
		// ..."): the message says where it came.
		named := *x
		named.Message = err.Error()
		x = &named
	}
	switch {
	case x.Kind == errdefs.KindUnavailable && x.Reason == "":
		// The transport failed: nothing answers on the socket.
		who, start := serverOf(e.dialed, e.Home)
		x = errdefs.Unavailable(errdefs.Unreachable,
			"no %s serves on home %s (a stale socket, or a stopped server: %s); start one with %s",
			who, e.Home, x.Message, start).With("home", e.Home).Wrap(err)
	case x.Reason == errdefs.TokenUnknown && e.tokenFrom == "BUS_TOKEN":
		if t := strings.TrimSpace(e.Getenv("BUS_TOKEN")); strings.ContainsRune(t, '/') {
			x.Message += fmt.Sprintf("; $BUS_TOKEN holds %q, which looks like a file's path: $BUS_TOKEN is the token itself, give a path as $BUS_TOKEN_FILE or --token-file", t)
		}
	}
	return x
}

// token returns the bearer token: --token-file, else $BUS_TOKEN_FILE (a
// path), else $BUS_TOKEN (the token), else the host's admin.token in home.
func (e *Env) token() (string, error) {
	file, from := e.TokenFile, "--token-file"
	if file == "" {
		file, from = strings.TrimSpace(e.Getenv("BUS_TOKEN_FILE")), "$BUS_TOKEN_FILE"
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", errdefs.Unauthenticated(errdefs.TokenMissing, "read token (%s): %v", from, err).Wrap(err)
		}
		e.tokenFrom = strings.Trim(from, "-$")
		return strings.TrimSpace(string(b)), nil
	}
	if t := strings.TrimSpace(e.Getenv("BUS_TOKEN")); t != "" {
		e.tokenFrom = "BUS_TOKEN"
		return t, nil
	}
	path := home.At(e.Home).AdminToken()
	b, err := os.ReadFile(path)
	if err != nil {
		if _, serr := os.Stat(e.Home); serr != nil {
			return "", errdefs.Unavailable(errdefs.Unreachable,
				"no bushostd serves on home %s (%v); start one with 'bushostd serve --home %s', or give --home or $BUSHOST_HOME", e.Home, serr, e.Home).
				With("home", e.Home).Wrap(serr)
		}
		if errors.Is(err, fs.ErrNotExist) && !e.hasSocket() {
			// Not a bus host's home at all: no daemon ever served there.
			return "", errdefs.Unavailable(errdefs.Unreachable,
				"no bushostd serves on home %s: it holds no admin.token and no socket; start one with 'bushostd serve --home %s', or give the home of a running one with --home or $BUSHOST_HOME (and, unless you are its host, your grant's token with --token-file, $BUS_TOKEN_FILE or $BUS_TOKEN)", e.Home, e.Home).
				With("home", e.Home).Wrap(err)
		}
		return "", errdefs.Unauthenticated(errdefs.TokenMissing,
			"no token: give --token-file FILE, $BUS_TOKEN_FILE or $BUS_TOKEN (or run as the host, with %s readable): %v", path, err).Wrap(err)
	}
	e.tokenFrom = home.AdminTokenName
	return strings.TrimSpace(string(b)), nil
}

// dial connects to a socket of the bus host's home and returns a context
// that carries the token.
func (e *Env) dial(ctx context.Context, socket string, opts ...grpc.DialOption) (*grpc.ClientConn, context.Context, error) {
	tok, err := e.token()
	if err != nil {
		return nil, nil, err
	}
	path := home.At(e.Home).Path(socket)
	e.dialed = socket
	if _, err := os.Stat(path); err != nil {
		who, start := serverOf(socket, e.Home)
		return nil, nil, errdefs.Unavailable(errdefs.Unreachable,
			"no %s serves on home %s (%v: a stopped server, or the wrong --home); start one with %s", who, e.Home, err, start).
			With("home", e.Home).With("socket", path).Wrap(err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, err
	}
	// grpcerr's interceptors come first: every call's error reaches the
	// command as an *errdefs.Error, whatever the others return.
	dopts := append(grpcerr.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20)))
	dopts = append(append(dopts, e.timeouts()...), opts...)
	conn, err := grpc.NewClient("unix://"+abs, dopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", path, err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	return conn, ctx, nil
}

// serverOf names what serves socket in home and how to start it:
// bushostd for git.sock and broker.sock, the launcher for launch.sock.
func serverOf(socket, dir string) (who, start string) {
	if socket == home.LaunchSockName {
		return "launcher (sandbox serve)", fmt.Sprintf("'sandbox serve --home %s' as root, beside the bushostd serving there (docs/launch.md)", dir)
	}
	return "bushostd", fmt.Sprintf("'bushostd serve --home %s'", dir)
}

// hasSocket reports whether the home holds one of bushostd's sockets.
func (e *Env) hasSocket() bool {
	h := home.At(e.Home)
	for _, path := range []string{h.GitSock(), h.BrokerSock()} {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
			return true
		}
	}
	return false
}

// gitClient dials git.sock.
func (e *Env) gitClient(ctx context.Context) (gitv1.GitServiceClient, context.Context, func(), error) {
	conn, ctx, err := e.dial(ctx, home.GitSockName)
	if err != nil {
		return nil, nil, nil, err
	}
	return gitv1.NewGitServiceClient(conn), ctx, func() { conn.Close() }, nil
}

// brokerClient dials broker.sock.
func (e *Env) brokerClient(ctx context.Context) (brokerv1.BrokerServiceClient, context.Context, func(), error) {
	conn, ctx, err := e.dial(ctx, home.BrokerSockName)
	if err != nil {
		return nil, nil, nil, err
	}
	return brokerv1.NewBrokerServiceClient(conn), ctx, func() { conn.Close() }, nil
}

// writeJSONError writes x as the one JSON object an error is with --json:
// {"error":{"code":...,"reason":...,"message":...,"metadata":{...}}}.
func writeJSONError(w io.Writer, x *errdefs.Error) {
	md := x.Metadata
	if md == nil {
		md = map[string]string{}
	}
	if x.RetryAfter > 0 {
		md["retry_after"] = x.RetryAfter.String()
	}
	b, err := json.Marshal(map[string]any{"error": map[string]any{
		"code": x.Kind.String(), "reason": string(x.Reason), "message": x.Message, "metadata": md,
	}})
	if err != nil {
		b = []byte(`{"error":{"code":"Internal","reason":"INTERNAL","message":"cannot print the error as JSON","metadata":{}}}`)
	}
	fmt.Fprintf(w, "%s\n", b)
}

// callTimeout bounds unary calls that should answer at once.
const callTimeout = 2 * time.Minute

// Package cli is the bushost client: the command line that hosts, agents and
// scripts use (DESIGN.md, "Command line"). Each command is registered by the
// file of its domain (git.go, broker.go); this file owns the global flags,
// the token, the sockets and how errors are printed. The client never
// decides anything the server must decide: it only asks and reports.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/textsafe"
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
}

// command is one command line form, e.g. words "review verdict".
type command struct {
	words string
	usage string
	help  string
	run   func(ctx context.Context, e *Env, args []string) error
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.words]; dup {
		panic("cli: command registered twice: " + c.words)
	}
	commands[c.words] = c
}

// usageError is a mistake in the command line; it prints the usage.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// Main runs the client with args (without the program name) and returns
// the exit status: 0 on success, 1 when the bus host refused or failed, 2
// for a malformed command line.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return mainWith(args, stdin, stdout, stderr, os.Getenv)
}

func mainWith(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	// Nothing from the bus host reaches a terminal raw (internal/textsafe).
	safeOut, safeErr := textsafe.NewWriter(stdout), textsafe.NewWriter(stderr)
	defer safeOut.Flush()
	defer safeErr.Flush()
	stdout, stderr = safeOut, safeErr
	e := &Env{Home: "./bus-host", Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: getenv}
	rest, err := e.globalFlags(args)
	if err != nil {
		fmt.Fprintf(stderr, "bushost: %v\n\n", err)
		printUsage(stderr)
		return 2
	}
	if len(rest) == 0 || rest[0] == "help" || rest[0] == "--help" || rest[0] == "-h" {
		if len(rest) > 1 {
			if c, _ := lookup(rest[1:]); c != nil {
				printCommandHelp(stdout, c)
				return 0
			}
		}
		printUsage(stdout)
		if len(rest) == 0 {
			return 2
		}
		return 0
	}
	c, cargs := lookup(rest)
	if c == nil {
		fmt.Fprintf(stderr, "bushost: unknown command %q\n\n", strings.Join(rest, " "))
		printUsage(stderr)
		return 2
	}
	for _, a := range cargs {
		if a == "--help" || a == "-h" {
			printCommandHelp(stdout, c)
			return 0
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.run(ctx, e, cargs); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "bushost %s: %s\nusage: bushost %s\n", c.words, ue.msg, c.usage)
			return 2
		}
		err = e.failure(err)
		fmt.Fprintf(stderr, "bushost %s: %s\n", c.words, describe(err))
		return exitFor(err)
	}
	return 0
}

// globalFlags takes --home, --token-file and --json from anywhere in args
// (before or after the command words) and returns the rest in order.
func (e *Env) globalFlags(args []string) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			rest = append(rest, a)
			continue
		}
		name = strings.TrimPrefix(name, "-")
		switch name {
		case "json":
			e.JSON = true
		case "home", "token-file", "timeout":
			if !hasVal {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("--%s needs a value", name)
				}
				i++
				val = args[i]
			}
			switch name {
			case "timeout":
				d, err := time.ParseDuration(val)
				if err != nil || d <= 0 {
					return nil, fmt.Errorf("--timeout %q: want a positive duration such as 30s or 5m", val)
				}
				e.Timeout = d
			case "home":
				e.Home = val
			default:
				e.TokenFile = val
			}
		default:
			rest = append(rest, a)
		}
	}
	return rest, nil
}

// lookup finds the longest registered command made of the leading words.
func lookup(args []string) (*command, []string) {
	for n := min(3, len(args)); n > 0; n-- {
		if c, ok := commands[strings.Join(args[:n], " ")]; ok {
			return c, args[n:]
		}
	}
	return nil, nil
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `bushost: the client of the bus host (bushostd).

usage: bushost [--home DIR] [--token-file FILE] [--json] [--timeout D] COMMAND [FLAGS]

Global flags may stand before or after the command words:
  --home DIR         the bus host's home with git.sock, broker.sock and
                     admin.token (default ./bus-host)
  --token-file FILE  the session's grant token (else $BUS_TOKEN, else the
                     host's <home>/admin.token)
  --json             machine-readable output where a command prints data
  --timeout D        give up on a call with no answer, or a transfer with no
                     progress, after D (default: 2m for a call, 60s without
                     progress for a transfer); exits 3, leaves nothing

Commands:
`)
	names := make([]string, 0, len(commands))
	for k := range commands {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "  bushost %s\n      %s\n", commands[k].usage, commands[k].help)
	}
	fmt.Fprint(w, "\n'bushost COMMAND --help' shows a command's flags. A refused call exits 1\nwith the reason on stderr; a malformed command line exits 2.\n")
}

func printCommandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: bushost %s\n\n%s\n", c.usage, c.help)
	fs := c.flags()
	if fs != nil {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// flags returns the command's flag set by running its parser on --help
// without side effects; commands build their FlagSet with newFlags.
func (c *command) flags() *flag.FlagSet {
	var got *flag.FlagSet
	flagProbe = func(fs *flag.FlagSet) { got = fs }
	defer func() { flagProbe = nil }()
	_ = c.run(context.Background(), &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}, []string{"--help"})
	return got
}

var flagProbe func(*flag.FlagSet)

// newFlags makes a command's flag set; parse it with parseFlags.
func newFlags(words string) *flag.FlagSet {
	fs := flag.NewFlagSet("bushost "+words, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// errHelp stops a command after its flags were shown.
var errHelp = errors.New("help shown")

// parseFlags parses args into fs and refuses stray positional arguments
// unless allowArgs. With --help it hands fs to the help printer and returns
// errHelp (which the command returns unchanged).
func parseFlags(fs *flag.FlagSet, args []string, allowArgs bool) error {
	if flagProbe != nil {
		flagProbe(fs)
		return errHelp
	}
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if !allowArgs && fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// token returns the bearer token: --token-file, else $BUS_TOKEN, else the
// host's admin.token in home.
func (e *Env) token() (string, error) {
	if e.TokenFile != "" {
		b, err := os.ReadFile(e.TokenFile)
		if err != nil {
			return "", fmt.Errorf("read token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if t := strings.TrimSpace(e.Getenv("BUS_TOKEN")); t != "" {
		return t, nil
	}
	b, err := os.ReadFile(filepath.Join(e.Home, "admin.token"))
	if err != nil {
		return "", fmt.Errorf("no token: give --token-file FILE or $BUS_TOKEN (or run as the host, with %s readable): %w", filepath.Join(e.Home, "admin.token"), err)
	}
	return strings.TrimSpace(string(b)), nil
}

// dial connects to a socket of the bus host's home and returns a context
// that carries the token.
func (e *Env) dial(ctx context.Context, socket string) (*grpc.ClientConn, context.Context, error) {
	tok, err := e.token()
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(e.Home, socket)
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("bus host socket %s: %w (is bushostd serving --home %s?)", path, err, e.Home)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient("unix://"+abs, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4 << 20)),
	}, e.timeouts()...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", path, err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	return conn, ctx, nil
}

// gitClient dials git.sock.
func (e *Env) gitClient(ctx context.Context) (gitv1.GitServiceClient, context.Context, func(), error) {
	conn, ctx, err := e.dial(ctx, "git.sock")
	if err != nil {
		return nil, nil, nil, err
	}
	return gitv1.NewGitServiceClient(conn), ctx, func() { conn.Close() }, nil
}

// brokerClient dials broker.sock.
func (e *Env) brokerClient(ctx context.Context) (brokerv1.BrokerServiceClient, context.Context, func(), error) {
	conn, ctx, err := e.dial(ctx, "broker.sock")
	if err != nil {
		return nil, nil, nil, err
	}
	return brokerv1.NewBrokerServiceClient(conn), ctx, func() { conn.Close() }, nil
}

// describe turns an error into the line printed on stderr: a gRPC status
// becomes "Code: message", so scripts and people see the cause.
func describe(err error) string {
	if s, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", s.Code(), s.Message())
	}
	return err.Error()
}

// callTimeout bounds unary calls that should answer at once.
const callTimeout = 2 * time.Minute

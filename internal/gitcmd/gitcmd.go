// Package gitcmd is the one door through which bushost runs git, on the
// server and in the client alike.
//
// Every process it starts gets an environment built from nothing but PATH, a
// private HOME and the variables below; no system or global config; hooks,
// fsmonitor and every protocol but file switched off on the command line,
// where repository config cannot undo them; and only allow-listed
// subcommands. Caller values go after --end-of-options, or are refused when
// they could be read as options. Nothing in this project may call
// exec.Command("git", ...) outside this package.
package gitcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
)

// DefaultTimeout bounds a git process whose caller set no deadline.
const DefaultTimeout = 10 * time.Minute

// stderrLimit is how much of git's stderr an error keeps.
const stderrLimit = 64 << 10

// subcommands lists what may run. The value says whether the subcommand's
// option parser understands --end-of-options (git 2.39); for the others every
// caller value must not start with '-'.
var subcommands = map[string]bool{
	"add":          true,
	"bundle":       true,
	"cat-file":     true,
	"checkout":     false,
	"commit":       true,
	"commit-graph": false,
	"commit-tree":  true,
	"config":       true,
	"diff":         true,
	"diff-index":   true,
	"fetch":        true,
	"for-each-ref": true,
	"fsck":         true,
	"hash-object":  true,
	"index-pack":   false,
	"init":         true,
	"log":          true,
	"ls-files":     true,
	"ls-tree":      true,
	"merge-base":   true,
	"merge-tree":   true,
	"mktree":       true,
	"pack-objects": true,
	"pack-refs":    false,
	"read-tree":    true,
	"repack":       false,
	"reset":        false,
	"rev-list":     true,
	"rev-parse":    false,
	"rm":           true,
	"show-ref":     true,
	"status":       true,
	"symbolic-ref": true,
	"update-ref":   true,
	"write-tree":   true,
}

// fixedConfig is passed as -c to every git process. Command-line config wins
// over repository config, so a hostile .git/config cannot turn these back on.
var fixedConfig = []string{
	"core.hooksPath=/dev/null",
	"core.fsmonitor=false",
	"core.sshCommand=false",
	"core.askPass=",
	"core.pager=cat",
	"core.editor=false",
	"core.attributesFile=/dev/null",
	"credential.helper=",
	"commit.gpgSign=false",
	"tag.gpgSign=false",
	"diff.external=",
	"protocol.allow=never",
	"protocol.file.allow=always",
	"gc.auto=0",
	"maintenance.auto=false",
	"receive.autogc=false",
	"advice.detachedHead=false",
	"init.defaultBranch=main",
	"core.bigFileThreshold=16m",
	"pack.windowMemory=64m",
	"pack.threads=2",
}

// extraEnv lists the only variables a caller may add, besides the fixed
// environment. Each one points git at a place the caller chose on purpose.
var extraEnv = map[string]bool{
	"GIT_OBJECT_DIRECTORY":             true,
	"GIT_ALTERNATE_OBJECT_DIRECTORIES": true,
	"GIT_QUARANTINE_PATH":              true,
	"GIT_INDEX_FILE":                   true,
	"GIT_AUTHOR_NAME":                  true,
	"GIT_AUTHOR_EMAIL":                 true,
	"GIT_AUTHOR_DATE":                  true,
	"GIT_COMMITTER_NAME":               true,
	"GIT_COMMITTER_EMAIL":              true,
	"GIT_COMMITTER_DATE":               true,
}

// Runner starts git processes. The zero value is not usable: use New.
type Runner struct {
	gitPath string
	home    string
	path    string
	timeout time.Duration
	// dieWithParent: each git process gets SIGKILL when the thread that
	// started it ends (WithParentDeath).
	dieWithParent bool
}

// New returns a Runner whose processes see home as HOME. home should be a
// directory that holds nothing git would read (no .gitconfig); it is created
// 0700 if missing. An empty home makes a private one under os.TempDir().
func New(home string) (*Runner, error) {
	gitPath, err := exec.LookPath("git")
	if err != nil {
		return nil, fmt.Errorf("gitcmd: git not found on PATH: %w", err)
	}
	if home == "" {
		home, err = os.MkdirTemp("", "bushost-githome-")
		if err != nil {
			return nil, fmt.Errorf("gitcmd: private home: %w", err)
		}
	} else if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fmt.Errorf("gitcmd: private home: %w", err)
	}
	return &Runner{gitPath: gitPath, home: home, path: os.Getenv("PATH"), timeout: DefaultTimeout}, nil
}

// WithTimeout returns a copy of r whose processes are killed after d when the
// caller's context has no earlier deadline.
func (r *Runner) WithTimeout(d time.Duration) *Runner {
	c := *r
	c.timeout = d
	return &c
}

// WithParentDeath returns a Runner whose git processes are killed when the
// process that started them dies (PR_SET_PDEATHSIG), so that a SIGKILLed
// daemon leaves no repack or ref move of its own running beside the one
// restarted after it (which would remove the survivor's locks as stale).
//
// The kernel ties that signal to the *thread* that started git: use it
// only in a process where no goroutine ends while locked to its thread
// (runtime.LockOSThread), since Go retires such a thread and would take
// any git it started with it. bushostd locks no thread; the supervisor and
// the sandbox do, and do not use this.
func (r *Runner) WithParentDeath() *Runner {
	c := *r
	c.dieWithParent = true
	return &c
}

// Cmd describes one git invocation.
type Cmd struct {
	// Dir is the working directory (a work tree, or a bare repository).
	Dir string
	// GitDir, when set, is passed as --git-dir.
	GitDir string
	// Sub is the subcommand; it must be allow-listed. For "bundle" the
	// bundle verb ("create", "verify", "list-heads") is the first Flag.
	Sub string
	// Flags are options chosen by our code; each must start with '-' except
	// a verb of the subcommand given as the first element.
	Flags []string
	// Args are values that may come from outside (refs, paths, object ids);
	// they go after --end-of-options.
	Args []string
	// Config adds "key=value" entries passed with -c, after the fixed ones.
	Config []string
	// Env adds allow-listed variables ("NAME=value").
	Env []string
	// Stdin, Stdout: optional; Output and Line capture stdout themselves,
	// up to the cap their caller gives. Stderr is always kept for errors
	// (its first 64 KiB).
	Stdin  io.Reader
	Stdout io.Writer
	// Stderr, optional, receives git's stderr as well, for warnings git
	// gives without failing (the supervisor refuses a "could not open
	// directory" while it stages).
	Stderr io.Writer
}

// Error is a git process that failed. Stderr is git's own message, trimmed.
type Error struct {
	Args     []string
	ExitCode int
	Stderr   string
	Err      error
}

func (e *Error) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = e.Err.Error()
	}
	return fmt.Sprintf("git %s: %s", strings.Join(e.Args, " "), msg)
}

func (e *Error) Unwrap() error { return e.Err }

// ExitCode returns git's exit status from err, or -1 if err is not a git exit.
func ExitCode(err error) int {
	var ge *Error
	if errors.As(err, &ge) {
		return ge.ExitCode
	}
	return -1
}

// Argv returns the full argument list (without the git binary) that Run
// would use, or an error if the command is not allowed.
func (r *Runner) Argv(c Cmd) ([]string, error) {
	endOpts, ok := subcommands[c.Sub]
	if !ok {
		return nil, fmt.Errorf("gitcmd: subcommand %q is not allowed", c.Sub)
	}
	argv := make([]string, 0, 2*len(fixedConfig)+len(c.Config)*2+len(c.Flags)+len(c.Args)+4)
	for _, kv := range fixedConfig {
		argv = append(argv, "-c", kv)
	}
	for _, kv := range c.Config {
		if !strings.Contains(kv, "=") || strings.HasPrefix(kv, "-") {
			return nil, fmt.Errorf("gitcmd: bad config entry %q", kv)
		}
		argv = append(argv, "-c", kv)
	}
	if c.GitDir != "" {
		argv = append(argv, "--git-dir="+c.GitDir)
	}
	argv = append(argv, c.Sub)
	for i, f := range c.Flags {
		if !strings.HasPrefix(f, "-") && !(i == 0 && slices.Contains(verbs[c.Sub], f)) {
			return nil, fmt.Errorf("gitcmd: flag %q of git %s does not start with '-'", f, c.Sub)
		}
		argv = append(argv, f)
	}
	if len(c.Args) > 0 {
		if endOpts {
			argv = append(argv, "--end-of-options")
		} else {
			for _, a := range c.Args {
				if strings.HasPrefix(a, "-") {
					return nil, fmt.Errorf("gitcmd: value %q of git %s could be read as an option", a, c.Sub)
				}
			}
		}
		argv = append(argv, c.Args...)
	}
	return argv, nil
}

// verbs of subcommands that take one before their options.
var verbs = map[string][]string{
	"bundle":       {"create", "verify", "list-heads", "unbundle"},
	"commit-graph": {"write", "verify"},
}

func (r *Runner) env(c Cmd) ([]string, error) {
	env := []string{
		"PATH=" + r.path,
		"HOME=" + r.home,
		"XDG_CONFIG_HOME=" + r.home,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_PROTOCOL_FROM_USER=0",
		"GIT_OPTIONAL_LOCKS=0",
		"LC_ALL=C",
	}
	for _, kv := range c.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !extraEnv[name] {
			return nil, fmt.Errorf("gitcmd: environment %q is not allowed", name)
		}
		env = append(env, kv)
	}
	return env, nil
}

// Run runs c and returns an *Error carrying git's stderr if it fails.
// c.Stdout, when set, takes git's output as it comes (a pipe to another
// process, a stream to a client): nothing is held here.
func (r *Runner) Run(ctx context.Context, c Cmd) error {
	return r.run(ctx, c, nil)
}

func (r *Runner) run(ctx context.Context, c Cmd, capped *cappedBuffer) error {
	argv, err := r.Argv(c)
	if err != nil {
		return err
	}
	env, err := r.env(c)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok && r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	if capped != nil {
		// Past its cap the buffer cancels this context, which kills git:
		// a process that keeps printing must not wait on a full pipe.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		capped.over = cancel
		c.Stdout = capped
	}
	cmd := exec.CommandContext(ctx, r.gitPath, argv...)
	cmd.Dir = c.Dir
	cmd.Env = env
	cmd.Stdin = c.Stdin
	cmd.Stdout = c.Stdout
	stderr := &tailBuffer{limit: stderrLimit}
	cmd.Stderr = stderr
	if c.Stderr != nil {
		cmd.Stderr = io.MultiWriter(stderr, c.Stderr)
	}
	// git starts helpers of its own (index-pack under fetch, pack-objects
	// under bundle): a process group lets a cancel take them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r.dieWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	args := argv[2*len(fixedConfig):]
	if capped != nil && capped.exceeded {
		return errdefs.ResourceExhausted(errdefs.GitOutputTooLarge, "git %s printed more than %d bytes, the most this call reads; it was stopped", c.Sub, capped.limit).
			With("limit", capped.limit).With("command", c.Sub).
			Wrap(&Error{Args: args, ExitCode: -1, Stderr: stderr.String(), Err: errOutputTooLarge})
	}
	if err != nil {
		code := -1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return &Error{Args: args, ExitCode: code, Stderr: stderr.String(), Err: err}
	}
	return nil
}

// errOutputTooLarge is the cause under a GIT_OUTPUT_TOO_LARGE refusal.
var errOutputTooLarge = errors.New("output over its cap")

// Output runs c and returns its stdout, which may be at most max bytes:
// every caller says how much it is ready to hold. Past max, git is killed
// and the call fails with reason GIT_OUTPUT_TOO_LARGE (metadata "limit",
// "command"), whatever git would have said. c.Stdout must be unset.
func (r *Runner) Output(ctx context.Context, c Cmd, max int) ([]byte, error) {
	if c.Stdout != nil {
		return nil, fmt.Errorf("gitcmd: Output of git %s with a Stdout of its own", c.Sub)
	}
	if max <= 0 {
		return nil, fmt.Errorf("gitcmd: Output of git %s with no room (max %d)", c.Sub, max)
	}
	buf := &cappedBuffer{limit: max}
	err := r.run(ctx, c, buf)
	return buf.buf.Bytes(), err
}

// Line runs c and returns its stdout, at most max bytes (as Output), with
// surrounding space trimmed.
func (r *Runner) Line(ctx context.Context, c Cmd, max int) (string, error) {
	out, err := r.Output(ctx, c, max)
	return strings.TrimSpace(string(out)), err
}

// MaxLine is room for what git prints as one line of an answer: an object
// id, a type, a count, a ref name, a path or a config value (PATH_MAX,
// with room to spare).
const MaxLine = 8 << 10

// cappedBuffer holds at most limit bytes; the first write past them marks
// it exceeded, calls over (which kills git) and fails, so exec stops
// copying.
type cappedBuffer struct {
	buf      bytes.Buffer
	limit    int
	exceeded bool
	over     func()
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.exceeded || b.buf.Len()+len(p) > b.limit {
		b.exceeded = true
		b.over()
		return 0, errOutputTooLarge
	}
	return b.buf.Write(p)
}

// tailBuffer keeps the first limit bytes written to it, so that a chatty
// process cannot grow our memory without bound.
type tailBuffer struct {
	buf   bytes.Buffer
	limit int
	lost  bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	room := max(t.limit-t.buf.Len(), 0)
	if len(p) > room {
		t.lost = true
	}
	t.buf.Write(p[:min(len(p), room)])
	return len(p), nil
}

func (t *tailBuffer) String() string {
	if t.lost {
		return t.buf.String() + "\n[stderr truncated]"
	}
	return t.buf.String()
}

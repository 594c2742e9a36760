package runsc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Defaults for the optional Runtime fields.
const (
	DefaultPlatform = "systrap" // KVM hangs in our VMs; ptrace is slower.
	DefaultNetwork  = "none"
	DefaultHostUDS  = "all"
)

// ErrNotFound is returned (wrapped, test with errors.Is) by State, Start,
// Kill and Exec when runsc has no container with the given id under Root.
// Delete never returns it: deleting a missing container succeeds.
var ErrNotFound = errors.New("container not found")

// pipeDrainTimeout bounds how long a call waits, after runsc has exited, for
// pipes it shared with sandboxed processes to close. A process inside the
// sandbox that outlives `runsc exec` (a background child holding stdout)
// would otherwise block the call for its whole life.
const pipeDrainTimeout = 2 * time.Second

// Runtime holds the global flags passed identically to every runsc call for
// the containers under Root. runsc keeps no per-container record of them, so
// a call made with different flags (or none) silently uses runsc's defaults,
// for example a different network mode.
//
// A Runtime is a value with no state of its own: it is safe for concurrent
// use as long as its fields are not changed, and two Runtimes with equal
// fields are interchangeable (a restarted allocator finds its containers).
type Runtime struct {
	// Binary is the path of the runsc binary. Required.
	Binary string
	// Root is runsc's --root state directory, an absolute path. Required.
	// runsc creates it if missing.
	Root string
	// Platform is runsc's --platform; empty means DefaultPlatform.
	Platform string
	// Network is runsc's --network: "none" (empty means this) or "sandbox".
	// "sandbox" needs a bundle with a network namespace path (see
	// BundleSpec.NetNSPath); Create refuses a bundle without one, because
	// runsc would then use the caller's namespace. "host" is refused: it
	// shares the host's network, loopback services included.
	Network string
	// HostUDS is runsc's --host-uds: none, open, create or all (empty means
	// DefaultHostUDS). "create" suffices for the data plane (the sandboxed
	// server creates its sockets in a bind-mounted directory); "all" also
	// lets sandboxed processes connect to host sockets in bind-mounted
	// directories, which the egress proxy relay needs.
	HostUDS string
	// Debug adds --debug --debug-log=<Root>/logs/ (one file per runsc
	// command and per sandbox process).
	Debug bool
	// ExtraFlags are appended to the global flags of every call. They must
	// not set the flags the fields above control.
	ExtraFlags []string
}

// globalArgs returns the global flags for every runsc call, or an error if
// the Runtime is misconfigured.
func (r *Runtime) globalArgs() ([]string, error) {
	if r.Binary == "" {
		return nil, errors.New("runsc: Runtime.Binary is required")
	}
	if r.Root == "" || !filepath.IsAbs(r.Root) {
		return nil, fmt.Errorf("runsc: Runtime.Root must be an absolute path, got %q", r.Root)
	}
	network := orDefault(r.Network, DefaultNetwork)
	switch network {
	case "none", "sandbox":
	case "host":
		return nil, errors.New("runsc: Runtime.Network \"host\" is refused: it shares the host's network with untrusted code")
	default:
		return nil, fmt.Errorf("runsc: unknown Runtime.Network %q (want none or sandbox)", r.Network)
	}
	hostUDS := orDefault(r.HostUDS, DefaultHostUDS)
	switch hostUDS {
	case "none", "open", "create", "all":
	default:
		return nil, fmt.Errorf("runsc: unknown Runtime.HostUDS %q (want none, open, create or all)", r.HostUDS)
	}
	for _, f := range r.ExtraFlags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		switch name {
		case "root", "network", "host-uds", "platform", "debug", "debug-log", "log-fd":
			return nil, fmt.Errorf("runsc: Runtime.ExtraFlags must not set --%s (use the Runtime field)", name)
		}
	}
	args := []string{
		"--root=" + r.Root,
		"--network=" + network,
		"--host-uds=" + hostUDS,
		"--platform=" + orDefault(r.Platform, DefaultPlatform),
	}
	if r.Debug {
		args = append(args, "--debug", "--debug-log="+filepath.Join(r.Root, "logs")+"/")
	}
	return append(args, r.ExtraFlags...), nil
}

// orDefault returns s, or def if s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// CommandError is the error of a runsc call that ran and failed.
type CommandError struct {
	// Command is the subcommand, e.g. "create".
	Command string
	// ID is the container id the call was about, if any.
	ID string
	// ExitCode is runsc's exit status (128 for runsc's own fatal errors).
	ExitCode int
	// Message is what runsc reported: its stderr, or for calls whose stderr
	// belongs to a sandboxed process, the messages it wrote to --log-fd.
	Message string
}

func (e *CommandError) Error() string {
	var b strings.Builder
	b.WriteString("runsc ")
	b.WriteString(e.Command)
	if e.ID != "" {
		b.WriteString(" ")
		b.WriteString(e.ID)
	}
	fmt.Fprintf(&b, ": exit status %d", e.ExitCode)
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrNotFound) true when runsc reported that the
// container does not exist.
func (e *CommandError) Is(target error) bool {
	return target == ErrNotFound && isNotFoundMessage(e.Message)
}

// isNotFoundMessage recognises runsc's report of a missing container
// ("loading container: file does not exist" in the pinned version, from
// os.ErrNotExist). runsc has no exit code for it.
func isNotFoundMessage(msg string) bool {
	return strings.Contains(msg, "loading container") && strings.Contains(msg, os.ErrNotExist.Error())
}

// call describes one runsc invocation.
type call struct {
	command string   // subcommand
	id      string   // container id, for errors; already validated
	args    []string // subcommand flags and arguments
	// sharedStdio is set when runsc hands its stdio to a sandboxed process
	// (create, exec): then stderr is not runsc's alone, so runsc's own
	// messages are read from a private --log-fd file instead.
	sharedStdio bool
	// exitIsProcess is set when runsc's exit status is the sandboxed
	// process's (exec): only logged messages mean that runsc failed.
	exitIsProcess bool
	stdin         io.Reader
	stdout        io.Writer // nil: collected and returned, or /dev/null with sharedStdio
	stderr        io.Writer // only with sharedStdio; nil means /dev/null
}

// run runs runsc with the global flags and c, and returns what it wrote to
// stdout (when c.stdout is nil) and its exit code. A non-nil error is a
// *CommandError if runsc ran and failed.
func (r *Runtime) run(ctx context.Context, c call) (stdout []byte, exitCode int, err error) {
	global, err := r.globalArgs()
	if err != nil {
		return nil, -1, err
	}
	var logFile *os.File
	if c.sharedStdio {
		if logFile, err = openLogFile(c.command); err != nil {
			return nil, -1, err
		}
		defer logFile.Close()
		// ExtraFiles[0] is fd 3 in the child.
		global = append(global, "--log-fd=3")
	}
	argv := append(global, c.command)
	argv = append(argv, c.args...)

	cmd := exec.CommandContext(ctx, r.Binary, argv...)
	cmd.WaitDelay = pipeDrainTimeout
	cmd.Stdin = c.stdin
	var out, errBuf bytes.Buffer
	switch {
	case c.stdout != nil:
		cmd.Stdout = c.stdout
	case !c.sharedStdio:
		cmd.Stdout = &out
	}
	// else: /dev/null. A sandbox holds shared stdio for its whole life, so
	// a pipe would never reach EOF.
	if c.sharedStdio {
		if c.stderr != nil {
			cmd.Stderr = c.stderr
		}
		cmd.ExtraFiles = []*os.File{logFile}
	} else {
		cmd.Stderr = &errBuf
	}

	runErr := cmd.Run()
	if ctxErr := ctx.Err(); ctxErr != nil && runErr != nil {
		return nil, -1, fmt.Errorf("runsc %s %s: %w", c.command, c.id, ctxErr)
	}
	var msg string
	if c.sharedStdio {
		msg = readLogFile(logFile)
	} else {
		msg = strings.TrimSpace(errBuf.String())
	}
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
		exitCode = 0
	case errors.As(runErr, &exitErr) && exitErr.Exited():
		exitCode = exitErr.ExitCode()
	case errors.Is(runErr, exec.ErrWaitDelay) && cmd.ProcessState != nil:
		// runsc exited 0 but a sandboxed process still holds a pipe;
		// what it writes from now on is dropped.
		exitCode = cmd.ProcessState.ExitCode()
	default:
		// Not started, or killed by a signal.
		return nil, -1, fmt.Errorf("runsc %s %s: %w", c.command, c.id, runErr)
	}
	if c.exitIsProcess {
		// runsc exec exits with the process's status; its own failures are
		// the ones it logged.
		if msg != "" {
			return nil, exitCode, &CommandError{Command: c.command, ID: c.id, ExitCode: exitCode, Message: msg}
		}
		return out.Bytes(), exitCode, nil
	}
	if exitCode != 0 {
		return nil, exitCode, &CommandError{Command: c.command, ID: c.id, ExitCode: exitCode, Message: msg}
	}
	return out.Bytes(), 0, nil
}

// openLogFile returns an unlinked temporary file for runsc's --log-fd. A regular file, not a
// pipe: if it leaked into a sandbox process, a pipe would keep the call waiting; an unlinked
// file costs nothing.
func openLogFile(command string) (*os.File, error) {
	f, err := os.CreateTemp("", "runsc-log-")
	if err != nil {
		return nil, fmt.Errorf("runsc %s: creating error log file: %w", command, err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("runsc %s: unlinking error log file: %w", command, err)
	}
	return f, nil
}

// readLogFile returns the messages runsc wrote to its --log-fd file, one
// JSON object per error ({"msg": ..., "level": ..., "time": ...}), joined
// by "; ". Unparsable content is returned as is.
func readLogFile(f *os.File) string {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return ""
	}
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil || len(data) == 0 {
		return ""
	}
	var msgs []string
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var m struct {
			Msg string `json:"msg"`
		}
		if err := dec.Decode(&m); err != nil {
			if err != io.EOF {
				// Not JSON after all: keep the raw text.
				s := bufio.NewScanner(bytes.NewReader(data))
				msgs = msgs[:0]
				for s.Scan() {
					if line := strings.TrimSpace(s.Text()); line != "" {
						msgs = append(msgs, line)
					}
				}
			}
			break
		}
		if m.Msg != "" {
			msgs = append(msgs, m.Msg)
		}
	}
	return strings.Join(msgs, "; ")
}

// ReleaseRoot undoes what runsc keeps under Root between containers so that
// Root can be removed: runsc pins an empty network namespace for its gofers
// as a bind mount at Root/null-netns (shared by all containers, created
// again by the next Create), and removing Root fails with EBUSY while it is
// mounted. Call it after deleting the last container; it is a no-op if
// nothing is mounted.
func (r *Runtime) ReleaseRoot() error {
	if r.Root == "" || !filepath.IsAbs(r.Root) {
		return fmt.Errorf("runsc: Runtime.Root must be an absolute path, got %q", r.Root)
	}
	p := filepath.Join(r.Root, "null-netns")
	// Concurrent creates may stack several mounts on the same path.
	for {
		err := syscall.Unmount(p, syscall.MNT_DETACH)
		switch {
		case err == nil:
			continue
		case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOENT):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
}

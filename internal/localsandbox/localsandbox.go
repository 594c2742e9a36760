// Package localsandbox starts one fusebox-sandbox server inside a gVisor container on this
// machine and waits until its init socket is there. Tests, benchmarks and the local allocator
// use it; it knows nothing about pools or leases.
package localsandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// Paths inside the sandbox.
const (
	SocketDir    = "/run/fusebox"
	BinaryDir    = "/opt/fusebox"
	WorkspaceDir = "/workspace"
)

// LogName is the sandbox server's log (its standard output and error) in Options.Dir; the
// earlier part, once it passed Options.LogLimit, is in LogName+".1" (see serverLog).
const LogName = "server.log"

// DefaultCommandUser is who commands run as when the bundle names no other (non-root) user:
// the sandbox image's user.
var DefaultCommandUser = runsc.User{UID: 65532, GID: 65532}

// DefaultReadyTimeout bounds the wait for a new sandbox's init socket.
const DefaultReadyTimeout = 30 * time.Second

// Options describe one sandbox.
type Options struct {
	Runtime *runsc.Runtime // required
	ID      string         // a runsc.ID; required
	// Dir is a directory for this sandbox's bundle and sockets; it is created.
	Dir string
	// SandboxBinary is the host path of a static fusebox-sandbox, bound read-only (that one
	// file, nothing else of its directory) at BinaryDir in the sandbox. Required unless
	// Entrypoint is set.
	SandboxBinary string
	// Entrypoint, if set, starts the server from the sandbox's own root filesystem instead
	// (an image's entrypoint, such as /usr/local/bin/fusebox-sandbox): the server's argv is
	// Entrypoint followed by the socket flags and ServerArgs, and nothing is bound at
	// BinaryDir.
	Entrypoint []string
	// ServerArgs are extra flags for fusebox-sandbox (limits, idle TTL).
	ServerArgs []string
	// Bundle carries limits, root filesystem and extra mounts; Dir, Args and the socket and
	// binary mounts are filled in. Its UID:GID, if not root, is who commands run as
	// (DefaultCommandUser otherwise): the server itself always starts as root, keeps root as
	// its real user, and runs commands as that user (runsc.BundleSpec.CommandUser), so that
	// they can neither signal it nor write into the socket directory.
	Bundle runsc.BundleSpec
	// ReadyTimeout bounds the wait for the init socket (default DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// KeepAwake runs the server with KeepAwakeGODEBUG in its environment.
	KeepAwake bool
	// LogLimit bounds each of the server's two log files, LogName and LogName+".1" (default
	// DefaultLogLimit, at least 64 KiB).
	LogLimit int64
}

// KeepAwakeGODEBUG keeps the sandbox server's Go runtime monitor (sysmon) out of its deep
// sleep, at a cost in idle CPU, for faster allocations (the figures, and how to measure them
// with fusebox-bench allocate --fast-path-arms: docs/performance.md).
//
// A Go process whose goroutines are all idle parks sysmon; the next system call wakes it and
// it then polls every 20 µs for a millisecond or more. Under gVisor an idle sandbox is slow to
// wake, and each of those polls is a sleep through the sentry, on the CPUs the allocation is
// using. With schedtrace set, the runtime never deep-sleeps sysmon (runtime.sysmon, Go 1.26):
// it wakes every 10 ms instead, so the sandbox an allocation finds has run within the last
// 10 ms and no poll storm follows its first read. The period is 2^31-1 ms, so no trace is
// ever printed: a sandbox's monotonic clock starts at zero and no lease lasts 24.8 days. The
// server's environment is its own: commands get the base environment the server builds, not
// this variable. fusebox local up turns it on unless --keep-sandboxes-awake=false.
const KeepAwakeGODEBUG = "schedtrace=2147483647"

// withGODEBUG returns env with setting added to its GODEBUG entry (or as a new entry).
func withGODEBUG(env []string, setting string) []string {
	env = slices.Clone(env)
	for i, e := range env {
		if v, ok := strings.CutPrefix(e, "GODEBUG="); ok {
			if v == "" {
				env[i] = "GODEBUG=" + setting
			} else {
				env[i] = e + "," + setting
			}
			return env
		}
	}
	return append(env, "GODEBUG="+setting)
}

// Sandbox is a started sandbox.
type Sandbox struct {
	ID       string
	Dir      string
	InitAddr string // unix:// address of the init socket, on the host
	DataAddr string // unix:// address of the data socket, on the host (exists after init)
	// Pid is the host pid of the sandbox process (runsc's, holding gVisor's kernel), which
	// exits when the server does.
	Pid int
	rt  *runsc.Runtime
	log *serverLog
}

// Start writes the bundle, creates and starts the container and waits for the init socket.
// On failure it removes what it created.
func Start(ctx context.Context, o Options) (_ *Sandbox, err error) {
	if o.Runtime == nil || o.ID == "" || o.Dir == "" || (o.SandboxBinary == "" && len(o.Entrypoint) == 0) {
		return nil, errors.New("localsandbox: Runtime, ID, Dir and SandboxBinary or Entrypoint are required")
	}
	argv, binMount, err := serverCommand(o)
	if err != nil {
		return nil, err
	}
	sock, err := socketDir(o.Dir)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{ID: o.ID, Dir: o.Dir, rt: o.Runtime,
		InitAddr: "unix://" + filepath.Join(sock, "init.sock"),
		DataAddr: "unix://" + filepath.Join(sock, "data.sock")}
	defer func() {
		if err != nil {
			s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	spec := bundle(o, argv, append([]runsc.Mount{{Source: sock, Destination: SocketDir}}, binMount...))
	if err := runsc.WriteBundle(spec); err != nil {
		return nil, fmt.Errorf("writing bundle: %w", err)
	}
	var logw *os.File
	if s.log, logw, err = startServerLog(o.Dir, o.LogLimit); err != nil {
		return nil, fmt.Errorf("sandbox %s: starting its log: %w", o.ID, err)
	}
	// The sandbox holds its own copies; this one goes before a failure's Destroy, which
	// waits for the reader to see the pipe's end.
	defer logw.Close()
	if err := o.Runtime.CreateWithStdio(ctx, o.ID, spec.Dir, runsc.Stdio{Stdout: logw, Stderr: logw}); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", o.ID, err)
	}
	if s.Pid, err = runsc.ReadSandboxPID(spec.Dir); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", o.ID, err)
	}
	if err := o.Runtime.Start(ctx, o.ID); err != nil {
		return nil, fmt.Errorf("starting sandbox %s: %w", o.ID, err)
	}
	timeout := o.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	if err := s.waitReady(ctx, filepath.Join(sock, "init.sock"), timeout); err != nil {
		return nil, err
	}
	return s, nil
}

// serverCommand returns the sandbox server's command without its flags: o.Entrypoint, or
// o.SandboxBinary bound read-only into the sandbox with the mount that does it.
func serverCommand(o Options) ([]string, []runsc.Mount, error) {
	if len(o.Entrypoint) > 0 {
		return slices.Clone(o.Entrypoint), nil, nil
	}
	bin, err := filepath.Abs(o.SandboxBinary)
	if err != nil {
		return nil, nil, err
	}
	// The one file: the rest of its host directory (bin/ holds the fusebox CLI too)
	// stays out of the sandbox.
	inside := filepath.Join(BinaryDir, filepath.Base(bin))
	return []string{inside}, []runsc.Mount{{Source: bin, Destination: inside, ReadOnly: true}}, nil
}

// socketDir makes the sandbox's directory dir and the socket directory in it, and returns the
// latter's path. The socket directory, bound at SocketDir, is root's: the server binds its
// sockets there as root, and commands (another user) can list it but write nothing into it,
// so that nothing they write lands on the host's disk, and they cannot replace a socket by a
// link. Host users other than root cannot reach it: dir is private.
func socketDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating sandbox directory: %w", err)
	}
	sock := filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	if err := os.Chmod(sock, 0o755); err != nil { // undo the umask
		return "", fmt.Errorf("creating socket directory: %w", err)
	}
	return sock, nil
}

// bundle returns the bundle of o's sandbox: the server (argv and its flags) runs as root, and
// its commands as the bundle's user (DefaultCommandUser for root), with mounts added.
func bundle(o Options, argv []string, mounts []runsc.Mount) runsc.BundleSpec {
	spec := o.Bundle
	spec.Dir = filepath.Join(o.Dir, "bundle")
	spec.Workspace = WorkspaceDir
	cmdUser := runsc.User{UID: spec.UID, GID: spec.GID}
	if cmdUser.UID == 0 {
		cmdUser = DefaultCommandUser
	}
	spec.UID, spec.GID, spec.CommandUser = 0, 0, &cmdUser
	if o.KeepAwake {
		spec.Env = withGODEBUG(spec.Env, KeepAwakeGODEBUG)
	}
	spec.Args = append(append(argv,
		"-init-listen=unix://"+SocketDir+"/init.sock",
		"-data-listen=unix://"+SocketDir+"/data.sock",
		"-workspace="+WorkspaceDir,
		fmt.Sprintf("-command-user=%d:%d", cmdUser.UID, cmdUser.GID)), o.ServerArgs...)
	spec.Mounts = append(slices.Clone(spec.Mounts), mounts...)
	return spec
}

// waitReady waits until the server accepts connections on its init socket at initPath, for up
// to timeout.
func (s *Sandbox) waitReady(ctx context.Context, initPath string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	nextStateCheck := time.Now().Add(250 * time.Millisecond)
	for {
		// The socket file appears at bind, before listen: only a successful connect says the
		// server is ready.
		if c, err := endpoint.DialUnix(ctx, initPath); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: init socket did not appear within %v; server log: %s", s.ID, timeout, s.logTail())
		}
		// A server that exited (a bad flag, a failed self-check) fails the start at once
		// rather than at the deadline.
		if time.Now().After(nextStateCheck) {
			nextStateCheck = time.Now().Add(250 * time.Millisecond)
			if st, err := s.rt.State(ctx, s.ID); err == nil && st.Status == runsc.StatusStopped {
				return fmt.Errorf("sandbox %s: server exited before listening; server log: %s", s.ID, s.logTail())
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// logTail returns the last lines of the server's log, for error messages.
func (s *Sandbox) logTail() string {
	l := strings.TrimSpace(s.Log())
	if i := strings.IndexByte(l, '\n'); i >= 0 && len(l) > 600 {
		l = l[:i] // the first line says what went wrong; usage text follows
	}
	if len(l) > 600 {
		l = l[len(l)-600:]
	}
	return l
}

// Log returns what the sandbox server wrote to its standard output and error, as far as its
// two log files keep it (see Options.LogLimit), up to the moment of the call.
func (s *Sandbox) Log() string {
	if s.log != nil {
		s.log.flush(time.Second)
	}
	return readLog(s.Dir)
}

// Destroy kills and deletes the container and removes its directory. It is idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	err := s.rt.Remove(ctx, s.ID)
	if s.log != nil && err == nil {
		// The sandbox is gone, and with it the pipe's write end.
		s.log.wait(5 * time.Second)
	}
	if rmErr := os.RemoveAll(s.Dir); err == nil && rmErr != nil {
		err = fmt.Errorf("removing %s: %w", s.Dir, rmErr)
	}
	return err
}

package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
)

// drainGrace is how long Exec keeps reading output after the command's process group is gone:
// a process that left the group (setsid) may still hold the pipes open.
const drainGrace = 100 * time.Millisecond

// executor runs commands for Exec.
type executor struct {
	reaper *procs.Reaper
	state  *envstate.State
	limits Limits
	log    *slog.Logger
	bash   string // path of bash, or "" when the sandbox has none
	sh     string
	paths  pathCache
	user   *procs.User // who commands run as; nil: this process's user
}

func newExecutor(r *procs.Reaper, st *envstate.State, l Limits, log *slog.Logger) *executor {
	e := &executor{reaper: r, state: st, limits: l, log: log, sh: "/bin/sh"}
	for _, p := range []string{"/bin/bash", "/usr/bin/bash"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			e.bash = p
			break
		}
	}
	return e
}

// skipVar says which variables never enter a state delta: the shell's own bookkeeping.
func skipVar(k string) bool {
	switch k {
	case "PWD", "OLDPWD", "SHLVL", "_":
		return true
	}
	return false
}

func validateExec(req *sandboxv1.ExecRequest) error {
	hasArgv, hasScript := len(req.GetArgv()) > 0, req.GetScript() != ""
	switch {
	case hasArgv == hasScript:
		return fmt.Errorf("%w: exactly one of argv or script is required", errInvalid)
	case hasArgv && req.Argv[0] == "":
		return fmt.Errorf("%w: argv[0] is empty", errInvalid)
	}
	for _, a := range req.GetArgv() {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("%w: argv contains a NUL byte", errInvalid)
		}
	}
	if strings.IndexByte(req.GetScript(), 0) >= 0 || strings.IndexByte(req.GetCwd(), 0) >= 0 {
		return fmt.Errorf("%w: script or cwd contains a NUL byte", errInvalid)
	}
	for k, v := range req.GetEnv() {
		if err := validVarName(k); err != nil {
			return err
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: value of %s contains a NUL byte", errInvalid, k)
		}
	}
	for _, k := range req.GetUnsetEnv() {
		if err := validVarName(k); err != nil {
			return err
		}
	}
	if d := req.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return fmt.Errorf("%w: bad timeout %v", errInvalid, d)
		}
	}
	return nil
}

func validVarName(k string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") {
		return fmt.Errorf("%w: bad environment variable name %q", errInvalid, k)
	}
	return nil
}

// pathCache remembers where commands were found, keyed by name, PATH and working directory,
// so that the common case costs no filesystem lookups: each one is a round into gVisor's
// kernel and the gofer. Entries are dropped when starting from them fails.
type pathCache struct {
	mu sync.Mutex // guards m
	m  map[string]string
}

func (c *pathCache) key(name, pathVar, cwd string) string {
	if strings.Contains(name, "/") {
		return ""
	}
	return name + "\x00" + pathVar + "\x00" + cwd
}

func (c *pathCache) lookup(name, pathVar, cwd string) (string, error) {
	k := c.key(name, pathVar, cwd)
	if k != "" {
		c.mu.Lock()
		p, ok := c.m[k]
		c.mu.Unlock()
		if ok {
			return p, nil
		}
	}
	p, err := lookPath(name, pathVar, cwd)
	if err == nil && k != "" {
		c.mu.Lock()
		if c.m == nil || len(c.m) > 4096 {
			c.m = map[string]string{}
		}
		c.m[k] = p
		c.mu.Unlock()
	}
	return p, err
}

// forget drops a cached entry and reports whether there was one.
func (c *pathCache) forget(name, pathVar, cwd string) bool {
	k := c.key(name, pathVar, cwd)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.m[k]
	delete(c.m, k)
	return ok && k != ""
}

// lookPath finds an executable the way execvp would, in the command's own PATH.
func lookPath(name, pathVar, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(cwd, name)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if unix.Access(p, unix.X_OK) == nil {
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %q: %w", name, pathVar, os.ErrNotExist)
}

// run executes one command and reports its events to send, which is called from one goroutine
// at a time.
func (e *executor) run(ctx context.Context, req *sandboxv1.ExecRequest, send func(*sandboxv1.ExecEvent) error) error {
	if err := validateExec(req); err != nil {
		return err
	}
	snap, ticket, err := e.state.Begin(req.GetTaskGroupId(), req.GetLogicalOrder())
	if err != nil {
		return err
	}

	env := snap.Env
	if len(req.GetEnv()) > 0 || len(req.GetUnsetEnv()) > 0 {
		env = maps.Clone(snap.Env)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, req.GetEnv())
		for _, k := range req.GetUnsetEnv() {
			delete(env, k)
		}
	}
	cwd := snap.Cwd
	if c := req.GetCwd(); c != "" {
		if filepath.IsAbs(c) {
			cwd = filepath.Clean(c)
		} else {
			cwd = filepath.Join(snap.Cwd, c)
		}
	}
	var path string
	var argv []string
	capture := false
	switch {
	case req.GetScript() != "" && e.bash != "":
		path, argv, capture = e.bash, []string{"bash", "-c", envstate.BashTrap + req.GetScript()}, true
	case req.GetScript() != "":
		path, argv = e.sh, []string{"sh", "-c", req.GetScript()}
	default:
		argv = req.GetArgv()
		if path, err = e.paths.lookup(argv[0], env["PATH"], cwd); err != nil {
			return err
		}
	}
	envList := make([]string, 0, len(env))
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}

	// Descriptors: 0 stdin, 1 stdout, 2 stderr, 3 the state dump (scripts under bash). The
	// child's ends are raw blocking descriptors; only the ends this process reads are
	// non-blocking and registered with Go's poller, so that closing them interrupts a read.
	// Every syscall counts here: under gVisor each costs microseconds.
	var childFDs []int // closed once the child has them
	var closeAtEnd []*os.File
	defer func() {
		for _, fd := range childFDs {
			unix.Close(fd)
		}
		for _, f := range closeAtEnd {
			f.Close()
		}
	}()
	files := make([]int, 3, 4)
	var stdinW *os.File
	if len(req.GetStdin()) > 0 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return fmt.Errorf("creating stdin pipe: %w", err)
		}
		childFDs = append(childFDs, p[0])
		files[0], stdinW = p[0], os.NewFile(uintptr(p[1]), "stdin")
	} else {
		null, err := devNull()
		if err != nil {
			return fmt.Errorf("opening %s: %w", os.DevNull, err)
		}
		files[0] = int(null.Fd())
	}
	outR, outW, err := readPipe("stdout")
	if err != nil {
		return err
	}
	closeAtEnd, childFDs = append(closeAtEnd, outR), append(childFDs, outW)
	errR, errW, err := readPipe("stderr")
	if err != nil {
		return err
	}
	closeAtEnd, childFDs = append(closeAtEnd, errR), append(childFDs, errW)
	files[1], files[2] = outW, errW
	var dump *os.File
	if capture {
		fd, err := unix.MemfdCreate("fusebox-state", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("creating state file: %w", err)
		}
		dump = os.NewFile(uintptr(fd), "fusebox-state")
		closeAtEnd = append(closeAtEnd, dump)
		files = append(files, fd)
	}

	timeout := e.limits.DefaultTimeout
	if d := req.GetTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	timeout = min(timeout, e.limits.MaxTimeout)

	spec := procs.Spec{Path: path, Argv: argv, Env: envList, Dir: cwd, Files: files, User: e.user}
	p, err := e.reaper.Start(spec)
	if err != nil && len(req.GetArgv()) > 0 && e.paths.forget(argv[0], env["PATH"], cwd) {
		// The cached location went stale (the binary moved): look it up afresh once.
		if spec.Path, err = e.paths.lookup(argv[0], env["PATH"], cwd); err == nil {
			p, err = e.reaper.Start(spec)
		}
	}
	if err != nil {
		// The working directory is checked only now, off the hot path: a failed chdir and a
		// missing binary both surface as ForkExec errors.
		if fi, serr := os.Stat(cwd); serr != nil {
			return fmt.Errorf("working directory %s: %w", cwd, serr)
		} else if !fi.IsDir() {
			return fmt.Errorf("working directory %s: %w", cwd, unix.ENOTDIR)
		}
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: %v", os.ErrNotExist, err)
		}
		return err
	}
	for _, fd := range childFDs {
		unix.Close(fd)
	}
	childFDs = nil
	if stdinW != nil {
		go func() {
			// EPIPE when the command does not read its input is not an error of ours.
			stdinW.Write(req.GetStdin())
			stdinW.Close()
		}()
	}

	var sendMu sync.Mutex // serialises send and guards sendErr, sent, truncated
	var sendErr error
	var sent int64
	truncated := false

	emit := func(ev *sandboxv1.ExecEvent) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = send(ev)
		}
	}
	_ = emit // emit(&sandboxv1.ExecEvent{Event: &sandboxv1.ExecEvent_Started{Started: &sandboxv1.ExecStarted{Pid: int32(p.Pid)}}})

	var readers sync.WaitGroup
	pump := func(r *os.File, kind sandboxv1.StreamKind) {
		defer readers.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				sendMu.Lock()
				keep := int64(n)
				if room := e.limits.MaxOutputBytes - sent; keep > room {
					keep, truncated = max(room, 0), true
				}
				sent += keep
				if keep > 0 && sendErr == nil {
					sendErr = send(&sandboxv1.ExecEvent{Event: &sandboxv1.ExecEvent_Output{
						Output: &sandboxv1.ExecOutput{Stream: kind, Data: buf[:keep]}}})
				}
				sendMu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}
	readers.Add(2)
	go pump(outR, sandboxv1.StreamKind_STREAM_KIND_STDOUT)
	go pump(errR, sandboxv1.StreamKind_STREAM_KIND_STDERR)

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-p.Done():
	case <-timer.C:
		timedOut = true
		p.KillGroup()
		<-p.Done()
	case <-ctx.Done():
		// The client cancelled or went away: nobody is left to see the result.
		p.KillGroup()
		<-p.Done()
		return ctx.Err()
	}

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		// Someone outside the process group still holds the pipes: stop reading.
		outR.Close()
		errR.Close()
		<-drained
	}

	st := p.Status()
	exit := &sandboxv1.ExecExit{
		ExitCode: int32(st.ExitCode),
		Duration: durationpb.New(st.Exited.Sub(st.Started)),
		TimedOut: timedOut,
	}
	if st.Signal != 0 {
		exit.Signal = unix.SignalName(st.Signal)
	}
	if capture && !timedOut && st.Signal == 0 {
		exit.StateRecorded = e.record(dump, env, cwd, ticket)
	}
	sendMu.Lock()
	exit.Truncated = truncated
	err = sendErr
	sendMu.Unlock()
	if err != nil {
		return err
	}
	return send(&sandboxv1.ExecEvent{Event: &sandboxv1.ExecEvent_Exit{Exit: exit}})
}

// readPipe returns a pipe whose read end is a non-blocking *os.File on Go's poller and whose
// write end is a raw blocking descriptor for a child.
func readPipe(name string) (*os.File, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("creating %s pipe: %w", name, err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("creating %s pipe: %w", name, err)
	}
	return os.NewFile(uintptr(p[0]), name), p[1], nil
}

// record reads a script's state dump and enters its delta into the group's overlay.
func (e *executor) record(f *os.File, startEnv map[string]string, startCwd string, t envstate.Ticket) bool {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 64<<20))
	if err != nil || len(b) == 0 {
		return false // the script replaced the trap or closed the descriptor
	}
	dump, err := envstate.ParseBashDump(b)
	if err != nil {
		e.log.Debug("discarding unparsable state dump", "err", err)
		return false
	}
	// A variable set back to its value at the start is indistinguishable from one left alone,
	// so it is not a write; a change of directory is tracked by BashTrap's cd wrappers and
	// counts even when it returns to where it started.
	d := envstate.Diff(startEnv, dump.Env, skipVar)
	if (dump.CwdChanged || dump.Cwd != startCwd) && filepath.IsAbs(dump.Cwd) {
		d.Cwd = dump.Cwd
	}
	return e.state.Record(t, d)
}

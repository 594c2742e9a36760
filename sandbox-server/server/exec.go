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
	"github.com/fusebox-dev/fusebox/sandbox-server/process"
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
	sh     string // path of sh, or "" when the sandbox has none
	paths  pathCache
	user   *procs.User // who commands run as; nil: this process's user
}

func newExecutor(r *procs.Reaper, st *envstate.State, l Limits, log *slog.Logger) *executor {
	e := &executor{reaper: r, state: st, limits: l, log: log}
	e.bash = firstFile("/bin/bash", "/usr/bin/bash")
	e.sh = firstFile("/bin/sh", "/usr/bin/sh")
	return e
}

// errNoShell: a script asked of a sandbox whose image has no shell.
var errNoShell = errors.New("the sandbox's image has no shell (neither bash nor /bin/sh): run the command as argv, not as a script")

// firstFile returns the first of paths that is a regular file (following links), or "".
func firstFile(paths ...string) string {
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
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
// at a time and never after run returns. Its steps: plan the command from the request and the
// state it starts from, open its descriptors, start it, pump its output while waiting for its
// end, and report the exit (after recording a script's state delta).
func (e *executor) run(ctx context.Context, req *sandboxv1.ExecRequest, send func(*sandboxv1.ExecEvent) error) error {
	if err := validateExec(req); err != nil {
		return err
	}
	snap, ticket, err := e.state.Begin(req.GetTaskGroupId(), req.GetLogicalOrder())
	if err != nil {
		return err
	}
	c, err := e.plan(req, snap)
	if err != nil {
		return err
	}
	fds, err := openStdio(len(req.GetStdin()) > 0, c.capture)
	if err != nil {
		return err
	}
	defer fds.close()
	p, err := e.start(c, fds.files)
	if err != nil {
		return err
	}
	fds.handOver(req.GetStdin())

	out := &output{send: send, limit: e.limits.MaxOutputBytes}
	out.start(fds.stdout, fds.stderr)
	timedOut, err := wait(ctx, p, c.timeout)
	if err != nil {
		// The client cancelled or went away: nobody is left to see the result.
		out.stop(fds.stdout, fds.stderr, 0)
		return err
	}
	out.stop(fds.stdout, fds.stderr, drainGrace)

	st := p.Status()
	exit := &sandboxv1.ExecExit{
		ExitCode: int32(st.ExitCode),
		Duration: durationpb.New(st.Exited.Sub(st.Started)),
		TimedOut: timedOut,
	}
	if st.Signal != 0 {
		exit.Signal = unix.SignalName(st.Signal)
	}
	if c.capture && !timedOut && st.Signal == 0 {
		exit.StateRecorded = e.record(fds.dump, c.env, c.cwd, ticket)
	}
	if exit.Truncated, err = out.result(); err != nil {
		return err
	}
	return send(&sandboxv1.ExecEvent{Event: &sandboxv1.ExecEvent_Exit{Exit: exit}})
}

// command is what one Exec runs.
type command struct {
	path     string            // the program
	argv     []string          // its arguments, argv[0] included
	env      map[string]string // its environment, also the base of a script's state delta
	cwd      string            // its working directory
	capture  bool              // a script under bash, whose state dump is read after it exits
	lookedUp bool              // path came from the PATH cache, for argv[0]
	timeout  time.Duration
	terminal bool // files[0] is a terminal to become its controlling terminal (procs.Spec)
}

// plan works out what req runs from the state snap it starts from: the request's environment
// changes and working directory over the state's, the program (a shell for a script, argv[0]
// looked up in the command's PATH otherwise) and the timeout within the limits.
func (e *executor) plan(req *sandboxv1.ExecRequest, snap *envstate.Snapshot) (*command, error) {
	c := &command{env: snap.Env, cwd: snap.Cwd}
	if len(req.GetEnv()) > 0 || len(req.GetUnsetEnv()) > 0 {
		c.env = maps.Clone(snap.Env)
		if c.env == nil {
			c.env = map[string]string{}
		}
		maps.Copy(c.env, req.GetEnv())
		for _, k := range req.GetUnsetEnv() {
			delete(c.env, k)
		}
	}
	if d := req.GetCwd(); d != "" {
		if filepath.IsAbs(d) {
			c.cwd = filepath.Clean(d)
		} else {
			c.cwd = filepath.Join(snap.Cwd, d)
		}
	}
	switch {
	case req.GetScript() != "" && e.bash != "":
		c.path, c.argv, c.capture = e.bash, []string{"bash", "-c", envstate.BashTrap + req.GetScript()}, true
	case req.GetScript() != "" && e.sh == "":
		return nil, errNoShell
	case req.GetScript() != "":
		c.path, c.argv = e.sh, []string{"sh", "-c", req.GetScript()}
	default:
		c.argv, c.lookedUp = req.GetArgv(), true
		var err error
		if c.path, err = e.paths.lookup(c.argv[0], c.env["PATH"], c.cwd); err != nil {
			return nil, err
		}
	}
	c.timeout = e.limits.DefaultTimeout
	if d := req.GetTimeout(); d != nil && d.AsDuration() > 0 {
		c.timeout = d.AsDuration()
	}
	c.timeout = min(c.timeout, e.limits.MaxTimeout)
	return c, nil
}

// stdio holds a command's descriptors: 0 stdin, 1 stdout, 2 stderr, and 3 the state dump of a
// script under bash. The child's ends are raw blocking descriptors; only the ends this process
// reads are non-blocking and registered with Go's poller, so that closing them interrupts a
// read. Every syscall counts here: under gVisor each is a round into its kernel.
type stdio struct {
	files          []int    // the child's descriptors, in order
	child          []int    // the child's ends of the pipes, closed once it has them
	stdin          *os.File // the write end of stdin's pipe; nil without input or once handed over
	stdout, stderr *os.File // the read ends of the output pipes
	dump           *os.File // the state dump; nil unless the command is a script under bash
}

// openStdio opens a command's descriptors: a pipe for stdin when it has input (else the shared
// /dev/null), pipes for its output, and with capture a memory file for its state dump.
func openStdio(stdin, capture bool) (_ *stdio, err error) {
	s := &stdio{files: make([]int, 3, 4)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if stdin {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, fmt.Errorf("creating stdin pipe: %w", err)
		}
		s.child = append(s.child, p[0])
		s.files[0], s.stdin = p[0], os.NewFile(uintptr(p[1]), "stdin")
	} else {
		null, err := devNull()
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
		}
		s.files[0] = int(null.Fd())
	}
	var outW, errW int
	if s.stdout, outW, err = process.OutputPipe("stdout"); err != nil {
		return nil, err
	}
	s.child = append(s.child, outW)
	if s.stderr, errW, err = process.OutputPipe("stderr"); err != nil {
		return nil, err
	}
	s.child = append(s.child, errW)
	s.files[1], s.files[2] = outW, errW
	if capture {
		if s.dump, err = openDump(); err != nil {
			return nil, err
		}
		s.files = append(s.files, int(s.dump.Fd()))
	}
	return s, nil
}

// openDump creates the memory file a script under bash dumps its state into (descriptor 3).
func openDump() (*os.File, error) {
	fd, err := unix.MemfdCreate("fusebox-state", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating state file: %w", err)
	}
	return os.NewFile(uintptr(fd), "fusebox-state"), nil
}

// handOver closes the child's ends, which the started child now holds, and writes its input
// from a goroutine of its own, which closes the pipe after.
func (s *stdio) handOver(input []byte) {
	for _, fd := range s.child {
		unix.Close(fd)
	}
	s.child = nil
	if w := s.stdin; w != nil {
		s.stdin = nil
		go func() {
			// EPIPE when the command does not read its input is not an error of ours.
			w.Write(input)
			w.Close()
		}()
	}
}

// close closes every descriptor still held.
func (s *stdio) close() {
	for _, fd := range s.child {
		unix.Close(fd)
	}
	for _, f := range []*os.File{s.stdin, s.stdout, s.stderr, s.dump} {
		if f != nil {
			f.Close()
		}
	}
}

// start starts c with files as its descriptors. A failure to start from a cached PATH entry
// looks argv[0] up afresh once, and a failure is explained by the working directory when it is
// the cause.
func (e *executor) start(c *command, files []int) (*procs.Process, error) {
	spec := procs.Spec{Path: c.path, Argv: c.argv, Env: envList(c.env), Dir: c.cwd, Files: files, User: e.user, Terminal: c.terminal}
	p, err := e.reaper.Start(spec)
	if err != nil && c.lookedUp && e.paths.forget(c.argv[0], c.env["PATH"], c.cwd) {
		// The cached location went stale (the binary moved): look it up afresh once.
		if spec.Path, err = e.paths.lookup(c.argv[0], c.env["PATH"], c.cwd); err == nil {
			p, err = e.reaper.Start(spec)
		}
	}
	if err == nil {
		return p, nil
	}
	// The working directory is checked only now, off the hot path: a failed chdir and a
	// missing binary both surface as ForkExec errors.
	if fi, serr := os.Stat(c.cwd); serr != nil {
		return nil, fmt.Errorf("working directory %s: %w", c.cwd, serr)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("working directory %s: %w", c.cwd, unix.ENOTDIR)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("%w: %v", os.ErrNotExist, err)
	}
	return nil, err
}

func envList(env map[string]string) []string {
	l := make([]string, 0, len(env))
	for k, v := range env {
		l = append(l, k+"="+v)
	}
	return l
}

// output sends a command's output as it comes, up to limit bytes in all, from two pumps (stdout
// and stderr) that take turns at send.
type output struct {
	send    func(*sandboxv1.ExecEvent) error
	limit   int64
	readers sync.WaitGroup

	mu        sync.Mutex // serialises send; guards err, sent, truncated
	err       error      // send's first error; nothing is sent after it
	sent      int64
	truncated bool
}

// start starts the pumps of stdout and stderr.
func (o *output) start(stdout, stderr *os.File) {
	o.readers.Add(2)
	go o.pump(stdout, sandboxv1.StreamKind_STREAM_KIND_STDOUT)
	go o.pump(stderr, sandboxv1.StreamKind_STREAM_KIND_STDERR)
}

// pump sends what it reads from r as output of kind until r ends or is closed.
func (o *output) pump(r *os.File, kind sandboxv1.StreamKind) {
	defer o.readers.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			o.mu.Lock()
			keep := int64(n)
			if room := o.limit - o.sent; keep > room {
				keep, o.truncated = max(room, 0), true
			}
			o.sent += keep
			if keep > 0 && o.err == nil {
				o.err = o.send(&sandboxv1.ExecEvent{Event: &sandboxv1.ExecEvent_Output{
					Output: &sandboxv1.ExecOutput{Stream: kind, Data: buf[:keep]}}})
			}
			o.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// stop returns once both pumps have, after reading to the end of the pipes for up to grace:
// someone outside the command's process group (a process that called setsid) may still hold
// them open, and then the pipes are closed to stop the reads.
func (o *output) stop(stdout, stderr *os.File, grace time.Duration) {
	drained := make(chan struct{})
	go func() { o.readers.Wait(); close(drained) }()
	if grace > 0 {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-drained:
			return
		case <-t.C:
		}
	}
	stdout.Close()
	stderr.Close()
	<-drained
}

// result reports whether output was cut at the limit, and send's error if it failed; valid
// once stop has returned.
func (o *output) result() (truncated bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.truncated, o.err
}

// wait waits for p to exit. At the timeout it kills p's process group and reports that time
// ran out; when ctx ends first it kills the group and returns ctx's error.
func wait(ctx context.Context, p *procs.Process, timeout time.Duration) (timedOut bool, err error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.Done():
		return false, nil
	case <-timer.C:
		p.KillGroup()
		<-p.Done()
		return true, nil
	case <-ctx.Done():
		p.KillGroup()
		<-p.Done()
		return false, ctx.Err()
	}
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

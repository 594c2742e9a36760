// Package process runs a sandbox's long-lived processes: commands that outlive the call that
// started them, whose output any later call can read again, and that can run on a terminal.
//
// Each process's output goes into a bounded buffer (the last BufferBytes bytes of stdout and
// stderr together, in the order they were read, each chunk tagged by stream). Offsets are
// absolute: byte n of a process's output keeps offset n however much is dropped before it, so
// a reader that comes back says where it stopped and learns exactly what it missed. Readers
// follow live output by waiting for a channel that every write closes and replaces: a reader
// holds no goroutine of its own and nothing of the process, and a slow one never slows the
// process down (it is told what was dropped instead).
//
// A Registry bounds how many processes run at once and keeps the most recent exited ones for
// replay. Starting goes through a Launch function, the server's, so that a process starts
// exactly as a one-shot command does (environment, working directory, task group, user, the
// reaper's process group) with descriptors of this package's making.
package process

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
)

// Errors of this package; the server maps each to one gRPC code.
var (
	// ErrNotFound: no process with that id (never started, or exited and forgotten).
	ErrNotFound = errors.New("no such process")
	// ErrInvalid: a malformed request (a bad signal number or terminal size).
	ErrInvalid = errors.New("invalid request")
	// ErrExited: the process has exited.
	ErrExited = errors.New("process has exited")
	// ErrStdinClosed: the process's standard input is closed (by an earlier eof, or by the
	// process itself).
	ErrStdinClosed = errors.New("standard input is closed")
	// ErrNoTerminal: a terminal operation on a process started without one.
	ErrNoTerminal = errors.New("process has no terminal")
	// ErrFutureOffset: an Attach offset past what the process has written.
	ErrFutureOffset = errors.New("offset past the end of the output")
	// ErrLimit: the sandbox's limit of running processes is reached.
	ErrLimit = errors.New("too many processes")
	// ErrKeyReused: an idempotency key already used for a different request.
	ErrKeyReused = errors.New("idempotency key already used for a different request")
)

// drainGrace is how long output is still read after a process's group is gone: a process
// that left the group (setsid) may still hold the pipes or the terminal open.
const drainGrace = 100 * time.Millisecond

// Launch starts req's command with files as its descriptors 0, 1 and 2 (with terminal, one
// terminal thrice, to become its controlling terminal), as the leader of its own process
// group under the reaper. It returns the process and a function to call once it has exited,
// which records a script's state delta in its task group; the function also releases what
// Launch opened for it. An invalid request fails with an error the caller maps as it maps
// one-shot commands' errors.
type Launch func(req *sandboxv1.StartProcessRequest, files []int, terminal bool) (*procs.Process, func(procs.Status), error)

// Options configure a Registry. Launch is required.
type Options struct {
	Launch Launch
	// MaxProcesses bounds the processes running at once (default 64); as many exited ones
	// are kept for replay, the oldest forgotten first.
	MaxProcesses int
	// BufferBytes is how much of each process's most recent output is kept (default 1 MiB).
	BufferBytes int
	Logger      *slog.Logger
}

// Registry holds a sandbox's processes. It is safe for concurrent use.
type Registry struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // guards every field below
	procs   map[string]*Process
	order   []*Process // listed ones, in start order
	running int        // running or being started
	exited  int        // exited and still listed
	keys    map[string]*keyed
	lastID  uint64
}

// keyed is a start under an idempotency key: in flight until ready is closed, then p (or err
// when it failed, and the key is forgotten).
type keyed struct {
	fingerprint [32]byte
	ready       chan struct{}
	p           *Process
	err         error
}

// NewRegistry checks opts and returns an empty Registry.
func NewRegistry(opts Options) (*Registry, error) {
	if opts.Launch == nil {
		return nil, errors.New("process: a launch function is required")
	}
	if opts.MaxProcesses <= 0 {
		opts.MaxProcesses = 64
	}
	if opts.BufferBytes <= 0 {
		opts.BufferBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Registry{opts: opts, log: opts.Logger, procs: map[string]*Process{}, keys: map[string]*keyed{}}, nil
}

// Start starts the process req describes and returns it at once. With an idempotency key the
// registry still remembers, it returns that key's process instead (existing true), waiting
// for a start under the same key still in flight; the same key with a different request fails
// with ErrKeyReused. At the limit of running processes it fails with ErrLimit.
func (r *Registry) Start(ctx context.Context, req *sandboxv1.StartProcessRequest) (p *Process, existing bool, err error) {
	rows, cols, err := terminalSize(req.GetPty())
	if err != nil {
		return nil, false, err
	}
	key := req.GetIdempotencyKey()
	var fp [32]byte
	if key != "" {
		if fp, err = fingerprint(req); err != nil {
			return nil, false, err
		}
	}
	for {
		r.mu.Lock()
		k := r.keys[key]
		if key == "" || k == nil {
			break // still locked
		}
		r.mu.Unlock()
		if k.fingerprint != fp {
			return nil, false, fmt.Errorf("%w: %q", ErrKeyReused, key)
		}
		select {
		case <-k.ready:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if k.err == nil {
			return k.p, true, nil
		}
		// The first start failed and its key was forgotten: this one tries afresh.
	}
	if r.running >= r.opts.MaxProcesses {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("%w: %d running, the sandbox's limit", ErrLimit, r.opts.MaxProcesses)
	}
	r.running++
	var k *keyed
	if key != "" {
		k = &keyed{fingerprint: fp, ready: make(chan struct{})}
		r.keys[key] = k
	}
	r.lastID++
	id := "p" + strconv.FormatUint(r.lastID, 10)
	r.mu.Unlock()

	p, err = r.start(id, req, rows, cols)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.running--
		if k != nil {
			delete(r.keys, key)
			k.err = err
			close(k.ready)
		}
		return nil, false, err
	}
	r.procs[id] = p
	r.order = append(r.order, p)
	if k != nil {
		k.p = p
		close(k.ready)
	}
	go r.supervise(p)
	return p, false, nil
}

// fingerprint identifies what req asks for, its key aside.
func fingerprint(req *sandboxv1.StartProcessRequest) ([32]byte, error) {
	c := proto.Clone(req).(*sandboxv1.StartProcessRequest)
	c.IdempotencyKey = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return [32]byte{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return sha256.Sum256(b), nil
}

func terminalSize(s *sandboxv1.TerminalSize) (rows, cols uint16, err error) {
	if s == nil {
		return 0, 0, nil
	}
	if s.GetRows() < 1 || s.GetRows() > 65535 || s.GetCols() < 1 || s.GetCols() > 65535 {
		return 0, 0, fmt.Errorf("%w: terminal size %dx%d: rows and cols must be 1..65535", ErrInvalid, s.GetRows(), s.GetCols())
	}
	return uint16(s.GetRows()), uint16(s.GetCols()), nil
}

// start opens the process's descriptors and launches it.
func (r *Registry) start(id string, req *sandboxv1.StartProcessRequest, rows, cols uint16) (_ *Process, err error) {
	p := &Process{
		id: id, tag: req.GetTag(), argv: req.GetArgv(), script: req.GetScript(), group: req.GetTaskGroupId(),
		key: req.GetIdempotencyKey(), pty: req.GetPty() != nil,
		out: ring{max: r.opts.BufferBytes}, changed: make(chan struct{}), done: make(chan struct{}),
	}
	var (
		files   []int
		readers []*os.File // output to pump, in the order of streams
		streams []Stream
		child   []int // the child's ends, closed here once it has them
	)
	defer func() {
		for _, fd := range child {
			unix.Close(fd)
		}
		if err != nil {
			for _, f := range readers {
				f.Close()
			}
			if p.stdin != nil {
				p.stdin.Close()
			}
		}
	}()
	if p.pty {
		master, slave, err := openTerminal(rows, cols)
		if err != nil {
			return nil, err
		}
		child = append(child, slave)
		p.stdin, p.master = master, master
		files, readers, streams = []int{slave, slave, slave}, []*os.File{master}, []Stream{Stdout}
	} else {
		in, w, err := inputPipe()
		if err != nil {
			return nil, err
		}
		child = append(child, in)
		p.stdin = w
		files = []int{in}
		for _, s := range []Stream{Stdout, Stderr} {
			name := "stdout"
			if s == Stderr {
				name = "stderr"
			}
			f, fd, err := OutputPipe(name)
			if err != nil {
				return nil, err
			}
			child = append(child, fd)
			readers, streams = append(readers, f), append(streams, s)
			files = append(files, fd)
		}
	}
	proc, finish, err := r.opts.Launch(req, files, p.pty)
	if err != nil {
		return nil, err
	}
	p.proc, p.finish, p.readers, p.streams = proc, finish, readers, streams
	p.started = proc.Status().Started
	return p, nil
}

// supervise pumps p's output until it has exited and its output is read, then marks it
// ended and makes room among the exited ones.
func (r *Registry) supervise(p *Process) {
	var pumps sync.WaitGroup
	for i, f := range p.readers {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			p.pump(f, p.streams[i])
		}()
	}
	<-p.proc.Done()
	st := p.proc.Status()
	p.finish(st)
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	t := time.NewTimer(drainGrace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	for _, f := range p.readers {
		f.Close() // ends the pumps of output held open from outside the group
	}
	<-drained
	p.stdin.Close() // the master, with a terminal: closed once; later writes fail with ErrExited
	p.mu.Lock()
	p.status, p.ended = st, true
	close(p.changed)
	p.mu.Unlock()
	r.log.Debug("process ended", "id", p.id, "exit_code", st.ExitCode, "signal", st.Signal)

	// The registry's count is right before Wait returns: a caller that waited for a process
	// finds its room free.
	r.mu.Lock()
	defer close(p.done)
	defer r.mu.Unlock()
	r.running--
	r.exited++
	for i := 0; r.exited > r.opts.MaxProcesses && i < len(r.order); {
		old := r.order[i]
		old.mu.Lock()
		ended := old.ended
		old.mu.Unlock()
		if !ended {
			i++
			continue
		}
		r.order = append(r.order[:i], r.order[i+1:]...)
		delete(r.procs, old.id)
		if k := r.keys[old.key]; k != nil && k.p == old {
			delete(r.keys, old.key)
		}
		r.exited--
	}
}

// Get returns the process with id, or ErrNotFound.
func (r *Registry) Get(id string) (*Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[id]
	if p == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return p, nil
}

// List returns the listed processes, running and exited, in start order.
func (r *Registry) List() []Info {
	r.mu.Lock()
	l := make([]*Process, len(r.order))
	copy(l, r.order)
	r.mu.Unlock()
	infos := make([]Info, len(l))
	for i, p := range l {
		infos[i] = p.Info()
	}
	return infos
}

// Process is one started process.
type Process struct {
	id, tag, script, group, key string
	argv                        []string
	pty                         bool
	started                     time.Time
	proc                        *procs.Process
	finish                      func(procs.Status)
	readers                     []*os.File // the output's read ends (the master, with a terminal)
	streams                     []Stream   // of readers, in order
	master                      *os.File   // the terminal's master; nil without one

	stdinMu     sync.Mutex // serialises writes to stdin; guards stdinClosed
	stdin       *os.File   // the write end of stdin's pipe, or the master; closed when the process ends
	stdinClosed bool

	mu      sync.Mutex // guards every field below
	out     ring
	changed chan struct{} // closed and replaced at every write, and closed at the end
	ended   bool          // exited and output read to the end
	status  procs.Status
	done    chan struct{} // closed when ended
}

// Info is what ListProcesses shows of a process.
type Info struct {
	ID, Tag, Script, TaskGroup string
	Argv                       []string
	Pid                        int
	Terminal                   bool
	Ended                      bool
	Status                     procs.Status // ExitCode, Signal and Exited valid once Ended
	Started                    time.Time
	OutputStart, OutputEnd     uint64
}

// ID returns the process's id.
func (p *Process) ID() string { return p.id }

// Info returns the process's state now.
func (p *Process) Info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Info{
		ID: p.id, Tag: p.tag, Script: p.script, TaskGroup: p.group, Argv: p.argv, Pid: p.proc.Pid,
		Terminal: p.pty, Ended: p.ended, Status: p.status, Started: p.started,
		OutputStart: p.out.start(), OutputEnd: p.out.end,
	}
}

func (p *Process) hasEnded() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pump reads f into the buffer as output of stream s until f ends or is closed (a
// terminal's master reads EIO once no process holds the terminal).
func (p *Process) pump(f *os.File, s Stream) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.out.write(s, buf[:n])
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// Event is one step of Attach: output, a gap of dropped output, or the end.
type Event struct {
	Output *Chunk
	// Dropped, when its To is non-zero: the bytes [From, To) are no longer held.
	Dropped struct{ From, To uint64 }
	Exit    *Info // the last event, once the process has ended
}

// Attach sends p's output from offset from on to send, following live output until the
// process has ended and every byte was sent, then one Exit event. A gap (output dropped
// before the reader got to it) is sent as a Dropped event before the output after it. It
// returns send's error, or ctx's when ctx ends first; an offset past the output's end fails
// with ErrFutureOffset.
func (p *Process) Attach(ctx context.Context, from uint64, send func(Event) error) error {
	p.mu.Lock()
	end := p.out.end
	p.mu.Unlock()
	if from > end {
		return fmt.Errorf("%w: offset %d, the output ends at %d", ErrFutureOffset, from, end)
	}
	next := from
	for {
		p.mu.Lock()
		var gap Event
		if start := p.out.start(); next < start {
			gap.Dropped.From, gap.Dropped.To = next, start
			next = start
		}
		chunks := p.out.since(next)
		ended, changed := p.ended, p.changed
		p.mu.Unlock()
		if gap.Dropped.To != 0 {
			if err := send(gap); err != nil {
				return err
			}
		}
		for i := range chunks {
			if err := send(Event{Output: &chunks[i]}); err != nil {
				return err
			}
			next = chunks[i].End()
		}
		if len(chunks) > 0 {
			continue
		}
		if ended {
			info := p.Info()
			return send(Event{Exit: &info})
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WriteStdin writes data to p's standard input and then, with eof, closes it (with a
// terminal, writes its end-of-file character instead). It returns once every byte is
// written, or with ctx's error when ctx ends first (part of data may have been written). It
// fails with ErrExited once p has exited and with ErrStdinClosed once its input is closed.
func (p *Process) WriteStdin(ctx context.Context, data []byte, eof bool) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.hasEnded() {
		return fmt.Errorf("writing to %s: %w", p.id, ErrExited)
	}
	if p.stdinClosed {
		return fmt.Errorf("writing to %s: %w", p.id, ErrStdinClosed)
	}
	if p.pty && eof {
		data = append(data[:len(data):len(data)], eofChar(p.master))
	}
	if len(data) > 0 {
		// A write blocks while the process does not read: the call's end interrupts it.
		stop := context.AfterFunc(ctx, func() { p.stdin.SetWriteDeadline(time.Now()) })
		_, err := p.stdin.Write(data)
		if !stop() {
			p.stdin.SetWriteDeadline(time.Time{})
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrClosed), !p.proc.Status().Exited.IsZero():
			return fmt.Errorf("writing to %s: %w", p.id, ErrExited)
		case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
			return fmt.Errorf("writing to %s: %w (by the process)", p.id, ErrStdinClosed)
		default:
			return fmt.Errorf("writing to %s: %w", p.id, err)
		}
	}
	if eof && !p.pty {
		p.stdinClosed = true
		if err := p.stdin.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("closing the standard input of %s: %w", p.id, err)
		}
	}
	return nil
}

// Signal sends sig (1..64) to p, or with group to its whole process group. It fails with
// ErrExited once p has exited.
func (p *Process) Signal(sig int, group bool) error {
	if sig < 1 || sig > 64 {
		return fmt.Errorf("%w: signal %d: want 1..64", ErrInvalid, sig)
	}
	if p.hasEnded() {
		return fmt.Errorf("signalling %s: %w", p.id, ErrExited)
	}
	if err := p.proc.Signal(syscall.Signal(sig), group); err != nil {
		if errors.Is(err, os.ErrProcessDone) || errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signalling %s: %w", p.id, ErrExited)
		}
		return err
	}
	return nil
}

// Wait waits until p has ended (exited, and its output read to the end) and reports true,
// or until timeout (when positive) passes and reports false. It returns ctx's error when ctx
// ends first.
func (p *Process) Wait(ctx context.Context, timeout time.Duration) (bool, error) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-p.done:
		return true, nil
	case <-expired:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// Resize sets the size of p's terminal. It fails with ErrNoTerminal for a process without
// one and with ErrExited once p has ended.
func (p *Process) Resize(s *sandboxv1.TerminalSize) error {
	if !p.pty {
		return fmt.Errorf("resizing %s: %w", p.id, ErrNoTerminal)
	}
	if s == nil {
		return fmt.Errorf("%w: a size is required", ErrInvalid)
	}
	rows, cols, err := terminalSize(s)
	if err != nil {
		return err
	}
	// The master is closed only once the process has ended: checked first, a resize of an
	// ended process is an ErrExited, and one that races the end finds the file closed.
	if p.hasEnded() {
		return fmt.Errorf("resizing %s: %w", p.id, ErrExited)
	}
	if err := resize(p.master, rows, cols); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("resizing %s: %w", p.id, ErrExited)
		}
		return fmt.Errorf("resizing %s: %w", p.id, err)
	}
	return nil
}

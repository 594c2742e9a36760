package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// ProcessSpec is a long-lived process to start. Exactly one of Argv and Script is set.
type ProcessSpec struct {
	Argv   []string
	Script string // run by bash
	Cwd    string
	Env    map[string]string
	Unset  []string
	// PTY, if set, runs the process on a terminal of this size: its stdin, stdout and stderr,
	// and its controlling terminal. Its output is then all Stdout, with the terminal's output
	// processing ("\n" becomes "\r\n" until the process turns that off, e.g. `stty raw`).
	PTY *TerminalSize
	// Tag is a label of the caller's, shown by ListProcesses.
	Tag string
	// IdempotencyKey, if set, makes StartProcess safe to retry: while the sandbox still lists
	// the process a request with this key started, the same request returns that process
	// (with Process.Existing set) instead of starting another; the key with a different
	// request fails with FailedPrecondition.
	IdempotencyKey string
}

// TerminalSize is a terminal's size in characters, 1..65535 each.
type TerminalSize struct {
	Rows, Cols uint32
}

// ProcessInfo is a process as ListProcesses, Wait and StartProcess report it.
type ProcessInfo struct {
	ID, Tag   string
	Argv      []string
	Script    string
	TaskGroup string
	Pid       int // inside the sandbox
	PTY       bool
	Running   bool
	// Once exited: ExitCode (128+signal when a signal ended it), Signal (e.g. "SIGTERM"),
	// Ended.
	ExitCode int
	Signal   string
	Started  time.Time
	Ended    time.Time
	// OutputStart and OutputEnd bound the output the sandbox still holds; OutputEnd is
	// everything the process has written so far.
	OutputStart, OutputEnd uint64
}

// Process is a handle to a long-lived process in the sandbox. Handles are cheap and hold
// nothing open: any number, from any connection to the sandbox, may name one process.
type Process struct {
	s  *Sandbox
	id string
	// Existing reports, for a handle StartProcess returned, that the idempotency key was
	// already known: the process is the one an earlier request started.
	Existing bool
	// Info is the process as StartProcess reported it (zero for a handle from
	// Sandbox.Process).
	Info ProcessInfo
}

func (s *Sandbox) processes() sandboxv1.ProcessesClient { return sandboxv1.NewProcessesClient(s.conn) }

// ProcessesRPC returns the raw generated client of the Processes service, for calls this
// package does not wrap.
func (s *Sandbox) ProcessesRPC() sandboxv1.ProcessesClient { return s.processes() }

// StartProcess starts a process in its own group of the environment state (as Exec does)
// and returns as soon as it runs; it runs until it exits or is signalled, outliving this call
// and this connection. At the sandbox's limit of running processes it fails with
// ResourceExhausted.
func (s *Sandbox) StartProcess(ctx context.Context, spec ProcessSpec) (*Process, error) {
	return s.startProcess(ctx, spec, "", 0)
}

// StartProcess starts a process as a command of the group (see Sandbox.StartProcess): it
// starts from the group's state, and a script's changes count for the group if it exits
// before the next group starts.
func (g *TaskGroup) StartProcess(ctx context.Context, spec ProcessSpec) (*Process, error) {
	return g.s.startProcess(ctx, spec, g.id, g.order.Add(1))
}

func (s *Sandbox) startProcess(ctx context.Context, spec ProcessSpec, group string, order uint64) (*Process, error) {
	req := &sandboxv1.StartProcessRequest{
		Argv: spec.Argv, Script: spec.Script, Cwd: spec.Cwd, Env: spec.Env, UnsetEnv: spec.Unset,
		TaskGroupId: group, LogicalOrder: order, Tag: spec.Tag, IdempotencyKey: spec.IdempotencyKey,
	}
	if t := spec.PTY; t != nil {
		req.Pty = &sandboxv1.TerminalSize{Rows: t.Rows, Cols: t.Cols}
	}
	resp, err := s.processes().StartProcess(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("starting process: %w", err)
	}
	info := processInfo(resp.GetProcess())
	return &Process{s: s, id: info.ID, Existing: resp.GetExisting(), Info: info}, nil
}

// ListProcesses lists the sandbox's running processes and its most recently exited ones, in
// the order they started.
func (s *Sandbox) ListProcesses(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := s.processes().ListProcesses(ctx, &sandboxv1.ListProcessesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	l := make([]ProcessInfo, len(resp.GetProcesses()))
	for i, p := range resp.GetProcesses() {
		l[i] = processInfo(p)
	}
	return l, nil
}

// Process returns a handle to the process with id, started by this connection or any other.
// It checks nothing: a call on a handle to an unknown id fails with NotFound.
func (s *Sandbox) Process(id string) *Process { return &Process{s: s, id: id} }

// ID returns the process's id.
func (p *Process) ID() string { return p.id }

// OutputEvent is one step of an attached process's output: a chunk of output, a gap of
// output the sandbox no longer held, or, last, the process's end.
type OutputEvent struct {
	// Offset is where Data starts in the process's output (stdout and stderr together).
	Offset uint64
	Stderr bool // Data is from stderr; false: stdout (or the terminal)
	Data   []byte
	// Dropped > 0: the Dropped bytes before Offset were no longer held (the offset asked for
	// was older than the sandbox's buffer, or the reader fell behind); Data is empty.
	Dropped uint64
	// Exit, on the last event: how the process ended; Offset is then where its output ends.
	Exit *ProcessInfo
}

// OutputStream is an attached process's output, read with Recv. Close it (or end the
// context it was attached with) to stop following.
type OutputStream struct {
	stream sandboxv1.Processes_AttachClient
	cancel context.CancelFunc
	done   bool
}

// Attach streams the process's output from offset from (0: its first byte): what the
// sandbox still holds, then live output, then one event with Exit set once it has exited
// and its output was read to the end. An offset past what the process has written fails
// with OutOfRange.
func (p *Process) Attach(ctx context.Context, from uint64) (*OutputStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := p.s.processes().Attach(ctx, &sandboxv1.AttachRequest{Id: p.id, FromOffset: from})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("attaching to %s: %w", p.id, err)
	}
	return &OutputStream{stream: stream, cancel: cancel}, nil
}

// Recv returns the next event; after the Exit event, io.EOF. An error (NotFound,
// OutOfRange, a broken connection) ends the stream.
func (o *OutputStream) Recv() (*OutputEvent, error) {
	if o.done {
		return nil, io.EOF
	}
	ev, err := o.stream.Recv()
	if err != nil {
		o.Close()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("attach: stream ended without an exit event")
		}
		return nil, fmt.Errorf("attach: %w", err)
	}
	switch e := ev.GetEvent().(type) {
	case *sandboxv1.AttachEvent_Output:
		return &OutputEvent{Offset: e.Output.GetOffset(), Data: e.Output.GetData(),
			Stderr: e.Output.GetStream() == sandboxv1.StreamKind_STREAM_KIND_STDERR}, nil
	case *sandboxv1.AttachEvent_Dropped:
		d := e.Dropped
		return &OutputEvent{Offset: d.GetToOffset(), Dropped: d.GetToOffset() - d.GetFromOffset()}, nil
	case *sandboxv1.AttachEvent_Exit:
		o.done = true
		x := e.Exit
		info := &ProcessInfo{ExitCode: int(x.GetExitCode()), Signal: x.GetSignal(), Ended: x.GetEndedAt().AsTime(),
			OutputEnd: x.GetOutputEnd()}
		// Read the trailers in the background, so that the stream ends cleanly.
		go func() {
			o.stream.Recv()
			o.cancel()
		}()
		return &OutputEvent{Offset: x.GetOutputEnd(), Exit: info}, nil
	default:
		o.Close()
		return nil, fmt.Errorf("attach: unknown event %T", e)
	}
}

// Close stops following the output.
func (o *OutputStream) Close() {
	o.done = true
	o.cancel()
}

// WriteStdin writes data to the process's standard input; it returns once every byte is
// written. It fails with FailedPrecondition once the process has exited or its input is
// closed.
func (p *Process) WriteStdin(ctx context.Context, data []byte) error {
	if _, err := p.s.processes().WriteStdin(ctx, &sandboxv1.WriteStdinRequest{Id: p.id, Data: data}); err != nil {
		return fmt.Errorf("writing to %s: %w", p.id, err)
	}
	return nil
}

// CloseStdin closes the process's standard input (it reads end of file). With a terminal it
// writes the terminal's end-of-file character (Ctrl-D) instead, which ends the input of a
// program reading lines; the terminal stays open.
func (p *Process) CloseStdin(ctx context.Context) error {
	if _, err := p.s.processes().WriteStdin(ctx, &sandboxv1.WriteStdinRequest{Id: p.id, Eof: true}); err != nil {
		return fmt.Errorf("closing the input of %s: %w", p.id, err)
	}
	return nil
}

// Signal sends sig to the process, or with group to its whole process group (every
// descendant that stayed in it). It fails with FailedPrecondition once the process has
// exited, InvalidArgument for a number outside 1..64.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal, group bool) error {
	if _, err := p.s.processes().Signal(ctx, &sandboxv1.SignalRequest{Id: p.id, Signal: int32(sig), Group: group}); err != nil {
		return fmt.Errorf("signalling %s: %w", p.id, err)
	}
	return nil
}

// Wait waits until the process has exited and its output was read to the end (then
// Running is false in what it returns), or until timeout passes (when positive: Running is
// then true, and it is not an error), or ctx ends.
func (p *Process) Wait(ctx context.Context, timeout time.Duration) (*ProcessInfo, error) {
	req := &sandboxv1.WaitRequest{Id: p.id}
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
	}
	resp, err := p.s.processes().Wait(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("waiting for %s: %w", p.id, err)
	}
	info := processInfo(resp.GetProcess())
	return &info, nil
}

// Resize sets the size of the process's terminal; its foreground process group gets
// SIGWINCH. It fails with FailedPrecondition for a process started without a terminal.
func (p *Process) Resize(ctx context.Context, size TerminalSize) error {
	req := &sandboxv1.ResizeRequest{Id: p.id, Size: &sandboxv1.TerminalSize{Rows: size.Rows, Cols: size.Cols}}
	if _, err := p.s.processes().Resize(ctx, req); err != nil {
		return fmt.Errorf("resizing %s: %w", p.id, err)
	}
	return nil
}

func processInfo(p *sandboxv1.ProcessInfo) ProcessInfo {
	i := ProcessInfo{
		ID: p.GetId(), Tag: p.GetTag(), Argv: p.GetArgv(), Script: p.GetScript(), TaskGroup: p.GetTaskGroupId(),
		Pid: int(p.GetPid()), PTY: p.GetPty(), Running: p.GetState() == sandboxv1.ProcessState_PROCESS_STATE_RUNNING,
		ExitCode: int(p.GetExitCode()), Signal: p.GetSignal(), Started: p.GetStartedAt().AsTime(),
		OutputStart: p.GetOutputStart(), OutputEnd: p.GetOutputEnd(),
	}
	if p.GetEndedAt() != nil {
		i.Ended = p.GetEndedAt().AsTime()
	}
	return i
}

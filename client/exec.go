package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Command is one Exec. Exactly one of Argv and Script is set.
type Command struct {
	Argv   []string
	Script string // run by bash; exported variables and the final directory persist
	Cwd    string
	Env    map[string]string // for this command only
	Unset  []string          // for this command only
	Stdin  []byte
	// Timeout: zero means the sandbox's default.
	Timeout time.Duration
	// Stdout and Stderr receive output as it streams. When nil, output is collected into
	// Result.Stdout and Result.Stderr.
	Stdout, Stderr io.Writer
}

// Result is how a command ended.
type Result struct {
	ExitCode int
	Signal   string // e.g. "SIGKILL"; empty when the process exited normally
	// Duration is the process's own run time inside the sandbox.
	Duration       time.Duration
	Truncated      bool // output beyond the sandbox's limit was discarded
	TimedOut       bool
	StateRecorded  bool
	Stdout, Stderr []byte // collected when Command.Stdout / Stderr are nil
}

// Exec runs cmd as a group of its own: a script's exported variables and final working
// directory are visible to the next command.
func (s *Sandbox) Exec(ctx context.Context, cmd Command) (*Result, error) {
	return s.exec(ctx, cmd, "", 0)
}

// Run runs argv and collects its output.
func (s *Sandbox) Run(ctx context.Context, argv ...string) (*Result, error) {
	return s.Exec(ctx, Command{Argv: argv})
}

func (s *Sandbox) exec(ctx context.Context, cmd Command, group string, order uint64) (*Result, error) {
	req := &sandboxv1.ExecRequest{
		Argv: cmd.Argv, Script: cmd.Script, Cwd: cmd.Cwd, Env: cmd.Env, UnsetEnv: cmd.Unset,
		Stdin: cmd.Stdin, TaskGroupId: group, LogicalOrder: order,
	}
	if cmd.Timeout > 0 {
		req.Timeout = durationpb.New(cmd.Timeout)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := false
	defer func() {
		if !done {
			cancel() // ends the stream, and with it the command, on every early return
		}
	}()
	stream, err := s.rpc.Exec(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	res := &Result{}
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := cmd.Stdout, cmd.Stderr
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("exec: stream ended without an exit status")
		}
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		switch e := ev.GetEvent().(type) {
		case *sandboxv1.ExecEvent_Output:
			w := stdout
			if e.Output.GetStream() == sandboxv1.StreamKind_STREAM_KIND_STDERR {
				w = stderr
			}
			if _, err := w.Write(e.Output.GetData()); err != nil {
				return nil, fmt.Errorf("exec: writing output: %w", err)
			}
		case *sandboxv1.ExecEvent_Exit:
			x := e.Exit
			res.ExitCode, res.Signal = int(x.GetExitCode()), x.GetSignal()
			res.Duration = x.GetDuration().AsDuration()
			res.Truncated, res.TimedOut, res.StateRecorded = x.GetTruncated(), x.GetTimedOut(), x.GetStateRecorded()
			if cmd.Stdout == nil {
				res.Stdout = outBuf.Bytes()
			}
			if cmd.Stderr == nil {
				res.Stderr = errBuf.Bytes()
			}
			// The trailers follow at once: read them in the background so that the stream
			// ends cleanly (not reset by a cancel) without the caller waiting for them.
			done = true
			go func() {
				stream.Recv()
				cancel()
			}()
			return res, nil
		}
	}
}

// TaskGroup issues commands that may run concurrently and share one starting state. Each
// command gets its logical order when Exec is called (issue time), and among the group's
// commands the logically last change to a variable or to the working directory wins, however
// the commands' completions interleave. The group's changes become visible to the next group.
//
// Start the next group only after this group's Exec calls have returned: the sandbox commits a
// group when a command of another group arrives.
type TaskGroup struct {
	s     *Sandbox
	id    string
	order atomic.Uint64
}

// NewTaskGroup starts a new task group with a random id.
func (s *Sandbox) NewTaskGroup() *TaskGroup {
	var b [12]byte
	rand.Read(b[:])
	return &TaskGroup{s: s, id: hex.EncodeToString(b[:])}
}

// ID returns the group's id.
func (g *TaskGroup) ID() string { return g.id }

// Exec assigns cmd the next logical order, then runs it. Call it from the goroutine that
// decides the order; the RPC itself may run concurrently with others of the group.
func (g *TaskGroup) Exec(ctx context.Context, cmd Command) (*Result, error) {
	return g.s.exec(ctx, cmd, g.id, g.order.Add(1))
}

// Go assigns cmd the next logical order now and runs it in the background; the returned
// function waits for the result.
func (g *TaskGroup) Go(ctx context.Context, cmd Command) func() (*Result, error) {
	order := g.order.Add(1)
	type out struct {
		r   *Result
		err error
	}
	ch := make(chan out, 1)
	go func() {
		r, err := g.s.exec(ctx, cmd, g.id, order)
		ch <- out{r, err}
	}()
	return func() (*Result, error) {
		o := <-ch
		return o.r, o.err
	}
}

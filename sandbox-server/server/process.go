package server

import (
	"context"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/process"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
)

// launch is the registry's process.Launch: a long-lived process starts as an Exec's command
// does (the same validation, task group state, PATH lookup, user and process group), on the
// registry's descriptors and with no timeout.
func (e *executor) launch(req *sandboxv1.StartProcessRequest, files []int, terminal bool) (*procs.Process, func(procs.Status), error) {
	ereq := &sandboxv1.ExecRequest{
		Argv: req.GetArgv(), Script: req.GetScript(), Cwd: req.GetCwd(), Env: req.GetEnv(), UnsetEnv: req.GetUnsetEnv(),
		TaskGroupId: req.GetTaskGroupId(), LogicalOrder: req.GetLogicalOrder(),
	}
	if err := validateExec(ereq); err != nil {
		return nil, nil, err
	}
	snap, ticket, err := e.state.Begin(ereq.GetTaskGroupId(), ereq.GetLogicalOrder())
	if err != nil {
		return nil, nil, err
	}
	c, err := e.plan(ereq, snap)
	if err != nil {
		return nil, nil, err
	}
	c.terminal = terminal
	var dump *os.File
	if c.capture {
		if dump, err = openDump(); err != nil {
			return nil, nil, err
		}
		files = append(files[:len(files):len(files)], int(dump.Fd()))
	}
	p, err := e.start(c, files)
	if err != nil {
		if dump != nil {
			dump.Close()
		}
		return nil, nil, err
	}
	finish := func(st procs.Status) {
		if dump == nil {
			return
		}
		defer dump.Close()
		// As for Exec: a script killed by a signal left no complete state.
		if st.Signal == 0 {
			e.record(dump, c.env, c.cwd, ticket)
		}
	}
	return p, finish, nil
}

// processService implements the Processes service. Every method returns through toStatus.
type processService struct {
	sandboxv1.UnimplementedProcessesServer
	reg *process.Registry
}

func (s *processService) StartProcess(ctx context.Context, req *sandboxv1.StartProcessRequest) (*sandboxv1.StartProcessResponse, error) {
	p, existing, err := s.reg.Start(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &sandboxv1.StartProcessResponse{Process: processInfo(p.Info()), Existing: existing}, nil
}

func (s *processService) ListProcesses(context.Context, *sandboxv1.ListProcessesRequest) (*sandboxv1.ListProcessesResponse, error) {
	resp := &sandboxv1.ListProcessesResponse{ServerGoroutines: int64(runtime.NumGoroutine())}
	for _, i := range s.reg.List() {
		resp.Processes = append(resp.Processes, processInfo(i))
	}
	return resp, nil
}

func (s *processService) Attach(req *sandboxv1.AttachRequest, stream sandboxv1.Processes_AttachServer) error {
	p, err := s.reg.Get(req.GetId())
	if err != nil {
		return toStatus(err)
	}
	err = p.Attach(stream.Context(), req.GetFromOffset(), func(ev process.Event) error {
		out := &sandboxv1.AttachEvent{}
		switch {
		case ev.Output != nil:
			kind := sandboxv1.StreamKind_STREAM_KIND_STDOUT
			if ev.Output.Stream == process.Stderr {
				kind = sandboxv1.StreamKind_STREAM_KIND_STDERR
			}
			out.Event = &sandboxv1.AttachEvent_Output{Output: &sandboxv1.ProcessOutput{
				Offset: ev.Output.Offset, Stream: kind, Data: ev.Output.Data}}
		case ev.Exit != nil:
			info := processInfo(*ev.Exit)
			out.Event = &sandboxv1.AttachEvent_Exit{Exit: &sandboxv1.ProcessExit{
				ExitCode: info.ExitCode, Signal: info.Signal, EndedAt: info.EndedAt, OutputEnd: info.OutputEnd}}
		default:
			out.Event = &sandboxv1.AttachEvent_Dropped{Dropped: &sandboxv1.OutputDropped{
				FromOffset: ev.Dropped.From, ToOffset: ev.Dropped.To}}
		}
		return stream.Send(out)
	})
	return toStatus(err)
}

func (s *processService) WriteStdin(ctx context.Context, req *sandboxv1.WriteStdinRequest) (*sandboxv1.WriteStdinResponse, error) {
	p, err := s.reg.Get(req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sandboxv1.WriteStdinResponse{}, toStatus(p.WriteStdin(ctx, req.GetData(), req.GetEof()))
}

func (s *processService) Signal(_ context.Context, req *sandboxv1.SignalRequest) (*sandboxv1.SignalResponse, error) {
	p, err := s.reg.Get(req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sandboxv1.SignalResponse{}, toStatus(p.Signal(int(req.GetSignal()), req.GetGroup()))
}

func (s *processService) Wait(ctx context.Context, req *sandboxv1.WaitRequest) (*sandboxv1.WaitResponse, error) {
	p, err := s.reg.Get(req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	if d := req.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, toStatus(fmt.Errorf("%w: bad timeout %v", errInvalid, d))
		}
	}
	exited, err := p.Wait(ctx, req.GetTimeout().AsDuration())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sandboxv1.WaitResponse{Process: processInfo(p.Info()), Exited: exited}, nil
}

func (s *processService) Resize(_ context.Context, req *sandboxv1.ResizeRequest) (*sandboxv1.ResizeResponse, error) {
	p, err := s.reg.Get(req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sandboxv1.ResizeResponse{}, toStatus(p.Resize(req.GetSize()))
}

// processInfo is the wire form of i.
func processInfo(i process.Info) *sandboxv1.ProcessInfo {
	pi := &sandboxv1.ProcessInfo{
		Id: i.ID, Tag: i.Tag, Argv: i.Argv, Script: i.Script, Pid: int64(i.Pid), Pty: i.Terminal,
		State: sandboxv1.ProcessState_PROCESS_STATE_RUNNING, StartedAt: timestamppb.New(i.Started),
		OutputStart: i.OutputStart, OutputEnd: i.OutputEnd, TaskGroupId: i.TaskGroup,
	}
	if i.Ended {
		pi.State = sandboxv1.ProcessState_PROCESS_STATE_EXITED
		pi.ExitCode = int32(i.Status.ExitCode)
		pi.EndedAt = timestamppb.New(i.Status.Exited)
		if i.Status.Signal != 0 {
			pi.Signal = unix.SignalName(i.Status.Signal)
		}
	}
	return pi
}

package server

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
)

// newTestExecutor returns an executor over a reaper of its own, in a temporary directory with
// this process's PATH.
func newTestExecutor(t *testing.T, l Limits) *executor {
	t.Helper()
	r, err := procs.NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	st := envstate.New(map[string]string{"PATH": os.Getenv("PATH")}, t.TempDir())
	return newExecutor(r, st, l, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// events records what run sends, and fails the test on a send after run has returned.
type events struct {
	t        *testing.T
	mu       sync.Mutex // guards the fields below
	returned bool
	out      strings.Builder
	exit     *sandboxv1.ExecExit
	delay    time.Duration // how long each send of output takes
}

func (ev *events) send(e *sandboxv1.ExecEvent) error {
	ev.mu.Lock()
	if ev.returned {
		ev.t.Errorf("event sent after run returned: %T", e.GetEvent())
	}
	ev.mu.Unlock()
	if o := e.GetOutput(); o != nil {
		time.Sleep(ev.delay)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.returned {
		ev.t.Errorf("send still in progress when run returned: %T", e.GetEvent())
	}
	if o := e.GetOutput(); o != nil {
		ev.out.Write(o.GetData())
	}
	if x := e.GetExit(); x != nil {
		ev.exit = x
	}
	return nil
}

func (ev *events) run(ctx context.Context, e *executor, req *sandboxv1.ExecRequest) error {
	err := e.run(ctx, req, ev.send)
	ev.mu.Lock()
	ev.returned = true
	ev.mu.Unlock()
	return err
}

func TestExecRun(t *testing.T) {
	limits := Limits{MaxOutputBytes: 10, DefaultTimeout: time.Minute, MaxTimeout: time.Minute}
	for _, tc := range []struct {
		name                     string
		req                      *sandboxv1.ExecRequest
		out                      string
		code                     int32
		signal                   string
		timedOut, truncated, rec bool
	}{
		{name: "argv", req: &sandboxv1.ExecRequest{Argv: []string{"echo", "hi"}}, out: "hi\n"},
		{name: "stdin", req: &sandboxv1.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in")}, out: "in"},
		{name: "env and cwd", req: &sandboxv1.ExecRequest{Script: `printf %s "$V"; cd /; exit 3`,
			Env: map[string]string{"V": "v"}}, out: "v", code: 3, rec: true},
		{name: "state recorded", req: &sandboxv1.ExecRequest{Script: "export W=1"}, rec: true},
		{name: "truncated", req: &sandboxv1.ExecRequest{Argv: []string{"echo", "0123456789abc"}},
			out: "0123456789", truncated: true},
		{name: "timeout", req: &sandboxv1.ExecRequest{Argv: []string{"sleep", "10"},
			Timeout: durationpb.New(50 * time.Millisecond)}, code: 128 + 9, signal: "SIGKILL", timedOut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestExecutor(t, limits)
			ev := &events{t: t}
			if err := ev.run(context.Background(), e, tc.req); err != nil {
				t.Fatal(err)
			}
			x := ev.exit
			if x == nil {
				t.Fatal("no exit event")
			}
			if got := ev.out.String(); got != tc.out {
				t.Errorf("output %q, want %q", got, tc.out)
			}
			if x.GetExitCode() != tc.code || x.GetSignal() != tc.signal || x.GetTimedOut() != tc.timedOut ||
				x.GetTruncated() != tc.truncated || x.GetStateRecorded() != tc.rec {
				t.Errorf("exit %v, want code %d signal %q timed out %v truncated %v state recorded %v",
					x, tc.code, tc.signal, tc.timedOut, tc.truncated, tc.rec)
			}
		})
	}
}

func TestExecStartErrors(t *testing.T) {
	e := newTestExecutor(t, Limits{MaxOutputBytes: 1 << 20, DefaultTimeout: time.Minute, MaxTimeout: time.Minute})
	for _, tc := range []struct {
		name string
		req  *sandboxv1.ExecRequest
		want string
	}{
		{"missing program", &sandboxv1.ExecRequest{Argv: []string{"fusebox-no-such-program"}}, "not found in PATH"},
		{"missing directory", &sandboxv1.ExecRequest{Argv: []string{"true"}, Cwd: "no-such-dir"}, "working directory"},
		{"both argv and script", &sandboxv1.ExecRequest{Argv: []string{"true"}, Script: "true"}, "exactly one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := &events{t: t}
			err := ev.run(context.Background(), e, tc.req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestExecCancelStopsSending checks that a cancelled Exec sends nothing once run has returned:
// gRPC does not allow a stream's Send after its handler has returned.
func TestExecCancelStopsSending(t *testing.T) {
	e := newTestExecutor(t, Limits{MaxOutputBytes: 1 << 30, DefaultTimeout: time.Minute, MaxTimeout: time.Minute})
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		ev := &events{t: t, delay: 5 * time.Millisecond}
		go func() {
			for {
				ev.mu.Lock()
				n := ev.out.Len()
				ev.mu.Unlock()
				if n > 0 {
					cancel()
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		if err := ev.run(ctx, e, &sandboxv1.ExecRequest{Argv: []string{"yes"}}); err != context.Canceled {
			t.Fatalf("run: %v, want %v", err, context.Canceled)
		}
		time.Sleep(20 * time.Millisecond) // room for a late send to show
		cancel()
	}
}

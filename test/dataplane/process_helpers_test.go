package dataplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// attached is what an Attach stream has delivered so far.
type attached struct {
	stdout, stderr bytes.Buffer
	all            bytes.Buffer // both, in offset order
	dropped        []client.OutputEvent
	next           uint64 // the offset after the last byte received
	exit           *client.ProcessInfo
}

// take adds ev to a, checking that offsets are contiguous.
func (a *attached) take(t testing.TB, ev *client.OutputEvent) {
	t.Helper()
	switch {
	case ev.Exit != nil:
		if ev.Offset != a.next {
			t.Fatalf("exit at offset %d, but output was received up to %d", ev.Offset, a.next)
		}
		a.exit = ev.Exit
	case ev.Dropped > 0:
		if ev.Offset-ev.Dropped != a.next {
			t.Fatalf("dropped [%d, %d), but output was received up to %d", ev.Offset-ev.Dropped, ev.Offset, a.next)
		}
		a.dropped = append(a.dropped, *ev)
		a.next = ev.Offset
	default:
		if ev.Offset != a.next {
			t.Fatalf("output at offset %d, want %d (contiguous)", ev.Offset, a.next)
		}
		if ev.Stderr {
			a.stderr.Write(ev.Data)
		} else {
			a.stdout.Write(ev.Data)
		}
		a.all.Write(ev.Data)
		a.next += uint64(len(ev.Data))
	}
}

// attachAll attaches to p from offset from and reads until the process's exit event.
func attachAll(t testing.TB, ctx context.Context, p *client.Process, from uint64) *attached {
	t.Helper()
	o, err := p.Attach(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	a := &attached{next: from}
	for a.exit == nil {
		ev, err := o.Recv()
		if err != nil {
			t.Fatalf("attach to %s: %v", p.ID(), err)
		}
		a.take(t, ev)
	}
	if _, err := o.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the exit event: %v, want io.EOF", err)
	}
	return a
}

// follower reads an attached stream until the output satisfies a condition.
type follower struct {
	o *client.OutputStream
	attached
}

func follow(t testing.TB, ctx context.Context, p *client.Process, from uint64) *follower {
	t.Helper()
	o, err := p.Attach(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return &follower{o: o, attached: attached{next: from}}
}

// until reads until cond holds of what was received (or the process ends, a failure).
func (f *follower) until(t testing.TB, what string, cond func(*attached) bool) {
	t.Helper()
	for !cond(&f.attached) {
		if f.exit != nil {
			t.Fatalf("waiting for %s: the process exited (%+v); stdout %q stderr %q", what, *f.exit, f.stdout.String(), f.stderr.String())
		}
		ev, err := f.o.Recv()
		if err != nil {
			t.Fatalf("waiting for %s: %v; stdout %q stderr %q", what, err, f.stdout.String(), f.stderr.String())
		}
		f.take(t, ev)
	}
}

// untilStdout reads until stdout contains s.
func (f *follower) untilStdout(t testing.TB, s string) {
	t.Helper()
	f.until(t, "stdout to contain "+s, func(a *attached) bool { return strings.Contains(a.stdout.String(), s) })
}

// goroutines is the sandbox server's goroutine count as ListProcesses reports it.
func goroutines(t testing.TB, ctx context.Context, c *client.Sandbox) int64 {
	t.Helper()
	resp, err := c.ProcessesRPC().ListProcesses(ctx, &sandboxv1.ListProcessesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetServerGoroutines()
}

// mustStart starts spec; it must succeed.
func mustStart(t testing.TB, ctx context.Context, c *client.Sandbox, spec client.ProcessSpec) *client.Process {
	t.Helper()
	p, err := c.StartProcess(ctx, spec)
	if err != nil {
		t.Fatalf("starting %+v: %v", spec, err)
	}
	return p
}

// kill kills p's whole group and waits for its end; a process already gone is fine.
func kill(t testing.TB, ctx context.Context, p *client.Process) {
	t.Helper()
	if err := p.Signal(ctx, 9, true); err != nil && codeOf(err).String() != "FailedPrecondition" {
		t.Errorf("killing %s: %v", p.ID(), err)
	}
	if info, err := p.Wait(ctx, 0); err != nil || info.Running {
		t.Errorf("waiting for %s after SIGKILL: %+v, %v", p.ID(), info, err)
	}
}

// dialAgain opens another connection to b's sandbox with the same agent key.
func dialAgain(t testing.TB, b *sandboxtest.Bound) *client.Sandbox {
	t.Helper()
	c, err := client.Dial(b.DataAddr, b.SandboxKey, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cutProxy forwards connections from a unix socket of its own to the sandbox's data socket.
// Once armed, it cuts a connection (both directions, at once) at the first bytes the sandbox
// sends on it: with the connection otherwise idle, those are the answer to a call the sandbox
// has received and handled, which the client therefore never gets.
type cutProxy struct {
	addr   string
	ln     net.Listener
	target string

	mu    sync.Mutex // guards armed and cuts
	armed bool
	cuts  int
	wg    sync.WaitGroup
}

func newCutProxy(t testing.TB, dataAddr string) *cutProxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: "unix://" + path, ln: ln, target: socketPath(dataAddr)}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *cutProxy) arm() {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
}

func (p *cutProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("unix", p.target, 10*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			io.Copy(s, c)
			s.Close()
			c.Close()
		}()
		go func() {
			defer p.wg.Done()
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					p.mu.Lock()
					cut := p.armed
					if cut {
						p.armed = false
						p.cuts++
					}
					p.mu.Unlock()
					if cut {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

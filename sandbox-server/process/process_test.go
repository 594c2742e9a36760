package process

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
)

// TestMain starts os/signal's watcher, which the first reaper would start and which never
// ends, before any test counts goroutines.
func TestMain(m *testing.M) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGCHLD)
	signal.Stop(c)
	os.Exit(m.Run())
}

func TestRing(t *testing.T) {
	type write struct {
		s    Stream
		data string
	}
	for _, tc := range []struct {
		name       string
		max        int
		writes     []write
		start, end uint64
		since      uint64
		want       []Chunk
	}{
		{"merges one stream", 100, []write{{Stdout, "ab"}, {Stdout, "cd"}}, 0, 4, 1,
			[]Chunk{{1, Stdout, []byte("bcd")}}},
		{"keeps streams apart in order", 100, []write{{Stdout, "ab"}, {Stderr, "cd"}, {Stdout, "e"}}, 0, 5, 0,
			[]Chunk{{0, Stdout, []byte("ab")}, {2, Stderr, []byte("cd")}, {4, Stdout, []byte("e")}}},
		{"drops the oldest bytes exactly", 4, []write{{Stdout, "abc"}, {Stderr, "de"}, {Stdout, "f"}}, 2, 6, 2,
			[]Chunk{{2, Stdout, []byte("c")}, {3, Stderr, []byte("de")}, {5, Stdout, []byte("f")}}},
		{"a write larger than the buffer", 3, []write{{Stdout, "ab"}, {Stderr, "cdefg"}}, 4, 7, 5,
			[]Chunk{{5, Stderr, []byte("fg")}}},
		{"nothing after the end", 10, []write{{Stdout, "ab"}}, 0, 2, 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ring{max: tc.max}
			for _, w := range tc.writes {
				r.write(w.s, []byte(w.data))
			}
			if r.start() != tc.start || r.end != tc.end {
				t.Fatalf("holds [%d, %d), want [%d, %d)", r.start(), r.end, tc.start, tc.end)
			}
			got := r.since(tc.since)
			if len(got) != len(tc.want) {
				t.Fatalf("since %d: %+v, want %+v", tc.since, got, tc.want)
			}
			for i := range got {
				if got[i].Offset != tc.want[i].Offset || got[i].Stream != tc.want[i].Stream || !bytes.Equal(got[i].Data, tc.want[i].Data) {
					t.Fatalf("since %d: chunk %d is %+v, want %+v", tc.since, i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestRingKeepsGivenSlices: bytes handed to a reader do not change as writes go on.
func TestRingKeepsGivenSlices(t *testing.T) {
	r := ring{max: 8}
	r.write(Stdout, []byte("abcd"))
	got := r.since(0)
	for range 10 {
		r.write(Stdout, []byte("xyz"))
	}
	if string(got[0].Data) != "abcd" {
		t.Fatalf("a chunk given out became %q", got[0].Data)
	}
}

// newRegistry returns a registry whose launch runs argv (or sh -c script) directly under a
// real reaper.
func newRegistry(t *testing.T, max, buffer int) *Registry {
	t.Helper()
	reaper, err := procs.NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reaper.Close)
	var mu sync.Mutex
	launches := 0
	launch := func(req *sandboxv1.StartProcessRequest, files []int, terminal bool) (*procs.Process, func(procs.Status), error) {
		argv := req.GetArgv()
		if req.GetScript() != "" {
			argv = []string{"sh", "-c", req.GetScript()}
		}
		if len(argv) == 0 {
			return nil, nil, ErrInvalid
		}
		mu.Lock()
		launches++
		mu.Unlock()
		p, err := reaper.Start(procs.Spec{Path: "/bin/" + argv[0], Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/",
			Files: files, Terminal: terminal})
		return p, func(procs.Status) {}, err
	}
	r, err := NewRegistry(Options{Launch: launch, MaxProcesses: max, BufferBytes: buffer})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func output(t *testing.T, p *Process, from uint64) (stdout, stderr string, gaps []Event, exit *Info) {
	t.Helper()
	var o, e strings.Builder
	err := p.Attach(context.Background(), from, func(ev Event) error {
		switch {
		case ev.Output != nil && ev.Output.Stream == Stderr:
			e.Write(ev.Output.Data)
		case ev.Output != nil:
			o.Write(ev.Output.Data)
		case ev.Exit != nil:
			exit = ev.Exit
		default:
			gaps = append(gaps, ev)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), gaps, exit
}

func TestStartAttachWait(t *testing.T) {
	leakcheck.Check(t)
	r := newRegistry(t, 4, 1<<20)
	ctx := context.Background()
	p, existing, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Script: "echo out; echo err >&2; echo out2", Tag: "t"})
	if err != nil || existing {
		t.Fatal(err, existing)
	}
	if ok, err := p.Wait(ctx, 0); !ok || err != nil {
		t.Fatal(ok, err)
	}
	stdout, stderr, gaps, exit := output(t, p, 0)
	if stdout != "out\nout2\n" || stderr != "err\n" || len(gaps) != 0 || exit == nil || exit.Status.ExitCode != 0 {
		t.Fatalf("stdout %q stderr %q gaps %v exit %+v", stdout, stderr, gaps, exit)
	}
	if err := p.Attach(ctx, 100, func(Event) error { return nil }); !errors.Is(err, ErrFutureOffset) {
		t.Fatalf("attach past the end: %v", err)
	}
	if err := p.WriteStdin(ctx, []byte("x"), false); !errors.Is(err, ErrExited) {
		t.Fatalf("stdin after the end: %v", err)
	}
	if err := p.Signal(15, false); !errors.Is(err, ErrExited) {
		t.Fatalf("signal after the end: %v", err)
	}
	if l := r.List(); len(l) != 1 || !l[0].Ended || l[0].Tag != "t" {
		t.Fatalf("list: %+v", l)
	}
}

func TestDroppedOutput(t *testing.T) {
	leakcheck.Check(t)
	r := newRegistry(t, 4, 10)
	ctx := context.Background()
	p, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Script: "printf 0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait(ctx, 0)
	stdout, _, gaps, _ := output(t, p, 2)
	if stdout != "6789abcdef" || len(gaps) != 1 || gaps[0].Dropped.From != 2 || gaps[0].Dropped.To != 6 {
		t.Fatalf("stdout %q gaps %+v", stdout, gaps)
	}
}

func TestStdinAndSignal(t *testing.T) {
	leakcheck.Check(t)
	r := newRegistry(t, 4, 1<<20)
	ctx := context.Background()
	p, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, []byte("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, []byte("more"), false); !errors.Is(err, ErrStdinClosed) && !errors.Is(err, ErrExited) {
		t.Fatalf("stdin after eof: %v", err)
	}
	p.Wait(ctx, 0)
	if stdout, _, _, exit := output(t, p, 0); stdout != "hello\n" || exit.Status.ExitCode != 0 {
		t.Fatalf("cat: %q %+v", stdout, exit)
	}

	p, _, err = r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(0, false); !errors.Is(err, ErrInvalid) {
		t.Fatalf("signal 0: %v", err)
	}
	if ok, _ := p.Wait(ctx, time.Millisecond); ok {
		t.Fatal("sleep ended by itself")
	}
	if err := p.Signal(9, true); err != nil {
		t.Fatal(err)
	}
	p.Wait(ctx, 0)
	if i := p.Info(); !i.Ended || i.Status.Signal != 9 {
		t.Fatalf("after SIGKILL: %+v", i)
	}
}

func TestLimitAndIdempotency(t *testing.T) {
	leakcheck.Check(t)
	r := newRegistry(t, 2, 1<<20)
	ctx := context.Background()
	req := &sandboxv1.StartProcessRequest{Argv: []string{"sleep", "100"}, IdempotencyKey: "k"}
	a, existing, err := r.Start(ctx, req)
	if err != nil || existing {
		t.Fatal(err, existing)
	}
	b, existing, err := r.Start(ctx, req)
	if err != nil || !existing || b != a {
		t.Fatalf("retry: %v %v %v", b, existing, err)
	}
	if _, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"sleep", "99"}, IdempotencyKey: "k"}); !errors.Is(err, ErrKeyReused) {
		t.Fatalf("the key with another request: %v", err)
	}
	c, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"sleep", "100"}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := r.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	for _, p := range []*Process{a, c} {
		p.Signal(9, true)
		p.Wait(ctx, 0)
	}
	// Exited ones beyond the limit are forgotten, the oldest first, with their keys.
	for range 2 {
		p, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		p.Wait(ctx, 0)
	}
	if _, err := r.Get(a.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the oldest exited process is still there: %v", err)
	}
	if l := r.List(); len(l) != 2 {
		t.Fatalf("%d listed, want 2", len(l))
	}
	if p, existing, err := r.Start(ctx, req); err != nil || existing {
		t.Fatalf("the forgotten key: %v %v", existing, err)
	} else {
		p.Signal(9, true)
		p.Wait(ctx, 0)
	}
}

func TestTerminal(t *testing.T) {
	leakcheck.Check(t)
	r := newRegistry(t, 2, 1<<20)
	ctx := context.Background()
	p, _, err := r.Start(ctx, &sandboxv1.StartProcessRequest{Script: "stty size; read l; stty size",
		Pty: &sandboxv1.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Skipf("no terminal here: %v", err)
	}
	if err := p.Resize(&sandboxv1.TerminalSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(&sandboxv1.TerminalSize{Rows: 0, Cols: 100}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("0 rows: %v", err)
	}
	if err := p.WriteStdin(ctx, []byte("x\n"), false); err != nil {
		t.Fatal(err)
	}
	p.Wait(ctx, 0)
	stdout, _, _, _ := output(t, p, 0)
	if !strings.HasSuffix(stdout, "30 100\r\n") {
		t.Fatalf("stty size after a resize printed %q", stdout)
	}
}

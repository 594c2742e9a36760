package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// pingServer prints a known preamble, then serves TCP on loopback inside the sandbox: it
// answers each connection's message with "pong <message>" and logs it to stdout and stderr.
const pingServer = `
import socket, sys
for i in range(2000):
    sys.stdout.write("line %05d\n" % i)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    m = c.recv(100).decode()
    c.sendall(("pong " + m).encode())
    c.close()
    print("served " + m, flush=True)
    print("log " + m, file=sys.stderr, flush=True)
`

const pingClient = `python3 -c '
import socket, sys
c = socket.create_connection(("127.0.0.1", 8765))
c.sendall(sys.argv[1].encode())
print(c.recv(100).decode())
' `

// TestProcessOutlivesConnection: a server started as a process keeps serving after the call
// that started it and its connection are gone; another connection re-attaches from offset 0
// and gets its whole output, stdout and stderr apart and in order.
func TestProcessOutlivesConnection(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)

	first := dialAgain(t, b)
	p := mustStart(t, ctx, first, client.ProcessSpec{Argv: []string{"python3", "-c", pingServer}, Tag: "ping-server"})
	if !p.Info.Running || p.Info.Tag != "ping-server" || p.Info.Pid <= 1 {
		t.Fatalf("started: %+v", p.Info)
	}
	f := follow(t, ctx, p, 0)
	f.untilStdout(t, "listening\n")
	f.o.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := dialAgain(t, b)
	for _, m := range []string{"ping1", "ping2"} {
		if got := sandboxtest.Sh(t, ctx, second, pingClient+m); got != "pong "+m+"\n" {
			t.Fatalf("the server answered %q to %s", got, m)
		}
	}
	var want strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&want, "line %05d\n", i)
	}
	want.WriteString("listening\nserved ping1\nserved ping2\n")
	again := follow(t, ctx, second.Process(p.ID()), 0)
	again.until(t, "both requests in the output", func(a *attached) bool {
		return a.stdout.Len() >= want.Len() && a.stderr.String() == "log ping1\nlog ping2\n"
	})
	if got := again.stdout.String(); got != want.String() {
		t.Fatalf("stdout from offset 0 on a new connection: %d bytes, want %d; tail %q", len(got), want.Len(), got[max(0, len(got)-80):])
	}
	if len(again.dropped) != 0 {
		t.Fatalf("dropped %+v, want nothing", again.dropped)
	}

	l, err := second.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 1 || l[0].ID != p.ID() || !l[0].Running || l[0].Tag != "ping-server" || l[0].Argv[0] != "python3" ||
		l[0].OutputEnd != uint64(want.Len()+len("log ping1\nlog ping2\n")) || l[0].Started.IsZero() {
		t.Fatalf("ListProcesses: %+v", l)
	}
	if err := second.Process(p.ID()).Signal(ctx, syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	info, err := second.Process(p.ID()).Wait(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Running || info.Signal != "SIGTERM" || info.ExitCode != 128+15 || info.Ended.Before(info.Started) {
		t.Fatalf("after SIGTERM: %+v", info)
	}
}

// TestProcessAttachReportsDroppedBytes: an offset older than the buffer (1 MiB by default)
// reports exactly which bytes are lost, then the rest of the output, byte for byte.
func TestProcessAttachReportsDroppedBytes(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)
	c := b.Client
	var want bytes.Buffer
	for i := 1; i <= 400000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	const buffer = 1 << 20
	total := uint64(want.Len())
	p := mustStart(t, ctx, c, client.ProcessSpec{Argv: []string{"seq", "1", "400000"}})
	if info, err := p.Wait(ctx, 0); err != nil || info.Running || info.ExitCode != 0 || info.OutputEnd != total ||
		info.OutputStart != total-buffer {
		t.Fatalf("seq: %+v, %v; want exit 0 and output [%d, %d)", info, err, total-buffer, total)
	}
	for _, from := range []uint64{0, 100, total - buffer - 1} {
		a := attachAll(t, ctx, p, from)
		if len(a.dropped) != 1 || a.dropped[0].Dropped != total-buffer-from || a.dropped[0].Offset != total-buffer {
			t.Fatalf("attach from %d: dropped %+v, want exactly %d bytes up to %d", from, a.dropped, total-buffer-from, total-buffer)
		}
		if !bytes.Equal(a.stdout.Bytes(), want.Bytes()[total-buffer:]) || a.stderr.Len() != 0 {
			t.Fatalf("attach from %d: %d bytes after the gap, want the last %d of seq's output", from, a.stdout.Len(), buffer)
		}
		if a.exit.ExitCode != 0 || a.exit.OutputEnd != total {
			t.Fatalf("attach from %d: exit %+v", from, a.exit)
		}
	}
	// From within the buffer: no gap.
	a := attachAll(t, ctx, p, total-10)
	if len(a.dropped) != 0 || !bytes.Equal(a.stdout.Bytes(), want.Bytes()[total-10:]) {
		t.Fatalf("attach from %d: dropped %+v, output %q", total-10, a.dropped, a.stdout.String())
	}
}

// TestProcessStartIdempotentAcrossCut: a StartProcess whose connection is cut after the
// sandbox handled it, retried with the same key on a new connection, returns the process the
// first call started; the sandbox runs one.
func TestProcessStartIdempotentAcrossCut(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	proxy := newCutProxy(t, b.DataAddr)
	cut, err := client.Dial(proxy.addr, b.SandboxKey, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	if _, err := cut.ListProcesses(ctx); err != nil { // the connection is up and idle
		t.Fatal(err)
	}
	spec := client.ProcessSpec{Script: "echo started; exec sleep 1000", Tag: "once", IdempotencyKey: "key-1"}
	proxy.arm()
	if p, err := cut.StartProcess(ctx, spec); err == nil {
		t.Fatalf("StartProcess through the cut connection returned %+v; want it cut", p.Info)
	}
	if proxy.cutCount() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.cutCount())
	}

	c := b.Client
	p, err := c.StartProcess(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Existing {
		t.Fatalf("the retry started a new process %+v: want the cut call's", p.Info)
	}
	again, err := c.StartProcess(ctx, spec)
	if err != nil || again.ID() != p.ID() || !again.Existing {
		t.Fatalf("a second retry: %+v, %v; want %s again", again, err, p.ID())
	}
	l, err := c.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 1 || l[0].ID != p.ID() || !l[0].Running {
		t.Fatalf("ListProcesses after the retries: %+v, want the one process", l)
	}
	if n := strings.Count(sandboxtest.Sh(t, ctx, c, "ps -eo args"), "sleep 1000"); n != 1 {
		t.Fatalf("%d sleep processes in the sandbox, want 1", n)
	}
	other := spec
	other.Script = "exec sleep 999"
	_, err = c.StartProcess(ctx, other)
	wantCode(t, "the key with a different request", err, codes.FailedPrecondition)
	kill(t, ctx, p)
	waitNoLeftovers(t, ctx, c)
}

// TestProcessREPL: a REPL on pipes, driven through WriteStdin, answers expression after
// expression, and ends at end of input.
func TestProcessREPL(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	p := mustStart(t, ctx, c, client.ProcessSpec{Argv: []string{"python3", "-i", "-q", "-u"}, Tag: "repl"})
	f := follow(t, ctx, p, 0)
	for _, step := range []struct{ in, out string }{
		{"1+2\n", "3\n"},
		{"x = 6 * 7\n", ""},
		{"x\n", "42\n"},
		{"'ab' * 3\n", "'ababab'\n"},
		{"import sys; print('to stderr', file=sys.stderr)\n", ""},
		{"[i*i for i in range(5)]\n", "[0, 1, 4, 9, 16]\n"},
	} {
		before := f.stdout.String()
		if err := p.WriteStdin(ctx, []byte(step.in)); err != nil {
			t.Fatal(err)
		}
		if step.out != "" {
			f.until(t, "the answer to "+step.in, func(a *attached) bool { return a.stdout.String() == before+step.out })
		}
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := p.Wait(ctx, 0)
	if err != nil || info.Running || info.ExitCode != 0 {
		t.Fatalf("python after end of input: %+v, %v", info, err)
	}
	f.until(t, "the exit event", func(a *attached) bool { return a.exit != nil })
	if !strings.Contains(f.stderr.String(), "to stderr\n") || !strings.Contains(f.stderr.String(), ">>> ") {
		t.Fatalf("stderr %q: want the prompts and the line written to it", f.stderr.String())
	}
	err = p.WriteStdin(ctx, []byte("1\n"))
	wantCode(t, "stdin to an exited process", err, codes.FailedPrecondition)
}

// TestProcessTerminal: a process on a terminal sees its size and its changes, and output
// through the terminal arrives byte for byte. Under the production template's limits and
// user (commands apart from the server).
func TestProcessTerminal(t *testing.T) {
	b := sandboxtest.StartBound(t, defaultBundle())
	ctx := testenv.Context(t, 3*time.Minute)
	c := b.Client

	t.Run("stty size after a resize", func(t *testing.T) {
		p := mustStart(t, ctx, c, client.ProcessSpec{Script: "tty; stty size; read l; stty size",
			PTY: &client.TerminalSize{Rows: 24, Cols: 80}})
		f := follow(t, ctx, p, 0)
		f.untilStdout(t, "24 80\r\n")
		if !strings.HasPrefix(f.stdout.String(), "/dev/pts/") {
			t.Errorf("tty printed %q, want a /dev/pts terminal", f.stdout.String())
		}
		if err := p.Resize(ctx, client.TerminalSize{Rows: 50, Cols: 132}); err != nil {
			t.Fatal(err)
		}
		if err := p.WriteStdin(ctx, []byte("go\n")); err != nil {
			t.Fatal(err)
		}
		f.untilStdout(t, "50 132\r\n")
		if info, err := p.Wait(ctx, 0); err != nil || info.ExitCode != 0 || !info.PTY {
			t.Fatalf("after stty size: %+v, %v", info, err)
		}
	})

	t.Run("1 MiB intact", func(t *testing.T) {
		blob := make([]byte, 1<<20)
		rand.Read(blob)
		if err := c.WriteFile(ctx, "blob", blob, 0o644); err != nil {
			t.Fatal(err)
		}
		// The terminal's output processing would turn "\n" into "\r\n" (onlcr) and more:
		// `stty raw` turns all of it off (-opost) before cat writes a byte, and -echo keeps
		// nothing of the input in the output. Nothing else writes to the terminal.
		p := mustStart(t, ctx, c, client.ProcessSpec{Script: "stty raw -echo && exec cat blob",
			PTY: &client.TerminalSize{Rows: 24, Cols: 80}})
		a := attachAll(t, ctx, p, 0)
		if a.exit.ExitCode != 0 || len(a.dropped) != 0 || a.stderr.Len() != 0 {
			t.Fatalf("cat through the terminal: exit %+v, dropped %+v, stderr %d bytes", a.exit, a.dropped, a.stderr.Len())
		}
		if !bytes.Equal(a.stdout.Bytes(), blob) {
			got := a.stdout.Bytes()
			i := 0
			for i < min(len(got), len(blob)) && got[i] == blob[i] {
				i++
			}
			t.Fatalf("%d bytes through the terminal, want the %d written; they differ from byte %d", len(got), len(blob), i)
		}
	})

	t.Run("interactive shell", func(t *testing.T) {
		p := mustStart(t, ctx, c, client.ProcessSpec{Argv: []string{"bash", "--norc", "--noprofile", "-i"},
			Env: map[string]string{"PS1": "ready> "}, PTY: &client.TerminalSize{Rows: 24, Cols: 80}})
		f := follow(t, ctx, p, 0)
		if err := p.WriteStdin(ctx, []byte("echo $((6*7)) $(tty)\n")); err != nil {
			t.Fatal(err)
		}
		// The prompt after the answer: bash is reading its next line (readline has the
		// terminal, so a Ctrl-D now is a key it reads, not end of input for a line being run).
		f.until(t, "the answer and the next prompt", func(a *attached) bool {
			out := a.stdout.String()
			i := strings.Index(out, "42 /dev/pts/")
			return i >= 0 && strings.HasSuffix(out[i:], "ready> ")
		})
		if err := p.CloseStdin(ctx); err != nil { // Ctrl-D at the prompt: bash exits
			t.Fatal(err)
		}
		if info, err := p.Wait(ctx, 0); err != nil || info.Running || info.ExitCode != 0 {
			t.Fatalf("bash after Ctrl-D: %+v, %v", info, err)
		}
	})
}

// TestProcessSignalEndsTree: a signal to the group ends a process and its children; Wait
// reports how.
func TestProcessSignalEndsTree(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	p := mustStart(t, ctx, c, client.ProcessSpec{Script: "sleep 1000 & sleep 1001 & echo started; wait"})
	f := follow(t, ctx, p, 0)
	f.untilStdout(t, "started\n")
	sandboxtest.Eventually(t, 30*time.Second, "both children running sleep", func() (bool, string) {
		l := leftovers(t, ctx, c)
		return len(l) == 2, strings.Join(l, "; ")
	})
	if info, err := p.Wait(ctx, time.Millisecond); err != nil || !info.Running {
		t.Fatalf("Wait with a short timeout on a running process: %+v, %v; want still running", info, err)
	}
	if err := p.Signal(ctx, syscall.SIGTERM, true); err != nil {
		t.Fatal(err)
	}
	info, err := p.Wait(ctx, 0)
	if err != nil || info.Running || info.Signal != "SIGTERM" || info.ExitCode != 143 {
		t.Fatalf("after SIGTERM to the group: %+v, %v", info, err)
	}
	waitNoLeftovers(t, ctx, c)
	err = p.Signal(ctx, syscall.SIGTERM, true)
	wantCode(t, "a signal to an exited process", err, codes.FailedPrecondition)
}

// TestProcessBadInputAndLimits: each kind of bad request fails with its own code, the limit
// of running processes fails at once rather than waiting, and once everything has ended no
// process runs and the server's goroutines are back to where they were.
func TestProcessBadInputAndLimits(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{ServerArgs: []string{"-max-processes=3"}})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	rpc := c.ProcessesRPC()
	baseline := goroutines(t, ctx, c)

	unknown := c.Process("p999")
	_, err := unknown.Wait(ctx, 0)
	wantCode(t, "Wait of an unknown id", err, codes.NotFound)
	wantCode(t, "WriteStdin to an unknown id", unknown.WriteStdin(ctx, []byte("x")), codes.NotFound)
	wantCode(t, "Signal to an unknown id", unknown.Signal(ctx, syscall.SIGTERM, false), codes.NotFound)
	wantCode(t, "Resize of an unknown id", unknown.Resize(ctx, client.TerminalSize{Rows: 1, Cols: 1}), codes.NotFound)
	if o, err := unknown.Attach(ctx, 0); err == nil {
		_, err = o.Recv()
		wantCode(t, "Attach to an unknown id", err, codes.NotFound)
	} else {
		wantCode(t, "Attach to an unknown id", err, codes.NotFound)
	}

	_, err = c.StartProcess(ctx, client.ProcessSpec{})
	wantCode(t, "neither argv nor script", err, codes.InvalidArgument)
	_, err = c.StartProcess(ctx, client.ProcessSpec{Argv: []string{"true"}, PTY: &client.TerminalSize{Rows: 0, Cols: 80}})
	wantCode(t, "a terminal of 0 rows", err, codes.InvalidArgument)
	_, err = c.StartProcess(ctx, client.ProcessSpec{Argv: []string{"no-such-program"}})
	wantCode(t, "a program that does not exist", err, codes.NotFound)

	var running []*client.Process
	for i := range 3 {
		running = append(running, mustStart(t, ctx, c, client.ProcessSpec{Argv: []string{"sleep", "1000"}, Tag: fmt.Sprint(i)}))
	}
	_, err = c.StartProcess(ctx, client.ProcessSpec{Argv: []string{"sleep", "1000"}})
	wantCode(t, "a fourth process with -max-processes=3", err, codes.ResourceExhausted)

	p := running[0]
	for _, sig := range []int32{0, -1, 65, 1000} {
		_, err := rpc.Signal(ctx, &sandboxv1.SignalRequest{Id: p.ID(), Signal: sig})
		wantCode(t, fmt.Sprintf("signal %d", sig), err, codes.InvalidArgument)
	}
	o, err := p.Attach(ctx, 1<<40)
	if err == nil {
		_, err = o.Recv()
	}
	wantCode(t, "an attach offset in the future", err, codes.OutOfRange, codes.InvalidArgument)
	wantCode(t, "Resize without a terminal", p.Resize(ctx, client.TerminalSize{Rows: 10, Cols: 10}), codes.FailedPrecondition)
	_, err = rpc.Wait(ctx, &sandboxv1.WaitRequest{Id: p.ID(), Timeout: &durationpb.Duration{Seconds: -1}})
	wantCode(t, "a negative wait timeout", err, codes.InvalidArgument)

	// A follower of a running process, and a Wait, end with their calls.
	f := follow(t, ctx, p, 0)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = p.Wait(wctx, 0)
	cancel()
	wantCode(t, "a Wait whose deadline passes", err, codes.DeadlineExceeded)
	f.o.Close()

	for _, p := range running {
		kill(t, ctx, p)
	}
	wantCode(t, "stdin to an exited process", p.WriteStdin(ctx, []byte("x")), codes.FailedPrecondition)
	wantCode(t, "end of input to an exited process", p.CloseStdin(ctx), codes.FailedPrecondition)
	// The limit counts running processes only: there is room again.
	kill(t, ctx, mustStart(t, ctx, c, client.ProcessSpec{Argv: []string{"sleep", "1000"}}))

	l, err := c.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) > 3 {
		t.Errorf("%d processes listed, want at most 3 exited ones kept", len(l))
	}
	for _, i := range l {
		if i.Running || i.Signal != "SIGKILL" {
			t.Errorf("after the kills: %+v", i)
		}
	}
	waitNoLeftovers(t, ctx, c)
	sandboxtest.Eventually(t, 30*time.Second, "the server's goroutines back to the baseline", func() (bool, string) {
		n := goroutines(t, ctx, c)
		return n <= baseline, fmt.Sprintf("%d goroutines, %d at the start", n, baseline)
	})
}

// TestProcessTaskGroupState: a started script belongs to its task group as a one-shot
// command does: its exported variables and final directory count when it exits while its
// group is current, and are dropped when another group has started since.
func TestProcessTaskGroupState(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	sandboxtest.Sh(t, ctx, c, "mkdir -p sub")

	g := c.NewTaskGroup()
	p, err := g.StartProcess(ctx, client.ProcessSpec{Script: "export FROM_PROCESS=early; cd sub"})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := p.Wait(ctx, 0); err != nil || info.ExitCode != 0 || info.TaskGroup != g.ID() {
		t.Fatalf("%+v, %v", info, err)
	}
	if got := sandboxtest.Sh(t, ctx, c, "echo $FROM_PROCESS; pwd"); got != "early\n/workspace/sub\n" {
		t.Fatalf("the next group sees %q, want the process's variable and directory", got)
	}

	late := mustStart(t, ctx, c, client.ProcessSpec{Script: "read l; export LATE=1"})
	sandboxtest.Sh(t, ctx, c, "true") // another group starts: the process's group is committed
	if err := late.WriteStdin(ctx, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if info, err := late.Wait(ctx, 0); err != nil || info.ExitCode != 0 {
		t.Fatalf("%+v, %v", info, err)
	}
	if got := sandboxtest.Sh(t, ctx, c, "echo ${LATE:-unset}"); got != "unset\n" {
		t.Fatalf("a change of a process that ended after its group: %q, want it dropped", got)
	}
}

package adversarial

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// resourceAttacks use up what a sandbox is given (processes, memory, disk, inodes, open
// files, connections, output) and more. Each must fail inside the sandbox, or end with the
// sandbox alone harmed: the manager and the bystander serve on.
func resourceAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "resources")
	ctx := g.ctx
	allowed := newLoopbackServer(t, "tcp4", "127.0.0.1:0", "allowed")
	r := s.allocate(t, ctx, allowed.hostPort())
	c := r.C
	tmpl, err := limits.Template()
	if err != nil {
		t.Fatal(err)
	}

	g.attack("a fork bomb", "bomb() { bomb | bomb & }; bomb, stopped by the command's 8 s timeout", func(t *testing.T) verdict {
		res := run(t, ctx, c, client.Command{Script: "bomb() { bomb | bomb & }; bomb; sleep 5", Timeout: 8 * time.Second})
		detail := fmt.Sprintf("exit %d, timed out %v, stderr %.120q", res.ExitCode, res.TimedOut, res.Stderr)
		return s.containedOr(ctx, detail, r)
	})
	g.attack("processes past the limit", fmt.Sprintf("%d background processes (the limit is %d)", 2*runscalloc.DefaultProcessLimit+100, runscalloc.DefaultProcessLimit), func(t *testing.T) verdict {
		defer run(t, ctx, c, client.Command{Script: "pkill sleep; true"})
		// dash, which reports a failed fork at once (bash retries it, backing off).
		res := run(t, ctx, c, client.Command{Argv: []string{"sh", "-c", fmt.Sprintf(
			"i=0; while [ $i -lt %d ]; do sleep 600 & i=$((i+1)); done; echo started $i", 2*runscalloc.DefaultProcessLimit+100)},
			Timeout: time.Minute})
		if res.ExitCode == 0 {
			return escapedf("exit 0: %s", res.Stdout)
		}
		if !strings.Contains(string(res.Stderr), "fork") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want a failed fork", res.ExitCode, res.Stdout, res.Stderr)
		}
		return refusedf("exit %d: %.100s", res.ExitCode, res.Stderr)
	})
	g.attack("threads past the limit", "start threads until one fails (at most 5000)", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
import threading, time
ev = threading.Event()
n = 0
try:
    while n < 5000:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
    report(True, "started %d threads" % n)
except RuntimeError as e:
    report(False, "after %d threads: %s" % (n, e))
ev.set()
`)
	})
	for _, fs := range []struct {
		dir  string
		size int64
	}{{"/workspace", tmpl.Bundle.WorkspaceSizeBytes}, {"/tmp", tmpl.Bundle.TmpSizeBytes}} {
		g.attack("fill "+fs.dir, fmt.Sprintf("write %d MiB into %s (its cap is %d MiB)", 2*fs.size>>20, fs.dir, fs.size>>20), func(t *testing.T) verdict {
			return shell(t, ctx, c, fmt.Sprintf("head -c %d /dev/zero > %s/fill", 2*fs.size, fs.dir), "No space left on device")
		})
	}
	g.attack("write through the API into a full workspace", "WriteFile of 1 MiB with /workspace full", func(t *testing.T) verdict {
		err := c.WriteFile(ctx, "more", make([]byte, 1<<20), 0o644)
		if status.Code(err) != codes.ResourceExhausted {
			return escapedf("WriteFile into a full workspace: %v, want ResourceExhausted", err)
		}
		return refusedf("%.200v", err)
	})
	sandboxtest.Sh(t, ctx, c, "rm -f /workspace/fill /tmp/fill")
	g.attack("open files past the limit", "raise RLIMIT_NOFILE to its hard limit, then open /dev/null until it fails", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = []
try:
    while len(fds) <= hard:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    report(True, "opened %d files, past the hard limit %d" % (len(fds), hard))
except OSError as e:
    report(False, "after %d files (hard limit %d): %s" % (len(fds), hard, errno.errorcode.get(e.errno, str(e.errno))))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))
    print("ESCAPED raised the hard limit past %d" % hard)
except (ValueError, OSError):
    pass
`)
	})
	g.attack("flood the output", "write 256 MiB to standard output", func(t *testing.T) verdict {
		res := run(t, ctx, c, client.Command{Script: "head -c 268435456 /dev/zero", Timeout: 2 * time.Minute})
		if !res.Truncated || len(res.Stdout) >= 256<<20 {
			return escapedf("got %d bytes, truncated %v", len(res.Stdout), res.Truncated)
		}
		return refusedf("output capped at %d bytes", len(res.Stdout))
	})
	g.attack("many idle data-plane connections", "hold 500 connections to the data socket open without a byte, then connect as the agent", func(t *testing.T) verdict {
		path := strings.TrimPrefix(r.Endpoint, "unix://")
		var conns []net.Conn
		defer func() {
			for _, cn := range conns {
				cn.Close()
			}
		}()
		for range 500 {
			cn, err := net.Dial("unix", path)
			if err != nil {
				break
			}
			conns = append(conns, cn)
		}
		fresh, err := client.Dial(r.Endpoint, r.SandboxKey, r.Key)
		if err != nil {
			return escapedf("with %d idle connections the agent cannot connect: %v", len(conns), err)
		}
		defer fresh.Close()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if res, err := fresh.Exec(cctx, client.Command{Script: "echo alive"}); err != nil || string(res.Stdout) != "alive\n" {
			return escapedf("with %d idle connections a new agent connection does not serve: %v", len(conns), err)
		}
		return s.containedOr(ctx, fmt.Sprintf("%d idle connections held; a new agent connection served", len(conns)), r)
	})
	g.attack("many connections through the relay", "hold 1000 connections to the egress relay from inside, then reach the allowed server", func(t *testing.T) verdict {
		res := run(t, ctx, c, client.Command{Argv: []string{"python3", "-c", `import socket, subprocess, sys
conns = []
try:
    for i in range(1000):
        conns.append(socket.create_connection(("127.0.0.1", 3128), timeout=10))
except OSError as e:
    print("stopped at %d: %s" % (len(conns), e))
out = subprocess.run(["curl", "-sS", "--max-time", "20", sys.argv[1]], capture_output=True, text=True)
print("held %d, curl: %s %s" % (len(conns), out.stdout, out.stderr.strip()))
`, "http://" + allowed.hostPort() + "/"}, Timeout: 2 * time.Minute})
		if res.ExitCode != 0 {
			t.Fatalf("connection flood: exit %d, %q, %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		out := strings.TrimSpace(string(res.Stdout))
		if strings.Contains(out, "the most it may") {
			if err := s.unharmed(ctx, r); err != nil {
				return escapedf("%s; then: %v", out, err)
			}
			return refusedf("%s", out)
		}
		return s.containedOr(ctx, out, r)
	})

	// What may take the sandbox down runs in sandboxes of its own.
	for _, a := range []struct{ name, tried, program string }{
		{"memory past the limit", fmt.Sprintf("allocate and touch 1 GiB in one process (the sandbox has %d MiB)", limits.MemoryBytes>>20), `
try:
    b = bytearray(b"x") * (1 << 30)
    report(True, "allocated %d bytes" % len(b))
except MemoryError:
    report(False, "MemoryError")
`},
		{"a memfd past the limit", fmt.Sprintf("write 1 GiB into a memfd (the sandbox has %d MiB)", limits.MemoryBytes>>20), `
fd = os.memfd_create("fill")
chunk = b"x" * (1 << 20)
n = 0
try:
    while n < 1024:
        os.write(fd, chunk)
        n += 1
    report(True, "wrote %d MiB" % n)
except OSError as e:
    report(False, "after %d MiB: %s" % (n, errno.errorcode.get(e.errno, str(e.errno))))
`},
		{"SysV shared memory past the limit", fmt.Sprintf("shmget and fill a 1 GiB SysV segment (the sandbox has %d MiB)", limits.MemoryBytes>>20), `
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
size = 1 << 30
shm = libc.shmget(0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
if shm < 0:
    report(False, "shmget: " + err())
    sys.exit(0)
addr = libc.shmat(shm, None, 0)
if addr is None or addr == ctypes.c_void_p(-1).value:
    report(False, "shmat: " + err())
    sys.exit(0)
n = 0
while n < size >> 20:
    ctypes.memset(addr + (n << 20), 1, 1 << 20)
    n += 1
report(True, "filled %d MiB of a SysV segment" % n)
`},
		{"inodes", "create 200,000 empty files in /workspace", `
n = 0
try:
    os.mkdir("/workspace/inodes")
    while n < 200000:
        os.close(os.open("/workspace/inodes/%d" % n, os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
    print("CREATED %d files" % n)
except OSError as e:
    report(False, "after %d files: %s" % (n, errno.errorcode.get(e.errno, str(e.errno))))
`},
	} {
		g.attack(a.name, a.tried, func(t *testing.T) verdict {
			m := s.allocate(t, ctx)
			return s.alone(t, ctx, m, a.program)
		})
	}
	if err := s.unharmed(ctx, r); err != nil {
		t.Errorf("after the resource attacks: %v", err)
	}
}

// alone runs a Python attack (pyPrelude and program) in m, a sandbox of its own, and judges
// it: refused if the program reports a refusal and m serves on; contained if it ran (or
// took m down) and the manager and the bystander serve on; a success if it reports one.
func (s *suite) alone(t *testing.T, ctx context.Context, m *lease, program string) verdict {
	t.Helper()
	start := time.Now()
	res, err := m.C.Exec(ctx, client.Command{Argv: []string{"python3", "-c", pyPrelude + program}, Timeout: 3 * time.Minute})
	took := time.Since(start).Round(time.Second)
	if err != nil {
		// Not asserted: how soon the manager notices a sandbox that ended.
		var listed string
		for range 20 {
			units, lerr := s.list(ctx)
			listed = fmt.Sprintf("%v %q (%v)", units[m.ID].GetState(), units[m.ID].GetError(), lerr)
			if units[m.ID].GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		return s.containedOr(ctx, fmt.Sprintf("the sandbox ended after %v (%v); the manager lists it %s", took, err, listed))
	}
	out := strings.TrimSpace(string(res.Stdout))
	switch {
	case strings.Contains(out, "ESCAPED"):
		return escapedf("%s", out)
	case strings.HasPrefix(out, "REFUSED"):
		if err := serves(ctx, m); err != nil {
			return escapedf("%s, but then %v", out, err)
		}
		return refusedf("%s, in %v", out, took)
	case strings.HasPrefix(out, "CREATED"), res.ExitCode != 0:
		return s.containedOr(ctx, fmt.Sprintf("output %q in %v (exit %d, signal %q, stderr %.200q)", out, took, res.ExitCode, res.Signal, res.Stderr), m)
	}
	t.Fatalf("attack: exit %d, stdout %q, stderr %q", res.ExitCode, out, res.Stderr)
	return verdict{}
}

package managere2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// A manager killed with SIGKILL does not interrupt the sandbox bound through it; the next
// `fusebox local up` on the same state directory adopts it (its lease token, labels and
// egress allowlist survive), destroys the previous manager's warm pool and a bound sandbox
// whose lease ended while no manager ran, and builds its own pool; a SIGTERM then leaves
// nothing but bound sandboxes, and here none.
func TestManagerKilledWhileBound(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 10*time.Minute)
	mc := dialManager(t, e.Addr)
	web := newLoopbackServer(t, "egress ok")
	egressOK := func(sb *client.Sandbox) curlResult {
		return curl(t, ctx, sb, "env -u NO_PROXY -u no_proxy", "", "http://"+web.hostPort()+"/")
	}

	first := e.startLocalUp(t, "manager-1", "--pool-size", "2")
	e.waitServing(t, first, mc)
	waitPoolSettled(t, ctx, mc, 2)
	key := sandboxtest.NewKey(t)
	resp, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(),
		LeaseTtl: durationpb.New(10 * time.Minute), Egress: []string{web.hostPort()}, Labels: map[string]string{"session": "s-1"}})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	id, token := resp.GetSandboxId(), resp.GetLeaseToken()
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if out := sandboxtest.Sh(t, ctx, sb, "echo before > /workspace/state; cat /workspace/state"); out != "before\n" {
		t.Fatalf("exec before the kill: %q", out)
	}
	if r := egressOK(sb); r.code != "200" || r.body != "egress ok" {
		t.Fatalf("egress before the kill: %+v", r)
	}
	// A second sandbox whose short lease will end while no manager runs.
	short, _ := rawAllocate(t, ctx, mc, sandboxtest.NewKey(t), 5*time.Second)
	shortID := short.GetSandboxId()
	units := waitPoolSettled(t, ctx, mc, 2)
	oldReady := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)
	if got, want := e.containers(t), slices.Sorted(slices.Values(append([]string{id, shortID}, oldReady...))); !slices.Equal(got, want) {
		t.Fatalf("before the kill runsc lists %v, want the bound and ready units %v", got, want)
	}
	shortAlive := units[shortID].GetState() == managerv1.UnitState_UNIT_STATE_BOUND

	if code := first.signal(t, syscall.SIGKILL); code != -1 {
		t.Errorf("SIGKILLed manager exit code %d", code)
	}
	// The data path does not go through the manager.
	if out := sandboxtest.Sh(t, ctx, sb, "cat /workspace/state; echo during >> /workspace/state"); out != "before\n" {
		t.Errorf("exec with the manager dead: %q", out)
	}
	if !slices.Contains(e.containers(t), id) {
		t.Fatalf("the bound sandbox's container vanished with the manager")
	}
	// Egress fails closed while its proxy (in the manager) is gone.
	hits := web.hits.Load()
	if r := egressOK(sb); r.code == "200" || web.hits.Load() != hits || !strings.Contains(r.body, "egress proxy is not reachable") {
		t.Errorf("egress with the manager dead: %+v, server hits %d -> %d", r, hits, web.hits.Load())
	}
	if !shortAlive {
		t.Logf("the short lease of %s ended before the kill; its destruction at adoption is not exercised", shortID)
	}
	for !time.Now().After(short.GetLeaseExpires().AsTime()) {
		time.Sleep(100 * time.Millisecond)
	}

	second := e.startLocalUp(t, "manager-2", "--pool-size", "2")
	e.waitServing(t, second, mc)
	s := list(t, ctx, mc)[id]
	if s.GetState() != managerv1.UnitState_UNIT_STATE_BOUND || s.GetLabels()["session"] != "s-1" || !slices.Equal(s.GetEgress(), []string{web.hostPort()}) {
		t.Errorf("after the restart List shows the bound sandbox as %v, want BOUND with its labels and egress", s)
	}
	if out := sandboxtest.Sh(t, ctx, sb, "cat /workspace/state"); out != "before\nduring\n" {
		t.Errorf("exec after the restart: %q", out)
	}
	if r := egressOK(sb); r.code != "200" || r.body != "egress ok" {
		t.Errorf("egress after the restart (allowlist re-bound at adoption): %+v", r)
	}
	if r, err := mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: token}); err != nil {
		t.Errorf("Renew with the original token after the restart: %v", err)
	} else if !r.GetLeaseExpires().AsTime().After(time.Now()) {
		t.Errorf("renewed lease expires at %v, in the past", r.GetLeaseExpires().AsTime())
	}
	for _, old := range append([]string{shortID}, oldReady...) {
		e.waitUnitGone(t, old)
	}
	if l := second.log(); !strings.Contains(l, "adopted bound sandbox") || !strings.Contains(l, id) {
		t.Errorf("the new manager did not log adopting %s:\n%s", id, l)
	}
	units = waitPoolSettled(t, ctx, mc, 2)
	newReady := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)
	for _, r := range newReady {
		if slices.Contains(oldReady, r) {
			t.Errorf("the new manager kept the previous manager's ready unit %s", r)
		}
	}
	want := slices.Sorted(slices.Values(append([]string{id}, newReady...)))
	if got := e.containers(t); !slices.Equal(got, want) {
		t.Errorf("after the restart runsc lists %v, want the bound unit and the new pool %v", got, want)
	}
	if got := e.sandboxDirs(t); !slices.Equal(got, want) {
		t.Errorf("after the restart the sandbox directories are %v, want %v", got, want)
	}
	if got := slices.Sorted(maps.Keys(units)); !slices.Equal(got, want) {
		t.Errorf("the new manager knows %v, want %v", got, want)
	}

	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: id, LeaseToken: token}); err != nil {
		t.Fatalf("Release after the restart: %v", err)
	}
	e.waitUnitGone(t, id)
	if code := second.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("manager exit code after SIGTERM: %d", code)
	}
	if got := e.containers(t); len(got) != 0 {
		t.Errorf("after a graceful exit runsc still lists %v", got)
	}
	if got := e.sandboxDirs(t); len(got) != 0 {
		t.Errorf("after a graceful exit sandbox directories remain: %v", got)
	}
}

// The process allocator refuses to start without --insecure-process-runtime; with it, it
// serves allocations and the manager logs a warning for each.
func TestProcessAllocatorNeedsInsecureFlag(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)

	refused := e.startLocalUp(t, "refused", "--allocator", "process", "--pool-size", "1")
	if code := refused.wait(t); code == 0 {
		t.Errorf("fusebox local up --allocator process without the flag exited 0:\n%s", refused.log())
	}
	if l := refused.log(); !strings.Contains(l, "--insecure-process-runtime") {
		t.Errorf("the refusal does not name --insecure-process-runtime:\n%s", l)
	}
	if _, err := os.Stat(e.Socket); err == nil {
		t.Errorf("the refused manager left a socket at %s", e.Socket)
	}

	p := e.startLocalUp(t, "insecure", "--allocator", "process", "--insecure-process-runtime", "--pool-size", "1")
	mc := dialManager(t, e.Addr)
	e.waitServing(t, p, mc)
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if out := sandboxtest.Sh(t, ctx, a.Sandbox, "echo hi"); out != "hi\n" {
		t.Errorf("echo hi: %q", out)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetAllocator() != "process" {
		t.Errorf("allocator %q, want process", ps.GetAllocator())
	}
	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
	l := p.log()
	if !strings.Contains(l, "INSECURE: the process runtime") {
		t.Errorf("no INSECURE warning at start:\n%s", l)
	}
	if n := strings.Count(l, "INSECURE: allocating a sandbox"); n != 1 {
		t.Errorf("%d INSECURE allocation warnings for 1 allocation:\n%s", n, l)
	}
	sandboxtest.Eventually(t, pollDeadline, "process sandboxes removed", func() (bool, string) {
		d := e.sandboxDirs(t)
		return len(d) == 0, strings.Join(d, " ")
	})
}

// runFusebox runs the CLI with args and returns its exit code, stdout and stderr.
func runFusebox(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, fuseboxCLI(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fusebox %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// `fusebox run` allocates, uploads, streams output, exits with the command's code and
// releases; `fusebox status` shows the pool.
func TestFuseboxRunAndStatus(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 10*time.Minute)
	mc := dialManager(t, e.Addr)
	p := e.startLocalUp(t, "manager", "--pool-size", "2")
	e.waitServing(t, p, mc)

	t.Run("exit code", func(t *testing.T) {
		for _, tc := range []struct {
			argv []string
			want int
		}{
			{[]string{"sh", "-c", "exit 7"}, 7},
			{[]string{"true"}, 0},
			{[]string{"false"}, 1},
		} {
			code, stdout, stderr := runFusebox(t, ctx, append([]string{"run", "--manager", e.Addr, "--"}, tc.argv...)...)
			if code != tc.want {
				t.Errorf("fusebox run -- %q exited %d, want %d\nstdout: %s\nstderr: %s", tc.argv, code, tc.want, stdout, stderr)
			}
		}
	})

	t.Run("upload", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "sub", "b.txt"), []byte("beta\n"), 0o644)
		code, stdout, stderr := runFusebox(t, ctx, "run", "--manager", e.Addr, "--upload", dir, "-q", "--",
			"sh", "-c", "cat a.txt sub/b.txt /workspace/a.txt; echo to-stderr >&2")
		if code != 0 || stdout != "alpha\nbeta\nalpha\n" {
			t.Errorf("fusebox run --upload: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		if !strings.Contains(stderr, "to-stderr") || strings.Contains(stdout, "to-stderr") {
			t.Errorf("the command's stderr is not on fusebox's stderr: stdout %q, stderr %q", stdout, stderr)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		code, stdout, stderr := runFusebox(t, ctx, "run", "--manager", e.Addr, "--timeout", "1s", "--", "sleep", "600")
		if code == 0 || !strings.Contains(stderr, "timed out") {
			t.Errorf("fusebox run --timeout 1s -- sleep 600: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})

	t.Run("streams", func(t *testing.T) {
		// The command prints a line and then sleeps far longer than the test waits: the line
		// can only arrive if output is streamed while the command runs.
		cmd := exec.CommandContext(ctx, fuseboxCLI(t), "run", "--manager", e.Addr, "-q", "--", "sh", "-c", "echo first; sleep 600; echo second")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		line := make(chan string, 1)
		go func() {
			l, _ := bufio.NewReader(out).ReadString('\n')
			line <- l
		}()
		select {
		case l := <-line:
			if l != "first\n" {
				t.Errorf("first line %q (stderr %q)", l, stderr.String())
			}
		case <-time.After(pollDeadline):
			t.Fatalf("no output while the command runs (stderr %q)", stderr.String())
		}
		// Interrupted, fusebox run releases its sandbox.
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err == nil {
			t.Errorf("interrupted fusebox run exited 0")
		}
	})

	// Every sandbox fusebox run used was released and destroyed.
	units := waitPoolSettled(t, ctx, mc, 2)
	if bound := idsIn(units, managerv1.UnitState_UNIT_STATE_BOUND); len(bound) != 0 {
		t.Errorf("sandboxes still bound after fusebox run exited: %v", bound)
	}
	ready := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)
	if got := e.containers(t); !slices.Equal(got, ready) {
		t.Errorf("runsc lists %v, want only the pool %v", got, ready)
	}

	t.Run("status", func(t *testing.T) {
		code, stdout, stderr := runFusebox(t, ctx, "status", "--manager", e.Addr)
		if code != 0 {
			t.Fatalf("fusebox status: exit %d, stderr %q", code, stderr)
		}
		for _, want := range []string{"allocator runsc, estimator fixed, target 2 ready", "ready 2,", "allocations 6 ", "SANDBOX", "STATE"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("fusebox status does not show %q:\n%s", want, stdout)
			}
		}
		for _, id := range ready {
			found := false
			for line := range strings.Lines(stdout) {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == id && f[1] == "ready" {
					found = true
				}
			}
			if !found {
				t.Errorf("fusebox status has no row for ready sandbox %s:\n%s", id, stdout)
			}
		}
	})

	t.Run("status without a manager", func(t *testing.T) {
		code, _, stderr := runFusebox(t, ctx, "status", "--manager", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
		if code == 0 || !strings.Contains(stderr, "fusebox local up") {
			t.Errorf("fusebox status against no manager: exit %d, stderr %q", code, stderr)
		}
	})

	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("manager exit code after SIGTERM: %d", code)
	}
	if got := e.containers(t); len(got) != 0 {
		t.Errorf("after a graceful exit runsc still lists %v", got)
	}
}

// A second `fusebox local up` on the state directory and socket of a running manager (the
// natural mistake: running it twice with the defaults) must refuse to start, and must not
// touch the running manager's sandboxes or socket.
func TestSecondManagerOnSameStateDirRefused(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	first := e.startLocalUp(t, "manager-1", "--pool-size", "2")
	e.waitServing(t, first, mc)
	units := waitPoolSettled(t, ctx, mc, 2)
	ready := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)

	second := e.startLocalUp(t, "manager-2", "--pool-size", "2")
	exited := false
	sandboxtest.Eventually(t, pollDeadline, "second manager exits or serves", func() (bool, string) {
		if second.exited() {
			exited = true
			return true, ""
		}
		return strings.Contains(second.log(), "manager serving"), second.log()
	})
	if !exited {
		t.Errorf("a second manager started on the state directory and socket of a running one:\n%s", second.log())
		second.signal(t, syscall.SIGTERM)
	} else if code := second.wait(t); code == 0 {
		t.Errorf("the second manager exited 0:\n%s", second.log())
	}
	for _, id := range ready {
		if !slices.Contains(e.containers(t), id) {
			t.Errorf("the running manager's ready sandbox %s was destroyed by the second manager", id)
		}
	}
	if first.exited() {
		t.Fatalf("the first manager exited: %v", first.err)
	}
	if _, err := os.Stat(e.Socket); err != nil {
		t.Errorf("the running manager's socket is gone: %v", err)
	}
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
	if err != nil {
		t.Fatalf("allocating from the first manager: %v", err)
	}
	defer a.Close()
	if !slices.Contains(ready, a.ID) {
		t.Errorf("the first manager handed out %s, not one of its ready units %v", a.ID, ready)
	}
}

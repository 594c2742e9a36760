package managere2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// An allocation through the in-process daemon runs commands under gVisor, and releasing it
// destroys its container and its state directory.
func TestAllocateExecRelease(t *testing.T) {
	e := newEnv(t)
	m := e.startDaemon(t, daemonOpts{PoolSize: 1, KeepAwake: true})
	ctx := testenv.Context(t, testDeadline)

	var used fastUse
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Trace: used.trace()})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	id := a.ID
	if !slices.Contains(e.containers(t), id) || !slices.Contains(e.sandboxDirs(t), id) {
		t.Errorf("allocated %s, but runsc lists %v and the state directory holds %v", id, e.containers(t), e.sandboxDirs(t))
	}
	if want := "unix://" + e.StateDir + "/sandboxes/" + id + "/sock/data.sock"; a.Endpoint != want {
		t.Errorf("endpoint %q, want %q", a.Endpoint, want)
	}
	if out := sandboxtest.Sh(t, ctx, a.Sandbox, "uname -r"); !strings.Contains(out, "gvisor") {
		t.Errorf("uname -r = %q, want gVisor's kernel", out)
	}
	if n := used.connected.Load(); n != 1 {
		t.Errorf("AllocateTrace.Connected ran %d times, want once", n)
	}
	// The server (the sandbox's first process) runs with its runtime monitor kept awake;
	// the commands it starts do not inherit the setting. (Commands cannot read the server's
	// /proc entries: its environment is read from the bundle runsc started it from.)
	if env := e.serverEnv(t, id); !slices.Contains(env, "GODEBUG="+localsandbox.KeepAwakeGODEBUG) {
		t.Errorf("the server's environment is %q, want GODEBUG=%s in it", env, localsandbox.KeepAwakeGODEBUG)
	}
	if out := sandboxtest.Sh(t, ctx, a.Sandbox, "env"); strings.Contains(out, "GODEBUG") {
		t.Errorf("a command's environment has GODEBUG:\n%s", out)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	e.waitUnitGone(t, id)
	mc := dialManager(t, e.Addr)
	sandboxtest.Eventually(t, pollDeadline, "released unit forgotten by List", func() (bool, string) {
		s, ok := list(t, ctx, mc)[id]
		return !ok || s.GetState() == managerv1.UnitState_UNIT_STATE_GONE, fmt.Sprint(s)
	})
	// The Manager service is ready once the pool has held a ready unit; the one allocated
	// above counts, however soon the agent took it.
	hcc := healthpb.NewHealthClient(dialConn(t, e.Addr))
	sandboxtest.Eventually(t, pollDeadline, "the Manager service serving", func() (bool, string) {
		hc, err := hcc.Check(ctx, &healthpb.HealthCheckRequest{Service: managerv1.Manager_ServiceDesc.ServiceName})
		return err == nil && hc.GetStatus() == healthpb.HealthCheckResponse_SERVING, fmt.Sprint(hc, err)
	})

	// A graceful stop destroys the warm pool.
	if err := m.Stop(); err != nil {
		t.Fatalf("daemon.Run: %v", err)
	}
	if c, d := e.containers(t), e.sandboxDirs(t); len(c) != 0 || len(d) != 0 {
		t.Errorf("after the daemon stopped: containers %v, sandbox directories %v", c, d)
	}
	// Nothing is left mounted under the state directory: a user can remove it.
	if mounts := e.mountsUnder(t); len(mounts) != 0 {
		t.Errorf("after the daemon stopped, still mounted under the state directory: %v", mounts)
	}
	if strings.Contains(m.Log.String(), "level=ERROR") {
		t.Errorf("manager logged errors:\n%s", m.Log)
	}
}

// Twenty allocations in a row each get a fresh sandbox: a distinct id and a workspace with
// nothing an earlier allocation wrote.
func TestAllocationsNeverReuseSandboxes(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, 10*time.Minute)

	const n = 20
	var ids []string
	// Odd allocations go through one kept Manager connection, as an agent's loop would;
	// even ones through client.Allocate's own connection.
	mgr, err := client.NewManager(e.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	for i := range n {
		var a *client.Allocation
		var err error
		var used fastUse
		if i%2 == 1 {
			a, err = mgr.Allocate(ctx, client.AllocateOptions{Trace: used.trace()})
		} else {
			a, err = client.Allocate(ctx, e.Addr, client.AllocateOptions{Trace: used.trace()})
		}
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if slices.Contains(ids, a.ID) {
			t.Errorf("allocation %d got sandbox %s again (earlier: %v)", i, a.ID, ids)
		}
		ids = append(ids, a.ID)
		if i == 0 {
			// Sandboxes not kept awake (daemonOpts.KeepAwake false, as with
			// --keep-sandboxes-awake=false): the server runs without the setting.
			env := strings.Join(e.serverEnv(t, a.ID), "\n")
			if !strings.Contains(env, "=") || strings.Contains(env, localsandbox.KeepAwakeGODEBUG) {
				t.Errorf("the server's environment, read %q, should have no %s with keep-awake off", env, localsandbox.KeepAwakeGODEBUG)
			}
		}
		out := sandboxtest.Sh(t, ctx, a.Sandbox, fmt.Sprintf(
			"ls -A /workspace; echo @@; echo %d > /workspace/marker-%d; ls -A /workspace", i, i))
		before, after, _ := strings.Cut(out, "@@\n")
		for _, name := range strings.Fields(before) {
			if strings.HasPrefix(name, "marker-") {
				t.Errorf("allocation %d (%s) sees %s from an earlier allocation; /workspace: %q", i, a.ID, name, before)
			}
		}
		if !slices.Contains(strings.Fields(after), fmt.Sprintf("marker-%d", i)) {
			t.Errorf("allocation %d: marker not written; /workspace after: %q", i, after)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("releasing allocation %d: %v", i, err)
		}
	}
	slices.Sort(ids)
	if len(slices.Compact(slices.Clone(ids))) != n {
		t.Errorf("sandbox ids repeat: %v", ids)
	}
	for _, id := range ids {
		e.waitUnitGone(t, id)
	}
}

// After the warm pool is drained by allocations that are kept, it refills to its target.
func TestWarmPoolRefills(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 2})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	waitPoolSettled(t, ctx, mc, 2)

	var held []string
	for i := range 2 {
		a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		t.Cleanup(func() { a.Close() })
		held = append(held, a.ID)
	}
	sandboxtest.Eventually(t, pollDeadline, "pool back to 2 ready", func() (bool, string) {
		ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		return ps.GetUnits()["ready"] == 2 && ps.GetUnits()["bound"] == 2, fmt.Sprint(ps.GetUnits())
	})
	ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetTarget() != 2 || ps.GetEstimator() != "fixed" || ps.GetAllocator() != "runsc" || ps.GetAllocations() != 2 || ps.GetCreations() < 4 {
		t.Errorf("PoolStatus = %v, want target 2, fixed, runsc, 2 allocations, at least 4 creations", ps)
	}
	units := list(t, ctx, mc)
	ready := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)
	slices.Sort(held)
	if bound := idsIn(units, managerv1.UnitState_UNIT_STATE_BOUND); !slices.Equal(bound, held) {
		t.Errorf("bound units %v, want the held ones %v", bound, held)
	}
	for _, id := range ready {
		if slices.Contains(held, id) {
			t.Errorf("unit %s is both held and ready", id)
		}
	}
	if got, want := e.containers(t), slices.Sorted(slices.Values(append(ready, held...))); !slices.Equal(got, want) {
		t.Errorf("runsc lists %v, want the ready and bound units %v", got, want)
	}
}

// A sandbox that dies while it waits in the pool is found by the manager (its sandbox
// process's exit, or its ping), destroyed and replaced, and the next allocation gets a live one.
func TestDeadPoolUnitIsReplaced(t *testing.T) {
	e := newEnv(t)
	m := e.startDaemon(t, daemonOpts{PoolSize: 1, PoolPing: 50 * time.Millisecond})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	dead := idsIn(waitPoolSettled(t, ctx, mc, 1), managerv1.UnitState_UNIT_STATE_READY)[0]
	if err := e.RT.Kill(ctx, dead, syscall.SIGKILL, true); err != nil {
		t.Fatalf("killing the pool's sandbox: %v", err)
	}
	sandboxtest.Eventually(t, pollDeadline, "the dead unit replaced", func() (bool, string) {
		ready := idsIn(list(t, ctx, mc), managerv1.UnitState_UNIT_STATE_READY)
		return len(ready) == 1 && ready[0] != dead && !slices.Contains(e.containers(t), dead), fmt.Sprint(ready, e.containers(t))
	})
	// The sandbox process's exit (or, failing that, the ping) told the manager.
	if l := m.Log.String(); !strings.Contains(l, "ended on its own") && !strings.Contains(l, "stopped answering pings") {
		t.Errorf("the manager did not log why it destroyed %s", dead)
	}
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
	if err != nil {
		t.Fatalf("allocation after the replacement: %v", err)
	}
	defer a.Close()
	if a.ID == dead {
		t.Fatalf("allocated the dead unit %s", dead)
	}
	sandboxtest.Sh(t, ctx, a.Sandbox, "true")
}

// A lease that is not renewed expires: the manager destroys the sandbox and its data plane
// stops answering.
func TestExpiredLeaseDestroysSandbox(t *testing.T) {
	e := newEnv(t)
	m := e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)

	// Control: the same raw allocation and dialling, with a long lease, answers.
	ctrl, ctrlSB := rawAllocate(t, ctx, mc, sandboxtest.NewKey(t), 10*time.Minute)
	if out := sandboxtest.Sh(t, ctx, ctrlSB, "echo alive"); out != "alive\n" {
		t.Fatalf("control sandbox: %q", out)
	}

	key := sandboxtest.NewKey(t)
	resp, sb := rawAllocate(t, ctx, mc, key, time.Second)
	id := resp.GetSandboxId()
	if d := resp.GetLeaseExpires().AsTime().Sub(time.Now()); d > time.Minute {
		t.Errorf("lease expires in %v, asked for 1s", d)
	}
	sandboxtest.Eventually(t, pollDeadline, "expired unit gone from List", func() (bool, string) {
		s, ok := list(t, ctx, mc)[id]
		return !ok || s.GetState() == managerv1.UnitState_UNIT_STATE_GONE, fmt.Sprint(s)
	})
	e.waitUnitGone(t, id)
	sandboxtest.Eventually(t, pollDeadline, "data plane of the expired sandbox stops answering", func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res, err := sb.Exec(cctx, client.Command{Argv: []string{"true"}})
		return err != nil, fmt.Sprintf("exec still answers: %+v", res)
	})
	// A fresh connection with the same keys fails too.
	sb2, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if res, err := sb2.Exec(cctx, client.Command{Argv: []string{"true"}}); err == nil {
		t.Errorf("exec on a fresh connection to the expired sandbox succeeded: %+v", res)
	}
	_, err = mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: resp.GetLeaseToken()})
	wantCode(t, "Renew after expiry", err, codes.NotFound, codes.FailedPrecondition)
	if !strings.Contains(m.Log.String(), "lease expired") {
		t.Errorf("manager did not log the expiry:\n%s", m.Log)
	}

	// The control, whose lease is live, is untouched.
	if out := sandboxtest.Sh(t, ctx, ctrlSB, "echo alive"); out != "alive\n" {
		t.Errorf("control sandbox after the expiry: %q", out)
	}
	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: ctrl.GetSandboxId(), LeaseToken: ctrl.GetLeaseToken()}); err != nil {
		t.Errorf("releasing the control: %v", err)
	}
	e.waitUnitGone(t, ctrl.GetSandboxId())
}

// AllocateStream, kept for the clients of earlier releases, sends the answer alone (no unit
// is named before sFuse any more), and the agent dials after it. The state directory holds no
// handoff socket (that accelerator was removed).
func TestAllocateStreamAnswersAlone(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	key := sandboxtest.NewKey(t)
	stream, err := mc.AllocateStream(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*managerv1.AllocateEvent
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("AllocateStream: %v", err)
		}
		evs = append(evs, ev)
	}
	if len(evs) != 1 || evs[0].GetAllocated() == nil {
		t.Fatalf("events %v, want the answer alone", evs)
	}
	resp := evs[0].GetAllocated()
	if _, err := os.Stat(filepath.Join(e.StateDir, "handoff.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state directory holds a handoff socket: %v", err)
	}
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if out := sandboxtest.Sh(t, ctx, sb, "echo answered"); out != "answered\n" {
		t.Errorf("exec: %q", out)
	}
	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.GetSandboxId(), LeaseToken: resp.GetLeaseToken()}); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// Untrusted code cannot end its sandbox's server (`kill -9 1` is refused and the unit stays
// bound and serving); a bound sandbox that dies anyway (here killed from the host) is noticed
// by the manager, listed as failed with the reason, and destroyed.
func TestDeadBoundUnitIsMarkedFailed(t *testing.T) {
	e := newEnv(t)
	m := e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	defer a.Close()
	res, err := a.Sandbox.Exec(ctx, client.Command{Script: "kill -9 1"})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("kill -9 1 from a command: %+v %v; want it refused", res, err)
	}
	if got := sandboxtest.Sh(t, ctx, a.Sandbox, "echo alive"); got != "alive\n" {
		t.Fatalf("after kill -9 1: %q", got)
	}
	if s := list(t, ctx, mc)[a.ID]; s.GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
		t.Fatalf("after kill -9 1 the unit is %v, want bound", s)
	}

	if err := e.RT.Kill(ctx, a.ID, syscall.SIGKILL, true); err != nil {
		t.Fatalf("killing the bound sandbox: %v", err)
	}
	sandboxtest.Eventually(t, pollDeadline, "the dead bound unit listed as failed", func() (bool, string) {
		s := list(t, ctx, mc)[a.ID]
		return s.GetState() == managerv1.UnitState_UNIT_STATE_FAILED && strings.Contains(s.GetError(), "exited"), fmt.Sprint(s)
	})
	e.waitUnitGone(t, a.ID)
	if !strings.Contains(m.Log.String(), "ended on its own") {
		t.Errorf("the manager did not log why %s failed:\n%s", a.ID, m.Log)
	}
	// The pool still serves (List is what fusebox status prints, errors included).
	b, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{})
	if err != nil {
		t.Fatalf("allocation after the dead unit: %v", err)
	}
	defer b.Close()
	sandboxtest.Sh(t, ctx, b.Sandbox, "true")
}

// With the accelerators switched off (--fast-path=none) an allocation takes the plain path:
// no unit named early, no keep-awake; the pinning holds as on the fast path.
func TestPlainPath(t *testing.T) {
	e := newEnv(t)
	none := fastpath.Switches{}
	e.startDaemon(t, daemonOpts{PoolSize: 1, KeepAwake: true, FastPath: &none})
	ctx := testenv.Context(t, testDeadline)
	var used fastUse
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Trace: used.trace()})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if out := sandboxtest.Sh(t, ctx, a.Sandbox, "echo plain"); out != "plain\n" {
		t.Errorf("exec on the plain path: %q", out)
	}
	if n := used.connected.Load(); n != 1 {
		t.Errorf("AllocateTrace.Connected ran %d times, want once", n)
	}
	if env := e.serverEnv(t, a.ID); slices.Contains(env, "GODEBUG="+localsandbox.KeepAwakeGODEBUG) {
		t.Errorf("the server's environment is %q: keep-awake is on with --fast-path=none", env)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// The pinning on the plain path: the pinned agent is served, another key is not.
	key := sandboxtest.NewKey(t)
	resp, sb := rawAllocate(t, ctx, dialManager(t, e.Addr), key, time.Minute)
	if out := sandboxtest.Sh(t, ctx, sb, "echo pinned"); out != "pinned\n" {
		t.Errorf("the pinned agent's exec: %q", out)
	}
	intruder, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), sandboxtest.NewKey(t))
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close()
	if _, err := intruder.Run(ctx, "true"); status.Code(errors.Unwrap(err)) != codes.Unavailable && status.Code(err) != codes.Unavailable {
		t.Errorf("another agent's exec on the plain path: %v, want Unavailable", err)
	}
}

package managere2e

import (
	"errors"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/schedtrace"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/bench"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// fusebox-bench allocate --manager measures warm allocations against a running manager and
// releases every sandbox it took; a pool that never fills is reported, not waited on forever.
func TestBenchAgainstRunningManager(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)

	// With --sched where the kernel has tracefs (root: this test's sandboxes need it anyway).
	noTracefs := schedtrace.Available()
	sched := noTracefs == nil
	r, err := bench.AllocateRemote(ctx, bench.RemoteOptions{Manager: e.Addr, Runs: 3, Settle: 10 * time.Millisecond, Sched: sched})
	if err != nil {
		t.Fatalf("AllocateRemote: %v", err)
	}
	if sched {
		// Every allocation wakes its sandbox (sFuse, the first call): gVisor's processes ran.
		if s := r.Sched; s == nil || s.Runs != 3 || s.GVisorMs <= 0 || len(s.Slowest) != 3 {
			t.Errorf("sched %+v: want 3 allocations with gVisor's processes on the CPUs", s)
		}
	} else {
		t.Logf("no --sched: %v", noTracefs)
	}
	if r.Runs != 3 || r.Allocator != "runsc" || r.AllocateP50Ms <= 0 || r.AllocateP99Ms < r.AllocateP50Ms {
		t.Errorf("result %+v: want 3 runs on runsc with p50 > 0 and p99 >= p50", r)
	}
	// The split: until the manager's answer, and from it to the first call's end, each
	// within the whole.
	if r.AnswerP50Ms <= 0 || r.FirstCallP50Ms <= 0 || r.AnswerP50Ms > r.AllocateP99Ms || r.FirstCallP50Ms > r.AllocateP99Ms {
		t.Errorf("result %+v: want the answer's and the first call's times, each > 0 and within the whole", r)
	}
	// Each first call is split again, within the first call.
	if r.ConnectP50Ms <= 0 || r.ReplyP50Ms <= 0 || r.ConnectP50Ms > r.AllocateP99Ms || r.ReplyP50Ms > r.AllocateP99Ms {
		t.Errorf("result %+v: want the first calls split into connect and reply, each > 0 and within the whole", r)
	}
	if r.ColdWaits != 0 {
		t.Errorf("%d allocations waited for a cold start: each run waits for a full pool", r.ColdWaits)
	}
	mc := dialManager(t, e.Addr)
	for id, s := range list(t, ctx, mc) {
		if st := s.GetState(); st == managerv1.UnitState_UNIT_STATE_BOUND || st == managerv1.UnitState_UNIT_STATE_INITIALISING {
			t.Errorf("unit %s is %v after the benchmark: every allocation must be released", id, st)
		}
	}

	// Busy does not wait for creations to pause, but the pool must still be full: with a
	// one-unit pool taken and no time to refill, the wait ends with an error.
	_, err = bench.AllocateRemote(ctx, bench.RemoteOptions{Manager: e.Addr, Runs: 50, Settle: -1, Busy: true, Wait: time.Nanosecond})
	if err == nil || !errors.Is(err, bench.ErrNotSettled) {
		t.Errorf("AllocateRemote with a 1 ns wait: %v, want ErrNotSettled", err)
	}
}

// fusebox-bench sdk --manager measures the Go SDK's workloads in a sandbox the manager
// allocated, verifying what it read back, and releases that sandbox.
func TestSDKBenchAgainstRunningManager(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	r, err := bench.SDK(ctx, bench.SDKOptions{Manager: e.Addr, ExecRuns: 5})
	if err != nil {
		t.Fatalf("SDK: %v", err)
	}
	if r.ExecRuns != 5 || r.ExecRoundtripP50Ms <= 0 || r.ExecRoundtripP99Ms < r.ExecRoundtripP50Ms {
		t.Errorf("exec figures %+v: want 5 runs, p50 > 0 and p99 >= p50", r)
	}
	for _, f := range []bench.Figure{r.Materialize, r.Read} {
		if f.Files != 3000 || f.Dirs != 50 || f.Rounds != 5 || f.Seconds <= 0 || f.RPCs <= 0 {
			t.Errorf("figure %+v: want 3000 files in 50 directories, 5 rounds, time and RPCs", f)
		}
	}
	if !r.Read.Verified {
		t.Error("the read-back figure is not marked verified")
	}
	mc := dialManager(t, e.Addr)
	for id, s := range list(t, ctx, mc) {
		if st := s.GetState(); st == managerv1.UnitState_UNIT_STATE_BOUND || st == managerv1.UnitState_UNIT_STATE_INITIALISING {
			t.Errorf("unit %s is %v after the benchmark: its sandbox must be released", id, st)
		}
	}
}

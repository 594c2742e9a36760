package manager_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// fakeClock drives every wait of the manager (tickers, timers, the refill delay, backoff,
// deadlines): tests step it instead of sleeping.
type fakeClock = testingclock.FakeClock

func newFakeClock(t time.Time) *fakeClock { return testingclock.NewFakeClock(t) }

type env struct {
	m     *manager.Manager
	alloc *memalloc.Allocator
	clock *fakeClock
	svc   *asCaller
	met   *manager.Metrics
	key   []byte
}

func newEnv(t *testing.T, pool int, mutate func(*manager.Options)) *env {
	t.Helper()
	a := memalloc.New()
	c := newFakeClock(time.Unix(1_000_000, 0))
	met := manager.NewMetrics(prometheus.NewRegistry())
	o := manager.Options{Allocator: a, Estimator: estimator.Fixed{N: pool}, Clock: c,
		Initializer: memalloc.Initializer, Metrics: met, ReconcileInterval: 10 * time.Millisecond,
		AllocateWait: 5 * time.Second}
	if mutate != nil {
		mutate(&o)
	}
	m, err := manager.New(o)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := client.NewKey()
	return &env{m: m, alloc: a, clock: c, svc: rootService(m), met: met, key: k.PublicKey()}
}

func (e *env) start(t *testing.T) {
	t.Helper()
	if err := e.m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.m.Close(context.Background()) })
}

// eventually waits for cond, which background work of the manager (a creation, a destroy)
// makes true without any time passing on its clock; the deadline only bounds a failing test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	stepping(t, what, nil, 0, cond)
}

// stepping waits for cond while stepping c by d between looks: for what needs time to pass on
// the manager's clock (a backoff, an interval, a deadline).
func stepping(t *testing.T, what string, c *fakeClock, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if c != nil {
			c.Step(d)
		}
		time.Sleep(time.Millisecond) // lets the manager's goroutines run
	}
}

// drive steps the fake clock by d every millisecond of real time until the returned func is
// called: for tests of many concurrent allocations, where some wait on the clock (a backoff)
// at moments the test does not know.
func (e *env) drive(t *testing.T, d time.Duration) (stop func()) {
	t.Helper()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				e.clock.Step(d)
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func (e *env) ready() int { return e.m.States().Counts("")[manager.Ready] }

func TestAllocateBindReleaseDestroys(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.start(t)
	eventually(t, "pool of 2", func() bool { return e.ready() == 2 })
	ctx := context.Background()
	resp, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key,
		Egress: []string{"api.example.com:443", "*.pypi.org:443"}, Labels: map[string]string{"session": "s1"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.SandboxPublicKey == nil || resp.LeaseToken == "" || resp.Endpoint == "" {
		t.Fatalf("incomplete response %+v", resp)
	}
	if got := e.alloc.Egress(resp.SandboxId); !slices.Equal(got, []string{"api.example.com:443", "*.pypi.org:443"}) {
		t.Fatalf("egress bound %q", got)
	}
	u, _ := e.m.States().Get(resp.SandboxId)
	if u.State != manager.Bound || u.Lease.Labels["session"] != "s1" {
		t.Fatalf("unit after allocate: %+v", u)
	}
	// The lease is persisted with the allocator for adoption.
	units, _ := e.alloc.List(ctx)
	for _, info := range units {
		if info.ID == resp.SandboxId && info.Annotations["fusebox.dev/state"] != "bound" {
			t.Fatalf("annotations %v", info.Annotations)
		}
	}
	if _, err := e.svc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.SandboxId, LeaseToken: "wrong"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("release with a wrong token: %v", err)
	}
	if _, err := e.svc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.SandboxId, LeaseToken: resp.LeaseToken}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "destroyed", func() bool { return !slices.Contains(e.alloc.Units(), resp.SandboxId) })
	if _, err := e.svc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.SandboxId, LeaseToken: resp.LeaseToken}); status.Code(err) != codes.NotFound && status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second release: %v", err)
	}
	eventually(t, "pool refilled", func() bool { return e.ready() == 2 })
}

func TestAllocateRejectsBadInput(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	ctx := context.Background()
	tests := []struct {
		name string
		req  *managerv1.AllocateRequest
	}{
		{"no key", &managerv1.AllocateRequest{}},
		{"garbage key", &managerv1.AllocateRequest{AgentPublicKey: []byte("nope")}},
		{"unknown template", &managerv1.AllocateRequest{AgentPublicKey: e.key, Template: "gpu"}},
		{"bad egress", &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"http://x.com/"}}},
		{"egress without port", &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"x.com"}}},
		{"bare wildcard", &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"*:443"}}},
		{"negative ttl", &managerv1.AllocateRequest{AgentPublicKey: e.key, LeaseTtl: durationpb.New(-time.Second)}},
		{"bad label", &managerv1.AllocateRequest{AgentPublicKey: e.key, Labels: map[string]string{"a=b": "x"}}},
		{"bad env name", &managerv1.AllocateRequest{AgentPublicKey: e.key, Env: map[string]string{"1X": "y"}}},
		{"NUL in env", &managerv1.AllocateRequest{AgentPublicKey: e.key, Env: map[string]string{"X": "a\x00b"}}},
		{"cwd leaves the workspace", &managerv1.AllocateRequest{AgentPublicKey: e.key, Cwd: "../etc"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.svc.Allocate(ctx, tc.req); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Allocate = %v, want InvalidArgument", err)
			}
		})
	}
	// Nothing was taken from the pool by the refusals.
	if n := e.m.States().Counts("")[manager.Bound]; n != 0 {
		t.Fatalf("%d units bound by refused requests", n)
	}
}

func TestZeroReuse(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.start(t)
	ctx := context.Background()
	seen := map[string]bool{}
	for i := range 20 {
		a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key})
		if err != nil {
			t.Fatal(err)
		}
		if seen[a.ID] {
			t.Fatalf("allocation %d reused %s", i, a.ID)
		}
		seen[a.ID] = true
		if err := e.m.Release(ctx, a.ID, a.LeaseToken); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "released units destroyed", func() bool {
		for id := range seen {
			if slices.Contains(e.alloc.Units(), id) {
				return false
			}
		}
		return true
	})
}

func TestLeaseExpiryDestroysWithFakeClock(t *testing.T) {
	e := newEnv(t, 1, func(o *manager.Options) { o.ReconcileInterval = time.Hour })
	e.start(t)
	ctx := context.Background()
	e.m.Reconcile(ctx)
	eventually(t, "ready", func() bool { return e.ready() == 1 })
	a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Step(30 * time.Second)
	exp, err := e.m.Renew(ctx, a.ID, a.LeaseToken, 0)
	if err != nil || !exp.Equal(e.clock.Now().Add(time.Minute)) {
		t.Fatalf("renew: %v %v", exp, err)
	}
	e.clock.Step(59 * time.Second)
	e.m.Reconcile(ctx)
	if u, _ := e.m.States().Get(a.ID); u.State != manager.Bound {
		t.Fatalf("renewed lease expired early: %v", u.State)
	}
	e.clock.Step(2 * time.Second)
	e.m.Reconcile(ctx)
	eventually(t, "expired unit destroyed", func() bool { return !slices.Contains(e.alloc.Units(), a.ID) })
	if _, err := e.m.Renew(ctx, a.ID, a.LeaseToken, 0); err == nil {
		t.Fatal("renewed an expired lease")
	}
}

func TestCreateFailuresAreVisibleAndRetried(t *testing.T) {
	var mu sync.Mutex
	fails := 3
	e := newEnv(t, 2, nil)
	e.alloc.SetFail(func(method, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if method == "Create" && fails > 0 {
			fails--
			return errors.New("runsc create: injected failure")
		}
		return nil
	})
	e.start(t)
	// The creation backoff (0.5 s, 1 s, 2 s) passes on the fake clock.
	stepping(t, "pool filled despite failures", e.clock, 500*time.Millisecond, func() bool { return e.ready() == 2 })
	if got := testutil.ToFloat64(e.met.Failures.WithLabelValues("create")); got != 3 {
		t.Fatalf("create failures metric %v, want 3", got)
	}
	if n := e.m.States().Counts("")[manager.Failed]; n != 3 {
		t.Fatalf("%d failed units visible, want 3", n)
	}
	for _, u := range e.m.List() {
		if u.State == manager.Failed && u.Err == "" {
			t.Fatalf("failed unit without a reason: %+v", u)
		}
	}
}

func TestInitAndEgressFailuresNeverHandOut(t *testing.T) {
	for _, stage := range []string{"init", "BindEgress", "Annotate"} {
		t.Run(stage, func(t *testing.T) {
			var mu sync.Mutex
			failed := map[string]bool{}
			e := newEnv(t, 2, func(o *manager.Options) {
				if stage == "init" {
					first := true
					o.Initializer = func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
						mu.Lock()
						defer mu.Unlock()
						if first {
							first = false
							return sfuse.Result{}, errors.New("injected init failure")
						}
						return memalloc.Initializer(ctx, addr, req)
					}
				}
			})
			if stage != "init" {
				first := true
				e.alloc.SetFail(func(method, id string) error {
					mu.Lock()
					defer mu.Unlock()
					if method == stage && first {
						first, failed[id] = false, true
						return errors.New("injected failure")
					}
					return nil
				})
			}
			e.start(t)
			eventually(t, "pool", func() bool { return e.ready() == 2 })
			a, err := e.m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: e.key})
			if err != nil {
				t.Fatalf("allocate after one injected failure: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if failed[a.ID] {
				t.Fatalf("the unit whose %s failed was handed out", stage)
			}
			eventually(t, "failed unit destroyed", func() bool { return len(e.alloc.Units()) <= 3 })
		})
	}
}

func TestAdoptionAfterRestart(t *testing.T) {
	// The first manager "dies" below: its loops stop (its context ends) without a Close, so
	// that its reconciler does not act on the clock's step.
	e := newEnv(t, 1, func(o *manager.Options) { o.ReconcileInterval = time.Hour })
	firstCtx, die := context.WithCancel(context.Background())
	if err := e.m.Start(firstCtx); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eventually(t, "ready", func() bool { return e.ready() == 1 })
	kept, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"a.example.com:443"}, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	short, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready again", func() bool { return e.ready() == 1 })
	// The manager dies without cleaning up (no Close); a new one starts on the same allocator
	// two minutes later: the long lease is adopted, the expired one and the ready unit are
	// destroyed.
	die()
	e.m.Wait() // the reconciler, and a pass the refill's end nudged, end before the step
	e.clock.Step(2 * time.Minute)
	m2, err := manager.New(manager.Options{Allocator: e.alloc, Estimator: estimator.Fixed{N: 0}, Clock: e.clock,
		Initializer: memalloc.Initializer})
	if err != nil {
		t.Fatal(err)
	}
	before := e.alloc.Units()
	if len(before) != 3 {
		t.Fatalf("units before restart %v", before)
	}
	if err := m2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m2.Close(ctx)
	if got := e.alloc.Units(); !slices.Equal(got, []string{kept.ID}) {
		t.Fatalf("after adoption the allocator holds %v, want only %s (expired %s)", got, kept.ID, short.ID)
	}
	u, ok := m2.States().Get(kept.ID)
	if !ok || u.State != manager.Bound || !slices.Equal(u.Lease.Egress, []string{"a.example.com:443"}) {
		t.Fatalf("adopted unit %+v", u)
	}
	// The adopted lease still answers to its token.
	if _, err := m2.Renew(ctx, kept.ID, kept.LeaseToken, 0); err != nil {
		t.Fatalf("renewing an adopted lease: %v", err)
	}
	if err := m2.Release(ctx, kept.ID, kept.LeaseToken); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentAllocationsNeverShareAUnit(t *testing.T) {
	e := newEnv(t, 16, func(o *manager.Options) { o.CreateConcurrency = 16 })
	e.start(t)
	ctx := context.Background()
	var mu sync.Mutex
	ids := map[string]int{}
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids[a.ID]++
			mu.Unlock()
		})
	}
	wg.Wait()
	for id, n := range ids {
		if n != 1 {
			t.Fatalf("%s bound %d times", id, n)
		}
	}
	if len(ids) != 64 {
		t.Fatalf("%d distinct allocations, want 64", len(ids))
	}
}

func TestNoCapacityIsResourceExhausted(t *testing.T) {
	e := newEnv(t, 0, func(o *manager.Options) { o.AllocateWait = 50 * time.Millisecond })
	e.alloc.SetFail(func(method, id string) error {
		if method == "Create" {
			return fmt.Errorf("no capacity")
		}
		return nil
	})
	e.start(t)
	done := make(chan error, 1)
	go func() {
		_, err := e.svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key})
		done <- err
	}()
	var err error
	stepping(t, "the allocation's deadline", e.clock, 10*time.Millisecond, func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Allocate = %v, want ResourceExhausted", err)
	}
}

// TestCountsMatchUnits checks that the counts the state operator keeps incrementally agree
// with its units after a burst of allocations, releases, failures and expiries.
func TestCountsMatchUnits(t *testing.T) {
	e := newEnv(t, 4, nil)
	var mu sync.Mutex
	n := 0
	e.alloc.SetFail(func(method, id string) error {
		mu.Lock()
		defer mu.Unlock()
		n++
		if method == "Create" && n%7 == 0 {
			return errors.New("injected")
		}
		return nil
	})
	e.start(t)
	ctx := context.Background()
	// Allocations that wait out a creation's backoff need the clock to move.
	stop := e.drive(t, 50*time.Millisecond)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, LeaseTTL: time.Minute})
			if err != nil {
				return
			}
			if i%2 == 0 {
				e.m.Release(ctx, a.ID, a.LeaseToken)
			}
		})
	}
	wg.Wait()
	stop()
	e.clock.Step(2 * time.Minute)
	e.m.Reconcile(ctx)
	eventually(t, "counts to match the units", func() bool {
		want := map[manager.State]int{}
		for _, u := range e.m.List() {
			want[u.State]++
		}
		got := e.m.States().Counts("")
		for s, c := range got {
			if c != want[s] {
				return false
			}
		}
		for s, c := range want {
			if got[s] != c {
				return false
			}
		}
		return true
	})
}

// TestRefillWaitsWhileThePoolHoldsReadyUnits: an allocation that leaves ready units behind
// does not start a creation until the refill delay has passed on the clock; one that empties
// the pool starts one at once.
func TestRefillWaitsWhileThePoolHoldsReadyUnits(t *testing.T) {
	const delay = manager.DefaultRefillDelay
	e := newEnv(t, 2, func(o *manager.Options) {
		o.Allocator.(*memalloc.Allocator).Caps = &manager.Capabilities{Egress: true, Adoption: true, CreatesOnHost: true}
		o.ReconcileInterval = time.Hour
	})
	e.start(t)
	eventually(t, "pool of 2", func() bool { return e.ready() == 2 })
	// From now on a creation blocks in Create until released, so that one started shows in
	// CreationsInFlight until the test lets it finish.
	release := make(chan struct{})
	e.alloc.SetFail(func(method, id string) error {
		if method == "Create" {
			<-release
		}
		return nil
	})
	ctx := context.Background()
	if _, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key}); err != nil {
		t.Fatal(err)
	}
	e.m.Reconcile(ctx) // the deficit begins (the allocation's own nudge may have begun it)
	e.clock.Step(delay - time.Millisecond)
	e.m.Reconcile(ctx)
	if n := e.m.CreationsInFlight(); n != 0 {
		t.Fatalf("%d creations before the refill delay passed, with a ready unit left", n)
	}
	// The delay passes: its timer nudges the reconciler, which starts the creation.
	e.clock.Step(time.Millisecond)
	eventually(t, "a creation after the refill delay", func() bool { return e.m.CreationsInFlight() == 1 })
	// The last ready unit taken, the pool is empty: its creation starts at once.
	if _, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key}); err != nil {
		t.Fatal(err)
	}
	e.m.Reconcile(ctx)
	if n := e.m.CreationsInFlight(); n != 2 {
		t.Fatalf("%d creations in flight after the pool emptied, want 2 (no delay for an empty pool)", n)
	}
	close(release)
	eventually(t, "the pool refilled", func() bool { return e.ready() == 2 })
}

// An allocation waiting on an empty pool gets the unit it had made, even when the estimator's
// target is zero and the reconciler trims every spare ready unit: the reconciler must not take
// a waiter's unit for a surplus. (It did, now and then, and the allocation then waited out its
// deadline.)
func TestWaitingAllocationKeepsItsUnitAgainstTrimming(t *testing.T) {
	e := newEnv(t, 0, func(o *manager.Options) {
		o.ReconcileInterval = time.Millisecond // trim as often as possible (see below)
		o.AllocateWait = time.Hour             // on the fake clock, which a goroutine steps
	})
	e.alloc.Delay = time.Millisecond
	e.start(t)
	stop := make(chan struct{})
	stepped := make(chan struct{})
	go func() { // ticks the reconciler as fast as it can take them
		defer close(stepped)
		for {
			select {
			case <-stop:
				return
			default:
				e.clock.Step(time.Millisecond)
				runtime.Gosched()
			}
		}
	}()
	defer func() { close(stop); <-stepped }()
	ctx := context.Background()
	for i := range 300 {
		a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key})
		if err != nil {
			t.Fatalf("allocation %d on an empty pool: %v", i, err)
		}
		if err := e.m.Release(ctx, a.ID, a.LeaseToken); err != nil {
			t.Fatal(err)
		}
	}
}

// The units' warm-up (Capabilities.WarmUp) counts in the provisioning latency the estimator sizes the pool by.
func TestProvisioningLatencyIncludesWarmUp(t *testing.T) {
	const warmUp = time.Second
	e := newEnv(t, 2, func(o *manager.Options) {
		o.Allocator.(*memalloc.Allocator).Caps = &manager.Capabilities{Egress: true, Adoption: true, WarmUp: warmUp}
	})
	e.alloc.Delay = 20 * time.Millisecond
	if got := e.m.ProvisioningLatency(); got != time.Second+warmUp {
		t.Errorf("before any creation: %v, want the 1 s guess plus the warm-up", got)
	}
	e.start(t)
	eventually(t, "two ready units", func() bool { return e.m.States().Counts("")[manager.Ready] == 2 })
	if got := e.m.ProvisioningLatency(); got < warmUp+20*time.Millisecond || got >= warmUp+time.Second {
		t.Errorf("after creations of about 20 ms: %v, want 20 ms plus the %v warm-up", got, warmUp)
	}
}

// The manager pings the unit its next allocation takes; one that stops answering is
// destroyed after three misses in a row, counted as a ping failure, and replaced.
func TestPoolHeadPingsFindADeadUnit(t *testing.T) {
	var mu sync.Mutex
	pinged := map[string]int{}
	dead := ""
	e := newEnv(t, 2, func(o *manager.Options) {
		o.PingInterval = 5 * time.Millisecond
		o.Initializer, o.Conns = nil, &fakeConns{ping: func(ctx context.Context, addr string) error {
			mu.Lock()
			defer mu.Unlock()
			pinged[addr]++
			if addr == dead {
				return errors.New("connection refused")
			}
			return nil
		}}
	})
	e.start(t)
	eventually(t, "two ready units", func() bool { return e.m.States().Counts("")[manager.Ready] == 2 })
	head := e.m.States().OldestReady("default", 1)[0]
	u, _ := e.m.States().Get(head)
	// Every 5 ms of the fake clock is one ping.
	const tick = 5 * time.Millisecond
	stepping(t, "pings of the next unit", e.clock, tick, func() bool { mu.Lock(); defer mu.Unlock(); return pinged[u.Info.InitAddr] >= 3 })
	mu.Lock()
	for addr, n := range pinged {
		if addr != u.Info.InitAddr && n > 0 {
			t.Errorf("%s, not the next unit, was pinged %d times", addr, n)
		}
	}
	dead = u.Info.InitAddr
	mu.Unlock()
	stepping(t, "the dead unit destroyed", e.clock, tick, func() bool { return !slices.Contains(e.alloc.Units(), head) })
	if got := testutil.ToFloat64(e.met.Failures.WithLabelValues("ping")); got != 1 {
		t.Errorf("ping failures = %v, want 1", got)
	}
	eventually(t, "the pool refilled", func() bool { return e.m.States().Counts("")[manager.Ready] == 2 })
}

// An allocation waiting on an empty pool whose own creation fails starts another (after the
// creation backoff) instead of waiting out its deadline.
func TestWaitingAllocationRetriesAFailedCreation(t *testing.T) {
	e := newEnv(t, 0, func(o *manager.Options) { o.AllocateWait = 20 * time.Second })
	var creates atomic.Int32
	e.alloc.SetFail(func(method, id string) error {
		if method == "Create" && creates.Add(1) == 1 {
			return errors.New("injected: runsc create failed")
		}
		return nil
	})
	e.start(t)
	type result struct {
		a   manager.Allocation
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := e.m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: e.key})
		done <- result{a, err}
	}()
	var r result
	// The retry waits out the creation backoff (0.5 s) on the fake clock.
	stepping(t, "the allocation", e.clock, 100*time.Millisecond, func() bool {
		select {
		case r = <-done:
			return true
		default:
			return false
		}
	})
	a, err := r.a, r.err
	if err != nil {
		t.Fatalf("allocation after one failed creation: %v", err)
	}
	if n := creates.Load(); n != 2 {
		t.Errorf("%d creations, want 2 (the failed one and its retry)", n)
	}
	if got := testutil.ToFloat64(e.met.Failures.WithLabelValues("create")); got != 1 {
		t.Errorf("create failures = %v, want 1", got)
	}
	if got, m := e.m.Status().ColdWaits, testutil.ToFloat64(e.met.ColdWaits); got != 1 || m != 1 {
		t.Errorf("cold waits = %d (metric %v), want 1: the allocation found the pool empty", got, m)
	}
	e.m.Release(context.Background(), a.ID, a.LeaseToken)
}

// An allocation that finds a ready unit is not a cold wait.
func TestAllocationFromAReadyUnitIsNoColdWait(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.m.States().Counts("")[manager.Ready] == 1 })
	a, err := e.m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if got, m := e.m.Status().ColdWaits, testutil.ToFloat64(e.met.ColdWaits); got != 0 || m != 0 {
		t.Errorf("cold waits = %d (metric %v), want 0", got, m)
	}
	e.m.Release(context.Background(), a.ID, a.LeaseToken)
}

// A unit whose destroy fails keeps its remains on record and is destroyed again after
// RemainsRetry, until that succeeds; nothing is left in the allocator.
func TestFailedDestroyIsRetried(t *testing.T) {
	e := newEnv(t, 1, nil)
	var destroys atomic.Int32
	e.alloc.SetFail(func(method, id string) error {
		if method == "Destroy" && destroys.Add(1) <= 2 {
			return errors.New("injected: runsc delete failed")
		}
		return nil
	})
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.ready() == 1 })
	ctx := context.Background()
	a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Release(ctx, a.ID, a.LeaseToken); err != nil {
		t.Fatal(err)
	}
	remains := func() bool {
		u, ok := e.m.States().Get(a.ID)
		return ok && u.State == manager.Failed && u.Remains
	}
	eventually(t, "the failed destroy on record", remains)
	if !slices.Contains(e.alloc.Units(), a.ID) {
		t.Fatal("the unit is gone from the allocator although its destroy failed")
	}
	// Not before RemainsRetry (a pass just short of it starts no destroy: the decision is
	// synchronous, and moves the unit out of Failed); then again (failing once more), then
	// for good.
	e.clock.Step(manager.RemainsRetry - time.Millisecond)
	e.m.Reconcile(ctx)
	if n, u := destroys.Load(), remains(); n != 1 || !u {
		t.Fatalf("%d destroys before RemainsRetry (remains still on record: %v), want 1", n, u)
	}
	e.clock.Step(time.Millisecond)
	e.m.Reconcile(ctx)
	eventually(t, "the second destroy", func() bool { return destroys.Load() == 2 && remains() })
	e.clock.Step(manager.RemainsRetry)
	e.m.Reconcile(ctx)
	eventually(t, "the unit destroyed", func() bool {
		_, ok := e.m.States().Get(a.ID)
		return !ok && !slices.Contains(e.alloc.Units(), a.ID)
	})
	if got := testutil.ToFloat64(e.met.Failures.WithLabelValues("destroy")); got != 2 {
		t.Errorf("destroy failures = %v, want 2", got)
	}
}

// A creation whose cleanup failed too (ErrRemains) is destroyed again after RemainsRetry; one
// that cleaned up after itself is not.
func TestFailedCreationWithRemainsIsDestroyed(t *testing.T) {
	e := newEnv(t, 1, nil)
	var creates atomic.Int32
	var first atomic.Value
	e.alloc.SetFail(func(method, id string) error {
		if method != "Create" {
			return nil
		}
		switch creates.Add(1) {
		case 1:
			first.Store(id)
			return fmt.Errorf("injected: runsc start failed (%w: runsc delete failed)", manager.ErrRemains)
		case 2:
			return errors.New("injected: runsc create failed, cleaned up")
		}
		return nil
	})
	e.start(t)
	stepping(t, "a ready unit after two failed creations", e.clock, 250*time.Millisecond, func() bool { return e.ready() == 1 })
	destroyed := func(id string) bool {
		for _, c := range e.alloc.Calls() {
			if c.Method == "Destroy" && c.ID == id {
				return true
			}
		}
		return false
	}
	id := first.Load().(string)
	if u, ok := e.m.States().Get(id); !ok || u.State != manager.Failed || !u.Remains {
		t.Fatalf("unit %s after a creation with remains: %+v, want Failed with remains", id, u)
	}
	e.clock.Step(manager.RemainsRetry)
	eventually(t, "the remains destroyed", func() bool {
		_, ok := e.m.States().Get(id)
		return !ok && destroyed(id)
	})
	for _, c := range e.alloc.Calls() {
		if c.Method == "Destroy" && c.ID != id {
			t.Errorf("destroy of %s, whose creation cleaned up after itself", c.ID)
		}
	}
}

// Labels are capped in number and in total size: a request over either cap is refused with
// InvalidArgument before a unit is spent, and one at the caps is accepted.
func TestAllocateCapsLabels(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	ctx := context.Background()
	labels := func(n, valueBytes int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("l%02d", i)] = strings.Repeat("v", valueBytes)
		}
		return m
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   codes.Code
	}{
		{"at the caps", labels(manager.MaxLabels, manager.MaxLabelBytes/manager.MaxLabels-3), codes.OK},
		{"one label too many", labels(manager.MaxLabels+1, 1), codes.InvalidArgument},
		{"3.5 MB in small labels", labels(3500, 1000), codes.InvalidArgument},
		{"over the total size", labels(manager.MaxLabels, manager.MaxLabelBytes/manager.MaxLabels), codes.InvalidArgument},
		{"one value too long", map[string]string{"a": strings.Repeat("v", 1025)}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key, Labels: tc.labels})
			if status.Code(err) != tc.want {
				t.Fatalf("Allocate with %d labels = %v, want %v", len(tc.labels), err, tc.want)
			}
			if err == nil {
				e.m.Release(ctx, resp.SandboxId, resp.LeaseToken)
			} else if !strings.Contains(status.Convert(err).Message(), "label") {
				t.Errorf("error %q does not name the labels", status.Convert(err).Message())
			}
		})
	}
}

// Renew accepts exactly the lease TTLs Allocate accepts: a negative or malformed duration is
// InvalidArgument for both, and one over the maximum is capped by both.
func TestRenewChecksTTLAsAllocateDoes(t *testing.T) {
	e := newEnv(t, 1, func(o *manager.Options) { o.MaxLeaseTTL = time.Hour })
	e.start(t)
	ctx := context.Background()
	tests := []struct {
		name string
		ttl  *durationpb.Duration
		want codes.Code
	}{
		{"negative", durationpb.New(-time.Second), codes.InvalidArgument},
		{"seconds and nanos of opposite signs", &durationpb.Duration{Seconds: 60, Nanos: -1}, codes.InvalidArgument},
		{"nanos out of range", &durationpb.Duration{Seconds: 1, Nanos: 2_000_000_000}, codes.InvalidArgument},
		{"beyond a duration's range", &durationpb.Duration{Seconds: 400_000_000_000}, codes.InvalidArgument},
		{"over the maximum (capped)", durationpb.New(48 * time.Hour), codes.OK},
		{"none (the lease's own)", nil, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, aerr := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key, LeaseTtl: tc.ttl})
			if status.Code(aerr) != tc.want {
				t.Fatalf("Allocate = %v, want %v", aerr, tc.want)
			}
			a, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key, LeaseTtl: durationpb.New(time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			defer e.svc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: a.SandboxId, LeaseToken: a.LeaseToken})
			r, rerr := e.svc.Renew(ctx, &managerv1.RenewRequest{SandboxId: a.SandboxId, LeaseToken: a.LeaseToken, LeaseTtl: tc.ttl})
			if status.Code(rerr) != tc.want {
				t.Fatalf("Renew = %v, want %v (as Allocate)", rerr, tc.want)
			}
			if rerr == nil && r.LeaseExpires.AsTime().After(e.clock.Now().Add(time.Hour)) {
				t.Errorf("renewed until %v, beyond the maximum TTL", r.LeaseExpires.AsTime())
			}
		})
	}
}

// The sandbox's certificate comes back with the allocation as the sandbox sent it, for
// agents that pin through a root certificate.
func TestAllocateRelaysSandboxCertificate(t *testing.T) {
	cert := []byte("the sandbox's certificate, opaque to the manager")
	e := newEnv(t, 1, func(o *manager.Options) {
		o.Initializer = func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
			r, err := memalloc.Initializer(ctx, addr, req)
			r.SandboxCertificate = cert
			return r, err
		}
	})
	e.start(t)
	resp, err := e.svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.GetSandboxCertificate(), cert) {
		t.Fatalf("sandbox_certificate = %q, want %q", resp.GetSandboxCertificate(), cert)
	}
}

// ipOnly is an allocator whose egress binding takes IP addresses only (a plain-NetworkPolicy
// cluster): it refuses names through manager.EgressChecker.
type ipOnly struct {
	*memalloc.Allocator
	bound atomic.Int32
}

func (a *ipOnly) CheckEgress(allow []string) error {
	for _, e := range allow {
		if h := e[:strings.LastIndexByte(e, ':')]; net.ParseIP(strings.Trim(h, "[]")) == nil {
			return fmt.Errorf("%w: %q names a host; this cluster takes IP addresses only", manager.ErrInvalid, e)
		}
	}
	return nil
}

func (a *ipOnly) BindEgress(context.Context, string, []string) error { a.bound.Add(1); return nil }

// TestEgressCheckerRefusesBeforeSpendingAUnit: an allowlist the allocator cannot enforce is
// refused with InvalidArgument, naming the entry, and no unit is claimed or initialised.
func TestEgressCheckerRefusesBeforeSpendingAUnit(t *testing.T) {
	var inits atomic.Int32
	a := &ipOnly{Allocator: memalloc.New()}
	e := newEnv(t, 1, func(o *manager.Options) {
		o.Allocator = a
		o.Initializer = func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
			inits.Add(1)
			return memalloc.Initializer(ctx, addr, req)
		}
	})
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.m.States().Counts("")[manager.Ready] == 1 })
	_, err := e.svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"192.0.2.1:443", "pypi.org:443"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pypi.org:443") {
		t.Fatalf("Allocate = %v, want InvalidArgument naming pypi.org:443", err)
	}
	if inits.Load() != 0 || a.bound.Load() != 0 || e.m.States().Counts("")[manager.Ready] != 1 {
		t.Errorf("a unit was spent on the refused allowlist: %d inits, %d binds", inits.Load(), a.bound.Load())
	}
	if _, err := e.svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"192.0.2.1:443"}}); err != nil {
		t.Fatalf("IP-only allowlist: %v", err)
	}
}

// samples is how many observations histogram vector v holds for label value.
func samples(t *testing.T, v *prometheus.HistogramVec, value string) uint64 {
	t.Helper()
	var out dto.Metric
	if err := v.WithLabelValues(value).(prometheus.Histogram).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount()
}

func TestAllocationStepsAreTimed(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	eventually(t, "pool of 1", func() bool { return e.ready() == 1 })
	for _, s := range manager.Steps {
		if n := samples(t, e.met.AllocationSteps, s); n != 0 {
			t.Fatalf("step %s timed %d times before any allocation", s, n)
		}
	}
	if _, err := e.svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"api.example.com:443"}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range manager.Steps {
		if n := samples(t, e.met.AllocationSteps, s); n != 1 {
			t.Errorf("step %s timed %d times after one allocation, want 1", s, n)
		}
	}
}

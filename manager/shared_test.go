package manager_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

// replicas starts two managers on one shared pool: the first leads.
func replicas(t *testing.T, pool int) (*memalloc.Shared, *fakeClock, [2]*manager.Manager) {
	t.Helper()
	return replicasWith(t, pool, func(*manager.Options) {})
}

// replicasWith is replicas with each manager's options changed by opt.
func replicasWith(t *testing.T, pool int, opt func(*manager.Options)) (*memalloc.Shared, *fakeClock, [2]*manager.Manager) {
	t.Helper()
	a := memalloc.NewShared()
	c := newFakeClock(time.Unix(2_000_000, 0))
	var ms [2]*manager.Manager
	for i := range ms {
		leader := i == 0
		o := manager.Options{Allocator: a, Estimator: estimator.Fixed{N: pool}, Clock: c,
			Initializer: memalloc.Initializer, IsLeader: func() bool { return leader }, CreateConcurrency: 16,
			ReconcileInterval: 5 * time.Millisecond, AllocateWait: 10 * time.Second,
			Metrics: manager.NewMetrics(prometheus.NewRegistry())}
		opt(&o)
		m, err := manager.New(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(context.Background()) })
		ms[i] = m
	}
	return a, c, ms
}

// TestReplicasNeverBindTheSameUnit: 200 allocations through two replicas at once, each
// unit claimed with the lease's write (the default) or by a claim of its own
// (SeparateClaim), bind 200 distinct units, and each allocation's sandbox key is the one its
// own sFuse got: the initializer works once per unit, as a sandbox's fuse does, and no
// allocation fails on a unit another replica's sFuse reached first (sFuse runs beside the
// claim: the claim's winner, refused, destroys the unit and takes another).
func TestReplicasNeverBindTheSameUnit(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(map[bool]string{false: "one write", true: "separate claim"}[separate], func(t *testing.T) {
			var fuseMu sync.Mutex
			fused := map[string]string{} // init address -> the key its one sFuse returned
			once := func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
				r, err := memalloc.Initializer(ctx, addr, req)
				if err != nil {
					return r, err
				}
				fuseMu.Lock()
				defer fuseMu.Unlock()
				if _, blown := fused[addr]; blown {
					return sfuse.Result{}, fmt.Errorf("%s: %w", addr, sfuse.ErrBlown)
				}
				fused[addr] = string(r.SandboxKey)
				return r, nil
			}
			a, c, ms := replicasWith(t, 8, func(o *manager.Options) {
				o.Initializer, o.SeparateClaim = once, separate
				o.AllocateWait, o.ClaimGrace = time.Hour, time.Hour // the clock runs below
			})
			eventually(t, "shared pool filled by the leader", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 8 })
			key, _ := client.NewKey()
			ctx := context.Background()
			var mu sync.Mutex
			bound := map[string]int{}
			// The clock runs while the allocations do: once the leader's own allocations
			// are served, only its reconcile ticker refills the pool for the follower's
			// (a waiting allocation makes one unit of its own, which another may take).
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(time.Millisecond):
						c.Step(5 * time.Millisecond)
					}
				}
			}()
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Go(func() {
					al, err := ms[i%2].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
					if err != nil {
						t.Error(err)
						return
					}
					fuseMu.Lock()
					got := fused["mem://"+al.ID+"/init"]
					fuseMu.Unlock()
					if got != string(al.SandboxKey) {
						t.Errorf("%s handed out with a sandbox key its sFuse did not get", al.ID)
					}
					mu.Lock()
					bound[al.ID]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if len(bound) != 200 {
				t.Fatalf("%d distinct units for 200 allocations", len(bound))
			}
			for id, n := range bound {
				if n != 1 {
					t.Fatalf("%s bound %d times", id, n)
				}
			}
			oneWrite := 0
			for _, c := range a.Calls() {
				if c.Method == "ClaimBound" {
					oneWrite++
				}
			}
			// (Claim is also the leader's way to take a surplus unit to destroy.)
			if separate && oneWrite > 0 || !separate && oneWrite < 200 {
				t.Errorf("%d ClaimBound calls for 200 allocations", oneWrite)
			}
			t.Logf("%d ClaimBound calls for 200 allocations", oneWrite)
		})
	}
}

// TestLostClaimLeavesTheUnitAlone: a replica that picked a unit another replica then took
// allocates another unit and neither destroys nor rewrites the one it lost (its sFuse, which
// runs beside the claim, may have reached it: then the winner's is refused, see
// TestClaimWinnerDestroysAUnitFusedFirst).
func TestLostClaimLeavesTheUnitAlone(t *testing.T) {
	var fusedMu sync.Mutex
	var fused []string
	a, _, ms := replicasWith(t, 3, func(o *manager.Options) {
		o.Initializer = func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
			fusedMu.Lock()
			fused = append(fused, addr)
			fusedMu.Unlock()
			return memalloc.Initializer(ctx, addr, req)
		}
	})
	eventually(t, "pool", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 3 })
	ctx := context.Background()
	var lost string
	winner := map[string]string{"fusebox.dev/state": "bound", "winner": "yes"}
	var mu sync.Mutex
	a.SetFail(func(method, id string) error {
		mu.Lock()
		first := method == "ClaimBound" && lost == ""
		if first {
			lost = id
		}
		mu.Unlock()
		if !first {
			return nil
		}
		u, err := a.Lookup(ctx, id)
		if err == nil {
			err = a.ClaimBound(ctx, u, winner) // another replica wins it first
		}
		return err
	})
	key, _ := client.NewKey()
	al, err := ms[1].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	if lost == "" || al.ID == lost {
		t.Fatalf("allocated %s; lost %q: the race was not exercised", al.ID, lost)
	}
	u, err := a.Lookup(ctx, lost)
	if err != nil {
		t.Fatalf("the lost unit is gone: %v", err)
	}
	if u.Annotations["winner"] != "yes" {
		t.Errorf("the lost unit's annotations were rewritten: %v", u.Annotations)
	}
	for _, c := range a.Calls() {
		if c.Method == "Destroy" && c.ID == lost {
			t.Errorf("the replica that lost %s destroyed it", lost)
		}
	}
	fusedMu.Lock()
	defer fusedMu.Unlock()
	if want := "mem://" + al.ID + "/init"; !slices.Contains(fused, want) || len(fused) > 2 {
		t.Errorf("sFuse reached %v, want the allocated unit %s (and perhaps the lost one)", fused, al.ID)
	}
	for _, u := range ms[1].List() {
		if u.Info.ID == lost && u.State != manager.Bound {
			t.Errorf("the lost unit is listed %s by the replica that lost it", u.State)
		}
	}
}

// TestClaimWinnerDestroysAUnitFusedFirst: two replicas picked one unit, and the one that lost
// the claim blew the unit's fuse first (sFuse runs beside the claim). The claim's winner, its
// sFuse refused, destroys the unit (it is this replica's, and no agent of its can use it) and
// allocates another, as after a lost claim: a race, not a failure.
func TestClaimWinnerDestroysAUnitFusedFirst(t *testing.T) {
	var mu sync.Mutex
	var blown string
	a, _, ms := replicasWith(t, 3, func(o *manager.Options) {
		o.Initializer = func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
			mu.Lock()
			first := blown == ""
			if first {
				blown = addr // another replica's sFuse came first
			}
			mu.Unlock()
			if first {
				return sfuse.Result{}, fmt.Errorf("InitializeTLS on %s: %w", addr, sfuse.ErrBlown)
			}
			return memalloc.Initializer(ctx, addr, req)
		}
	})
	eventually(t, "pool", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 3 })
	key, _ := client.NewKey()
	al, err := ms[0].Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lost := strings.TrimSuffix(strings.TrimPrefix(blown, "mem://"), "/init")
	mu.Unlock()
	if lost == "" || al.ID == lost {
		t.Fatalf("allocated %s; blown %q: the race was not exercised", al.ID, lost)
	}
	eventually(t, "the blown unit destroyed", func() bool {
		return slices.ContainsFunc(a.Calls(), func(c memalloc.Call) bool { return c.Method == "Destroy" && c.ID == lost })
	})
	if n := ms[0].Status().Failures; n != 0 {
		t.Errorf("%d failures counted for a race", n)
	}
}

func TestAnyReplicaRenewsAndReleases(t *testing.T) {
	a, c, ms := replicas(t, 2)
	eventually(t, "pool", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 2 })
	key, _ := client.NewKey()
	ctx := context.Background()
	al, err := ms[1].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.Step(30 * time.Second)
	exp, err := ms[0].Renew(ctx, al.ID, al.LeaseToken, 0)
	if err != nil || !exp.Equal(c.Now().Add(time.Minute)) {
		t.Fatalf("renew on the other replica: %v %v", exp, err)
	}
	if _, err := ms[0].Renew(ctx, al.ID, "wrong", 0); err == nil {
		t.Fatal("renewed with a wrong token")
	}
	// Both replicas list it as bound.
	for i, m := range ms {
		if !slices.ContainsFunc(m.List(), func(u manager.Unit) bool { return u.Info.ID == al.ID && u.State == manager.Bound }) {
			t.Fatalf("replica %d does not list %s as bound", i, al.ID)
		}
	}
	if err := ms[0].Release(ctx, al.ID, al.LeaseToken); err != nil {
		t.Fatal(err)
	}
	eventually(t, "released unit destroyed", func() bool { return !slices.Contains(a.Units(), al.ID) })
}

func TestLeaderExpiresLeasesOfEveryReplica(t *testing.T) {
	a, c, ms := replicas(t, 1)
	eventually(t, "pool", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 1 })
	key, _ := client.NewKey()
	al, err := ms[1].Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.Step(2 * time.Minute)
	eventually(t, "expired unit destroyed by the leader", func() bool { return !slices.Contains(a.Units(), al.ID) })
}

func TestFollowerDoesNotSizeThePool(t *testing.T) {
	a := memalloc.NewShared()
	c := newFakeClock(time.Unix(0, 0))
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: 3}, Clock: c,
		Initializer: memalloc.Initializer, IsLeader: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	// A creation started would block in Create, so it shows in CreationsInFlight.
	a.SetFail(func(method, id string) error {
		if method == "Create" {
			<-t.Context().Done()
		}
		return nil
	})
	m.Reconcile(context.Background())
	if n := m.CreationsInFlight(); n != 0 {
		t.Fatalf("a follower started %d creations", n)
	}
}

// A unit the allocator reports as still being made ("creating": a pod not yet Ready) is not
// counted ready by a replica that did not create it: PoolStatus through any replica tells
// what can be claimed.
func TestEveryReplicaCountsUnitsBeingMadeAsCreating(t *testing.T) {
	a, _, ms := replicas(t, 2)
	eventually(t, "shared pool filled by the leader", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 2 })
	units, err := a.List(context.Background())
	if err != nil || len(units) < 2 {
		t.Fatalf("List: %d units, %v", len(units), err)
	}
	if err := a.Annotate(context.Background(), units[0].ID, map[string]string{manager.AnnotationState: "creating"}); err != nil {
		t.Fatal(err)
	}
	u := ms[1].Status().Units
	if u[manager.Creating.String()] != 1 || u[manager.Ready.String()] != len(units)-1 {
		t.Fatalf("the follower's pool status %v: want 1 creating and %d ready", u, len(units)-1)
	}
}

// TestEveryReplicaPreparesTheReadyUnitsInits: each replica keeps a prepared init connection
// to every ready unit of the shared pool, whichever replica made it, and forgets the one a
// unit had once any replica has taken it; an allocation's sFuse then runs on an open one.
func TestEveryReplicaPreparesTheReadyUnitsInits(t *testing.T) {
	var seen [2]fakeConns
	var replica atomic.Int32
	a, clk, ms := replicasWith(t, 3, func(o *manager.Options) {
		o.Initializer, o.Conns = nil, &seen[replica.Add(1)-1]
	})
	readyAddrs := func() map[string]bool {
		units, _ := a.List(context.Background())
		out := map[string]bool{}
		for _, u := range units {
			if u.Annotations[manager.AnnotationState] == "ready" {
				out[u.InitAddr] = true
			}
		}
		return out
	}
	same := func(c *fakeConns) bool {
		want := readyAddrs()
		return len(want) == 3 && maps.Equal(c.opened(), want)
	}
	// Every replica's reconcile ticks on the manager's clock.
	stepping(t, "both replicas prepared the 3 ready units", clk, 5*time.Millisecond, func() bool { return same(&seen[0]) && same(&seen[1]) })
	key, _ := client.NewKey()
	al, err := ms[1].Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	taken := "mem://" + al.ID + "/init" // memalloc's init address of the unit
	stepping(t, "the taken unit forgotten and its replacement prepared by both", clk, 5*time.Millisecond, func() bool {
		for i := range seen {
			if seen[i].opened()[taken] || !same(&seen[i]) {
				return false
			}
		}
		return true
	})
}

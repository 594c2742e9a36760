package manager_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

// replicas starts two managers on one shared pool: the first leads.
func replicas(t *testing.T, pool int) (*memalloc.Shared, *fakeClock, [2]*manager.Manager) {
	t.Helper()
	a := memalloc.NewShared()
	c := newFakeClock(time.Unix(2_000_000, 0))
	var ms [2]*manager.Manager
	for i := range ms {
		leader := i == 0
		m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: pool}, Clock: c,
			Initializer: memalloc.Initializer, IsLeader: func() bool { return leader }, CreateConcurrency: 16,
			ReconcileInterval: 5 * time.Millisecond, AllocateWait: 10 * time.Second,
			Metrics: manager.NewMetrics(prometheus.NewRegistry())})
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

func TestReplicasNeverBindTheSameUnit(t *testing.T) {
	a, _, ms := replicas(t, 8)
	eventually(t, "shared pool filled by the leader", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 8 })
	key, _ := client.NewKey()
	ctx := context.Background()
	var mu sync.Mutex
	bound := map[string]int{}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			al, err := ms[i%2].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
			if err != nil {
				t.Error(err)
				return
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
	a.Fail = func(method, id string) error {
		if method == "Create" {
			<-t.Context().Done()
		}
		return nil
	}
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

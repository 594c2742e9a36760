package kube

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// TestManagersOverKube runs two manager replicas on the kube allocator against the real API
// server: the leader keeps the shared pool of pods at its target, both replicas allocate
// (200 concurrent allocations over a pool of 40, no pod bound twice), a lease bound by one
// replica is renewed and released by the other, and the released pod is deleted. sFuse is the
// in-memory one: kwok's pods run no sandbox server (TestAllocateExecThroughKube backs pods
// with real runsc sandboxes).
func TestManagersOverKube(t *testing.T) {
	ns := env.Namespace(t)
	allocs := [2]*kubealloc.Allocator{newAllocator(t, ns, "replica-a", nil), newAllocator(t, ns, "replica-b", nil)}
	var ms [2]*manager.Manager
	for i := range ms {
		leader := i == 0
		m, err := manager.New(manager.Options{Allocator: allocs[i], Estimator: estimator.Fixed{N: 40}, Clock: manager.RealClock{},
			Initializer: memalloc.Initializer, IsLeader: func() bool { return leader }, CreateConcurrency: 8,
			ReconcileInterval: 20 * time.Millisecond, AllocateWait: 3 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(context.Background()) })
		ms[i] = m
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if r, _ := allocs[1].Counts(manager.DefaultTemplate); r >= 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader did not fill the pool: %v", ms[0].Status().Units)
		}
		time.Sleep(20 * time.Millisecond)
	}
	key, _ := client.NewKey()
	// 200 allocations, 160 of them waiting for pods the leader creates: what this checks is
	// that no pod is bound twice, not how fast; on a loaded 2-core machine they have taken
	// more than two minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var mu sync.Mutex
	bound := map[string]int{}
	var first manager.Allocation
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			a, err := ms[i%2].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Hour,
				Egress: []string{"api.example.com:443"}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			bound[a.ID]++
			if i == 1 {
				first = a
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(bound) != 200 {
		t.Fatalf("%d distinct pods bound by 200 allocations", len(bound))
	}
	for id, n := range bound {
		if n != 1 {
			t.Fatalf("pod %s bound %d times", id, n)
		}
	}
	// first was allocated by replica b (i == 1); replica a renews and releases it.
	if _, err := ms[0].Renew(ctx, first.ID, first.LeaseToken, 0); err != nil {
		t.Fatalf("renewing on the other replica: %v", err)
	}
	if err := ms[0].Release(ctx, first.ID, first.LeaseToken); err != nil {
		t.Fatalf("releasing on the other replica: %v", err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		units, _ := allocs[0].List(ctx)
		if !slices.ContainsFunc(units, func(u manager.UnitInfo) bool { return u.ID == first.ID }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released pod %s still listed", first.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaderCollectsOrphanedClaims: a replica that claimed a pod and died before binding it
// leaves the pod claimed forever; the leader destroys it once the claim is older than the
// grace period.
func TestLeaderCollectsOrphanedClaims(t *testing.T) {
	ns := env.Namespace(t)
	dead := newAllocator(t, ns, "replica-dead", nil)
	live := newAllocator(t, ns, "replica-live", nil)
	createPool(t, dead, "orph", 2, live)
	ctx := testenv.Context(t, 2*time.Minute)
	orphan, err := dead.Claim(ctx, manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Options{Allocator: live, Estimator: estimator.Fixed{N: 0}, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, ClaimGrace: 500 * time.Millisecond, ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := live.Lookup(ctx, orphan.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphaned claim %s not collected", orphan.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

// awaitWarm, which the Manager service's readiness waits on, returns only once the pool has
// held a ready unit: not while every creation fails, and at once for a pool sized 0.
func TestAwaitWarm(t *testing.T) {
	var allow atomic.Bool
	a := memalloc.New()
	a.NoRecord = true
	a.SetFail(func(method, _ string) error {
		if method == "Create" && !allow.Load() {
			return errors.New("no capacity yet")
		}
		return nil
	})
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: 1}, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, ReconcileInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	if err := awaitWarm(ctx, m, 0); err != nil {
		t.Fatalf("a pool sized 0: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- awaitWarm(ctx, m, 1) }()
	// While creations fail the pool holds no ready unit; awaitWarm must still be waiting
	// after the manager has tried (and failed) to create one.
	for m.Status().Failures == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("awaitWarm returned (%v) with no ready unit", err)
	default:
	}
	allow.Store(true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := m.Status().Units[manager.Ready.String()]; n == 0 {
		t.Fatalf("awaitWarm returned with %d ready units", n)
	}

	// The pool's one ready unit is allocated before a look at the pool sees it, and no
	// other can be created: the unit served still counts as the pool having held one.
	allow.Store(false)
	k, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: k.PublicKey()}); err != nil {
		t.Fatal(err)
	}
	if n := m.Status().Units[manager.Ready.String()]; n != 0 {
		t.Fatalf("%d ready units after the allocation, want 0", n)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := awaitWarm(wctx, m, 1); err != nil {
		t.Fatalf("awaitWarm after a unit was served: %v", err)
	}
	cancel()
}

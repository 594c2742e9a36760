package manager_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// exitingAlloc is memalloc with an ExitWatcher: exit reports that a unit ended on its own.
type exitingAlloc struct {
	*memalloc.Allocator
	mu     sync.Mutex // guards exited
	exited func(id, reason string)
}

var _ manager.ExitWatcher = (*exitingAlloc)(nil)

func (a *exitingAlloc) Capabilities() manager.Capabilities {
	c := a.Allocator.Capabilities()
	c.Exits = true
	return c
}

func (a *exitingAlloc) WatchExits(f func(id, reason string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exited = f
}

func (a *exitingAlloc) exit(id, reason string) {
	a.mu.Lock()
	f := a.exited
	a.mu.Unlock()
	f(id, reason)
}

func TestUnitThatEndsOnItsOwnIsMarkedFailed(t *testing.T) {
	a := &exitingAlloc{Allocator: memalloc.New()}
	e := newEnv(t, 2, func(o *manager.Options) { o.Allocator = a })
	e.start(t)
	eventually(t, "pool of 2", func() bool { return e.ready() == 2 })
	ctx := context.Background()
	resp, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.SandboxId

	// A bound unit's sandbox dies: the unit is Failed with the reason, listed so, and
	// destroyed; its lease can no longer be renewed.
	a.exit(id, "sandbox process 42 exited")
	eventually(t, "the dead unit destroyed", func() bool { return !contains(a.Units(), id) })
	u, ok := e.m.States().Get(id)
	if !ok || u.State != manager.Failed || !strings.Contains(u.Err, "sandbox process 42 exited") {
		t.Fatalf("dead bound unit: %+v (known %v); want Failed with the reason", u, ok)
	}
	list, err := e.svc.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list.GetSandboxes() {
		if s.GetSandboxId() == id {
			found = true
			if s.GetState() != managerv1.UnitState_UNIT_STATE_FAILED || !strings.Contains(s.GetError(), "exited") {
				t.Errorf("List shows the dead unit as %q (%q), want failed with the reason", s.GetState(), s.GetError())
			}
		}
	}
	if !found {
		t.Errorf("List does not show the dead unit")
	}
	if _, err := e.svc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: resp.LeaseToken}); err == nil {
		t.Error("renewing the lease of a dead unit succeeded")
	}

	// A ready unit's sandbox dies: it is destroyed and the pool refilled.
	ready := e.m.States().OldestReady(manager.DefaultTemplate, 1)
	if len(ready) != 1 {
		t.Fatalf("ready units: %v", ready)
	}
	a.exit(ready[0], "sandbox process 43 exited")
	eventually(t, "the dead ready unit replaced", func() bool {
		_, known := e.m.States().Get(ready[0])
		return !known && !contains(a.Units(), ready[0]) && e.ready() == 2
	})
	// Reports about unknown or already destroyed units change nothing.
	a.exit("fbx-000000000000", "unknown")
	a.exit(id, "again")
	if u, _ := e.m.States().Get(id); !strings.Contains(u.Err, "42") {
		t.Errorf("a second report changed the failed unit: %+v", u)
	}
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

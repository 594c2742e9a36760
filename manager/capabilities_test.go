package manager_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// withoutEgress hides the memory allocator's EgressBinder but declares egress all the same.
type withoutEgress struct{ manager.Allocator }

func (withoutEgress) Capabilities() manager.Capabilities {
	return manager.Capabilities{Egress: true}
}

// syncBuffer is a log sink safe for the manager's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// An allocation with an egress allowlist on an allocator that does not declare egress fails
// closed with FailedPrecondition and spends no unit; one without an allowlist is served. The
// declaration decides, not the interfaces: the memory allocator still implements
// EgressBinder here, and it is never called.
func TestEgressFailsClosedWithoutTheCapability(t *testing.T) {
	e := newEnv(t, 1, func(o *manager.Options) {
		o.Allocator.(*memalloc.Allocator).Caps = &manager.Capabilities{Adoption: true} // read by New
	})
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.ready() == 1 })
	ctx := context.Background()
	_, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"api.example.com:443"}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot enforce egress") {
		t.Fatalf("Allocate with egress on an allocator without egress = %v, want FailedPrecondition saying egress cannot be enforced", err)
	}
	if n := e.m.States().Counts("")[manager.Bound]; n != 0 {
		t.Fatalf("%d units bound by a refused request", n)
	}
	a, err := e.svc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatalf("Allocate without egress: %v", err)
	}
	for _, c := range e.alloc.Calls() {
		if c.Method == "BindEgress" {
			t.Errorf("BindEgress called on an allocator that does not declare egress: %+v", c)
		}
	}
	e.svc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: a.SandboxId, LeaseToken: a.LeaseToken})
}

// An allocator without isolation (the insecure process runtime) is served an allowlist it
// cannot enforce, loudly: every allocation logs a warning that egress is not enforced.
func TestNoIsolationWarnsOnEveryAllocation(t *testing.T) {
	var logs syncBuffer
	e := newEnv(t, 1, func(o *manager.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		o.Allocator.(*memalloc.Allocator).Caps = &manager.Capabilities{Adoption: true, NoIsolation: true}
	})
	e.start(t)
	ctx := context.Background()
	for i := range 2 {
		a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"api.example.com:443"}})
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		e.m.Release(ctx, a.ID, a.LeaseToken)
	}
	out := logs.String()
	if n := strings.Count(out, "INSECURE"); n != 2 || !strings.Contains(out, "egress_not_enforced=[api.example.com:443]") {
		t.Fatalf("%d INSECURE warnings for 2 allocations, want 2 naming the unenforced allowlist; log:\n%s", n, out)
	}
}

// exitingShared is a shared pool that also implements ExitWatcher.
type exitingShared struct{ *memalloc.Shared }

func (exitingShared) WatchExits(func(id, reason string)) {}

// draining is an allocator that implements OutdatedDrainer.
type draining struct{ *memalloc.Allocator }

func (draining) DrainOutdated(context.Context, time.Time) ([]string, error) { return nil, nil }

// New refuses an allocator that declares a feature it does not implement, exits with a
// shared pool, or template versions without one.
func TestNewRefusesADeclarationWithoutItsInterface(t *testing.T) {
	for name, alloc := range map[string]manager.Allocator{
		"egress without EgressBinder": withoutEgress{memalloc.New()},
		"exits without ExitWatcher": func() manager.Allocator {
			a := memalloc.New()
			a.Caps = &manager.Capabilities{Egress: true, Adoption: true, Exits: true}
			return a
		}(),
		"exits with a shared pool": func() manager.Allocator {
			s := memalloc.NewShared()
			s.Caps = &manager.Capabilities{Egress: true, Adoption: true, SharedPool: true, Exits: true}
			return exitingShared{s}
		}(),
		"versions without OutdatedDrainer": func() manager.Allocator {
			s := memalloc.NewShared()
			s.Caps = &manager.Capabilities{Egress: true, Adoption: true, SharedPool: true, Versions: true}
			return s
		}(),
		"versions without a shared pool": func() manager.Allocator {
			a := memalloc.New()
			a.Caps = &manager.Capabilities{Egress: true, Adoption: true, Versions: true}
			return draining{a}
		}(),
		"shared pool without adoption": func() manager.Allocator {
			s := memalloc.NewShared()
			s.Caps = &manager.Capabilities{Egress: true}
			return s
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := manager.New(manager.Options{Allocator: alloc, Estimator: estimator.Fixed{N: 1}, Clock: newFakeClock(time.Unix(0, 0)),
				Initializer: memalloc.Initializer})
			if err == nil {
				t.Fatal("New accepted it")
			}
			t.Log(err)
		})
	}
}

package manager_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// earlyAlloc is an in-memory allocator whose units keep a data connection opened before sFuse
// (it declares EarlyNaming).
type earlyAlloc struct{ *memalloc.Allocator }

func (a earlyAlloc) Capabilities() manager.Capabilities {
	c := a.Allocator.Capabilities()
	c.EarlyNaming = true
	return c
}

// identities stands in for the sandboxes' identities: Identify tells each unit's, and sFuse
// answers with it, or with another key when wrong is set.
type identities struct {
	mu    sync.Mutex
	ids   map[string]initconns.Identity
	wrong bool
	asked int // Identify calls
}

func (s *identities) identity(addr string) (initconns.Identity, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.ids[addr]; ok {
		return id, nil
	}
	k, err := client.NewKey()
	if err != nil {
		return initconns.Identity{}, err
	}
	id := initconns.Identity{SandboxKey: k.PublicKey(), SandboxCertificate: []byte("certificate of " + addr)}
	s.ids[addr] = id
	return id, nil
}

func (s *identities) initialize(_ context.Context, addr string, _ sfuse.Request) (sfuse.Result, error) {
	id, err := s.identity(addr)
	if err != nil {
		return sfuse.Result{}, err
	}
	s.mu.Lock()
	wrong := s.wrong
	s.mu.Unlock()
	if wrong {
		k, _ := client.NewKey()
		id.SandboxKey = k.PublicKey()
	}
	return sfuse.Result{SandboxKey: id.SandboxKey, SandboxCertificate: id.SandboxCertificate}, nil
}

// eventStream collects what AllocateStream sends.
type eventStream struct {
	grpc.ServerStream
	ctx    context.Context
	events []*managerv1.AllocateEvent
}

func (s *eventStream) Context() context.Context { return s.ctx }

func (s *eventStream) Send(ev *managerv1.AllocateEvent) error {
	s.events = append(s.events, ev)
	return nil
}

func newEarlyEnv(t *testing.T, earlyNaming bool) (*env, *identities) {
	t.Helper()
	ids := &identities{ids: map[string]initconns.Identity{}}
	e := newEnv(t, 1, func(o *manager.Options) {
		if earlyNaming {
			o.Allocator = earlyAlloc{o.Allocator.(*memalloc.Allocator)}
		}
		o.Initializer, o.Conns = nil, &fakeConns{initialize: ids.initialize,
			identify: func(_ context.Context, addr string) (initconns.Identity, error) {
				ids.mu.Lock()
				ids.asked++
				ids.mu.Unlock()
				return ids.identity(addr)
			}}
	})
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.ready() == 1 })
	return e, ids
}

func allocateStream(e *env, req *managerv1.AllocateRequest) ([]*managerv1.AllocateEvent, error) {
	s := &eventStream{ctx: auth.NewContext(context.Background(), e.svc.id)}
	err := e.svc.s.AllocateStream(req, s)
	return s.events, err
}

// An allocation from a unit that keeps an early connection names the unit, with the identity
// it told while in the pool, before sFuse; the answer follows with the same identity.
func TestAllocateStreamNamesThePickedUnitFirst(t *testing.T) {
	e, _ := newEarlyEnv(t, true)
	evs, err := allocateStream(e, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].GetPicked() == nil || evs[1].GetAllocated() == nil {
		t.Fatalf("events %v, want picked then allocated", evs)
	}
	p, a := evs[0].GetPicked(), evs[1].GetAllocated()
	if p.GetSandboxId() != a.GetSandboxId() || p.GetEndpoint() != a.GetEndpoint() ||
		!bytes.Equal(p.GetSandboxPublicKey(), a.GetSandboxPublicKey()) ||
		!bytes.Equal(p.GetSandboxCertificate(), a.GetSandboxCertificate()) || len(p.GetSandboxCertificate()) == 0 {
		t.Fatalf("picked %v and allocated %v differ", p, a)
	}
	if a.GetLeaseToken() == "" {
		t.Fatal("the answer carries no lease token")
	}
}

// With early naming off (no Capabilities.EarlyNaming) no unit is asked for its identity and
// nothing is named before the answer, and the unary Allocate never names anything.
func TestAllocateStreamWithoutEarlyNamingOnlyAnswers(t *testing.T) {
	e, ids := newEarlyEnv(t, false)
	evs, err := allocateStream(e, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].GetAllocated() == nil {
		t.Fatalf("events %v, want the answer alone", evs)
	}
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.asked != 0 {
		t.Errorf("units were asked for their identity %d times, want none", ids.asked)
	}
}

// A sandbox whose sFuse answer is not the identity it told is not handed out: every unit
// tried was named, none is bound, and the error is the allocator's.
func TestAllocateStreamRefusesAnotherIdentityAfterSFuse(t *testing.T) {
	e, ids := newEarlyEnv(t, true)
	ids.mu.Lock()
	ids.wrong = true
	ids.mu.Unlock()
	evs, err := allocateStream(e, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err %v, want Unavailable", err)
	}
	seen := map[string]bool{}
	for _, ev := range evs {
		if ev.GetPicked() == nil {
			t.Fatalf("event %v before the error, want picked ones only", ev)
		}
		seen[ev.GetPicked().GetSandboxId()] = true
	}
	if len(seen) != 3 {
		t.Fatalf("%d units named, want the 3 tried", len(seen))
	}
	for _, u := range e.m.List() {
		if u.State == manager.Bound {
			t.Fatalf("unit %s was bound", u.Info.ID)
		}
	}
}

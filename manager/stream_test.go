package manager_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/manager/auth"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

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

func allocateStream(e *env, req *managerv1.AllocateRequest) ([]*managerv1.AllocateEvent, error) {
	s := &eventStream{ctx: auth.NewContext(context.Background(), e.svc.id)}
	err := e.svc.s.AllocateStream(req, s)
	return s.events, err
}

// AllocateStream, kept for the clients that call it, sends the answer alone: no unit is
// named before sFuse.
func TestAllocateStreamOnlyAnswers(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	eventually(t, "a ready unit", func() bool { return e.ready() == 1 })
	evs, err := allocateStream(e, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].GetAllocated() == nil {
		t.Fatalf("events %v, want the answer alone", evs)
	}
	if a := evs[0].GetAllocated(); a.GetSandboxId() == "" || a.GetLeaseToken() == "" || len(a.GetSandboxPublicKey()) == 0 {
		t.Fatalf("answer %v lacks the sandbox, its key or the lease token", a)
	}
}

// A refused AllocateStream sends nothing and ends with the error Allocate would return.
func TestAllocateStreamRefusalSendsNothing(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	evs, err := allocateStream(e, &managerv1.AllocateRequest{AgentPublicKey: []byte("not a key")})
	if status.Code(err) != codes.InvalidArgument || len(evs) != 0 {
		t.Fatalf("events %v, err %v; want none and InvalidArgument", evs, err)
	}
}

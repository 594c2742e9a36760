package client

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// refusing is a manager that records each Allocate request and refuses it.
type refusing struct {
	managerv1.UnimplementedManagerServer
	mu   sync.Mutex
	reqs []*managerv1.AllocateRequest
}

func (r *refusing) Allocate(_ context.Context, req *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	return nil, status.Error(codes.ResourceExhausted, "no capacity")
}

// serveUnix serves a gRPC server, its services registered by register, on a unix socket
// until the test ends, and returns its address (unix:///path).
func serveUnix(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "grpc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return "unix://" + sock
}

// Every allocation through a kept Manager gets a fresh key unless the agent brings its own,
// and Close leaves nothing running.
func TestManagerMakesAFreshKeyPerAllocation(t *testing.T) {
	leakcheck.Check(t)
	fake := &refusing{}
	addr := serveUnix(t, func(srv *grpc.Server) { managerv1.RegisterManagerServer(srv, fake) })

	m, err := NewManager(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	own, _ := NewKey()
	for i := range 4 {
		o := AllocateOptions{}
		if i == 2 {
			o.Key = own // an agent's own key is used as given
		}
		if _, err := m.Allocate(context.Background(), o); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("allocation %d: %v, want the manager's refusal", i, err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(fake.reqs))
	}
	if !bytes.Equal(fake.reqs[2].GetAgentPublicKey(), own.PublicKey()) {
		t.Error("the agent's own key was not the one sent")
	}
	for i, a := range fake.reqs {
		for j, b := range fake.reqs[:i] {
			if bytes.Equal(a.GetAgentPublicKey(), b.GetAgentPublicKey()) {
				t.Errorf("requests %d and %d share an agent key", j, i)
			}
		}
	}
}

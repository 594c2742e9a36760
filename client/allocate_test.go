package client

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// A kept Manager makes each allocation's key and ClientHello ahead of it; every allocation
// still gets a fresh key and its own handshake, and Close leaves nothing running.
func TestManagerPreparesAFreshHandshakePerAllocation(t *testing.T) {
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
		if len(a.GetTlsClientHello()) == 0 || a.GetTlsClientHello()[0] != 0x16 {
			t.Errorf("request %d carries no ClientHello", i)
		}
		for j, b := range fake.reqs[:i] {
			if bytes.Equal(a.GetAgentPublicKey(), b.GetAgentPublicKey()) {
				t.Errorf("requests %d and %d share an agent key", j, i)
			}
			if bytes.Equal(a.GetTlsClientHello(), b.GetTlsClientHello()) {
				t.Errorf("requests %d and %d share a ClientHello", j, i)
			}
		}
	}
}

// The next allocation's handshake is not made while this allocation's first call is on its
// way: it starts when that call has returned or, without a call, prepareAfter later.
func TestNextHandshakeWaitsForTheFirstCall(t *testing.T) {
	leakcheck.Check(t)
	addr := serveUnix(t, func(srv *grpc.Server) { managerv1.RegisterManagerServer(srv, &refusing{}) })
	m, err := NewManager(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitPrepared := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.next.Load() == nil {
			if time.Now().After(deadline) {
				t.Fatal("no handshake was made ahead")
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitPrepared()
	if _, err := m.Allocate(context.Background(), AllocateOptions{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Allocate: %v, want the manager's refusal", err)
	}
	if m.next.Load() != nil || m.preparing.Load() {
		t.Fatal("the next handshake was started as the allocation returned")
	}
	waitPrepared() // prepareAfter later, since no call came
}

// firstCall runs its function once: after the first unary call returns or the first stream
// opens, or when run is called first.
func TestFirstCallRunsOnce(t *testing.T) {
	leakcheck.Check(t)
	addr := serveUnix(t, func(srv *grpc.Server) { healthpb.RegisterHealthServer(srv, health.NewServer()) })
	ctx := context.Background()
	for _, first := range []string{"unary", "stream", "run"} {
		var n atomic.Int32
		f := &firstCall{fn: func() { n.Add(1) }}
		conn, err := grpc.NewClient(addr, append(f.dialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		if n.Load() != 0 {
			t.Fatalf("%s: ran before any call", first)
		}
		hc := healthpb.NewHealthClient(conn)
		switch first {
		case "unary":
			if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
		case "stream":
			sctx, cancel := context.WithCancel(ctx)
			if _, err := hc.Watch(sctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			cancel()
		case "run":
			f.run()
		}
		if n.Load() != 1 {
			t.Fatalf("%s first: ran %d times, want 1", first, n.Load())
		}
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		f.run()
		if n.Load() != 1 {
			t.Fatalf("%s first, then more calls: ran %d times, want 1", first, n.Load())
		}
		conn.Close()
	}
	var none *firstCall
	if opts := none.dialOptions(); opts != nil {
		t.Errorf("a nil firstCall has dial options %v", opts)
	}
}

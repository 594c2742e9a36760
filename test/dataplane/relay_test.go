package dataplane

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// oneSandbox is a manager that hands out one gVisor sandbox: sFuse through the real init
// socket, relaying the agent's ClientHello unless it plays a manager from before the relay.
type oneSandbox struct {
	managerv1.UnimplementedManagerServer
	initAddr, dataAddr string
	relay              bool
}

func (m *oneSandbox) Allocate(ctx context.Context, req *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	sreq := sfuse.Request{AgentKey: req.GetAgentPublicKey()}
	if m.relay {
		sreq.TLSClientHello = req.GetTlsClientHello()
	}
	res, err := sfuse.Initialize(ctx, m.initAddr, sreq)
	if err != nil {
		return nil, err
	}
	return &managerv1.AllocateResponse{SandboxId: "one", Endpoint: m.dataAddr, SandboxPublicKey: res.SandboxKey,
		LeaseExpires: timestamppb.New(time.Now().Add(time.Hour)), LeaseToken: "t", TlsServerFlight: res.TLSServerFlight}, nil
}

func (m *oneSandbox) Release(context.Context, *managerv1.ReleaseRequest) (*managerv1.ReleaseResponse, error) {
	return &managerv1.ReleaseResponse{}, nil
}

// The client continues the handshake the manager relayed, and makes a full one of its own
// when the manager relays none (a manager or sandbox from before the relay): either way the
// sandbox serves the agent, under gVisor.
func TestClientWithAndWithoutRelayedHandshake(t *testing.T) {
	for _, relay := range []bool{true, false} {
		t.Run(map[bool]string{true: "relayed", false: "full handshake"}[relay], func(t *testing.T) {
			sb := sandboxtest.Start(t, sandboxtest.Options{})
			sock := filepath.Join(t.TempDir(), "manager.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			managerv1.RegisterManagerServer(srv, &oneSandbox{initAddr: sb.InitAddr, dataAddr: sb.DataAddr, relay: relay})
			go srv.Serve(ln)
			defer srv.Stop()

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var answered, finished time.Time
			var sentNs atomic.Int64 // set on the connection's writer
			relayed := false
			trace := &client.AllocateTrace{
				Answered:         func(at time.Time) { answered = at },
				RelayedHandshake: func(at time.Time) { relayed, finished = true, at },
				FirstWrite:       func(at time.Time) { sentNs.Store(at.UnixNano()) },
			}
			start := time.Now()
			a, err := client.Allocate(ctx, "unix://"+sock, client.AllocateOptions{Trace: trace})
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			defer a.Close()
			if relayed != relay {
				t.Errorf("relayed handshake continued: %v, want %v", relayed, relay)
			}
			if answered.Before(start) {
				t.Errorf("trace: answered at %v, before the allocation began at %v", answered, start)
			}
			if relay == finished.IsZero() || relay && finished.Before(answered) {
				t.Errorf("trace: relayed handshake finished at %v (answered %v); want it set, after the answer, only when relayed", finished, answered)
			}
			res, err := a.Exec(ctx, client.Command{Script: "echo served"})
			if err != nil || string(res.Stdout) != "served\n" {
				t.Fatalf("exec: %v %q", err, res.Stdout)
			}
			sent := time.Unix(0, sentNs.Load())
			if relay == (sentNs.Load() == 0) || relay && sent.Before(finished) {
				t.Errorf("trace: first write at %v (finished %v); want it set, after the handshake, only when relayed", sent, finished)
			}
		})
	}
}

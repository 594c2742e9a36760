package dataplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// oneSandbox is a manager that hands out one gVisor sandbox, by InitializeTLS on its real
// init socket. With hello set it plays a manager of an earlier release, which sent a
// ClientHello in field 2 of the request (reserved since).
type oneSandbox struct {
	managerv1.UnimplementedManagerServer
	initAddr, dataAddr string
	hello              []byte
}

func (m *oneSandbox) Allocate(ctx context.Context, req *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	conn, err := grpc.NewClient(m.initAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	sreq := &sandboxv1.InitializeTLSRequest{AgentPublicKey: req.GetAgentPublicKey()}
	if m.hello != nil {
		sreq.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), m.hello))
	}
	res, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx, sreq)
	if err != nil {
		return nil, err
	}
	if extra := res.ProtoReflect().GetUnknown(); len(extra) > 0 {
		return nil, fmt.Errorf("InitializeTLS answered %d bytes of fields it no longer has (a TLS flight)", len(extra))
	}
	return &managerv1.AllocateResponse{SandboxId: "one", Endpoint: m.dataAddr, SandboxPublicKey: res.GetSandboxPublicKey(),
		LeaseExpires: timestamppb.New(time.Now().Add(time.Hour)), LeaseToken: "t"}, nil
}

func (m *oneSandbox) Release(context.Context, *managerv1.ReleaseRequest) (*managerv1.ReleaseResponse, error) {
	return &managerv1.ReleaseResponse{}, nil
}

// The client allocates through a manager and serves its first call over its own handshake,
// under gVisor; its trace hooks run in order. A manager of an earlier release that sends a
// ClientHello in InitializeTLS gets no TLS flight back, and the agent is served all the same.
func TestClientAllocatesThroughAManager(t *testing.T) {
	key, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tlspin.Certificate(key)
	if err != nil {
		t.Fatal(err)
	}
	hello := tlspintest.ClientHello(t, tlspin.ClientConfigPin(func() (tls.Certificate, error) { return cert, nil }, &tlspin.Pin{}))
	for name, hello := range map[string][]byte{"manager": nil, "earlier manager sending a ClientHello": hello} {
		t.Run(name, func(t *testing.T) {
			sb := sandboxtest.Start(t, sandboxtest.Options{})
			sock := filepath.Join(t.TempDir(), "manager.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			managerv1.RegisterManagerServer(srv, &oneSandbox{initAddr: sb.InitAddr, dataAddr: sb.DataAddr, hello: hello})
			go srv.Serve(ln)
			defer srv.Stop()

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var answered time.Time
			var connectedNs atomic.Int64 // set on gRPC's dialing goroutine
			trace := &client.AllocateTrace{
				Answered:  func(at time.Time) { answered = at },
				Connected: func(at time.Time) { connectedNs.Store(at.UnixNano()) },
			}
			start := time.Now()
			a, err := client.Allocate(ctx, "unix://"+sock, client.AllocateOptions{Trace: trace})
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			defer a.Close()
			res, err := a.Exec(ctx, client.Command{Script: "echo served"})
			if err != nil || string(res.Stdout) != "served\n" {
				t.Fatalf("exec: %v %q", err, res.Stdout)
			}
			connected := time.Unix(0, connectedNs.Load())
			if answered.Before(start) || connected.Before(answered) {
				t.Errorf("trace: began %v, answered %v, connected %v; want them in that order", start, answered, connected)
			}
		})
	}
}

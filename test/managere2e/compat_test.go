package managere2e

import (
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// An agent of an earlier release sends its ClientHello in Allocate (field 6, reserved since)
// and continues the handshake only if the answer carries the sandbox's TLS flight (field 6
// too): the manager, with every accelerator on, ignores the hello and answers no flight, and
// the agent's full handshake reaches the sandbox.
func TestClientHelloFromAnEarlierAgentIsIgnored(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1, KeepAwake: true})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)

	key := sandboxtest.NewKey(t)
	cert, err := tlspin.Certificate(key.Signer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlspin.ClientConfigPin(func() (tls.Certificate, error) { return cert, nil }, &tlspin.Pin{})
	req := &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTtl: durationpb.New(time.Minute)}
	req.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), tlspintest.ClientHello(t, cfg)))
	resp, err := mc.Allocate(ctx, req)
	if err != nil {
		t.Fatalf("Allocate with a ClientHello: %v", err)
	}
	defer mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.GetSandboxId(), LeaseToken: resp.GetLeaseToken()})
	if extra := resp.ProtoReflect().GetUnknown(); len(extra) > 0 {
		t.Fatalf("the answer carries %d bytes of fields it no longer has (a TLS flight): %x", len(extra), extra)
	}
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatalf("dialing %s: %v", resp.GetEndpoint(), err)
	}
	defer sb.Close()
	if out := sandboxtest.Sh(t, ctx, sb, "echo full"); out != "full\n" {
		t.Errorf("exec after a full handshake: %q", out)
	}
}

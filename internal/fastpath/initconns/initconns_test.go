package initconns

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/fuse"
)

// A prepared connection carries the unit's ping and its one sFuse, and is gone after it: a
// second Initialize dials afresh and finds the init socket closed.
func TestPreparedConnectionCarriesOneSFuse(t *testing.T) {
	dir := t.TempDir()
	initPath, dataPath := filepath.Join(dir, "init.sock"), filepath.Join(dir, "data.sock")
	dataLn, err := net.Listen("unix", dataPath)
	if err != nil {
		t.Fatal(err)
	}
	initLn, err := net.Listen("unix", initPath)
	if err != nil {
		t.Fatal(err)
	}
	key, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	id, err := tlspin.Certificate(key)
	if err != nil {
		t.Fatal(err)
	}
	start := func(context.Context, *sandboxv1.InitializeTLSRequest, credentials.TransportCredentials) (func(net.Listener), error) {
		return func(ln net.Listener) { <-t.Context().Done(); ln.Close() }, nil
	}
	f, err := fuse.New(dataLn, fuse.Options{Identity: id, IdleTTL: time.Minute, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Close() })
	go f.Serve(ctx, initLn)

	addr := "unix://" + initPath
	var c Conns
	c.Forget(addr) // nothing prepared: nothing to do
	c.Prepare(addr)
	if err := c.Ping(ctx, addr); err != nil {
		t.Fatalf("ping over the prepared connection: %v", err)
	}
	agent, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tlspin.MarshalPublicKey(agent.Public())
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Initialize(ctx, addr, sfuse.Request{AgentKey: der})
	if err != nil {
		t.Fatalf("sFuse over the prepared connection: %v", err)
	}
	if want, _ := tlspin.MarshalPublicKey(key.Public()); string(res.SandboxKey) != string(want) {
		t.Fatal("sFuse answered another key than the sandbox's")
	}
	c.mu.Lock()
	left := len(c.m)
	c.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d prepared connections kept after the unit's sFuse", left)
	}
	if _, err := c.Initialize(ctx, addr, sfuse.Request{AgentKey: der}); err == nil {
		t.Fatal("a second sFuse succeeded")
	}
	if err := c.Ping(ctx, addr); err == nil {
		t.Fatal("ping after the fuse blew succeeded")
	}
}

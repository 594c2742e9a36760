// Package sfuse is the manager's side of the sFuse handshake: one InitializeTLS call on a
// sandbox's init listener, which pins the agent's key and returns the sandbox's.
package sfuse

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Initialize calls InitializeTLS on the sandbox's init listener at initAddr with the agent's
// public key (DER SubjectPublicKeyInfo) and returns the sandbox's public key. The init channel
// carries no secrets (public keys only) and is reachable only by the manager, so it is not
// encrypted. Nothing is kept: the caller hands the key to the agent.
func Initialize(ctx context.Context, initAddr string, agentKey []byte) ([]byte, error) {
	a, err := endpoint.Parse(initAddr)
	if err != nil {
		return nil, fmt.Errorf("init address: %w", err)
	}
	conn, err := grpc.NewClient(a.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dialing init listener %s: %w", a, err)
	}
	defer conn.Close()
	return initialize(ctx, conn, a.String(), agentKey)
}

func initialize(ctx context.Context, conn *grpc.ClientConn, addr string, agentKey []byte) ([]byte, error) {
	resp, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx, &sandboxv1.InitializeTLSRequest{AgentPublicKey: agentKey})
	if err != nil {
		return nil, fmt.Errorf("InitializeTLS on %s: %w", addr, err)
	}
	if _, err := tlspin.ParsePublicKey(resp.GetSandboxPublicKey()); err != nil {
		return nil, fmt.Errorf("InitializeTLS on %s returned a bad key: %w", addr, err)
	}
	return resp.GetSandboxPublicKey(), nil
}

// Conns prepares the connection to a unit's init listener while the unit waits in the warm
// pool, so that an allocation does not pay for connection setup: on the allocation path only
// the InitializeTLS call itself remains. It is safe for concurrent use.
type Conns struct {
	mu sync.Mutex // guards m
	m  map[string]*grpc.ClientConn
}

// Prepare starts connecting to initAddr in the background.
func (c *Conns) Prepare(initAddr string) {
	a, err := endpoint.Parse(initAddr)
	if err != nil {
		return // Initialize reports it
	}
	conn, err := grpc.NewClient(a.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	conn.Connect()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*grpc.ClientConn{}
	}
	if old := c.m[initAddr]; old != nil {
		old.Close()
	}
	c.m[initAddr] = conn
}

// Forget closes the prepared connection to initAddr, if any.
func (c *Conns) Forget(initAddr string) {
	c.mu.Lock()
	conn := c.m[initAddr]
	delete(c.m, initAddr)
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// closeDelay is how long a prepared connection stays open after its InitializeTLS.
const closeDelay = 500 * time.Millisecond

// Initialize is Initialize over the prepared connection when there is one.
func (c *Conns) Initialize(ctx context.Context, initAddr string, agentKey []byte) ([]byte, error) {
	c.mu.Lock()
	conn := c.m[initAddr]
	delete(c.m, initAddr)
	c.mu.Unlock()
	if conn == nil {
		return Initialize(ctx, initAddr, agentKey)
	}
	// Closed a little later, off the allocation path: the sandbox closes its end once the
	// agent's first call is answered, and a close now would be work for the sandbox during
	// the agent's handshake.
	defer time.AfterFunc(closeDelay, func() { conn.Close() })
	return initialize(ctx, conn, initAddr, agentKey)
}

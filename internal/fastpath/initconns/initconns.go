// Package initconns keeps prepared connections to the init listeners of the units waiting in
// a manager's pool (Conns): an allocation's sFuse is then one call on an open connection, and
// the manager pings a unit over it. It is part of the latency wing (internal/fastpath): the trust
// core's side of sFuse is internal/sfuse, which this package only calls.
package initconns

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// Conns prepares the connection to a unit's init listener while the unit waits in the warm
// pool, so that an allocation does not pay for connection setup: on the allocation path only
// the InitializeTLS call itself remains. It is safe for concurrent use.
type Conns struct {
	mu sync.Mutex // guards m
	m  map[string]*grpc.ClientConn
}

// Prepare starts connecting to initAddr in the background.
func (c *Conns) Prepare(initAddr string) {
	conn, err := sfuse.Dial(initAddr)
	if err != nil {
		return // Initialize reports it
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
func (c *Conns) Initialize(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error) {
	c.mu.Lock()
	conn := c.m[initAddr]
	delete(c.m, initAddr)
	c.mu.Unlock()
	if conn == nil {
		return sfuse.Initialize(ctx, initAddr, req)
	}
	// Closed a little later, off the allocation path: the sandbox drains its end as soon as
	// it has answered (its init listener is closed by then), and a close from this side now
	// would be more work for the sandbox during the agent's handshake.
	defer time.AfterFunc(closeDelay, func() { conn.Close() })
	return sfuse.InitializeOn(ctx, conn, initAddr, req)
}

// conn returns the prepared connection to initAddr, kept after use, or else a connection made
// for this use; done closes the latter.
func (c *Conns) conn(initAddr string) (conn *grpc.ClientConn, done func(), err error) {
	c.mu.Lock()
	conn = c.m[initAddr]
	c.mu.Unlock()
	if conn != nil {
		return conn, func() {}, nil
	}
	if conn, err = sfuse.Dial(initAddr); err != nil {
		return nil, nil, err
	}
	return conn, func() { conn.Close() }, nil
}

// Ping checks that the init listener at initAddr answers (the gRPC health service, which a
// sandbox serves there until its fuse blows), over the prepared connection when there is one.
// The manager pings the unit its next allocation will take, to find a dead one before an
// agent does.
func (c *Conns) Ping(ctx context.Context, initAddr string) error {
	conn, done, err := c.conn(initAddr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("pinging %s: %w", initAddr, err)
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("pinging %s: %v", initAddr, s)
	}
	return nil
}

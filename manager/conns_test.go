package manager_test

import (
	"context"
	"sync"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

// fakeConns is an InitConns that records the connections it holds: Prepare opens one,
// Initialize and Forget close it. Its calls answer through its funcs (nil: sFuse by
// memalloc.Initializer, pings answered).
type fakeConns struct {
	initialize func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error)
	ping       func(ctx context.Context, addr string) error

	mu   sync.Mutex
	open map[string]bool // init address -> prepared and not yet initialised or forgotten
}

var _ manager.InitConns = (*fakeConns)(nil)

func (c *fakeConns) Initialize(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
	c.mu.Lock()
	delete(c.open, addr)
	c.mu.Unlock()
	if c.initialize != nil {
		return c.initialize(ctx, addr, req)
	}
	return memalloc.Initializer(ctx, addr, req)
}

func (c *fakeConns) Prepare(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		c.open = map[string]bool{}
	}
	c.open[addr] = true
}

func (c *fakeConns) Forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.open, addr)
}

func (c *fakeConns) Ping(ctx context.Context, addr string) error {
	if c.ping != nil {
		return c.ping(ctx, addr)
	}
	return nil
}

// opened returns the init addresses of the connections held now.
func (c *fakeConns) opened() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.open))
	for k := range c.open {
		out[k] = true
	}
	return out
}

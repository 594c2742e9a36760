package manager

import (
	"context"

	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// InitConns keeps connections to the init listeners of the units waiting in the pool, so
// that an allocation's sFuse is one call on an open connection (Options.Conns;
// internal/fastpath/initconns.Conns in production). The manager calls Prepare when a unit joins the pool,
// and then exactly one of Initialize (the unit is allocated) or Forget (it leaves the pool
// otherwise), so that no prepared connection outlives its unit. Implementations are safe for
// concurrent use.
type InitConns interface {
	// Initialize performs sFuse on the unit at initAddr, as an Initializer does, over the
	// connection Prepare opened to it when there is one, which it then releases.
	Initialize(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error)
	// Prepare starts opening a connection to initAddr and returns at once; a failure is
	// Initialize's to report.
	Prepare(initAddr string)
	// Forget closes the connection Prepare opened to initAddr; nothing when there is none.
	Forget(initAddr string)
	// Ping returns nil if the init listener at initAddr answers (a sandbox serves it until
	// its fuse blows), over the prepared connection when there is one.
	Ping(ctx context.Context, initAddr string) error
}

var _ InitConns = (*initconns.Conns)(nil)

package bench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// armPool is one arm's side of the allocation benchmark, in this process: a runsc allocator
// made with the arm's accelerators, a manager over it with a pool the benchmark sizes, the
// manager's gRPC API on a unix socket, and the agent's kept connection to it.
type armPool struct {
	arm   Arm
	fast  fastpath.Switches // in effect (see Arm.effective)
	alloc *runscalloc.Allocator
	m     *manager.Manager
	est   *switchable
	agent *client.Manager
	undo  []func() // run by close, last first
}

// startArmPool starts arm's pool, empty (est at 0), with its state in a directory of its own.
// wrap, if set, wraps the manager's sFuse call (the tracer's). Call close after.
func startArmPool(ctx context.Context, o AllocateOptions, arm Arm, wrap func(manager.Initializer) manager.Initializer) (_ *armPool, err error) {
	p := &armPool{arm: arm, fast: arm.effective(o.KeepAwake), est: &switchable{}}
	defer func() {
		if err != nil {
			p.close(ctx)
		}
	}()
	dir, err := os.MkdirTemp("", "fusebox-bench-alloc-")
	if err != nil {
		return nil, err
	}
	p.undo = append(p.undo, func() { os.RemoveAll(dir) })
	fast := arm.FastPath
	if p.alloc, err = runscalloc.New(runscalloc.Options{Runsc: o.Runsc, StateDir: dir, SandboxBinary: o.SandboxBinary,
		KeepAwake: o.KeepAwake, FastPath: &fast, Image: o.Image}); err != nil {
		return nil, fmt.Errorf("arm %s: starting the runsc allocator: %w", arm.Name, err)
	}
	// runsc's root; before that, after the manager has closed: a unit it
	// could not destroy (Failed) must not outlive the benchmark, whose state directory goes
	// with it.
	p.undo = append(p.undo, func() { p.alloc.Shutdown(context.WithoutCancel(ctx)) }, func() { removeContainers(p.alloc.Runtime(), o.Log) })
	var conns manager.InitConns = &initconns.Conns{}
	if wrap != nil {
		conns = wrappedConns{conns, wrap(conns.Initialize)}
	}
	if p.m, err = manager.New(manager.Options{Allocator: p.alloc, Estimator: p.est, Clock: manager.RealClock{},
		Conns: conns, ReconcileInterval: 20 * time.Millisecond, CreateConcurrency: o.PoolSize, PingInterval: o.PoolPing,
		Logger: o.Log.With("arm", arm.Name)}); err != nil {
		return nil, fmt.Errorf("arm %s: %w", arm.Name, err)
	}
	if err := p.m.Start(ctx); err != nil {
		return nil, fmt.Errorf("arm %s: starting the manager: %w", arm.Name, err)
	}
	p.undo = append(p.undo, func() { p.m.Close(context.WithoutCancel(ctx)) })
	addr, stop, err := ServeManager(p.m, dir)
	if err != nil {
		return nil, fmt.Errorf("arm %s: serving the manager: %w", arm.Name, err)
	}
	p.undo = append(p.undo, stop)
	// The agent's side, as in an agent's loop: one kept connection to the manager.
	if p.agent, err = client.NewManager(addr, nil); err != nil {
		return nil, fmt.Errorf("arm %s: connecting to the manager: %w", arm.Name, err)
	}
	p.undo = append(p.undo, func() { p.agent.Close() })
	return p, nil
}

// close stops what startArmPool started, last first: the agent's connection, the API, the
// manager (destroying its pool), leftover containers, the allocator, the state directory. A
// second call does nothing.
func (p *armPool) close(ctx context.Context) {
	for i := len(p.undo) - 1; i >= 0; i-- {
		p.undo[i]()
	}
	p.undo = nil
}

// ready is how many of the pool's units are ready.
func (p *armPool) ready() int { return p.m.States().Counts("")[manager.Ready] }

// quiet waits until every one of pools is full with nothing created or destroyed in it, then
// settle more (for the aftermath of the last creation: the new sandbox's startup work, the
// manager's connection to it), then until next's oldest ready unit, the one its next
// allocation takes, is minAge old: the figure is the allocation path itself, not a share of a
// runsc create on a 2-core machine, whichever arm made it.
func quiet(pools []*armPool, next *armPool, settle, minAge time.Duration) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		still := ""
		for _, p := range pools {
			c := p.m.States().Counts("")
			if c[manager.Ready] < p.est.get() || c[manager.Creating] > 0 || c[manager.Destroying] > 0 {
				still = fmt.Sprintf("arm %s: %v", p.arm.Name, p.m.Status().Units)
				break
			}
		}
		if still == "" {
			time.Sleep(settle)
			if wait := minAge - oldestReadyAge(next.m); wait > 0 {
				time.Sleep(wait)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool did not settle (%s)", still)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// wrappedConns is an InitConns whose sFuse goes through initialize (a wrapper of the embedded
// InitConns' own Initialize).
type wrappedConns struct {
	manager.InitConns
	initialize manager.Initializer
}

func (w wrappedConns) Initialize(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error) {
	return w.initialize(ctx, initAddr, req)
}

package manager

import (
	"context"
	"sync"
)

// unitExit is a unit that ended on its own (see ExitWatcher).
type unitExit struct{ id, reason string }

// exitQueue holds the exits an ExitWatcher reports until the manager's loop handles them:
// reporting never blocks the allocator, whatever the manager is doing (closing, for one).
type exitQueue struct {
	mu   sync.Mutex // guards q
	q    []unitExit
	wake chan struct{} // has a value when q may be non-empty
}

func newExitQueue() *exitQueue { return &exitQueue{wake: make(chan struct{}, 1)} }

// add queues an exit; it never blocks.
func (e *exitQueue) add(id, reason string) {
	e.mu.Lock()
	e.q = append(e.q, unitExit{id, reason})
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// take returns and clears the queued exits.
func (e *exitQueue) take() []unitExit {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.q
	e.q = nil
	return q
}

// handleExits handles queued exits until ctx ends or stop closes.
func (p *warmPool) handleExits(ctx context.Context, stop <-chan struct{}) {
	for {
		for _, x := range p.exits.take() {
			p.unitExited(ctx, x.id, x.reason)
		}
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-p.exits.wake:
		}
	}
}

// unitExited handles a unit that ended on its own. A bound unit becomes Failed with the
// reason (its agent's calls fail; List and status say why) and what remains of it is
// destroyed; the Failed entry stays visible like any other. A ready unit is destroyed and
// replaced. A unit being created or initialised fails by itself, and one being destroyed is
// on its way out.
func (p *warmPool) unitExited(ctx context.Context, id, reason string) {
	u, ok := p.ops.Get(id)
	if !ok {
		return
	}
	switch u.State {
	case Ready:
		p.tally.failure("exited")
		p.log.Error("a ready unit's sandbox ended on its own; replacing it", "id", id, "reason", reason)
		if p.destroy(ctx, id, Ready) == nil {
			p.host.nudge()
		}
	case Bound:
		if _, err := p.ops.Transition(id, Bound, Failed, func(x *Unit) { x.Err = "exited: " + reason }); err != nil {
			return // released or expired meanwhile
		}
		p.tally.failure("exited")
		p.log.Error("a bound unit's sandbox ended on its own; marked failed", "id", id, "reason", reason)
		p.tally.publishCounts()
		if err := p.alloc.Destroy(ctx, id); err != nil {
			p.tally.failure("destroy")
			p.ops.MarkRemains(id)
			p.log.Error("destroying an exited unit; it is retried", "id", id, "err", err, "retry_after", RemainsRetry)
		} else {
			p.tally.destroyed()
		}
	}
}

package manager

import (
	"context"
	"fmt"
)

// This file holds how the warm pool destroys its units: now, or in the background, with a
// unit whose destroy fails kept as Failed with its remains, destroyed again later.

// toDestroying moves a unit from state from to Destroying (a Ready unit's prepared init
// connection is forgotten).
func (p *warmPool) toDestroying(id string, from State) error {
	u, err := p.ops.Transition(id, from, Destroying, func(u *Unit) { u.Remains = false })
	if err != nil {
		return err
	}
	if from == Ready {
		p.forget(u.Info.InitAddr)
	}
	return nil
}

// destroy moves a unit from state from to Destroying and destroys it.
func (p *warmPool) destroy(ctx context.Context, id string, from State) error {
	if err := p.toDestroying(id, from); err != nil {
		return err
	}
	return p.finishDestroy(ctx, id)
}

// destroyInBackground moves a unit from state from to Destroying now and destroys it in the
// background (ctx's values, not its cancellation).
func (p *warmPool) destroyInBackground(ctx context.Context, id string, from State) error {
	if err := p.toDestroying(id, from); err != nil {
		return err
	}
	p.bg.do(func() { p.finishDestroy(context.WithoutCancel(ctx), id) })
	return nil
}

func (p *warmPool) finishDestroy(ctx context.Context, id string) error {
	p.tally.publishCounts()
	err := p.alloc.Destroy(ctx, id)
	if err != nil {
		p.tally.failure("destroy")
		p.ops.Transition(id, Destroying, Failed, func(u *Unit) {
			u.Err, u.Remains = fmt.Sprintf("destroy: %v (retried every %v)", err, RemainsRetry), true
		})
		p.log.Error("destroying unit; it is retried", "id", id, "err", err, "retry_after", RemainsRetry)
	} else {
		p.ops.Transition(id, Destroying, Gone, nil)
		p.tally.destroyed()
	}
	p.tally.publishCounts()
	return err
}

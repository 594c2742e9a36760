package manager

import (
	"context"
	"fmt"
	"sync"
)

// adopt starts watching for units that end on their own (ExitWatcher), then takes over the
// bound units with a live lease that a previous manager left and destroys every other unit it
// finds, so that none leak.
func (p *warmPool) adopt(ctx context.Context) error {
	if p.watcher != nil {
		p.watcher.WatchExits(p.exits.add) // before adoption: units that ended meanwhile are reported
	}
	units, err := p.alloc.List(ctx)
	if err != nil {
		return fmt.Errorf("listing units for adoption: %w", err)
	}
	now := p.o.Clock.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, p.o.CreateConcurrency)
	for _, info := range units {
		lease, lerr := leaseFromAnnotations(info.Annotations)
		if lerr == nil && now.Before(lease.Expires) {
			if p.binder != nil {
				if err := p.binder.BindEgress(ctx, info.ID, lease.Egress); err != nil {
					p.log.Error("re-binding egress of an adopted unit failed; destroying it", "id", info.ID, "err", err)
					lerr = err
				}
			}
		}
		if lerr == nil && now.Before(lease.Expires) {
			if err := p.ops.Insert(info, Bound, lease); err != nil {
				return err
			}
			p.log.Info("adopted bound sandbox", "id", info.ID, "lease_expires", lease.Expires)
			continue
		}
		reason := "not bound"
		if lerr == nil {
			reason = "lease expired"
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p.log.Info("destroying unit left by a previous manager", "id", info.ID, "reason", reason)
			if err := p.alloc.Destroy(ctx, info.ID); err != nil {
				p.log.Error("destroying leftover unit", "id", info.ID, "err", err)
				p.tally.failure("destroy")
			} else {
				p.tally.destroyed()
			}
		}()
	}
	wg.Wait()
	p.tally.publishCounts()
	return nil
}

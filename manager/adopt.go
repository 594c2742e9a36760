package manager

import (
	"context"
	"fmt"
	"sync"
)

// adopt starts watching for units that end on their own (ExitWatcher), then takes over the
// bound units with a live lease that a previous manager left and destroys every other unit it
// finds, so that none leak.
func (p *localPool) adopt(ctx context.Context) error {
	m := p.Manager
	if m.exitWatcher != nil {
		m.exitWatcher.WatchExits(m.exits.add) // before adoption: units that ended meanwhile are reported
	}
	units, err := m.alloc.List(ctx)
	if err != nil {
		return fmt.Errorf("listing units for adoption: %w", err)
	}
	now := m.o.Clock.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, m.o.CreateConcurrency)
	for _, info := range units {
		lease, lerr := leaseFromAnnotations(info.Annotations)
		if lerr == nil && now.Before(lease.Expires) {
			if m.binder != nil {
				if err := m.binder.BindEgress(ctx, info.ID, lease.Egress); err != nil {
					m.log.Error("re-binding egress of an adopted unit failed; destroying it", "id", info.ID, "err", err)
					lerr = err
				}
			}
		}
		if lerr == nil && now.Before(lease.Expires) {
			if err := m.ops.Insert(info, Bound, lease); err != nil {
				return err
			}
			m.log.Info("adopted bound sandbox", "id", info.ID, "lease_expires", lease.Expires)
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
			m.log.Info("destroying unit left by a previous manager", "id", info.ID, "reason", reason)
			if err := m.alloc.Destroy(ctx, info.ID); err != nil {
				m.log.Error("destroying leftover unit", "id", info.ID, "err", err)
				m.failure("destroy")
			} else {
				m.destroyed()
			}
		}()
	}
	wg.Wait()
	m.publishCounts()
	return nil
}

package manager

import (
	"context"
	"time"
)

// Reconcile runs one pass of the control loop: expire leases, ask the estimator for a target,
// and create or destroy ready units toward it.
func (m *Manager) Reconcile(ctx context.Context) {
	// One pass at a time: two passes reading the same counts would both fill one deficit.
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	m.pool.reconcile(ctx)
}

// reconcile is the pass over this manager's own pool: destroy remains again, expire leases,
// and size the pool.
func (p *warmPool) reconcile(ctx context.Context) {
	now := p.o.Clock.Now()
	for _, id := range p.ops.RemainsDue(now, RemainsRetry) {
		if p.destroyInBackground(ctx, id, Failed) == nil {
			p.log.Info("destroying a failed unit's remains again", "id", id)
		}
	}
	for _, id := range p.ops.Expired(now) {
		if p.destroyInBackground(ctx, id, Bound) == nil { // else released or expired concurrently
			p.log.Info("lease expired; destroying sandbox", "id", id)
		}
	}
	// Creations first: a unit turns Ready before its creation stops counting, so read in this
	// order a creation that ends between the two reads is seen in one of them, not in neither.
	creating := p.creations.count()
	c := p.ops.Counts(p.o.PoolTemplate)
	target := p.host.target(now, c[Ready], creating, c[Bound])
	if ctx.Err() != nil {
		return
	}
	if deficit := target - c[Ready] - creating; deficit > 0 {
		// Unless backing off after failures or waiting out the refill delay.
		if !p.creations.heldBack() && p.refillDue(c[Ready]) {
			for range min(deficit, p.o.CreateConcurrency-creating) {
				p.startCreate(ctx, p.o.PoolTemplate)
			}
		}
		return
	}
	p.endDeficit()
	if surplus := c[Ready] - target - int(p.waiting.Load()); surplus > 0 {
		for _, id := range p.ops.OldestReady(p.o.PoolTemplate, surplus) {
			p.destroyInBackground(ctx, id, Ready)
		}
	}
}

// refillDue reports whether creations may start now for a pool below its target that holds
// ready units; otherwise it schedules a reconcile for when they may (see DefaultRefillDelay).
func (p *warmPool) refillDue(ready int) bool {
	if p.refill <= 0 {
		return true
	}
	now := p.o.Clock.Now()
	p.refillMu.Lock()
	defer p.refillMu.Unlock()
	if p.deficitSince.IsZero() {
		p.deficitSince = now
	}
	wait := p.refill - now.Sub(p.deficitSince)
	if ready == 0 || wait <= 0 {
		p.deficitSince = time.Time{}
		return true
	}
	if !p.refillTimer {
		p.refillTimer = true
		// The callback takes refillMu on a goroutine of its own: a clock may run it while
		// holding its own lock (a fake clock's Step does), which this code holds refillMu
		// around.
		p.o.Clock.AfterFunc(wait, func() {
			go func() {
				p.refillMu.Lock()
				p.refillTimer = false
				p.refillMu.Unlock()
				p.host.nudge()
			}()
		})
	}
	return false
}

// endDeficit notes that the pool is not below its target: the next deficit starts its own
// refill delay.
func (p *warmPool) endDeficit() {
	if p.refill <= 0 {
		return
	}
	p.refillMu.Lock()
	p.deficitSince = time.Time{}
	p.refillMu.Unlock()
}

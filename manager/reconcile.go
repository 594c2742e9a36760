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
	for _, tp := range p.templates.pools() {
		if ctx.Err() != nil {
			return
		}
		p.size(ctx, now, tp.Template)
	}
}

// size creates or destroys ready units of tmpl toward its pool's target. Creations of every
// template together stay within CreateConcurrency.
func (p *warmPool) size(ctx context.Context, now time.Time, tmpl string) {
	// Creations first: a unit turns Ready before its creation stops counting, so read in this
	// order a creation that ends between the two reads is seen in one of them, not in neither.
	creating := p.creations.countOf(tmpl)
	c := p.ops.Counts(tmpl)
	target := p.host.target(now, tmpl, c[Ready], creating, c[Bound])
	if ctx.Err() != nil {
		return
	}
	if deficit := target - c[Ready] - creating; deficit > 0 {
		// Unless backing off after failures or waiting out the refill delay.
		if !p.creations.heldBack(tmpl) && p.refillDue(tmpl, c[Ready]) {
			for range min(deficit, p.o.CreateConcurrency-p.creations.count()) {
				p.startCreate(ctx, tmpl)
			}
		}
		return
	}
	p.endDeficit(tmpl)
	if surplus := c[Ready] - target - p.waitingFor(tmpl); surplus > 0 {
		for _, id := range p.ops.OldestReady(tmpl, surplus) {
			p.destroyInBackground(ctx, id, Ready)
		}
	}
}

// refillDue reports whether creations may start now for tmpl's pool, below its target, that
// holds ready units; otherwise it schedules a reconcile for when they may (see
// DefaultRefillDelay).
func (p *warmPool) refillDue(tmpl string, ready int) bool {
	if p.refill <= 0 {
		return true
	}
	now := p.o.Clock.Now()
	p.refillMu.Lock()
	defer p.refillMu.Unlock()
	since, ok := p.deficitSince[tmpl]
	if !ok {
		since = now
		p.deficitSince[tmpl] = now
	}
	wait := p.refill - now.Sub(since)
	if ready == 0 || wait <= 0 {
		delete(p.deficitSince, tmpl)
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

// endDeficit notes that tmpl's pool is not below its target: its next deficit starts its own
// refill delay.
func (p *warmPool) endDeficit(tmpl string) {
	if p.refill <= 0 {
		return
	}
	p.refillMu.Lock()
	delete(p.deficitSince, tmpl)
	p.refillMu.Unlock()
}

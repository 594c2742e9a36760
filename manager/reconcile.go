package manager

import (
	"context"
	"time"

	"github.com/fusebox-dev/fusebox/manager/estimator"
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
func (p *localPool) reconcile(ctx context.Context) {
	m := p.Manager
	now := m.o.Clock.Now()
	for _, id := range m.ops.RemainsDue(now, RemainsRetry) {
		if m.destroyInBackground(ctx, id, Failed) == nil {
			m.log.Info("destroying a failed unit's remains again", "id", id)
		}
	}
	for _, id := range m.ops.Expired(now) {
		if m.destroyInBackground(ctx, id, Bound) == nil { // else released or expired concurrently
			m.log.Info("lease expired; destroying sandbox", "id", id)
		}
	}
	// Creations first: a unit turns Ready before its creation stops counting, so read in this
	// order a creation that ends between the two reads is seen in one of them, not in neither.
	creating := int(m.creating.Load())
	c := m.ops.Counts(m.o.PoolTemplate)
	target := m.o.Estimator.Target(estimatorObservation(now, int(m.allocs.Swap(0)), c[Ready], creating, c[Bound], m.ProvisioningLatency()))
	m.target.Store(int32(target))
	if m.m != nil {
		m.m.Target.Set(float64(target))
	}
	if ctx.Err() != nil {
		return
	}
	if deficit := target - c[Ready] - creating; deficit > 0 {
		// Unless backing off after failures or waiting out the refill delay.
		if !m.heldBack() && p.refillDue(c[Ready]) {
			for range min(deficit, m.o.CreateConcurrency-creating) {
				m.startCreate(ctx, m.o.PoolTemplate)
			}
		}
		return
	}
	p.endDeficit()
	if surplus := c[Ready] - target - int(p.waiting.Load()); surplus > 0 {
		for _, id := range m.ops.OldestReady(m.o.PoolTemplate, surplus) {
			m.destroyInBackground(ctx, id, Ready)
		}
	}
}

// refillDue reports whether creations may start now for a pool below its target that holds
// ready units; otherwise it schedules a reconcile for when they may (see RefillDelay).
func (p *localPool) refillDue(ready int) bool {
	m := p.Manager
	if m.o.RefillDelay <= 0 {
		return true
	}
	now := m.o.Clock.Now()
	p.refillMu.Lock()
	defer p.refillMu.Unlock()
	if p.deficitSince.IsZero() {
		p.deficitSince = now
	}
	wait := m.o.RefillDelay - now.Sub(p.deficitSince)
	if ready == 0 || wait <= 0 {
		p.deficitSince = time.Time{}
		return true
	}
	if !p.refillTimer {
		p.refillTimer = true
		// The callback takes refillMu on a goroutine of its own: a clock may run it while
		// holding its own lock (a fake clock's Step does), which this code holds refillMu
		// around.
		m.o.Clock.AfterFunc(wait, func() {
			go func() {
				p.refillMu.Lock()
				p.refillTimer = false
				p.refillMu.Unlock()
				m.nudge()
			}()
		})
	}
	return false
}

// endDeficit notes that the pool is not below its target: the next deficit starts its own
// refill delay.
func (p *localPool) endDeficit() {
	if p.o.RefillDelay <= 0 {
		return
	}
	p.refillMu.Lock()
	p.deficitSince = time.Time{}
	p.refillMu.Unlock()
}

func estimatorObservation(now time.Time, allocs, ready, creating, bound int, lat time.Duration) estimator.Observation {
	return estimator.Observation{Now: now, Allocations: allocs, Ready: ready, Creating: creating, Bound: bound,
		ProvisioningLatency: lat}
}

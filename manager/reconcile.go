package manager

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fusebox-dev/fusebox/manager/estimator"
)

// This file holds the reconciler: its passes over each pool (expiry, sizing toward the
// estimator's target), the creations they and waiting allocations start, the creation
// backoff, the refill delay, and the provisioning latency the estimator sizes the pool by.

// Reconcile runs one pass of the control loop: expire leases, ask the estimator for a target,
// and create or destroy ready units toward it. Passes run one at a time: two at once (the
// loop's and one driven by hand) would both see the same deficit and both fill it.
func (m *Manager) Reconcile(ctx context.Context) {
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	m.pool.reconcile(ctx)
}

// reconcile is the local pool's pass: destroy failed units' remains again when due, expire
// leases, and create or destroy ready units toward the target.
func (p *localPool) reconcile(ctx context.Context) {
	now := p.o.Clock.Now()
	for _, id := range p.ops.RemainsDue(now, RemainsRetry) {
		if p.destroyInBackground(ctx, id, Failed) == nil {
			p.log.Info("destroying a failed unit's remains again", "id", id)
		}
	}
	p.expireLeases(ctx, now)
	// One view of both (see readyMu): a unit that turns Ready in between would count in
	// neither, and be made again.
	p.readyMu.Lock()
	c := p.ops.Counts(p.o.PoolTemplate)
	creating := int(p.creating.Load())
	p.readyMu.Unlock()
	target := p.o.Estimator.Target(estimatorObservation(now, int(p.allocs.Swap(0)), c[Ready], creating, c[Bound], p.ProvisioningLatency()))
	p.setTarget(target)
	if ctx.Err() != nil {
		return
	}
	if deficit := target - c[Ready] - creating; deficit > 0 {
		// Unless backing off after failures or waiting out the refill delay.
		if !p.heldBack() && p.refillDue(c[Ready]) {
			for range min(deficit, p.o.CreateConcurrency-creating) {
				p.startCreate(ctx, p.o.PoolTemplate, p.create)
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

// reconcile is the shared pool's pass, the leader's only: expire leases (read from the
// allocator, so leases bound by other replicas too), destroy units claimed but never bound,
// and size the pool.
func (p *sharedPool) reconcile(ctx context.Context) {
	now := p.o.Clock.Now()
	if !p.leader() {
		p.target.Store(0)
		return
	}
	units, err := p.alloc.List(ctx)
	if err != nil {
		p.log.Error("listing units", "err", err)
		return
	}
	bound := 0
	for _, u := range units {
		if u.Annotations[AnnotationState] == "claimed" {
			// Claimed but never bound: its replica died mid-allocation (no agent has it).
			at, err := time.Parse(time.RFC3339Nano, u.Annotations[AnnotationClaimedAt])
			if err == nil && now.Sub(at) > p.o.ClaimGrace && p.expiring.Add(u.ID) {
				p.log.Info("destroying a unit claimed but never bound", "id", u.ID, "claimed_at", at)
				p.destroyTracked(ctx, u.ID)
			}
			continue
		}
		l, err := leaseFromAnnotations(u.Annotations)
		if err != nil {
			continue
		}
		bound++
		p.expireLease(ctx, u.ID, l, now)
	}
	ready, creating := p.shared.Counts(p.o.PoolTemplate)
	creating = max(creating, int(p.creating.Load()))
	target := p.o.Estimator.Target(estimatorObservation(now, int(p.allocs.Swap(0)), ready, creating, bound, p.ProvisioningLatency()))
	p.setTarget(target)
	if ctx.Err() != nil {
		return
	}
	if deficit := target - ready - creating; deficit > 0 && !p.heldBack() {
		for range min(deficit, p.o.CreateConcurrency-int(p.creating.Load())) {
			p.startCreate(ctx, p.o.PoolTemplate, p.create)
		}
	} else if surplus := ready - target; surplus > 0 {
		// Claim before destroying, so that no replica is handed a unit being destroyed.
		for range surplus {
			info, err := p.shared.Claim(ctx, p.o.PoolTemplate)
			if err != nil {
				break
			}
			p.bg.Add(1)
			go func() { defer p.bg.Done(); p.destroy(context.WithoutCancel(ctx), info.ID) }()
		}
	}
}

// setTarget records the estimator's target.
func (m *Manager) setTarget(target int) {
	m.target.Store(int32(target))
	if m.m != nil {
		m.m.Target.Set(float64(target))
	}
}

// createFunc is a pool's creation of unit id of template tmpl: it reports whether it made a
// unit, and may call uncount (which ends the creation's count in m.creating; later calls do
// nothing) before it returns, at the moment its unit stops counting as being created.
type createFunc func(ctx context.Context, id, tmpl string, uncount func()) bool

// startCreate counts one creation of tmpl in m.creating and makes it in the background with
// create (the pool's), under a fresh id; the channel receives whether it made a unit. It is
// counted before the goroutine starts, so that a reconcile pass in between sees it, and
// uncounted by the time create returns.
func (m *Manager) startCreate(ctx context.Context, tmpl string, create createFunc) <-chan bool {
	made := make(chan bool, 1)
	m.creating.Add(1)
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		var once sync.Once
		uncount := func() { once.Do(func() { m.creating.Add(-1) }) }
		ok := create(ctx, m.o.NewID(), tmpl, uncount)
		uncount()
		made <- ok
	}()
	return made
}

// noteCreate keeps the creation backoff: exponential (0.5 s doubling to a minute) after
// consecutive failures, so that a broken runtime does not spin; failures stay visible in
// status and metrics meanwhile.
func (m *Manager) noteCreate(err error) {
	m.backoffMu.Lock()
	defer m.backoffMu.Unlock()
	if err != nil {
		m.failStreak++
		m.holdUntil = m.o.Clock.Now().Add(min(time.Minute, 500*time.Millisecond<<min(m.failStreak-1, 7)))
	} else {
		m.failStreak = 0
	}
}

// backoffLeft is how long creations still wait for the backoff.
func (m *Manager) backoffLeft() time.Duration {
	m.backoffMu.Lock()
	defer m.backoffMu.Unlock()
	return max(0, m.holdUntil.Sub(m.o.Clock.Now()))
}

// heldBack reports whether creations wait for the backoff.
func (m *Manager) heldBack() bool { return m.backoffLeft() > 0 }

// refillDue reports whether creations may start now for a pool below its target that holds
// ready units; otherwise it schedules a reconcile for when they may (see RefillDelay).
func (p *localPool) refillDue(ready int) bool {
	if p.o.RefillDelay <= 0 {
		return true
	}
	p.refillMu.Lock()
	defer p.refillMu.Unlock()
	now := p.o.Clock.Now()
	if p.deficitSince.IsZero() {
		p.deficitSince = now
	}
	wait := p.o.RefillDelay - now.Sub(p.deficitSince)
	if ready == 0 || wait <= 0 {
		p.deficitSince = time.Time{}
		return true
	}
	if !p.refillTimer {
		p.refillTimer = true
		p.o.Clock.AfterFunc(wait, func() {
			p.refillMu.Lock()
			p.refillTimer = false
			p.refillMu.Unlock()
			p.nudge()
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

func (m *Manager) recordLatency(d time.Duration) {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	m.latencies = append(m.latencies, d)
	if len(m.latencies) > 32 {
		m.latencies = m.latencies[len(m.latencies)-32:]
	}
}

func estimatorObservation(now time.Time, allocs, ready, creating, bound int, lat time.Duration) estimator.Observation {
	return estimator.Observation{Now: now, Allocations: allocs, Ready: ready, Creating: creating, Bound: bound,
		ProvisioningLatency: lat}
}

// ProvisioningLatency is the median of recent creation times (1 s before any creation) plus
// the units' WarmUp: how long a unit takes from the decision to create it to serving at full
// speed.
func (m *Manager) ProvisioningLatency() time.Duration {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	if len(m.latencies) == 0 {
		return time.Second + m.o.WarmUp
	}
	s := slices.Clone(m.latencies)
	slices.Sort(s)
	return s[len(s)/2] + m.o.WarmUp
}

func (m *Manager) publishCounts() {
	if m.m == nil {
		return
	}
	c := m.ops.Counts("")
	for s, name := range stateNames {
		m.m.Units.WithLabelValues(name).Set(float64(c[s]))
	}
}

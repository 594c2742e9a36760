package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// sharedPool is a pool several replicas of the manager share through a SharedPool allocator.
// Local state only tracks the units this replica is binding; the allocator's view
// (annotations) is the truth for leases.
type sharedPool struct {
	poolDeps
	shared   SharedPool
	claimer  OneWriteClaimer // the allocator's, unless Options.SeparateClaim
	expiring idSet           // expiries in progress
	// prepared maps the ready units this replica has prepared an init connection to (their
	// init addresses), and leftAt when each was first seen out of the pool; touched only by
	// reconcile, one pass at a time.
	prepared map[string]string
	leftAt   map[string]time.Time
	// drainer is the allocator's (Capabilities.Versions), or nil; leaderSince is when this
	// replica's current run of leader passes began (zero while it follows). Both are touched
	// only by reconcile.
	drainer     OutdatedDrainer
	leaderSince time.Time
}

var _ pool = (*sharedPool)(nil)

// newSharedPool makes the pool of a SharedPool allocator (checked by New); drainer is its
// OutdatedDrainer when it declares Capabilities.Versions.
func newSharedPool(d poolDeps, drainer OutdatedDrainer) *sharedPool {
	p := &sharedPool{poolDeps: d, shared: d.alloc.(SharedPool), drainer: drainer}
	if c, ok := d.alloc.(OneWriteClaimer); ok && !d.o.SeparateClaim {
		p.claimer = c
	}
	return p
}

// forgetDelay is how long a prepared init connection outlives its unit's leaving the pool.
const forgetDelay = time.Second

// leader reports whether this replica runs the pool-wide duties (sizing, expiry).
func (p *sharedPool) leader() bool { return p.o.IsLeader == nil || p.o.IsLeader() }

// startCreate counts one creation of tmpl and makes it in the background (create).
func (p *sharedPool) startCreate(ctx context.Context, tmpl string) {
	p.creations.start(p.bg, tmpl, func() bool { return p.create(ctx, tmpl) })
}

// take claims a ready unit from the shared pool, waiting (and asking for a creation) while
// there is none. It waits on the allocator's Changed notification, not a polling loop.
func (p *sharedPool) take(ctx context.Context, tmpl string) (Unit, error) {
	deadline := p.o.Clock.NewTimer(p.o.AllocateWait)
	defer deadline.Stop()
	guard := p.o.Clock.NewTimer(p.o.MissedEventGuard)
	defer guard.Stop()
	asked := false
	for {
		// Taken before Claim: a unit that turns ready after Claim looked closes it.
		changed := p.shared.Changed(tmpl)
		var info UnitInfo
		var err error
		if p.claimer != nil {
			// Picked, not claimed: bind claims it. Units this replica is binding are
			// passed over (the allocator's view may not show them taken yet).
			info, err = p.claimer.Pick(tmpl, func(id string) bool { _, ok := p.ops.Get(id); return ok })
		} else {
			info, err = p.shared.Claim(ctx, tmpl)
		}
		if err == nil {
			if err := p.ops.Insert(info, Initialising, nil); err != nil {
				if p.claimer != nil {
					continue // another allocation of this replica picked it meanwhile
				}
				return Unit{}, fmt.Errorf("%w: claimed unit %s twice: %v", ErrAllocator, info.ID, err)
			}
			u, _ := p.ops.Get(info.ID)
			u.claimOnBind = p.claimer != nil
			return u, nil
		}
		if !errors.Is(err, ErrNoReadyUnit) {
			return Unit{}, fmt.Errorf("%w: claiming a unit: %v", ErrAllocator, err)
		}
		if !asked {
			asked = true
			p.tally.coldWait()
			p.startCreate(p.bg.lifetime(), tmpl)
		}
		guard.Reset(p.o.MissedEventGuard)
		select {
		case <-changed:
		case <-guard.C():
		case <-deadline.C():
			return Unit{}, fmt.Errorf("%w (%v)", ErrNoCapacity, p.o.AllocateWait)
		case <-ctx.Done():
			return Unit{}, ctx.Err()
		}
	}
}

// lease reads unit id's lease from the allocator.
func (p *sharedPool) lease(ctx context.Context, id string) (UnitInfo, *Lease, error) {
	info, err := p.shared.Lookup(ctx, id)
	if err != nil {
		return UnitInfo{}, nil, err
	}
	l, err := leaseFromAnnotations(info.Annotations)
	if err != nil {
		return info, nil, fmt.Errorf("%w: %s is not bound", ErrLeaseEnded, id)
	}
	return info, l, nil
}

func (p *sharedPool) renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	info, l, err := p.lease(ctx, id)
	if err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if err := checkToken(l, token); err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if reason := info.Annotations[AnnotationFailed]; reason != "" {
		return time.Time{}, fmt.Errorf("renewing %s: %w: the sandbox failed: %s", id, ErrLeaseEnded, reason)
	}
	now := p.o.Clock.Now()
	if !now.Before(l.Expires) {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, ErrLeaseEnded)
	}
	d := l.TTL
	if ttl > 0 {
		d = ttl // checked and capped by Renew
	}
	l.Expires = now.Add(d)
	if err := p.annotator.Annotate(ctx, id, leaseAnnotations(l)); err != nil {
		p.tally.failure("annotate")
		return time.Time{}, fmt.Errorf("renewing %s: %w: %v", id, ErrAllocator, err)
	}
	p.ops.UpdateLease(id, func(x *Lease) error { x.Expires = l.Expires; return nil })
	return l.Expires, nil
}

func (p *sharedPool) release(ctx context.Context, id, token string) error {
	_, l, err := p.lease(ctx, id)
	if err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := checkToken(l, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	p.bg.do(func() { p.destroyShared(context.WithoutCancel(ctx), id) })
	return nil
}

// destroyShared destroys a unit of the shared pool and forgets any local record of it.
func (p *sharedPool) destroyShared(ctx context.Context, id string) {
	if u, ok := p.ops.Get(id); ok && u.State == Bound {
		p.ops.Transition(id, Bound, Destroying, nil)
	}
	if err := p.alloc.Destroy(ctx, id); err != nil {
		p.tally.failure("destroy")
		p.log.Error("destroying unit", "id", id, "err", err)
		return
	}
	p.ops.Transition(id, Destroying, Gone, nil)
	p.tally.destroyed()
}

// reconcile is the leader's pass over the shared pool: expire leases (read from the
// allocator, so leases bound by other replicas too) and size the pool. Every replica keeps its
// prepared init connections (prepareInits).
func (p *sharedPool) reconcile(ctx context.Context) {
	now := p.o.Clock.Now()
	units, err := p.alloc.List(ctx)
	if err != nil {
		p.log.Error("listing units", "err", err)
		return
	}
	p.prepareInits(units)
	if !p.leader() {
		p.leaderSince = time.Time{}
		p.host.following()
		return
	}
	if p.leaderSince.IsZero() {
		p.leaderSince = now
	}
	bound := p.expire(ctx, now, units)
	p.drainOutdated(ctx, now)
	for _, tp := range p.templates.pools() {
		if ctx.Err() != nil {
			return
		}
		p.size(ctx, now, tp.Template, bound[tp.Template])
	}
}

// size creates ready units of tmpl toward its pool's target, or destroys the surplus; bound
// is how many units of tmpl are bound. Creations of every template together stay within
// CreateConcurrency.
func (p *sharedPool) size(ctx context.Context, now time.Time, tmpl string, bound int) {
	inFlight := p.creations.countOf(tmpl) // before Counts, as in warmPool.size
	ready, creating := p.shared.Counts(tmpl)
	creating = max(creating, inFlight)
	target := p.host.target(now, tmpl, ready, creating, bound)
	if ctx.Err() != nil {
		return
	}
	if deficit := target - ready - creating; deficit > 0 && !p.creations.heldBack(tmpl) {
		for range min(deficit, p.o.CreateConcurrency-p.creations.count()) {
			p.startCreate(ctx, tmpl)
		}
	} else if surplus := ready - target; surplus > 0 {
		// Claim before destroying, so that no replica is handed a unit being destroyed.
		for range surplus {
			info, err := p.shared.Claim(ctx, tmpl)
			if err != nil {
				break
			}
			p.bg.do(func() { p.destroyShared(context.WithoutCancel(ctx), info.ID) })
		}
	}
}

// drainOutdated destroys the ready units of another version of their template (an upgrade's
// old image) that are older than this replica's leadership, or older than ClaimGrace: the
// former were made by an earlier leader, which no longer fills the pool; the latter are the
// spares of a replica still running the old version (its allocations' own creations) once
// they have waited that long. A unit made since by a replica still running another version is
// left to it for a while: while a new version rolls out, an old leader does not drain the new
// replicas' units as they make them, nor a new leader the old replicas'.
func (p *sharedPool) drainOutdated(ctx context.Context, now time.Time) {
	if p.drainer == nil {
		return
	}
	before := p.leaderSince
	if grace := now.Add(-p.o.ClaimGrace); grace.After(before) {
		before = grace
	}
	ids, err := p.drainer.DrainOutdated(ctx, before)
	for range ids {
		p.tally.destroyed()
	}
	if len(ids) > 0 {
		p.log.Info("drained warm units of an earlier template", "ids", ids)
	}
	if err != nil {
		p.tally.failure("destroy")
		p.log.Error("draining warm units of an earlier template", "err", err)
	}
}

// expire destroys, in the background, the units whose lease has expired and those claimed
// but never bound for longer than ClaimGrace (their replica died mid-allocation: no agent has
// them), and returns how many units of each template are bound.
func (p *sharedPool) expire(ctx context.Context, now time.Time, units []UnitInfo) (bound map[string]int) {
	bound = map[string]int{}
	destroy := func(id string) {
		p.bg.do(func() {
			defer p.expiring.Remove(id)
			p.destroyShared(context.WithoutCancel(ctx), id)
		})
	}
	for _, u := range units {
		if u.Annotations[AnnotationState] == "claimed" {
			at, err := time.Parse(time.RFC3339Nano, u.Annotations[AnnotationClaimedAt])
			if err == nil && now.Sub(at) > p.o.ClaimGrace && p.expiring.Add(u.ID) {
				p.log.Info("destroying a unit claimed but never bound", "id", u.ID, "claimed_at", at)
				destroy(u.ID)
			}
			continue
		}
		l, err := leaseFromAnnotations(u.Annotations)
		if err != nil {
			continue
		}
		if u.Annotations[AnnotationFailed] == "" {
			bound[u.Template]++ // a failed unit holds no sandbox; it stays listed until its lease ends
		}
		if !now.Before(l.Expires) && p.expiring.Add(u.ID) {
			p.log.Info("lease expired; destroying sandbox", "id", u.ID)
			destroy(u.ID)
		}
	}
	return bound
}

// prepareInits keeps, on every replica, a prepared connection (InitConns.Prepare) to the init
// endpoint of each ready unit of the shared pool, and forgets the connections of units that
// are ready no more (claimed by any replica, or gone): any replica may take any of them, and
// an allocation's sFuse is then one call on an open connection rather than a new connection
// into the sandbox pod's network stack first.
func (p *sharedPool) prepareInits(units []UnitInfo) {
	if p.o.Conns == nil {
		return
	}
	ready := make(map[string]string, len(units))
	for _, u := range units {
		if _, mine := p.ops.Get(u.ID); mine {
			continue // claimed here: the informer's cache may not say so yet
		}
		if sharedState(u.Annotations) == Ready && u.InitAddr != "" {
			ready[u.ID] = u.InitAddr
		}
	}
	now := p.o.Clock.Now()
	for id, addr := range p.prepared {
		if ready[id] == addr {
			delete(p.leftAt, id)
			continue
		}
		// Closed a while after the unit left the pool, not as another replica's sFuse and the
		// agent's first call reach the sandbox (as Conns.Initialize closes its own).
		if p.leftAt[id].IsZero() {
			p.leftAt[id] = now
			continue
		}
		if now.Sub(p.leftAt[id]) >= forgetDelay {
			p.o.Conns.Forget(addr) // a no-op after this replica's own sFuse took it
			delete(p.prepared, id)
			delete(p.leftAt, id)
		}
	}
	if p.prepared == nil {
		p.prepared, p.leftAt = make(map[string]string, len(ready)), map[string]time.Time{}
	}
	for id, addr := range ready {
		if _, ok := p.prepared[id]; !ok {
			p.o.Conns.Prepare(addr)
			p.prepared[id] = addr
		}
	}
}

// counts counts the shared pool's units by state, from the allocator's view.
func (p *sharedPool) counts() map[string]map[State]int {
	c := map[string]map[State]int{}
	for _, u := range p.units() {
		if c[u.Info.Template] == nil {
			c[u.Info.Template] = map[State]int{}
		}
		c[u.Info.Template][u.State]++
	}
	return c
}

// units describes every unit of the shared pool from the allocator's view.
func (p *sharedPool) units() []Unit {
	units, err := p.alloc.List(context.Background())
	if err != nil {
		p.log.Error("listing units", "err", err)
		return nil
	}
	out := make([]Unit, 0, len(units))
	for _, info := range units {
		u := Unit{Info: info, State: sharedState(info.Annotations)}
		switch u.State {
		case Bound:
			u.Lease, _ = leaseFromAnnotations(info.Annotations)
		case Failed: // still its owner's to see
			u.Lease, _ = leaseFromAnnotations(info.Annotations)
			u.Err = "exited: " + info.Annotations[AnnotationFailed]
		}
		if local, ok := p.ops.Get(info.ID); ok && local.State != Bound {
			u.State = local.State
		}
		out = append(out, u)
	}
	slices.SortFunc(out, byID)
	return out
}

// sharedState is a shared pool unit's state as the allocator reports it (AnnotationState).
func sharedState(annotations map[string]string) State {
	if annotations[AnnotationFailed] != "" {
		return Failed
	}
	switch annotations[annState] {
	case "creating":
		return Creating
	case "claimed":
		return Initialising
	case "bound":
		return Bound
	}
	return Ready
}

// create makes a unit of the shared pool: it is not tracked locally until claimed.
func (p *sharedPool) create(ctx context.Context, tmpl string) bool {
	id := p.o.NewID()
	t0 := time.Now()
	_, err := p.alloc.Create(ctx, id, tmpl)
	p.creations.ended(tmpl, err)
	if err != nil {
		if ctx.Err() == nil {
			p.tally.createFailed(tmpl)
			p.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		}
		return false
	}
	p.creations.took(tmpl, time.Since(t0))
	p.tally.created()
	return true
}

// idSet is a set of ids safe for concurrent use.
type idSet struct {
	mu  sync.Mutex // guards ids
	ids map[string]bool
}

// Add adds id and reports whether it was absent.
func (s *idSet) Add(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids[id] {
		return false
	}
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
	return true
}

// Remove removes id.
func (s *idSet) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, id)
}

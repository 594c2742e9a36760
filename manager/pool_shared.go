package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// sharedPool is the pool of a manager with a SharedPool allocator: several replicas share one
// pool of units in an API server. The manager's state then only tracks the units this
// replica is binding; the allocator's view (annotations) is the truth for leases, so that any
// replica renews or releases any lease. Pool sizing and lease expiry are the leader's
// (Options.IsLeader). There is nothing to adopt at Start nor to destroy at Close: the pool
// belongs to every replica.
type sharedPool struct {
	*Manager
	shared   SharedPool
	expiring idSet // destroys in progress that a reconcile pass started
}

var _ pool = (*sharedPool)(nil)

// start does nothing: a shared pool's leases live with its units, for every replica.
func (p *sharedPool) start(ctx, life context.Context) error { return nil }

// close does nothing: the pool belongs to every replica.
func (p *sharedPool) close(ctx context.Context) error { return nil }

// leader reports whether this replica runs the pool-wide duties (sizing, expiry).
func (p *sharedPool) leader() bool { return p.o.IsLeader == nil || p.o.IsLeader() }

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
		info, err := p.shared.Claim(ctx, tmpl)
		if err == nil {
			if err := p.ops.Insert(info, Initialising, nil); err != nil {
				return Unit{}, fmt.Errorf("%w: claimed unit %s twice: %v", ErrAllocator, info.ID, err)
			}
			u, _ := p.ops.Get(info.ID)
			return u, nil
		}
		if !errors.Is(err, ErrNoReadyUnit) {
			return Unit{}, fmt.Errorf("%w: claiming a unit: %v", ErrAllocator, err)
		}
		if !asked {
			asked = true
			p.coldWait()
			p.startCreate(p.lifetime(), tmpl, p.create)
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

// renew extends the lease read from the allocator and writes it back there (a failed write
// fails the renewal: the allocator's lease is the one of record).
func (p *sharedPool) renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	_, l, err := p.lease(ctx, id)
	if err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if err := p.extend(l, token, ttl, p.o.Clock.Now()); err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if err := p.annotator.Annotate(ctx, id, leaseAnnotations(l)); err != nil {
		p.failure("annotate")
		return time.Time{}, fmt.Errorf("renewing %s: %w: %v", id, ErrAllocator, err)
	}
	p.ops.UpdateLease(id, func(x *Lease) error { x.Expires = l.Expires; return nil })
	return l.Expires, nil
}

// release checks token against the lease read from the allocator and destroys the unit in
// the background.
func (p *sharedPool) release(ctx context.Context, id, token string) error {
	_, l, err := p.lease(ctx, id)
	if err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := p.checkToken(l, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		p.destroy(context.WithoutCancel(ctx), id)
	}()
	return nil
}

// create creates unit id into the shared pool: it is not tracked locally until claimed.
func (p *sharedPool) create(ctx context.Context, id, tmpl string, _ func()) bool {
	t0 := time.Now()
	_, err := p.alloc.Create(ctx, id, tmpl)
	p.noteCreate(err)
	if err != nil {
		if ctx.Err() == nil {
			p.failure("create")
			p.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		}
		return false
	}
	p.recordLatency(time.Since(t0))
	p.created()
	return true
}

// destroy destroys a unit of the shared pool and forgets any local record of it.
func (p *sharedPool) destroy(ctx context.Context, id string) {
	if u, ok := p.ops.Get(id); ok && u.State == Bound {
		p.ops.Transition(id, Bound, Destroying, nil)
	}
	if err := p.alloc.Destroy(ctx, id); err != nil {
		p.failure("destroy")
		p.log.Error("destroying unit", "id", id, "err", err)
		return
	}
	p.ops.Transition(id, Destroying, Gone, nil)
	p.destroyed()
}

// destroyTracked destroys unit id in the background, in p.expiring (which the caller added
// it to) until done, so that later passes do not start another destroy of it meanwhile.
func (p *sharedPool) destroyTracked(ctx context.Context, id string) {
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		defer p.expiring.Remove(id)
		p.destroy(context.WithoutCancel(ctx), id)
	}()
}

// list describes every unit of the shared pool from the allocator's view.
func (p *sharedPool) list() []Unit {
	units, err := p.alloc.List(context.Background())
	if err != nil {
		p.log.Error("listing units", "err", err)
		return nil
	}
	out := make([]Unit, 0, len(units))
	for _, info := range units {
		u := Unit{Info: info, State: Ready}
		switch info.Annotations[annState] {
		case "claimed":
			u.State = Initialising
		case "bound":
			u.State = Bound
			u.Lease, _ = leaseFromAnnotations(info.Annotations)
		}
		if local, ok := p.ops.Get(info.ID); ok && local.State != Bound {
			u.State = local.State
		}
		out = append(out, u)
	}
	slices.SortFunc(out, byID)
	return out
}

// counts returns the shared pool's units per state, from the allocator's view (list).
func (p *sharedPool) counts() map[State]int {
	c := map[State]int{}
	for _, u := range p.list() {
		c[u.State]++
	}
	return c
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

package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// This file holds the manager's behaviour with a SharedPool allocator (several replicas
// sharing one pool of units in an API server). Local state then only tracks the units this
// replica is binding; the allocator's view (annotations) is the truth for leases.

// leader reports whether this replica runs the pool-wide duties (sizing, expiry).
func (m *Manager) leader() bool { return m.o.IsLeader == nil || m.o.IsLeader() }

// claim takes a ready unit from the shared pool, waiting (and asking for a creation) while
// there is none. It waits on the allocator's Changed notification, not a polling loop.
func (m *Manager) claim(ctx context.Context, tmpl string) (Unit, error) {
	deadline := m.o.Clock.NewTimer(m.o.AllocateWait)
	defer deadline.Stop()
	guard := m.o.Clock.NewTimer(m.o.MissedEventGuard)
	defer guard.Stop()
	asked := false
	for {
		// Taken before Claim: a unit that turns ready after Claim looked closes it.
		changed := m.shared.Changed(tmpl)
		info, err := m.shared.Claim(ctx, tmpl)
		if err == nil {
			if err := m.ops.Insert(info, Initialising, nil); err != nil {
				return Unit{}, fmt.Errorf("%w: claimed unit %s twice: %v", ErrAllocator, info.ID, err)
			}
			u, _ := m.ops.Get(info.ID)
			return u, nil
		}
		if !errors.Is(err, ErrNoReadyUnit) {
			return Unit{}, fmt.Errorf("%w: claiming a unit: %v", ErrAllocator, err)
		}
		if !asked {
			asked = true
			m.coldWait()
			m.startCreate(m.lifetime(), tmpl)
		}
		guard.Reset(m.o.MissedEventGuard)
		select {
		case <-changed:
		case <-guard.C():
		case <-deadline.C():
			return Unit{}, fmt.Errorf("%w (%v)", ErrNoCapacity, m.o.AllocateWait)
		case <-ctx.Done():
			return Unit{}, ctx.Err()
		}
	}
}

// sharedLease reads unit id's lease from the allocator.
func (m *Manager) sharedLease(ctx context.Context, id string) (UnitInfo, *Lease, error) {
	info, err := m.shared.Lookup(ctx, id)
	if err != nil {
		return UnitInfo{}, nil, err
	}
	l, err := leaseFromAnnotations(info.Annotations)
	if err != nil {
		return info, nil, fmt.Errorf("%w: %s is not bound", ErrLeaseEnded, id)
	}
	return info, l, nil
}

func (m *Manager) sharedRenew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	_, l, err := m.sharedLease(ctx, id)
	if err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if err := m.checkToken(l, token); err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	now := m.o.Clock.Now()
	if !now.Before(l.Expires) {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, ErrLeaseEnded)
	}
	d := l.TTL
	if ttl > 0 {
		d = ttl // checked and capped by Renew
	}
	l.Expires = now.Add(d)
	if err := m.annotator.Annotate(ctx, id, leaseAnnotations(l)); err != nil {
		m.failure("annotate")
		return time.Time{}, fmt.Errorf("renewing %s: %w: %v", id, ErrAllocator, err)
	}
	m.ops.UpdateLease(id, func(x *Lease) error { x.Expires = l.Expires; return nil })
	return l.Expires, nil
}

func (m *Manager) sharedRelease(ctx context.Context, id, token string) error {
	_, l, err := m.sharedLease(ctx, id)
	if err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := m.checkToken(l, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		m.destroyShared(context.WithoutCancel(ctx), id)
	}()
	return nil
}

// destroyShared destroys a unit of the shared pool and forgets any local record of it.
func (m *Manager) destroyShared(ctx context.Context, id string) {
	if u, ok := m.ops.Get(id); ok && u.State == Bound {
		m.ops.Transition(id, Bound, Destroying, nil)
	}
	if err := m.alloc.Destroy(ctx, id); err != nil {
		m.failure("destroy")
		m.log.Error("destroying unit", "id", id, "err", err)
		return
	}
	m.ops.Transition(id, Destroying, Gone, nil)
	m.destroyed()
}

// reconcileShared is the leader's pass over the shared pool: expire leases (read from the
// allocator, so leases bound by other replicas too) and size the pool.
func (m *Manager) reconcileShared(ctx context.Context) {
	now := m.o.Clock.Now()
	if !m.leader() {
		m.target.Store(0)
		return
	}
	units, err := m.alloc.List(ctx)
	if err != nil {
		m.log.Error("listing units", "err", err)
		return
	}
	bound := 0
	for _, u := range units {
		if u.Annotations[AnnotationState] == "claimed" {
			// Claimed but never bound: its replica died mid-allocation (no agent has it).
			at, err := time.Parse(time.RFC3339Nano, u.Annotations[AnnotationClaimedAt])
			if err == nil && now.Sub(at) > m.o.ClaimGrace && m.expiring.Add(u.ID) {
				m.log.Info("destroying a unit claimed but never bound", "id", u.ID, "claimed_at", at)
				m.bg.Add(1)
				go func() {
					defer m.bg.Done()
					defer m.expiring.Remove(u.ID)
					m.destroyShared(context.WithoutCancel(ctx), u.ID)
				}()
			}
			continue
		}
		l, err := leaseFromAnnotations(u.Annotations)
		if err != nil {
			continue
		}
		bound++
		if !now.Before(l.Expires) && m.expiring.Add(u.ID) {
			m.log.Info("lease expired; destroying sandbox", "id", u.ID)
			m.bg.Add(1)
			go func() {
				defer m.bg.Done()
				defer m.expiring.Remove(u.ID)
				m.destroyShared(context.WithoutCancel(ctx), u.ID)
			}()
		}
	}
	ready, creating := m.shared.Counts(m.o.PoolTemplate)
	creating = max(creating, int(m.creating.Load()))
	target := m.o.Estimator.Target(estimatorObservation(now, int(m.allocs.Swap(0)), ready, creating, bound, m.ProvisioningLatency()))
	m.target.Store(int32(target))
	if m.m != nil {
		m.m.Target.Set(float64(target))
	}
	if ctx.Err() != nil {
		return
	}
	if deficit := target - ready - creating; deficit > 0 && !m.heldBack() {
		for range min(deficit, m.o.CreateConcurrency-int(m.creating.Load())) {
			m.startCreate(ctx, m.o.PoolTemplate)
		}
	} else if surplus := ready - target; surplus > 0 {
		// Claim before destroying, so that no replica is handed a unit being destroyed.
		for range surplus {
			info, err := m.shared.Claim(ctx, m.o.PoolTemplate)
			if err != nil {
				break
			}
			m.bg.Add(1)
			go func() { defer m.bg.Done(); m.destroyShared(context.WithoutCancel(ctx), info.ID) }()
		}
	}
}

// sharedList describes every unit of the shared pool from the allocator's view.
func (m *Manager) sharedList() []Unit {
	units, err := m.alloc.List(context.Background())
	if err != nil {
		m.log.Error("listing units", "err", err)
		return nil
	}
	out := make([]Unit, 0, len(units))
	for _, info := range units {
		u := Unit{Info: info, State: Ready}
		switch info.Annotations[annState] {
		case "creating":
			u.State = Creating
		case "claimed":
			u.State = Initialising
		case "bound":
			u.State = Bound
			u.Lease, _ = leaseFromAnnotations(info.Annotations)
		}
		if local, ok := m.ops.Get(info.ID); ok && local.State != Bound {
			u.State = local.State
		}
		out = append(out, u)
	}
	slices.SortFunc(out, byID)
	return out
}

package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// pool is where a Manager keeps its units, and how it takes, renews, releases, lists, counts,
// makes and sizes them. localPool is a pool this manager owns alone (its StateOperator is the truth;
// leases are persisted for the next manager's adoption); sharedPool is one that several
// replicas share through the allocator (Capabilities.SharedPool), whose units' annotations are
// the truth. What both need (creation counting and backoff, destroying, metrics) stays on the
// Manager.
type pool interface {
	// take returns a unit of template tmpl that is now Initialising for this allocation,
	// waiting for one (and asking for a creation) while there is none, up to AllocateWait.
	take(ctx context.Context, tmpl string) (Unit, error)
	// renew extends bound unit id's lease (ttl checked and capped; zero: the lease's own
	// length) if token is its lease token; release ends it and destroys the unit.
	renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error)
	release(ctx context.Context, id, token string) error
	// units describes every unit of the pool, ordered by id; counts counts them by state.
	units() []Unit
	counts() map[State]int
	// reconcile runs one pass of the control loop; create makes one unit of tmpl (started by
	// Manager.startCreate, which counts it) and reports whether it did.
	reconcile(ctx context.Context)
	create(ctx context.Context, tmpl string) bool
}

// ownedPool is a pool this manager owns alone: it adopts what a previous manager left when the
// manager starts, runs loops of its own, and destroys its warm units when the manager closes.
type ownedPool interface {
	adopt(ctx context.Context) error
	// run starts the pool's loops; they end when loops ends or stop closes.
	run(loops context.Context, stop <-chan struct{})
	// drain destroys the units no agent holds (after the loops ended).
	drain(ctx context.Context) error
}

// localPool is the pool of a manager that owns its allocator's units alone.
type localPool struct {
	*Manager

	waiting      atomic.Int32 // allocations waiting for a ready unit (take)
	refillMu     sync.Mutex   // guards deficitSince and refillTimer (times are Clock's)
	deficitSince time.Time    // when the pool last fell below its target; zero when it is not
	refillTimer  bool         // a nudge is scheduled for the end of the refill delay
}

// run starts the loops of units that end on their own (ExitWatcher) and of the pool head's
// liveness check (Options.Ping).
func (p *localPool) run(loops context.Context, stop <-chan struct{}) {
	p.bg.Add(1)
	go func() { defer p.bg.Done(); p.handleExits(loops, stop) }()
	if p.o.Ping != nil && p.o.PingInterval > 0 {
		p.bg.Add(1)
		go func() { defer p.bg.Done(); p.pingHead(loops, stop) }()
	}
}

// drain destroys the ready units, and tries once more the remains of failed ones; bound units
// keep serving their agents and are adopted by the next manager.
func (p *localPool) drain(ctx context.Context) error {
	var errs []error
	for _, u := range p.ops.Snapshot() {
		switch {
		case u.State == Ready:
			if err := p.destroy(ctx, u.Info.ID, Ready); err != nil {
				errs = append(errs, err)
			}
		case u.State == Failed && u.Remains:
			// A last try; a unit still failing is left to the next manager's adoption.
			if err := p.destroy(ctx, u.Info.ID, Failed); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (p *localPool) units() []Unit { return p.ops.Snapshot() }

func (p *localPool) counts() map[State]int { return p.ops.Counts("") }

// take pops a Ready unit, waiting for one if the pool is empty. A waiting allocation
// starts one creation of its own (whatever the estimator's target), so it never depends on
// the pool's size alone, and starts another if that one fails (after the creation backoff);
// spare units it makes join the pool.
func (p *localPool) take(ctx context.Context, tmpl string) (Unit, error) {
	m := p.Manager
	var timeout, retry <-chan time.Time
	var mine <-chan bool // this allocation's creation: whether it made a unit
	for {
		u, ok, wait := m.ops.TakeReady(tmpl)
		if ok {
			m.publishCounts()
			return u, nil
		}
		if timeout == nil {
			m.coldWait()
			t := m.o.Clock.NewTimer(m.o.AllocateWait)
			defer t.Stop()
			timeout = t.C()
			// Counted until this returns: the reconciler leaves this many ready units
			// beyond its target for the waiters to take.
			p.waiting.Add(1)
			defer p.waiting.Add(-1)
			mine = m.startCreate(m.lifetime(), tmpl)
		}
		m.nudge()
		select {
		case <-wait:
		case made := <-mine:
			mine = nil
			if !made {
				t := m.o.Clock.NewTimer(m.backoffLeft())
				defer t.Stop()
				retry = t.C()
			}
		case <-retry:
			retry = nil
			mine = m.startCreate(m.lifetime(), tmpl)
		case <-timeout:
			return Unit{}, fmt.Errorf("%w (%v)", ErrNoCapacity, m.o.AllocateWait)
		case <-ctx.Done():
			return Unit{}, ctx.Err()
		}
	}
}

// renew extends a lease of this manager's own (ttl checked and capped by Renew; zero: the
// lease's own length) and persists it for the next manager's adoption.
func (p *localPool) renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	now := p.o.Clock.Now()
	l, err := p.ops.UpdateLease(id, func(l *Lease) error {
		if err := p.checkToken(l, token); err != nil {
			return err
		}
		if !now.Before(l.Expires) {
			return ErrLeaseEnded
		}
		d := l.TTL
		if ttl > 0 {
			d = ttl
		}
		l.Expires = now.Add(d)
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("renewing %s: %w", id, err)
	}
	if p.annotator != nil {
		if err := p.annotator.Annotate(ctx, id, leaseAnnotations(&l)); err != nil {
			p.failure("annotate")
			p.log.Error("persisting renewed lease", "id", id, "err", err)
		}
	}
	return l.Expires, nil
}

// release ends a lease of this manager's own and destroys the unit in the background.
func (p *localPool) release(ctx context.Context, id, token string) error {
	u, ok := p.ops.Get(id)
	if !ok {
		return fmt.Errorf("releasing: %w: %s", ErrUnitNotFound, id)
	}
	if u.State != Bound || u.Lease == nil {
		return fmt.Errorf("releasing %s: %w (%s)", id, ErrLeaseEnded, u.State)
	}
	if err := p.checkToken(u.Lease, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := p.destroyInBackground(ctx, id, Bound); err != nil {
		return fmt.Errorf("releasing %s: %w", id, ErrLeaseEnded)
	}
	return nil
}

// identify learns a new unit's identity (Options.Identify) when its sandbox keeps a data
// connection opened before sFuse, and returns it; empty when it is not asked for or fails.
func (m *Manager) identify(ctx context.Context, info UnitInfo) sfuse.Identity {
	if m.o.Identify == nil || !m.caps.Handoff {
		return sfuse.Identity{}
	}
	ctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	id, err := m.o.Identify(ctx, info.InitAddr)
	if err != nil {
		m.log.Warn("asking a new unit for its identity; its allocation will not name it early", "id", info.ID, "err", err)
		return sfuse.Identity{}
	}
	return id
}

// identifyTimeout bounds Options.Identify.
const identifyTimeout = 5 * time.Second

// create makes one unit of template and puts it into the pool, and reports whether it did.
func (p *localPool) create(ctx context.Context, tmpl string) bool {
	m := p.Manager
	id := m.o.NewID()
	info := UnitInfo{ID: id, Template: tmpl, Created: m.o.Clock.Now()}
	if err := m.ops.Insert(info, Creating, nil); err != nil {
		m.log.Error("registering new unit", "id", id, "err", err)
		return false
	}
	m.publishCounts()
	t0 := time.Now() // the system clock: it measures the runtime's work
	got, err := m.alloc.Create(ctx, id, tmpl)
	m.noteCreate(err)
	if err != nil && ctx.Err() != nil {
		// Shutting down: the allocator has cleaned up; this is not a failure of the runtime.
		m.log.Info("unit creation cancelled", "id", id)
		m.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: cancelled", errors.Is(err, ErrRemains) })
		return false
	}
	if err != nil {
		m.failure("create")
		m.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		m.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: "+err.Error(), errors.Is(err, ErrRemains) })
		m.publishCounts()
		return false
	}
	m.recordLatency(time.Since(t0))
	got.ID, got.Template = id, tmpl
	if got.Created.IsZero() {
		got.Created = info.Created
	}
	if m.o.Prepare != nil {
		m.o.Prepare(got.InitAddr)
	}
	ident := m.identify(ctx, got)
	if _, err := m.ops.Transition(id, Creating, Ready, func(u *Unit) { u.Info, u.Identity = got, ident }); err != nil {
		m.log.Error("unit vanished while being created", "id", id, "err", err)
		if m.o.Forget != nil {
			m.o.Forget(got.InitAddr)
		}
		m.alloc.Destroy(context.WithoutCancel(ctx), id)
		return false
	}
	m.totals.creations.Add(1)
	if m.m != nil {
		m.m.Creations.Inc()
	}
	m.publishCounts()
	return true
}

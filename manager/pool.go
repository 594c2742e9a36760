package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// pool is where a Manager keeps its units, and how it takes, renews, releases, lists, counts,
// makes and sizes them. warmPool is a pool this manager owns alone (its StateOperator is the
// truth; leases are persisted for the next manager's adoption); sharedPool is one that several
// replicas share through the allocator (Capabilities.SharedPool), whose units' annotations are
// the truth.
type pool interface {
	// take returns a unit of template tmpl that is now Initialising for this allocation,
	// waiting for one (and asking for a creation) while there is none, up to AllocateWait.
	take(ctx context.Context, tmpl string) (Unit, error)
	// renew extends bound unit id's lease (ttl checked and capped; zero: the lease's own
	// length) if token is its lease token; release ends it and destroys the unit.
	renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error)
	release(ctx context.Context, id, token string) error
	// units describes every unit of the pool, ordered by id; counts counts them by
	// template and state.
	units() []Unit
	counts() map[string]map[State]int
	// reconcile runs one pass of the control loop.
	reconcile(ctx context.Context)
}

// ownedPool is a pool this manager owns alone: it adopts what a previous manager left when the
// manager starts, runs loops of its own, and destroys its warm units when the manager closes.
type ownedPool interface {
	adopt(ctx context.Context) error
	// run starts the pool's loops; they end when loops ends or stop closes.
	run(loops context.Context, stop <-chan struct{})
	// drain destroys the units no agent holds (after the loops ended).
	drain(ctx context.Context) error
	// drainTemplate destroys tmpl's ready units in the background, and returns how many.
	drainTemplate(ctx context.Context, tmpl string) int
}

// poolHost is what a pool asks of the manager that holds it. *Manager implements it; a
// pool's tests use a recording fake.
type poolHost interface {
	// target asks the estimator of tmpl's pool (one of Options.Pools) how many ready units
	// of tmpl the pool should hold, given its counts now and the demand since the last call,
	// and records the answer (Status, Metrics.Target).
	target(now time.Time, tmpl string, ready, creating, bound int) int
	// following records that this replica does not size its shared pool now (another replica
	// leads): its target is 0.
	following()
	// nudge asks for a reconcile pass soon; it never blocks.
	nudge()
}

var _ poolHost = (*Manager)(nil)

// poolDeps is what a pool is made of besides its own state: the manager's settings (with
// New's defaults), the allocator, the state operator, the books and the host.
type poolDeps struct {
	o         Options
	templates *templateSet // the templates served and their pools (not o.Templates, o.Pools)
	alloc     Allocator
	annotator Annotator // Capabilities.Adoption's; nil without it
	ops       *StateOperator
	log       *slog.Logger
	tally     *tally
	creations *creations
	bg        *background
	host      poolHost
}

// prepare and forget are Options.Conns' Prepare and Forget, when it is set.
func (d *poolDeps) prepare(initAddr string) {
	if d.o.Conns != nil {
		d.o.Conns.Prepare(initAddr)
	}
}

func (d *poolDeps) forget(initAddr string) {
	if d.o.Conns != nil {
		d.o.Conns.Forget(initAddr)
	}
}

// warmPool is the warm pool of a manager that owns its allocator's units alone: the ready
// units wait in its StateOperator, oldest first.
type warmPool struct {
	poolDeps
	binder  EgressBinder // Capabilities.Egress's; nil without it
	exits   *exitQueue   // units that ended on their own (ExitWatcher)
	watcher ExitWatcher  // Capabilities.Exits'; nil without it
	refill  time.Duration

	waitMu  sync.Mutex     // guards waiting
	waiting map[string]int // allocations waiting for a ready unit (take), by template
	// deficitSince is when each template's pool last fell below its target (absent when it
	// is not); refillTimer tells that a nudge is scheduled for the end of a refill delay.
	refillMu     sync.Mutex // guards deficitSince and refillTimer (times are Clock's)
	deficitSince map[string]time.Time
	refillTimer  bool
}

var (
	_ pool      = (*warmPool)(nil)
	_ ownedPool = (*warmPool)(nil)
)

// newWarmPool makes the warm pool of an allocator with caps (checked by New).
func newWarmPool(d poolDeps, caps Capabilities) *warmPool {
	p := &warmPool{poolDeps: d, exits: newExitQueue(), waiting: map[string]int{}, deficitSince: map[string]time.Time{}}
	p.binder, _ = d.alloc.(EgressBinder)
	if caps.Exits {
		p.watcher, _ = d.alloc.(ExitWatcher)
	}
	if caps.CreatesOnHost {
		p.refill = DefaultRefillDelay
	}
	return p
}

// run starts the loops of units that end on their own (ExitWatcher) and of the pool head's
// liveness check (Options.PingInterval).
func (p *warmPool) run(loops context.Context, stop <-chan struct{}) {
	p.bg.do(func() { p.handleExits(loops, stop) })
	if p.o.Conns != nil && p.o.PingInterval > 0 {
		p.bg.do(func() { p.pingHead(loops, stop) })
	}
}

// drain destroys the ready units, and tries once more the remains of failed ones; bound units
// keep serving their agents and are adopted by the next manager.
func (p *warmPool) drain(ctx context.Context) error {
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

// drainTemplate destroys tmpl's ready units in the background (a template replaced or
// removed), and returns how many it started to destroy.
func (p *warmPool) drainTemplate(ctx context.Context, tmpl string) int {
	n := 0
	for _, id := range p.ops.OldestReady(tmpl, p.ops.Counts(tmpl)[Ready]) {
		if p.destroyInBackground(ctx, id, Ready) == nil { // else taken meanwhile
			n++
		}
	}
	return n
}

func (p *warmPool) units() []Unit { return p.ops.Snapshot() }

func (p *warmPool) counts() map[string]map[State]int { return p.ops.CountsByTemplate() }

// startCreate counts one creation of tmpl and makes it in the background (create); the
// channel receives whether it made a unit.
func (p *warmPool) startCreate(ctx context.Context, tmpl string) <-chan bool {
	return p.creations.start(p.bg, tmpl, func() bool { return p.create(ctx, tmpl) })
}

// wait counts an allocation waiting for a ready unit of tmpl until the returned func is
// called: the reconciler leaves that many ready units beyond the target for the waiters.
func (p *warmPool) wait(tmpl string) (done func()) {
	p.waitMu.Lock()
	p.waiting[tmpl]++
	p.waitMu.Unlock()
	return func() {
		p.waitMu.Lock()
		p.waiting[tmpl]--
		p.waitMu.Unlock()
	}
}

// waitingFor is how many allocations wait for a ready unit of tmpl.
func (p *warmPool) waitingFor(tmpl string) int {
	p.waitMu.Lock()
	defer p.waitMu.Unlock()
	return p.waiting[tmpl]
}

// take pops a Ready unit, waiting for one if the pool is empty. A waiting allocation
// starts one creation of its own (whatever the estimator's target), so it never depends on
// the pool's size alone, and starts another if that one fails (after the creation backoff);
// spare units it makes join the pool.
func (p *warmPool) take(ctx context.Context, tmpl string) (Unit, error) {
	var timeout, retry <-chan time.Time
	var mine <-chan bool // this allocation's creation: whether it made a unit
	for {
		if !p.templates.known(tmpl) { // removed while this allocation waited
			return Unit{}, fmt.Errorf("%w: %q was removed", ErrUnknownTemplate, tmpl)
		}
		u, ok, wait := p.ops.TakeReady(tmpl)
		if ok {
			p.tally.publishCounts()
			return u, nil
		}
		if timeout == nil {
			p.tally.coldWait()
			t := p.o.Clock.NewTimer(p.o.AllocateWait)
			defer t.Stop()
			timeout = t.C()
			// Counted until this returns: the reconciler leaves this many ready units
			// beyond its target for the waiters to take.
			defer p.wait(tmpl)()
			mine = p.startCreate(p.bg.lifetime(), tmpl)
		}
		p.host.nudge()
		select {
		case <-wait:
		case made := <-mine:
			mine = nil
			if !made {
				t := p.o.Clock.NewTimer(p.creations.backoffLeft(tmpl))
				defer t.Stop()
				retry = t.C()
			}
		case <-retry:
			retry = nil
			mine = p.startCreate(p.bg.lifetime(), tmpl)
		case <-timeout:
			return Unit{}, fmt.Errorf("%w (%v)", ErrNoCapacity, p.o.AllocateWait)
		case <-ctx.Done():
			return Unit{}, ctx.Err()
		}
	}
}

// renew extends a lease of this manager's own (ttl checked and capped by Renew; zero: the
// lease's own length) and persists it for the next manager's adoption.
func (p *warmPool) renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	now := p.o.Clock.Now()
	l, err := p.ops.UpdateLease(id, func(l *Lease) error {
		if err := checkToken(l, token); err != nil {
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
			p.tally.failure("annotate")
			p.log.Error("persisting renewed lease", "id", id, "err", err)
		}
	}
	return l.Expires, nil
}

// release ends a lease of this manager's own and destroys the unit in the background.
func (p *warmPool) release(ctx context.Context, id, token string) error {
	u, ok := p.ops.Get(id)
	if !ok {
		return fmt.Errorf("releasing: %w: %s", ErrUnitNotFound, id)
	}
	if u.State != Bound || u.Lease == nil {
		return fmt.Errorf("releasing %s: %w (%s)", id, ErrLeaseEnded, u.State)
	}
	if err := checkToken(u.Lease, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := p.destroyInBackground(ctx, id, Bound); err != nil {
		return fmt.Errorf("releasing %s: %w", id, ErrLeaseEnded)
	}
	return nil
}

// create makes one unit of template and puts it into the pool, and reports whether it did.
func (p *warmPool) create(ctx context.Context, tmpl string) bool {
	gen, _ := p.templates.generation(tmpl)
	id := p.o.NewID()
	info := UnitInfo{ID: id, Template: tmpl, Created: p.o.Clock.Now()}
	if err := p.ops.Insert(info, Creating, nil); err != nil {
		p.log.Error("registering new unit", "id", id, "err", err)
		return false
	}
	p.tally.publishCounts()
	t0 := time.Now() // the system clock: it measures the runtime's work
	got, err := p.alloc.Create(ctx, id, tmpl)
	p.creations.ended(tmpl, err)
	if err != nil && ctx.Err() != nil {
		// Shutting down: the allocator has cleaned up; this is not a failure of the runtime.
		p.log.Info("unit creation cancelled", "id", id)
		p.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: cancelled", errors.Is(err, ErrRemains) })
		return false
	}
	if err != nil {
		p.tally.createFailed(tmpl)
		p.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		p.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: "+err.Error(), errors.Is(err, ErrRemains) })
		p.tally.publishCounts()
		return false
	}
	p.creations.took(tmpl, time.Since(t0))
	got.ID, got.Template = id, tmpl
	if got.Created.IsZero() {
		got.Created = info.Created
	}
	p.prepare(got.InitAddr)
	if _, err := p.ops.Transition(id, Creating, Ready, func(u *Unit) { u.Info = got }); err != nil {
		p.log.Error("unit vanished while being created", "id", id, "err", err)
		p.forget(got.InitAddr)
		p.alloc.Destroy(context.WithoutCancel(ctx), id)
		return false
	}
	if now, ok := p.templates.generation(tmpl); !ok || now != gen {
		// The template changed or went while the unit was made: it is not what the pool
		// serves now (and an allocation that took it meanwhile had asked before the change).
		if p.destroyInBackground(ctx, id, Ready) == nil {
			p.log.Info("destroying a unit of a template that changed while it was made", "id", id, "template", tmpl)
			return false
		}
	}
	p.tally.created()
	p.tally.publishCounts()
	return true
}

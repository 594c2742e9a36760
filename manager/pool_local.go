package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// localPool is the pool of a manager that is its units' only owner (an allocator without
// Capabilities.SharedPool): every unit is tracked in the manager's state (ops) from its
// creation to its destruction, the warm pool is the state's FIFO of Ready units, and leases
// live there, persisted with the allocator (Annotator) only for the next manager's adoption.
// It adopts at Start what a previous manager left, watches its units' exits and pings the
// pool's head, and destroys its unbound units at Close.
type localPool struct {
	*Manager
	exits *exitQueue // units that ended on their own (ExitWatcher)

	// readyMu makes a creation's end one step for a reconcile pass: its unit turns Ready
	// and stops counting in m.creating under it, and the pass reads both under it.
	readyMu sync.Mutex

	refillMu     sync.Mutex // guards deficitSince and refillTimer (times are Clock's)
	deficitSince time.Time  // when the pool last fell below its target; zero when it is not
	refillTimer  bool       // a nudge is scheduled for the end of the refill delay
}

var _ pool = (*localPool)(nil)

func newLocalPool(m *Manager) *localPool { return &localPool{Manager: m, exits: newExitQueue()} }

// start adopts or destroys the units a previous manager left, then watches exits and pings
// the pool's head under life until it or ctx ends.
func (p *localPool) start(ctx, life context.Context) error {
	if w, ok := p.alloc.(ExitWatcher); ok {
		w.WatchExits(p.exits.add) // before adoption: units that ended meanwhile are reported
	}
	if err := p.adopt(ctx); err != nil {
		return err
	}
	p.bg.Add(1)
	go func() { defer p.bg.Done(); p.handleExits(life, ctx.Done()) }()
	if p.o.Ping != nil && p.o.PingInterval > 0 {
		p.bg.Add(1)
		go func() { defer p.bg.Done(); p.pingHead(life, ctx.Done()) }()
	}
	return nil
}

// close destroys the units that are not bound; bound units keep serving their agents and are
// adopted by the next manager.
func (p *localPool) close(ctx context.Context) error {
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

// take pops a Ready unit, waiting for one if the pool is empty. A waiting allocation starts
// one creation of its own (whatever the estimator's target), so it never depends on the
// pool's size alone, and starts another if that one fails (after the creation backoff); spare
// units it makes join the pool.
func (p *localPool) take(ctx context.Context, tmpl string) (Unit, error) {
	var timeout, retry <-chan time.Time
	var mine <-chan bool // this allocation's creation: whether it made a unit
	for {
		u, ok, wait := p.ops.TakeReady(tmpl)
		if ok {
			p.publishCounts()
			return u, nil
		}
		if timeout == nil {
			p.coldWait()
			t := p.o.Clock.NewTimer(p.o.AllocateWait)
			defer t.Stop()
			timeout = t.C()
			// Counted until this returns: the reconciler leaves this many ready units
			// beyond its target for the waiters to take.
			p.waiting.Add(1)
			defer p.waiting.Add(-1)
			mine = p.startCreate(p.lifetime(), tmpl, p.create)
		}
		p.nudge()
		select {
		case <-wait:
		case made := <-mine:
			mine = nil
			if !made {
				t := p.o.Clock.NewTimer(p.backoffLeft())
				defer t.Stop()
				retry = t.C()
			}
		case <-retry:
			retry = nil
			mine = p.startCreate(p.lifetime(), tmpl, p.create)
		case <-timeout:
			return Unit{}, fmt.Errorf("%w (%v)", ErrNoCapacity, p.o.AllocateWait)
		case <-ctx.Done():
			return Unit{}, ctx.Err()
		}
	}
}

// renew extends the lease held in the manager's state, then persists it for adoption (a
// failure to persist is logged: the lease stands).
func (p *localPool) renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	now := p.o.Clock.Now()
	l, err := p.ops.UpdateLease(id, func(l *Lease) error { return p.extend(l, token, ttl, now) })
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

// release checks token against the lease in the manager's state and destroys the unit in the
// background.
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

// list returns every unit of the manager's state.
func (p *localPool) list() []Unit { return p.ops.Snapshot() }

// counts returns the manager's units per state.
func (p *localPool) counts() map[State]int { return p.ops.Counts("") }

// create makes unit id of template and puts it into the pool, and reports whether it did.
func (p *localPool) create(ctx context.Context, id, tmpl string, uncount func()) bool {
	info := UnitInfo{ID: id, Template: tmpl, Created: p.o.Clock.Now()}
	if err := p.ops.Insert(info, Creating, nil); err != nil {
		p.log.Error("registering new unit", "id", id, "err", err)
		return false
	}
	p.publishCounts()
	t0 := time.Now() // the system clock: it measures the runtime's work
	got, err := p.alloc.Create(ctx, id, tmpl)
	p.noteCreate(err)
	if err != nil && ctx.Err() != nil {
		// Shutting down: the allocator has cleaned up; this is not a failure of the runtime.
		p.log.Info("unit creation cancelled", "id", id)
		p.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: cancelled", errors.Is(err, ErrRemains) })
		return false
	}
	if err != nil {
		p.failure("create")
		p.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		p.ops.Transition(id, Creating, Failed, func(u *Unit) { u.Err, u.Remains = "create: "+err.Error(), errors.Is(err, ErrRemains) })
		p.publishCounts()
		return false
	}
	p.recordLatency(time.Since(t0))
	got.ID, got.Template = id, tmpl
	if got.Created.IsZero() {
		got.Created = info.Created
	}
	p.readyMu.Lock()
	_, err = p.ops.Transition(id, Creating, Ready, func(u *Unit) { u.Info = got })
	uncount()
	p.readyMu.Unlock()
	if err != nil {
		p.log.Error("unit vanished while being created", "id", id, "err", err)
		p.alloc.Destroy(context.WithoutCancel(ctx), id)
		return false
	}
	p.created()
	if p.o.Prepare != nil {
		p.o.Prepare(got.InitAddr)
	}
	p.publishCounts()
	return true
}

// toDestroying moves a unit from state from to Destroying (a Ready unit's prepared init
// connection is forgotten).
func (p *localPool) toDestroying(id string, from State) error {
	u, err := p.ops.Transition(id, from, Destroying, func(u *Unit) { u.Remains = false })
	if err != nil {
		return err
	}
	if from == Ready && p.o.Forget != nil {
		p.o.Forget(u.Info.InitAddr)
	}
	return nil
}

// destroy moves a unit from state from to Destroying and destroys it.
func (p *localPool) destroy(ctx context.Context, id string, from State) error {
	if err := p.toDestroying(id, from); err != nil {
		return err
	}
	return p.finishDestroy(ctx, id)
}

// destroyInBackground moves a unit from state from to Destroying now and destroys it in the
// background (ctx's values, not its cancellation).
func (p *localPool) destroyInBackground(ctx context.Context, id string, from State) error {
	if err := p.toDestroying(id, from); err != nil {
		return err
	}
	p.bg.Add(1)
	go func() { defer p.bg.Done(); p.finishDestroy(context.WithoutCancel(ctx), id) }()
	return nil
}

func (p *localPool) finishDestroy(ctx context.Context, id string) error {
	p.publishCounts()
	err := p.alloc.Destroy(ctx, id)
	if err != nil {
		p.failure("destroy")
		p.ops.Transition(id, Destroying, Failed, func(u *Unit) {
			u.Err, u.Remains = fmt.Sprintf("destroy: %v (retried every %v)", err, RemainsRetry), true
		})
		p.log.Error("destroying unit; it is retried", "id", id, "err", err, "retry_after", RemainsRetry)
	} else {
		p.ops.Transition(id, Destroying, Gone, nil)
		p.destroyed()
	}
	p.publishCounts()
	return err
}

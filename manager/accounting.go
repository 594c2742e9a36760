package manager

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds the books both pools and the allocation path keep: what happened (tally),
// the creations in flight with their backoff and times (creations), and the goroutines that
// outlive a call but not the manager (background). Each is usable alone, so that a pool is
// tested alone.

// tally counts what happened to units and allocations: Status's totals, and Metrics when
// set. Safe for concurrent use.
type tally struct {
	ops *StateOperator // the unit counts publishCounts reads
	m   *Metrics       // nil: totals only

	allocations, coldWaits, creations, destructions, failures atomic.Uint64
}

// failure counts a failure of stage (Metrics.Failures' label).
func (t *tally) failure(stage string) {
	t.failures.Add(1)
	if t.m != nil {
		t.m.Failures.WithLabelValues(stage).Inc()
	}
}

// createFailed counts a failed creation of tmpl: a "create" failure, and one of the
// template's (Metrics.CreateFailures).
func (t *tally) createFailed(tmpl string) {
	t.failure("create")
	if t.m != nil {
		t.m.CreateFailures.WithLabelValues(tmpl).Inc()
	}
}

// destroyed counts a destruction.
func (t *tally) destroyed() {
	t.destructions.Add(1)
	if t.m != nil {
		t.m.Destructions.Inc()
	}
}

// created counts a unit that joined a pool.
func (t *tally) created() {
	t.creations.Add(1)
	if t.m != nil {
		t.m.Creations.Inc()
	}
}

// coldWait counts an allocation that found no ready unit and waits for one to be created.
func (t *tally) coldWait() {
	t.coldWaits.Add(1)
	if t.m != nil {
		t.m.ColdWaits.Inc()
	}
}

// allocated counts an allocation served in d.
func (t *tally) allocated(d time.Duration) {
	t.allocations.Add(1)
	if t.m != nil {
		t.m.Allocations.Inc()
		t.m.AllocationSeconds.Observe(d.Seconds())
	}
}

// timeStep records the time since start as the allocation step's (Metrics.AllocationSteps).
func (t *tally) timeStep(step string, start time.Time) {
	if t.m != nil {
		t.m.steps[step].Observe(time.Since(start).Seconds())
	}
}

// publishCounts sets Metrics.Units from the state operator's counts.
func (t *tally) publishCounts() {
	if t.m == nil {
		return
	}
	c := t.ops.Counts("")
	for s, name := range stateNames {
		t.m.Units.WithLabelValues(name).Set(float64(c[s]))
	}
}

// creations counts the creations in flight, and keeps for each template the backoff after its
// failed creations, its last failure and the recent creation times its provisioning latency is
// made of: a template whose image cannot run holds back its own pool, not the others. Safe for
// concurrent use.
type creations struct {
	clock  Clock
	warmUp time.Duration // Capabilities.WarmUp
	// onEnd, if set, is called after each creation has left the count: the reconciler's
	// nudge. A creation's unit may turn ready, and be taken, before the count drops, so a
	// pass in between sees the pool refilling when it no longer is.
	onEnd func()

	inFlight atomic.Int32              // every template's
	mu       sync.Mutex                // guards of
	of       map[string]*templateBooks // by template, made on first use
}

// templateBooks are one template's creations.
type templateBooks struct {
	inFlight   int
	failStreak int       // consecutive failed creations
	holdUntil  time.Time // no new creations before this (Clock's time)
	lastErr    string    // the last failure's error, until a creation succeeds
	lastErrAt  time.Time
	latencies  []time.Duration
}

// books returns tmpl's books; c.mu must be held.
func (c *creations) books(tmpl string) *templateBooks {
	if c.of == nil {
		c.of = map[string]*templateBooks{}
	}
	b := c.of[tmpl]
	if b == nil {
		b = &templateBooks{}
		c.of[tmpl] = b
	}
	return b
}

// start counts one creation of tmpl in flight (before starting the goroutine, so that a
// reconcile pass in between sees it) and runs create in the background on bg; the channel
// receives whether it made a unit.
func (c *creations) start(bg *background, tmpl string, create func() bool) <-chan bool {
	made := make(chan bool, 1)
	c.mu.Lock()
	c.books(tmpl).inFlight++
	c.mu.Unlock()
	c.inFlight.Add(1)
	bg.do(func() {
		ok := create()
		c.mu.Lock()
		c.books(tmpl).inFlight--
		c.mu.Unlock()
		c.inFlight.Add(-1)
		if c.onEnd != nil {
			c.onEnd()
		}
		made <- ok
	})
	return made
}

// count is how many creations are in flight, of every template.
func (c *creations) count() int { return int(c.inFlight.Load()) }

// countOf is how many creations of tmpl are in flight.
func (c *creations) countOf(tmpl string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.books(tmpl).inFlight
}

// ended keeps tmpl's backoff after an allocator's Create returned err: exponential (0.5 s
// doubling to a minute) after consecutive failures, so that a broken template does not spin;
// failures stay visible in status and metrics meanwhile.
func (c *creations) ended(tmpl string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.books(tmpl)
	if err != nil {
		b.failStreak++
		b.holdUntil = c.clock.Now().Add(min(time.Minute, 500*time.Millisecond<<min(b.failStreak-1, 7)))
		b.lastErr, b.lastErrAt = err.Error(), c.clock.Now()
	} else {
		b.failStreak, b.lastErr, b.lastErrAt = 0, "", time.Time{}
	}
}

// forgetFailures clears tmpl's backoff and last failure: the template changed, and what
// failed before says nothing of it now.
func (c *creations) forgetFailures(tmpl string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.books(tmpl)
	b.failStreak, b.holdUntil, b.lastErr, b.lastErrAt = 0, time.Time{}, "", time.Time{}
}

// lastFailure is tmpl's last creation error and when it happened, while no creation has
// succeeded since; "" when none.
func (c *creations) lastFailure(tmpl string) (string, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.books(tmpl)
	return b.lastErr, b.lastErrAt
}

// backoffLeft is how long creations of tmpl still wait for its backoff.
func (c *creations) backoffLeft(tmpl string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(0, c.books(tmpl).holdUntil.Sub(c.clock.Now()))
}

// heldBack reports whether creations of tmpl wait for its backoff.
func (c *creations) heldBack(tmpl string) bool { return c.backoffLeft(tmpl) > 0 }

// took records the time a successful Create of tmpl took (the runtime's work).
func (c *creations) took(tmpl string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.books(tmpl)
	b.latencies = append(b.latencies, d)
	if len(b.latencies) > 32 {
		b.latencies = b.latencies[len(b.latencies)-32:]
	}
}

// provisioningLatency is the median of tmpl's recent creation times (1 s before any
// creation) plus the units' warm-up: how long a unit takes from the decision to create it to
// serving at full speed.
func (c *creations) provisioningLatency(tmpl string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.books(tmpl)
	if len(b.latencies) == 0 {
		return time.Second + c.warmUp
	}
	s := slices.Clone(b.latencies)
	slices.Sort(s)
	return s[len(s)/2] + c.warmUp
}

// background runs the goroutines that outlive a call but not the manager: Close waits for
// them.
type background struct {
	wg   sync.WaitGroup
	life context.Context // set by Manager.Start; ends at Close
}

// do runs f in a goroutine of its own.
func (b *background) do(f func()) {
	b.wg.Add(1)
	go func() { defer b.wg.Done(); f() }()
}

// lifetime is the context of work that outlives a request but not the manager.
func (b *background) lifetime() context.Context {
	if b.life == nil {
		return context.Background() // Reconcile driven by hand, without Start
	}
	return b.life
}

package manager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/manager/estimator"
)

// RemainsRetry is how long after a failed destroy the manager destroys the unit again (see
// Unit.Remains), and again after each further failure.
const RemainsRetry = 30 * time.Second

// DefaultRefillDelay is how long a pool whose allocator CreatesOnHost may stay below its
// target, while it still holds a ready unit, before creations start. A creation is CPU-heavy;
// started at once it competes with the allocation that emptied the slot and with that agent's
// TLS handshake and first calls. The wait is measured from when the deficit began, so steady
// demand cannot postpone a refill further, and an empty pool never waits (on Clock, like every
// wait of the manager). Long enough for an allocation and the agent's first calls, short
// against a creation (docs/performance.md).
const DefaultRefillDelay = 30 * time.Millisecond

// DefaultTemplate is the template used when a request names none.
const DefaultTemplate = "default"

// Options configure a Manager. Allocator, Estimator (or Pools), Clock, and Initializer or
// Conns are required. What depends on the runtime (the refill delay, the units' warm-up)
// comes from the allocator's Capabilities.
type Options struct {
	Allocator Allocator
	Estimator estimator.Estimator
	Clock     Clock
	// Initializer performs sFuse on a connection of its own (the plain path); not with Conns.
	Initializer Initializer
	// Conns, instead of Initializer, keeps connections to the init listeners of the units in
	// the pool and performs sFuse over them (internal/fastpath/initconns.Conns in production). With it
	// the manager also pings the pool's head (PingInterval).
	Conns InitConns
	// PingInterval, if positive with Conns, is how often the unit the next allocation will
	// take is pinged, to find it dead before an allocation does (see pingHead).
	PingInterval time.Duration
	// Templates the allocator can create. PoolTemplate is the template of a request that
	// names none (default: the first).
	Templates    []string
	PoolTemplate string
	// Pools are the templates the manager keeps ready units of, each sized by its own
	// estimator and refilled on its own; an allocation of a template takes only that
	// template's units, and one of a template without a pool waits for its unit to be made.
	// Empty: PoolTemplate's pool alone, sized by Estimator.
	Pools []TemplatePool
	// Lease lengths: DefaultLeaseTTL when a request gives none, capped at MaxLeaseTTL.
	DefaultLeaseTTL, MaxLeaseTTL time.Duration
	// AllocateWait bounds how long Allocate waits for a ready unit when the pool is empty.
	AllocateWait time.Duration
	// CreateConcurrency bounds units being created at once.
	CreateConcurrency int
	// ReconcileInterval is the reconciler's period (it also runs after every allocation).
	ReconcileInterval time.Duration
	// ClaimGrace is how long a unit may stay claimed without being bound before the leader
	// destroys it as an orphan of a replica that died mid-allocation (default 2 minutes).
	ClaimGrace time.Duration
	// SeparateClaim makes a shared pool claim each unit with its own write before binding
	// it, even where the allocator is a OneWriteClaimer (which by default claims the unit
	// with the lease's write, one write fewer on the allocation's path).
	SeparateClaim bool
	// MissedEventGuard is how long an Allocate waiting on an empty shared pool waits for the
	// allocator's change notification before it tries to claim again anyway (default 1 s). It
	// only guards against a notification lost to a bug: a change is never expected to go
	// unannounced, and a waiting Allocate makes no request to the backend.
	MissedEventGuard time.Duration
	// IsLeader tells whether this replica runs the pool-wide duties with a SharedPool
	// allocator (pool sizing, lease expiry); nil means always (a single manager).
	IsLeader func() bool
	// NewID returns a fresh unit id; nil uses random fixed-width "fbx-" ids.
	NewID   func() string
	Logger  *slog.Logger
	Metrics *Metrics
}

// TemplatePool is the warm pool of one template, and the estimator that sizes it. Image and
// Hash describe the template for Status only: its image, and the hash of its content.
type TemplatePool struct {
	Template    string
	Estimator   estimator.Estimator
	Image, Hash string
}

// Manager is the control plane. It is safe for concurrent use.
type Manager struct {
	o          Options
	alloc      Allocator
	pool       pool // where units are kept: warmPool or sharedPool
	ops        *StateOperator
	log        *slog.Logger
	initialize Initializer // Options.Initializer, or Options.Conns' Initialize

	// What the allocator declared (Capabilities) and, for each declared feature, its
	// interface (nil when not declared). Fixed by New.
	caps      Capabilities
	binder    EgressBinder
	annotator Annotator
	claimer   OneWriteClaimer // a shared pool's, unless Options.SeparateClaim
	drainer   OutdatedDrainer // Capabilities.Versions'

	tally     *tally
	creations *creations
	bg        *background

	wake        chan struct{} // nudges the reconciler
	reconcileMu sync.Mutex    // one Reconcile pass (or template change) at a time
	// templates are the templates served, with their pools' sizers and their allocation
	// times in the last minute (Options.Templates and Pools, then SetTemplate and
	// RemoveTemplate).
	templates   *templateSet
	cancelLoops context.CancelFunc
}

// sizer is one pool's estimator, the allocations since it last set a target, and that target.
type sizer struct {
	est    estimator.Estimator // called by reconcile passes, one at a time
	allocs atomic.Int64
	target atomic.Int32
}

// demandLog holds a template's allocation times in the last minute.
type demandLog struct {
	mu    sync.Mutex // guards times
	times []time.Time
}

// add records an allocation at now and forgets those more than a minute before it.
func (d *demandLog) add(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.times = append(d.times, now)
	cut := 0
	for cut < len(d.times) && now.Sub(d.times[cut]) > time.Minute {
		cut++
	}
	d.times = d.times[cut:]
}

// perSecond is the allocations per second over the minute before now.
func (d *demandLog) perSecond(now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, t := range d.times {
		if now.Sub(t) <= time.Minute {
			n++
		}
	}
	return float64(n) / 60
}

// New checks o and returns a Manager. Call Start to adopt leftovers and run the loops.
func New(o Options) (*Manager, error) {
	switch {
	case o.Allocator == nil:
		return nil, errors.New("manager: an allocator is required")
	case o.Estimator == nil && len(o.Pools) == 0:
		return nil, errors.New("manager: an estimator is required")
	case o.Clock == nil:
		return nil, errors.New("manager: a clock is required")
	case o.Initializer == nil && o.Conns == nil:
		return nil, errors.New("manager: an initializer (or init connections) is required")
	case o.Initializer != nil && o.Conns != nil:
		return nil, errors.New("manager: an initializer or init connections, not both (a connection Conns prepared is released by its own Initialize)")
	}
	if err := withDefaults(&o); err != nil {
		return nil, err
	}
	for _, p := range o.Pools {
		if p.Estimator == nil {
			return nil, fmt.Errorf("manager: the pool of template %q has no estimator", p.Template)
		}
	}
	ops := NewStateOperator(o.Clock)
	m := &Manager{o: o, alloc: o.Allocator, ops: ops, log: o.Logger, initialize: o.Initializer,
		tally: &tally{ops: ops, m: o.Metrics}, bg: &background{}, wake: make(chan struct{}, 1),
		templates: newTemplateSet(o.Templates, o.Pools)}
	if o.Conns != nil {
		m.initialize = o.Conns.Initialize
	}
	if err := m.useCapabilities(); err != nil {
		return nil, err
	}
	m.creations = &creations{clock: o.Clock, warmUp: m.caps.WarmUp, onEnd: m.nudge}
	deps := poolDeps{o: o, templates: m.templates, alloc: m.alloc, annotator: m.annotator, ops: ops, log: m.log,
		tally: m.tally, creations: m.creations, bg: m.bg, host: m}
	if m.caps.SharedPool {
		sp := newSharedPool(deps, m.drainer)
		m.pool, m.claimer = sp, sp.claimer
	} else {
		m.pool = newWarmPool(deps, m.caps)
	}
	return m, nil
}

// withDefaults checks o's templates and fills in the defaults of unset fields.
func withDefaults(o *Options) error {
	if len(o.Templates) == 0 {
		o.Templates = []string{DefaultTemplate}
	}
	if o.PoolTemplate == "" {
		o.PoolTemplate = o.Templates[0]
	}
	if !slices.Contains(o.Templates, o.PoolTemplate) {
		return fmt.Errorf("manager: pool template %q is not among the templates %q", o.PoolTemplate, o.Templates)
	}
	if len(o.Pools) == 0 {
		o.Pools = []TemplatePool{{Template: o.PoolTemplate, Estimator: o.Estimator}}
	}
	seen := map[string]bool{}
	for _, p := range o.Pools {
		switch {
		case !slices.Contains(o.Templates, p.Template):
			return fmt.Errorf("manager: pool of template %q, which is not among the templates %q", p.Template, o.Templates)
		case seen[p.Template]:
			return fmt.Errorf("manager: two pools of template %q", p.Template)
		}
		seen[p.Template] = true
	}
	if o.DefaultLeaseTTL <= 0 {
		o.DefaultLeaseTTL = 10 * time.Minute
	}
	if o.MaxLeaseTTL <= 0 {
		o.MaxLeaseTTL = 24 * time.Hour
	}
	o.DefaultLeaseTTL = min(o.DefaultLeaseTTL, o.MaxLeaseTTL)
	if o.AllocateWait <= 0 {
		o.AllocateWait = 30 * time.Second
	}
	if o.CreateConcurrency <= 0 {
		o.CreateConcurrency = 4
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = 200 * time.Millisecond
	}
	if o.NewID == nil {
		o.NewID = randomID
	}
	if o.MissedEventGuard <= 0 {
		o.MissedEventGuard = time.Second
	}
	if o.ClaimGrace <= 0 {
		o.ClaimGrace = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// useCapabilities takes the allocator's declaration and the interface of each declared
// feature; a declared feature the allocator does not implement is an error.
func (m *Manager) useCapabilities() error {
	c := m.alloc.Capabilities()
	missing := func(feature, iface string) error {
		return fmt.Errorf("manager: allocator %q declares %s but does not implement manager.%s", m.alloc.Name(), feature, iface)
	}
	var ok bool
	if c.Egress {
		if m.binder, ok = m.alloc.(EgressBinder); !ok {
			return missing("egress", "EgressBinder")
		}
	}
	if c.Adoption {
		if m.annotator, ok = m.alloc.(Annotator); !ok {
			return missing("adoption", "Annotator")
		}
	}
	if c.Exits {
		if _, ok = m.alloc.(ExitWatcher); !ok {
			return missing("exits", "ExitWatcher")
		}
		if c.SharedPool {
			return fmt.Errorf("manager: allocator %q declares exits with a shared pool (a shared pool's units are the allocator's to replace)", m.alloc.Name())
		}
	}
	if c.SharedPool {
		if _, ok = m.alloc.(SharedPool); !ok {
			return missing("a shared pool", "SharedPool")
		}
		if !c.Adoption {
			return fmt.Errorf("manager: allocator %q declares a shared pool without adoption (a shared pool's leases live in its units' annotations)", m.alloc.Name())
		}
	}
	if c.Versions {
		if m.drainer, ok = m.alloc.(OutdatedDrainer); !ok {
			return missing("versions", "OutdatedDrainer")
		}
		if !c.SharedPool {
			return fmt.Errorf("manager: allocator %q declares template versions without a shared pool (only a shared pool outlives a manager's template)", m.alloc.Name())
		}
	}
	m.caps = c
	return nil
}

// checkEgress refuses an allowlist the allocator cannot enforce (fails closed), except on an
// allocator without isolation, where nothing is enforced and every allocation says so.
func (m *Manager) checkEgress(allow egress.Allowlist) error {
	if m.caps.NoIsolation {
		m.log.Warn("INSECURE: allocating a sandbox without isolation: no kernel boundary and no egress control, it reaches whatever this host reaches",
			"allocator", m.alloc.Name(), "egress_not_enforced", allow.Entries())
		return nil
	}
	if len(allow.Entries()) > 0 && !m.caps.Egress {
		return fmt.Errorf("%w: egress allowlist %s: the %s allocator cannot enforce egress; allocate without an allowlist, or run a manager whose allocator enforces one (runsc, kube)",
			ErrUnsupported, allow, m.alloc.Name())
	}
	return nil
}

// randomID returns "fbx-" and 12 random digits: fixed width, as runsc matches ids by prefix.
func randomID() string {
	n, err := rand.Int(rand.Reader, big.NewInt(1e12))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return fmt.Sprintf("fbx-%012d", n)
}

// States exposes the state operator (read-only use: tests and status).
func (m *Manager) States() *StateOperator { return m.ops }

// Start adopts or destroys what a previous manager left behind, then runs the reconciler
// until ctx ends or Close is called.
func (m *Manager) Start(ctx context.Context) error {
	// A shared pool has nothing to adopt: leases live with the units, for every replica.
	own, owned := m.pool.(ownedPool)
	if owned {
		if err := own.adopt(ctx); err != nil {
			return err
		}
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancelLoops = cancel
	m.bg.life = loopCtx
	m.bg.do(func() {
		t := m.o.Clock.NewTicker(m.o.ReconcileInterval)
		defer t.Stop()
		for {
			m.Reconcile(loopCtx)
			select {
			case <-loopCtx.Done():
				return
			case <-ctx.Done():
				return
			case <-t.C():
			case <-m.wake:
			}
		}
	})
	if owned {
		own.run(loopCtx, ctx.Done())
	}
	return nil
}

// Close stops the reconciler and destroys the units that are not bound; bound units keep
// serving their agents and are adopted by the next manager.
func (m *Manager) Close(ctx context.Context) error {
	if m.cancelLoops != nil {
		m.cancelLoops()
	}
	m.Wait()
	if own, ok := m.pool.(ownedPool); ok {
		return own.drain(ctx)
	}
	return nil // a shared pool belongs to every replica
}

// Wait blocks until the work Start began in the background has returned: the reconciler and
// the pool's loops, once Close was called or Start's context ended, and the creations and
// destructions they started, which finish what they were doing.
func (m *Manager) Wait() { m.bg.wg.Wait() }

// nudge asks the reconciler for a pass soon; it never blocks.
func (m *Manager) nudge() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// target asks tmpl's estimator for its pool's target from its counts, the allocations of
// tmpl since the last call and tmpl's provisioning latency, and records it (poolHost). A
// template no longer served (removed during the pass) has none: 0.
func (m *Manager) target(now time.Time, tmpl string, ready, creating, bound int) int {
	e := m.templates.entry(tmpl)
	if e == nil || e.sizer == nil {
		return 0
	}
	sz := e.sizer
	n := sz.est.Target(estimator.Observation{Now: now, Allocations: int(sz.allocs.Swap(0)), Ready: ready,
		Creating: creating, Bound: bound, ProvisioningLatency: m.creations.provisioningLatency(tmpl)})
	m.setTarget(tmpl, sz, n)
	return n
}

// following records that another replica sizes the shared pool (poolHost).
func (m *Manager) following() {
	for _, p := range m.templates.pools() {
		if e := m.templates.entry(p.Template); e != nil {
			m.setTarget(p.Template, e.sizer, 0)
		}
	}
}

func (m *Manager) setTarget(tmpl string, sz *sizer, n int) {
	sz.target.Store(int32(n))
	if m.tally.m != nil {
		m.tally.m.Target.WithLabelValues(tmpl).Set(float64(n))
	}
}

// ProvisioningLatency is how long a unit of the default template takes from the decision to
// create it to serving at full speed: the median of recent creation times (1 s before any
// creation) plus the units' Capabilities.WarmUp.
func (m *Manager) ProvisioningLatency() time.Duration {
	return m.creations.provisioningLatency(m.o.PoolTemplate)
}

// Renew extends the lease of sandbox id; ttl zero means the lease's own length.
func (m *Manager) Renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	// Zero stays zero: the lease's own length, which only the lease knows.
	ttl, err := m.leaseTTL(ttl, 0)
	if err != nil {
		return time.Time{}, err
	}
	return m.pool.renew(ctx, id, token, ttl)
}

// Release ends the lease of sandbox id and destroys the sandbox.
func (m *Manager) Release(ctx context.Context, id, token string) error {
	return m.pool.release(ctx, id, token)
}

// List returns a snapshot of every unit (with a shared pool: every replica's units).
func (m *Manager) List() []Unit {
	return m.pool.units()
}

// PoolStatus summarises the pools.
type PoolStatus struct {
	Units map[string]int
	// Target is the sum of the pools' targets; Estimator the default template's pool's.
	Target                 int
	Estimator, Allocator   string
	DemandPerSecond        float64
	ProvisioningLatency    time.Duration
	Allocations, Creations uint64
	Destructions, Failures uint64
	// ColdWaits counts allocations that found no ready unit and waited for a creation.
	ColdWaits uint64
	// Pools are the templates' pools, in Options.Pools' order.
	Pools []TemplateStatus
}

// TemplateStatus is one template's pool.
type TemplateStatus struct {
	Template, Estimator string
	// Image and Hash are Options.Pools' description of the template.
	Image, Hash string
	Target      int
	// Units of the template by state.
	Units               map[string]int
	DemandPerSecond     float64
	ProvisioningLatency time.Duration
	// LastError is the template's last creation failure while none has succeeded since
	// (an image that cannot run the server), and when it happened.
	LastError   string
	LastErrorAt time.Time
}

// Status returns the pools' status.
func (m *Manager) Status() PoolStatus {
	byTemplate := m.pool.counts()
	units := map[string]int{}
	for _, c := range byTemplate {
		for s, n := range c {
			units[s.String()] += n
		}
	}
	now := m.o.Clock.Now()
	st := PoolStatus{
		Units: units, Allocator: m.alloc.Name(), ProvisioningLatency: m.ProvisioningLatency(),
		Allocations: m.tally.allocations.Load(), Creations: m.tally.creations.Load(),
		Destructions: m.tally.destructions.Load(), Failures: m.tally.failures.Load(),
		ColdWaits: m.tally.coldWaits.Load(),
	}
	for _, name := range m.templates.names() {
		if e := m.templates.entry(name); e != nil {
			st.DemandPerSecond += e.demand.perSecond(now)
		}
	}
	for _, p := range m.templates.pools() {
		e := m.templates.entry(p.Template)
		if e == nil { // removed since
			continue
		}
		sz := e.sizer
		ts := TemplateStatus{Template: p.Template, Estimator: sz.est.Name(), Target: int(sz.target.Load()),
			Image: p.Image, Hash: p.Hash,
			Units: map[string]int{}, DemandPerSecond: e.demand.perSecond(now),
			ProvisioningLatency: m.creations.provisioningLatency(p.Template)}
		for s, n := range byTemplate[p.Template] {
			ts.Units[s.String()] = n
		}
		ts.LastError, ts.LastErrorAt = m.creations.lastFailure(p.Template)
		st.Target += ts.Target
		if p.Template == m.o.PoolTemplate || st.Estimator == "" {
			st.Estimator = ts.Estimator
		}
		st.Pools = append(st.Pools, ts)
	}
	return st
}

package manager

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlsflight"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/manager/estimator"
)

// labelName is what a label name may be: it becomes part of an annotation key, which must
// be valid on Kubernetes objects too.
var labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// Caps on an allocation's labels: every label is stored with the lease (a unit annotation),
// and List returns all of them to every caller, so a few large allocations must not be able to
// make List's answer or a pod's annotations too large.
const (
	// MaxLabels is the most labels one allocation may carry.
	MaxLabels = 16
	// MaxLabelValueBytes is the longest label value.
	MaxLabelValueBytes = 1024
	// MaxLabelBytes caps the sum of the names' and values' lengths of one allocation's labels.
	MaxLabelBytes = 4096
)

// RemainsRetry is how long after a failed destroy the manager destroys the unit again (see
// Unit.Remains), and again after each further failure.
const RemainsRetry = 30 * time.Second

// DefaultRefillDelay is the RefillDelay for allocators that create units on the manager's own
// host: long enough for an allocation and the agent's first calls (a few ms), short against a
// creation (~100 ms for runsc).
const DefaultRefillDelay = 30 * time.Millisecond

// GVisorWarmUp is the WarmUp of gVisor sandboxes. gVisor calibrates a sandbox's clock from two
// samples taken a second apart; until then its vDSO cannot serve clock_gettime and every
// clock read in the sandbox is a system call (some 24 µs each here, against 44 ns after), and
// Go's scheduler reads the clock constantly: the first calls into a sandbox younger than a
// second are several times slower (fusebox-bench allocate: p50 6.9 / p99 18.5 ms against
// 4.9 / 6.4 ms once the pool's units are older than that).
const GVisorWarmUp = time.Second

// DefaultTemplate is the template used when a request names none.
const DefaultTemplate = "default"

// Options configure a Manager. Allocator, Estimator, Clock and Initializer are required.
type Options struct {
	Allocator   Allocator
	Estimator   estimator.Estimator
	Clock       Clock
	Initializer Initializer
	// Prepare, if set, is called with a unit's init address when it joins the warm pool (to
	// connect ahead of time), and Forget when it leaves the pool other than by Initializer.
	Prepare, Forget func(initAddr string)
	// Templates the allocator can create; the warm pool is kept for PoolTemplate only.
	Templates    []string
	PoolTemplate string
	// Lease lengths: DefaultLeaseTTL when a request gives none, capped at MaxLeaseTTL.
	DefaultLeaseTTL, MaxLeaseTTL time.Duration
	// AllocateWait bounds how long Allocate waits for a ready unit when the pool is empty.
	AllocateWait time.Duration
	// CreateConcurrency bounds units being created at once.
	CreateConcurrency int
	// ReconcileInterval is the reconciler's period (it also runs after every allocation).
	ReconcileInterval time.Duration
	// RefillDelay is how long the pool may stay below its target, while it still holds a
	// ready unit, before creations start. A creation is CPU-heavy (a runsc create is some
	// 100 ms of work); started at once it competes with the allocation that emptied the slot
	// and with that agent's TLS handshake and first calls. The wait is measured from when the
	// deficit began, so steady demand cannot postpone a refill further, and an empty pool
	// never waits (on Clock, like every wait of the manager). For allocators whose units
	// are made on this host (runsc, process; DefaultRefillDelay suits them); 0, for remote
	// or instant creation, means no delay.
	RefillDelay time.Duration
	// WarmUp is how long a unit takes, after it turns Ready, to serve at full speed
	// (GVisorWarmUp for gVisor sandboxes). It counts in the provisioning latency the
	// estimator sizes the pool by, so that at a steady demand the unit an allocation takes
	// (the oldest ready one) has warmed up; an allocation never waits for it.
	WarmUp time.Duration
	// Ping, if set with a positive PingInterval, is called every PingInterval with the init
	// address of the unit the next allocation will take, to find it dead before an
	// allocation does (see pingHead). internal/sfuse.Conns.Ping in production.
	Ping         func(ctx context.Context, initAddr string) error
	PingInterval time.Duration
	// Identify, if set, is called with the init address of each unit this manager creates
	// when its allocator keeps a data connection opened before sFuse (Capabilities.Handoff),
	// to learn the sandbox's identity while it waits in the pool: an allocation then names
	// it to the agent before sFuse (AllocateRequest.Picked). internal/sfuse.Conns.Identify
	// in production. A failure only costs that head start.
	Identify func(ctx context.Context, initAddr string) (sfuse.Identity, error)
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

// Manager is the control plane. It is safe for concurrent use.
type Manager struct {
	o     Options
	alloc Allocator
	pool  pool // where units are kept: localPool or sharedPool
	ops   *StateOperator
	log   *slog.Logger
	m     *Metrics

	// What the allocator declared (Capabilities) and, for each declared feature, its
	// interface (nil when not declared). Fixed by New.
	caps      Capabilities
	binder    EgressBinder
	annotator Annotator
	handoffer Handoffer
	claimer   OneWriteClaimer // a shared pool's, unless Options.SeparateClaim

	wake        chan struct{} // nudges the reconciler
	reconcileMu sync.Mutex    // one Reconcile pass at a time

	backoffMu   sync.Mutex   // guards failStreak, holdUntil (Clock's time)
	failStreak  int          // consecutive failed creations
	holdUntil   time.Time    // no new creations before this (backoff after failures)
	allocs      atomic.Int64 // allocations since the last observation
	creating    atomic.Int32 // creations in flight
	target      atomic.Int32
	totals      struct{ allocations, coldWaits, creations, destructions, failures atomic.Uint64 }
	latMu       sync.Mutex // guards latencies
	latencies   []time.Duration
	demandMu    sync.Mutex  // guards demand
	demand      []time.Time // allocation times in the last minute
	bg          sync.WaitGroup
	cancelLoops context.CancelFunc
	life        context.Context // ends at Close: creations run under it, not under a request
	exits       *exitQueue      // units that ended on their own (ExitWatcher)
	exitWatcher ExitWatcher     // the allocator's, if it declares Exits
}

// New checks o and returns a Manager. Call Start to adopt leftovers and run the loops.
func New(o Options) (*Manager, error) {
	switch {
	case o.Allocator == nil:
		return nil, errors.New("manager: an allocator is required")
	case o.Estimator == nil:
		return nil, errors.New("manager: an estimator is required")
	case o.Clock == nil:
		return nil, errors.New("manager: a clock is required")
	case o.Initializer == nil:
		return nil, errors.New("manager: an initializer is required")
	}
	if len(o.Templates) == 0 {
		o.Templates = []string{DefaultTemplate}
	}
	if o.PoolTemplate == "" {
		o.PoolTemplate = o.Templates[0]
	}
	if !slices.Contains(o.Templates, o.PoolTemplate) {
		return nil, fmt.Errorf("manager: pool template %q is not among the templates %q", o.PoolTemplate, o.Templates)
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
	m := &Manager{o: o, alloc: o.Allocator, ops: NewStateOperator(o.Clock), log: o.Logger, m: o.Metrics,
		wake: make(chan struct{}, 1), exits: newExitQueue()}
	if err := m.useCapabilities(); err != nil {
		return nil, err
	}
	if m.caps.SharedPool {
		m.pool = &sharedPool{Manager: m, shared: m.alloc.(SharedPool)}
		if c, ok := m.alloc.(OneWriteClaimer); ok && !o.SeparateClaim {
			m.claimer = c
		}
	} else {
		m.pool = &localPool{Manager: m}
	}
	return m, nil
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
	if c.Handoff {
		if m.handoffer, ok = m.alloc.(Handoffer); !ok {
			return missing("handoff", "Handoffer")
		}
	}
	if c.Exits {
		if m.exitWatcher, ok = m.alloc.(ExitWatcher); !ok {
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
	m.life = loopCtx
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
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
	}()
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
	m.bg.Wait()
	if own, ok := m.pool.(ownedPool); ok {
		return own.drain(ctx)
	}
	return nil // a shared pool belongs to every replica
}

// lifetime is the context of work that outlives a request but not the manager.
func (m *Manager) lifetime() context.Context {
	if m.life == nil {
		return context.Background() // Reconcile driven by hand, without Start
	}
	return m.life
}

func (m *Manager) nudge() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// AllocateRequest is a validated-at-entry request to bind a sandbox.
type AllocateRequest struct {
	AgentPublicKey []byte
	Template       string
	Egress         []string
	LeaseTTL       time.Duration
	Labels         map[string]string
	// TLSClientHello, optional, is relayed to the sandbox in sFuse (see internal/tlsflight).
	TLSClientHello []byte
	// Owner is the caller, stored with the lease (see Lease.Owner).
	Owner string
	// Authorize, if set, is asked whether the caller may have a unit of template with the
	// allowlist (after both are checked, before a unit is taken); its error ends the
	// allocation as it is.
	Authorize func(template string, allow egress.Allowlist) error
	// Picked, if set, is called before sFuse with the unit the allocation has picked, when
	// the manager knows its identity (Options.Identify): the agent may dial it and start its
	// TLS handshake while sFuse runs (the sandbox keeps that connection unread until its
	// fuse blows). It is called again if the allocation moves on to another unit. The
	// Allocation returned is what counts; it carries the same identity as the last Picked
	// when it names the same unit.
	Picked func(Picked)
}

// Picked names a unit an allocation has picked, before sFuse (AllocateRequest.Picked).
type Picked struct {
	ID, Endpoint string
	Identity     sfuse.Identity
}

// Allocation is the result of Allocate.
type Allocation struct {
	ID           string
	Endpoint     string
	SandboxKey   []byte
	LeaseExpires time.Time
	LeaseToken   string
	// TLSServerFlight is the sandbox's answer to the request's TLSClientHello, if any.
	TLSServerFlight []byte
	// SandboxCertificate is the sandbox's self-signed certificate (DER), relayed as the
	// sandbox sent it, for agents that pin through a root certificate.
	SandboxCertificate []byte
	// Handoff and HandoffToken say where the agent collects the data connection the
	// allocator opened ahead, if it did (see Handoffer).
	Handoff      string
	HandoffToken []byte
}

// Allocate binds a warm unit to the agent whose public key is in req.
func (m *Manager) Allocate(ctx context.Context, req AllocateRequest) (Allocation, error) {
	start := time.Now()
	if _, err := tlspin.ParsePublicKey(req.AgentPublicKey); err != nil {
		return Allocation{}, fmt.Errorf("%w: agent public key: %v", ErrInvalid, err)
	}
	if len(req.TLSClientHello) > 0 {
		// Checked before a unit is spent on it; a well-formed hello the sandbox still
		// refuses ends the allocation below without trying another unit.
		if err := tlsflight.CheckHello(req.TLSClientHello); err != nil {
			return Allocation{}, fmt.Errorf("%w: TLS ClientHello: %v", ErrInvalid, err)
		}
	}
	tmpl := req.Template
	if tmpl == "" {
		tmpl = m.o.PoolTemplate
	}
	if !slices.Contains(m.o.Templates, tmpl) {
		return Allocation{}, fmt.Errorf("%w: %q (known: %s)", ErrUnknownTemplate, tmpl, strings.Join(m.o.Templates, ", "))
	}
	allow, err := egress.ParseAllowlist(req.Egress)
	if err != nil {
		return Allocation{}, fmt.Errorf("%w: egress: %v", ErrInvalid, err)
	}
	if req.Authorize != nil {
		if err := req.Authorize(tmpl, allow); err != nil {
			return Allocation{}, err
		}
	}
	if c, ok := m.alloc.(EgressChecker); ok {
		if err := c.CheckEgress(allow.Entries()); err != nil {
			return Allocation{}, fmt.Errorf("egress: %w", err)
		}
	}
	ttl, err := m.leaseTTL(req.LeaseTTL, m.o.DefaultLeaseTTL)
	if err != nil {
		return Allocation{}, err
	}
	if err := checkLabels(req.Labels); err != nil {
		return Allocation{}, err
	}
	if err := m.checkEgress(allow); err != nil {
		return Allocation{}, err
	}

	var lastErr error
	lostUntil := m.o.Clock.Now().Add(m.o.AllocateWait) // claims lost to other replicas retried until then
	for attempt := 0; attempt < 3; attempt++ {
		took := time.Now()
		u, err := m.pool.take(ctx, tmpl)
		m.timeStep("take", took)
		if err != nil {
			return Allocation{}, err
		}
		a, err := m.bind(ctx, u, req, allow, ttl)
		if errors.Is(err, ErrUnitTaken) && m.o.Clock.Now().Before(lostUntil) {
			// Another replica claimed the unit first: a race, not a failure of the unit (the
			// allocator offers that version of it no more), as Claim's lost races are.
			attempt--
			lastErr = err
			continue
		}
		if err == nil {
			d := time.Since(start)
			m.recordAllocation()
			if m.m != nil {
				m.m.AllocationSeconds.Observe(d.Seconds())
			}
			m.log.Debug("allocated", "id", a.ID, "took", d)
			return a, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return Allocation{}, ctx.Err()
		}
		if errors.Is(err, ErrInvalid) {
			return Allocation{}, err // the request's fault: another unit would refuse it too
		}
		m.log.Warn("binding a unit failed; trying another", "id", u.Info.ID, "err", err)
	}
	return Allocation{}, fmt.Errorf("%w: %v", ErrAllocator, lastErr)
}

// checkLabels refuses labels over the caps (MaxLabels, MaxLabelValueBytes, MaxLabelBytes) or
// with a name that cannot be part of an annotation key.
func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%w: %d labels, at most %d", ErrInvalid, len(labels), MaxLabels)
	}
	total := 0
	for k, v := range labels {
		if !labelName.MatchString(k) {
			return fmt.Errorf("%w: bad label name %q (letters, digits, '-', '_', '.', at most 63, alphanumeric at both ends)", ErrInvalid, k)
		}
		if len(v) > MaxLabelValueBytes {
			return fmt.Errorf("%w: label %s is %d bytes, at most %d", ErrInvalid, k, len(v), MaxLabelValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxLabelBytes {
		return fmt.Errorf("%w: labels of %d bytes (names and values), at most %d", ErrInvalid, total, MaxLabelBytes)
	}
	return nil
}

// coldWait counts an allocation that found no ready unit and waits for one to be created.
func (m *Manager) coldWait() {
	m.totals.coldWaits.Add(1)
	if m.m != nil {
		m.m.ColdWaits.Inc()
	}
}

func (m *Manager) recordAllocation() {
	m.allocs.Add(1)
	m.totals.allocations.Add(1)
	if m.m != nil {
		m.m.Allocations.Inc()
	}
	now := m.o.Clock.Now()
	m.demandMu.Lock()
	m.demand = append(m.demand, now)
	cut := 0
	for cut < len(m.demand) && now.Sub(m.demand[cut]) > time.Minute {
		cut++
	}
	m.demand = m.demand[cut:]
	m.demandMu.Unlock()
	m.nudge()
}

// bind performs egress binding, sFuse and lease bookkeeping on an Initialising unit. On any
// failure the unit is destroyed: a unit that may have been initialised is never handed out
// again.
func (m *Manager) bind(ctx context.Context, u Unit, req AllocateRequest, allow egress.Allowlist, ttl time.Duration) (Allocation, error) {
	id := u.Info.ID
	fail := func(stage string, err error) (Allocation, error) {
		if !errors.Is(err, ErrUnitTaken) { // a race, not a failure
			m.failure(stage)
		}
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			if _, terr := m.ops.Transition(id, Initialising, Failed, func(x *Unit) { x.Err = fmt.Sprintf("%s: %v", stage, err) }); terr != nil {
				return
			}
			if derr := m.alloc.Destroy(context.Background(), id); derr != nil {
				m.failure("destroy")
				m.ops.MarkRemains(id) // its Err stays the stage's; Remains says the rest
				m.log.Error("destroying failed unit; it is retried", "id", id, "err", derr, "retry_after", RemainsRetry)
			}
		}()
		return Allocation{}, fmt.Errorf("%s %s: %w", stage, id, err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fail("init", err)
	}
	token := base64.RawURLEncoding.EncodeToString(raw[:])
	lease := &Lease{Owner: req.Owner, TokenHash: sha256.Sum256([]byte(token)), Expires: m.o.Clock.Now().Add(ttl), TTL: ttl,
		Egress: allow.Entries(), Labels: maps.Clone(req.Labels)}
	// A picked unit is claimed by the lease's write (OneWriteClaimer), beside sFuse: the
	// answer waits for the longer of the two, not their sum. Until the claim succeeds the unit
	// is not this replica's: its egress policy, named after it, waits for the claim, and a
	// lost claim leaves the unit to the winner whatever sFuse did. sFuse is exactly once, so
	// of two replicas that picked one unit at most one agent key is pinned: if the loser's
	// sFuse blew the fuse, the winner's is refused and the winner destroys the unit. A claim
	// whose write may have landed unseen leaves the unit to its lease's expiry. Neither is
	// destroyed here, only forgotten.
	var claimErr error
	claimed := make(chan struct{})
	if u.claimOnBind {
		go func() {
			defer close(claimed)
			defer m.timeStep("annotate", time.Now())
			claimErr = m.claimer.ClaimBound(ctx, u.Info, leaseAnnotations(lease))
		}()
	} else {
		close(claimed)
	}
	// The egress policy is bound and the lease persisted while sFuse runs: all three must
	// succeed before the agent hears of the unit (nothing in it runs agent code before the
	// agent connects, which it can only do after this returns), and a failure of any destroys
	// it, so their order does not matter. A shared pool's egress binding is an API write
	// (kube: a CiliumNetworkPolicy), worth its own goroutine; a local one is a map update,
	// cheaper inline than the scheduling a goroutine costs a saturated manager.
	egressed, annotated := make(chan error, 1), make(chan error, 1)
	bindEgress := func() error {
		defer m.timeStep("egress", time.Now())
		return m.binder.BindEgress(ctx, id, allow.Entries())
	}
	switch {
	case m.binder != nil && m.caps.SharedPool:
		go func() {
			if <-claimed; claimErr != nil {
				egressed <- nil // not this replica's unit: nothing to bind
				return
			}
			egressed <- bindEgress()
		}()
	case m.binder != nil:
		egressed <- bindEgress()
	default: // checkEgress has refused an allowlist this allocator cannot enforce
		egressed <- nil
	}
	if m.annotator != nil && !u.claimOnBind {
		go func() {
			defer m.timeStep("annotate", time.Now())
			annotated <- m.annotator.Annotate(ctx, id, leaseAnnotations(lease))
		}()
	} else {
		annotated <- nil
	}
	if req.Picked != nil && len(u.Identity.SandboxKey) > 0 {
		req.Picked(Picked{ID: id, Endpoint: u.Info.DataAddr, Identity: u.Identity})
	}
	fusing := time.Now()
	fused, err := m.o.Initializer(ctx, u.Info.InitAddr, sfuse.Request{AgentKey: req.AgentPublicKey,
		TLSClientHello: req.TLSClientHello, Egress: allow.Entries()})
	m.timeStep("init", fusing)
	if err == nil && len(u.Identity.SandboxKey) > 0 && (!bytes.Equal(fused.SandboxKey, u.Identity.SandboxKey) ||
		!bytes.Equal(fused.SandboxCertificate, u.Identity.SandboxCertificate)) {
		// What the agent may have been told before sFuse must be what it gets.
		err = errors.New("the sandbox answered sFuse with another identity than it told before")
	}
	<-claimed
	eerr, aerr := <-egressed, <-annotated
	if claimErr != nil {
		m.ops.Transition(id, Initialising, Destroying, nil)
		m.ops.Transition(id, Destroying, Gone, nil)
		if !errors.Is(claimErr, ErrUnitTaken) {
			m.failure("annotate")
			claimErr = fmt.Errorf("%w: %v", ErrAllocator, claimErr)
		}
		return Allocation{}, fmt.Errorf("claiming %s: %w", id, claimErr)
	}
	if eerr != nil {
		return fail("egress", eerr)
	}
	if errors.Is(err, sfuse.ErrRefused) {
		// The sandbox refused what the agent sent (the fuse is intact, but the unit is
		// destroyed all the same: it has been offered to someone).
		err = fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if u.claimOnBind && errors.Is(err, sfuse.ErrBlown) {
		// Another replica picked the unit too and its sFuse came first; this replica's claim
		// won, so the unit is this replica's to destroy. A race, as a lost claim is: retried.
		err = fmt.Errorf("%w: %v", ErrUnitTaken, err)
	}
	if err != nil {
		return fail("init", err)
	}
	if aerr != nil {
		return fail("annotate", aerr)
	}
	if _, err := m.ops.Transition(id, Initialising, Bound, func(x *Unit) { x.Lease = lease }); err != nil {
		return fail("init", err)
	}
	m.publishCounts()
	a := Allocation{ID: id, Endpoint: u.Info.DataAddr, SandboxKey: fused.SandboxKey, LeaseExpires: lease.Expires,
		LeaseToken: token, TLSServerFlight: fused.TLSServerFlight, SandboxCertificate: fused.SandboxCertificate}
	if m.handoffer != nil {
		if addr, tok, ok := m.handoffer.Handoff(id); ok {
			a.Handoff, a.HandoffToken = addr, tok
		}
	}
	return a, nil
}

// timeStep records the time since start as the allocation step's (Metrics.AllocationSteps).
func (m *Manager) timeStep(step string, start time.Time) {
	if m.m != nil {
		m.m.steps[step].Observe(time.Since(start).Seconds())
	}
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

func (m *Manager) publishCounts() {
	if m.m == nil {
		return
	}
	c := m.ops.Counts("")
	for s, name := range stateNames {
		m.m.Units.WithLabelValues(name).Set(float64(c[s]))
	}
}

// List returns a snapshot of every unit (with a shared pool: every replica's units).
func (m *Manager) List() []Unit {
	return m.pool.units()
}

// PoolStatus summarises the pool.
type PoolStatus struct {
	Units                  map[string]int
	Target                 int
	Estimator, Allocator   string
	DemandPerSecond        float64
	ProvisioningLatency    time.Duration
	Allocations, Creations uint64
	Destructions, Failures uint64
	// ColdWaits counts allocations that found no ready unit and waited for a creation.
	ColdWaits uint64
}

// Status returns the pool's status.
func (m *Manager) Status() PoolStatus {
	units := map[string]int{}
	for s, n := range m.pool.counts() {
		units[s.String()] = n
	}
	now := m.o.Clock.Now()
	m.demandMu.Lock()
	n := 0
	for _, t := range m.demand {
		if now.Sub(t) <= time.Minute {
			n++
		}
	}
	m.demandMu.Unlock()
	return PoolStatus{
		Units: units, Target: int(m.target.Load()), Estimator: m.o.Estimator.Name(), Allocator: m.alloc.Name(),
		DemandPerSecond: float64(n) / 60, ProvisioningLatency: m.ProvisioningLatency(),
		Allocations: m.totals.allocations.Load(), Creations: m.totals.creations.Load(),
		Destructions: m.totals.destructions.Load(), Failures: m.totals.failures.Load(),
		ColdWaits: m.totals.coldWaits.Load(),
	}
}

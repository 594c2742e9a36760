package manager

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
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
	// ClaimGrace is how long a unit may stay claimed without being bound before the leader
	// destroys it as an orphan of a replica that died mid-allocation (default 2 minutes).
	ClaimGrace time.Duration
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
	o      Options
	alloc  Allocator
	shared SharedPool // non-nil when the allocator's pool is shared by several replicas
	ops    *StateOperator
	log    *slog.Logger
	m      *Metrics

	// What the allocator declared (Capabilities) and, for each declared feature, its
	// interface (nil when not declared). Fixed by New.
	caps      Capabilities
	binder    EgressBinder
	annotator Annotator
	handoffer Handoffer

	wake chan struct{} // nudges the reconciler

	refillMu     sync.Mutex   // guards deficitSince and refillTimer (times are Clock's)
	deficitSince time.Time    // when the pool last fell below its target; zero when it is not
	refillTimer  bool         // a nudge is scheduled for the end of the refill delay
	backoffMu    sync.Mutex   // guards failStreak, holdUntil (Clock's time)
	failStreak   int          // consecutive failed creations
	holdUntil    time.Time    // no new creations before this (backoff after failures)
	allocs       atomic.Int64 // allocations since the last observation
	creating     atomic.Int32 // creations in flight
	waiting      atomic.Int32 // allocations waiting for a ready unit (takeReady)
	target       atomic.Int32
	totals       struct{ allocations, coldWaits, creations, destructions, failures atomic.Uint64 }
	latMu        sync.Mutex // guards latencies
	latencies    []time.Duration
	demandMu     sync.Mutex  // guards demand
	demand       []time.Time // allocation times in the last minute
	bg           sync.WaitGroup
	cancelLoops  context.CancelFunc
	life         context.Context // ends at Close: creations run under it, not under a request
	expiring     idSet           // shared pool: expiries in progress
	exits        *exitQueue      // units that ended on their own (ExitWatcher)
	exitWatcher  ExitWatcher     // the allocator's, if it declares Exits
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
		if m.shared, ok = m.alloc.(SharedPool); !ok {
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
	if m.shared == nil {
		if m.exitWatcher != nil {
			m.exitWatcher.WatchExits(m.exits.add) // before adoption: units that ended meanwhile are reported
		}
		if err := m.adopt(ctx); err != nil {
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
	if m.shared == nil {
		m.bg.Add(1)
		go func() { defer m.bg.Done(); m.handleExits(loopCtx, ctx.Done()) }()
	}
	if m.o.Ping != nil && m.o.PingInterval > 0 && m.shared == nil {
		m.bg.Add(1)
		go func() { defer m.bg.Done(); m.pingHead(loopCtx, ctx.Done()) }()
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
	if m.shared != nil {
		return nil // the pool belongs to every replica
	}
	var errs []error
	for _, u := range m.ops.Snapshot() {
		switch {
		case u.State == Ready:
			if err := m.destroy(ctx, u.Info.ID, Ready); err != nil {
				errs = append(errs, err)
			}
		case u.State == Failed && u.Remains:
			// A last try; a unit still failing is left to the next manager's adoption.
			if err := m.destroy(ctx, u.Info.ID, Failed); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
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

// AnnotationState and AnnotationClaimedAt are what a SharedPool allocator reports for a
// unit a replica has claimed but not bound yet: "claimed", and when (RFC 3339). A unit
// still being made, by whichever replica, is reported with AnnotationState "creating".
const (
	AnnotationState     = annState
	AnnotationClaimedAt = "fusebox.dev/claimed-at"
)

// Annotation keys under which a bound unit's lease is stored with its allocator.
const (
	annState     = "fusebox.dev/state"
	annExpires   = "fusebox.dev/lease-expires"
	annTTL       = "fusebox.dev/lease-ttl"
	annTokenHash = "fusebox.dev/lease-token-sha256"
	annEgress    = "fusebox.dev/egress"
	annOwner     = "fusebox.dev/owner"
	annLabel     = "fusebox.dev/label."
)

func leaseAnnotations(l *Lease) map[string]string {
	a := map[string]string{
		annState:     "bound",
		annExpires:   l.Expires.UTC().Format(time.RFC3339Nano),
		annTTL:       l.TTL.String(),
		annTokenHash: hex.EncodeToString(l.TokenHash[:]),
		annEgress:    strings.Join(l.Egress, ","),
		annOwner:     l.Owner,
	}
	for k, v := range l.Labels {
		a[annLabel+k] = v
	}
	return a
}

func leaseFromAnnotations(a map[string]string) (*Lease, error) {
	if a[annState] != "bound" {
		return nil, errors.New("not bound")
	}
	exp, err := time.Parse(time.RFC3339Nano, a[annExpires])
	if err != nil {
		return nil, fmt.Errorf("lease expiry: %w", err)
	}
	ttl, err := time.ParseDuration(a[annTTL])
	if err != nil {
		return nil, fmt.Errorf("lease ttl: %w", err)
	}
	h, err := hex.DecodeString(a[annTokenHash])
	if err != nil || len(h) != sha256.Size {
		return nil, errors.New("lease token hash")
	}
	l := &Lease{Owner: a[annOwner], Expires: exp, TTL: ttl, Labels: map[string]string{}}
	copy(l.TokenHash[:], h)
	if e := a[annEgress]; e != "" {
		l.Egress = strings.Split(e, ",")
	}
	for k, v := range a {
		if name, ok := strings.CutPrefix(k, annLabel); ok {
			l.Labels[name] = v
		}
	}
	return l, nil
}

// adopt takes over the bound units with a live lease that a previous manager left and
// destroys every other unit it finds, so that none leak.
func (m *Manager) adopt(ctx context.Context) error {
	units, err := m.alloc.List(ctx)
	if err != nil {
		return fmt.Errorf("listing units for adoption: %w", err)
	}
	now := m.o.Clock.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, m.o.CreateConcurrency)
	for _, info := range units {
		lease, lerr := leaseFromAnnotations(info.Annotations)
		if lerr == nil && now.Before(lease.Expires) {
			if m.binder != nil {
				if err := m.binder.BindEgress(ctx, info.ID, lease.Egress); err != nil {
					m.log.Error("re-binding egress of an adopted unit failed; destroying it", "id", info.ID, "err", err)
					lerr = err
				}
			}
		}
		if lerr == nil && now.Before(lease.Expires) {
			if err := m.ops.Insert(info, Bound, lease); err != nil {
				return err
			}
			m.log.Info("adopted bound sandbox", "id", info.ID, "lease_expires", lease.Expires)
			continue
		}
		reason := "not bound"
		if lerr == nil {
			reason = "lease expired"
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m.log.Info("destroying unit left by a previous manager", "id", info.ID, "reason", reason)
			if err := m.alloc.Destroy(ctx, info.ID); err != nil {
				m.log.Error("destroying leftover unit", "id", info.ID, "err", err)
				m.failure("destroy")
			} else {
				m.destroyed()
			}
		}()
	}
	wg.Wait()
	m.publishCounts()
	return nil
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

	take := m.takeReady
	if m.shared != nil {
		take = m.claim
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		took := time.Now()
		u, err := take(ctx, tmpl)
		m.timeStep("take", took)
		if err != nil {
			return Allocation{}, err
		}
		a, err := m.bind(ctx, u, req, allow, ttl)
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

// leaseTTL is the one check of a requested lease TTL, for Allocate and Renew alike: negative
// is invalid, zero means def, and more than MaxLeaseTTL is capped.
func (m *Manager) leaseTTL(ttl, def time.Duration) (time.Duration, error) {
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("%w: negative lease TTL %v", ErrInvalid, ttl)
	case ttl == 0:
		ttl = def
	}
	return min(ttl, m.o.MaxLeaseTTL), nil
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

// takeReady pops a Ready unit, waiting for one if the pool is empty. A waiting allocation
// starts one creation of its own (whatever the estimator's target), so it never depends on
// the pool's size alone, and starts another if that one fails (after the creation backoff);
// spare units it makes join the pool.
func (m *Manager) takeReady(ctx context.Context, tmpl string) (Unit, error) {
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
			m.waiting.Add(1)
			defer m.waiting.Add(-1)
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

// bind performs egress binding, sFuse and lease bookkeeping on an Initialising unit. On any
// failure the unit is destroyed: a unit that may have been initialised is never handed out
// again.
func (m *Manager) bind(ctx context.Context, u Unit, req AllocateRequest, allow egress.Allowlist, ttl time.Duration) (Allocation, error) {
	id := u.Info.ID
	fail := func(stage string, err error) (Allocation, error) {
		m.failure(stage)
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
	case m.binder != nil && m.shared != nil:
		go func() { egressed <- bindEgress() }()
	case m.binder != nil:
		egressed <- bindEgress()
	default: // checkEgress has refused an allowlist this allocator cannot enforce
		egressed <- nil
	}
	if m.annotator != nil {
		go func() {
			defer m.timeStep("annotate", time.Now())
			annotated <- m.annotator.Annotate(ctx, id, leaseAnnotations(lease))
		}()
	} else {
		annotated <- nil
	}
	fusing := time.Now()
	fused, err := m.o.Initializer(ctx, u.Info.InitAddr, sfuse.Request{AgentKey: req.AgentPublicKey,
		TLSClientHello: req.TLSClientHello, Egress: allow.Entries()})
	m.timeStep("init", fusing)
	eerr, aerr := <-egressed, <-annotated
	if eerr != nil {
		return fail("egress", eerr)
	}
	if errors.Is(err, sfuse.ErrRefused) {
		// The sandbox refused what the agent sent (the fuse is intact, but the unit is
		// destroyed all the same: it has been offered to someone).
		err = fmt.Errorf("%w: %v", ErrInvalid, err)
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
		m.m.AllocationSteps.WithLabelValues(step).Observe(time.Since(start).Seconds())
	}
}

func (m *Manager) checkToken(l *Lease, token string) error {
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], l.TokenHash[:]) != 1 {
		return ErrBadLeaseToken
	}
	return nil
}

// Renew extends the lease of sandbox id; ttl zero means the lease's own length.
func (m *Manager) Renew(ctx context.Context, id, token string, ttl time.Duration) (time.Time, error) {
	// Zero stays zero: the lease's own length, which only the lease knows.
	ttl, err := m.leaseTTL(ttl, 0)
	if err != nil {
		return time.Time{}, err
	}
	if m.shared != nil {
		return m.sharedRenew(ctx, id, token, ttl)
	}
	now := m.o.Clock.Now()
	l, err := m.ops.UpdateLease(id, func(l *Lease) error {
		if err := m.checkToken(l, token); err != nil {
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
	if m.annotator != nil {
		if err := m.annotator.Annotate(ctx, id, leaseAnnotations(&l)); err != nil {
			m.failure("annotate")
			m.log.Error("persisting renewed lease", "id", id, "err", err)
		}
	}
	return l.Expires, nil
}

// Release ends the lease of sandbox id and destroys the sandbox.
func (m *Manager) Release(ctx context.Context, id, token string) error {
	if m.shared != nil {
		return m.sharedRelease(ctx, id, token)
	}
	u, ok := m.ops.Get(id)
	if !ok {
		return fmt.Errorf("releasing: %w: %s", ErrUnitNotFound, id)
	}
	if u.State != Bound || u.Lease == nil {
		return fmt.Errorf("releasing %s: %w (%s)", id, ErrLeaseEnded, u.State)
	}
	if err := m.checkToken(u.Lease, token); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	if err := m.destroyInBackground(ctx, id, Bound); err != nil {
		return fmt.Errorf("releasing %s: %w", id, ErrLeaseEnded)
	}
	return nil
}

// toDestroying moves a unit from state from to Destroying (a Ready unit's prepared init
// connection is forgotten).
func (m *Manager) toDestroying(id string, from State) error {
	u, err := m.ops.Transition(id, from, Destroying, func(u *Unit) { u.Remains = false })
	if err != nil {
		return err
	}
	if from == Ready && m.o.Forget != nil {
		m.o.Forget(u.Info.InitAddr)
	}
	return nil
}

// destroy moves a unit from state from to Destroying and destroys it.
func (m *Manager) destroy(ctx context.Context, id string, from State) error {
	if err := m.toDestroying(id, from); err != nil {
		return err
	}
	return m.finishDestroy(ctx, id)
}

// destroyInBackground moves a unit from state from to Destroying now and destroys it in the
// background (ctx's values, not its cancellation).
func (m *Manager) destroyInBackground(ctx context.Context, id string, from State) error {
	if err := m.toDestroying(id, from); err != nil {
		return err
	}
	m.bg.Add(1)
	go func() { defer m.bg.Done(); m.finishDestroy(context.WithoutCancel(ctx), id) }()
	return nil
}

// startCreate counts one creation of tmpl in m.creating and makes it in the background; the
// channel receives whether it made a unit.
func (m *Manager) startCreate(ctx context.Context, tmpl string) <-chan bool {
	made := make(chan bool, 1)
	m.creating.Add(1)
	m.bg.Add(1)
	go func() { defer m.bg.Done(); made <- m.create(ctx, tmpl) }()
	return made
}

func (m *Manager) finishDestroy(ctx context.Context, id string) error {
	m.publishCounts()
	err := m.alloc.Destroy(ctx, id)
	if err != nil {
		m.failure("destroy")
		m.ops.Transition(id, Destroying, Failed, func(u *Unit) {
			u.Err, u.Remains = fmt.Sprintf("destroy: %v (retried every %v)", err, RemainsRetry), true
		})
		m.log.Error("destroying unit; it is retried", "id", id, "err", err, "retry_after", RemainsRetry)
	} else {
		m.ops.Transition(id, Destroying, Gone, nil)
		m.destroyed()
	}
	m.publishCounts()
	return err
}

// destroyed counts a destruction.
func (m *Manager) destroyed() {
	m.totals.destructions.Add(1)
	if m.m != nil {
		m.m.Destructions.Inc()
	}
}

func (m *Manager) failure(stage string) {
	m.totals.failures.Add(1)
	if m.m != nil {
		m.m.Failures.WithLabelValues(stage).Inc()
	}
}

// create makes one unit of template and puts it into the pool, and reports whether it did.
// startCreate has counted it in m.creating (before starting the goroutine, so that a reconcile
// pass in between sees it); create uncounts it when done.
func (m *Manager) create(ctx context.Context, tmpl string) bool {
	defer m.creating.Add(-1)
	id := m.o.NewID()
	info := UnitInfo{ID: id, Template: tmpl, Created: m.o.Clock.Now()}
	if m.shared != nil {
		return m.createShared(ctx, id, tmpl)
	}
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
	if _, err := m.ops.Transition(id, Creating, Ready, func(u *Unit) { u.Info = got }); err != nil {
		m.log.Error("unit vanished while being created", "id", id, "err", err)
		m.alloc.Destroy(context.WithoutCancel(ctx), id)
		return false
	}
	m.totals.creations.Add(1)
	if m.m != nil {
		m.m.Creations.Inc()
	}
	if m.o.Prepare != nil {
		m.o.Prepare(got.InitAddr)
	}
	m.publishCounts()
	return true
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

func (m *Manager) recordLatency(d time.Duration) {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	m.latencies = append(m.latencies, d)
	if len(m.latencies) > 32 {
		m.latencies = m.latencies[len(m.latencies)-32:]
	}
}

// createShared creates a unit into a shared pool: it is not tracked locally until claimed.
func (m *Manager) createShared(ctx context.Context, id, tmpl string) bool {
	t0 := time.Now()
	_, err := m.alloc.Create(ctx, id, tmpl)
	m.noteCreate(err)
	if err != nil {
		if ctx.Err() == nil {
			m.failure("create")
			m.log.Error("creating unit failed", "id", id, "template", tmpl, "err", err)
		}
		return false
	}
	m.recordLatency(time.Since(t0))
	m.totals.creations.Add(1)
	if m.m != nil {
		m.m.Creations.Inc()
	}
	return true
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

// Reconcile runs one pass of the control loop: expire leases, ask the estimator for a target,
// and create or destroy ready units toward it.
func (m *Manager) Reconcile(ctx context.Context) {
	if m.shared != nil {
		m.reconcileShared(ctx)
		return
	}
	now := m.o.Clock.Now()
	for _, id := range m.ops.RemainsDue(now, RemainsRetry) {
		if m.destroyInBackground(ctx, id, Failed) == nil {
			m.log.Info("destroying a failed unit's remains again", "id", id)
		}
	}
	for _, id := range m.ops.Expired(now) {
		if m.destroyInBackground(ctx, id, Bound) == nil { // else released or expired concurrently
			m.log.Info("lease expired; destroying sandbox", "id", id)
		}
	}
	c := m.ops.Counts(m.o.PoolTemplate)
	creating := int(m.creating.Load())
	target := m.o.Estimator.Target(estimatorObservation(now, int(m.allocs.Swap(0)), c[Ready], creating, c[Bound], m.ProvisioningLatency()))
	m.target.Store(int32(target))
	if m.m != nil {
		m.m.Target.Set(float64(target))
	}
	if ctx.Err() != nil {
		return
	}
	if deficit := target - c[Ready] - creating; deficit > 0 {
		// Unless backing off after failures or waiting out the refill delay.
		if !m.heldBack() && m.refillDue(c[Ready]) {
			for range min(deficit, m.o.CreateConcurrency-creating) {
				m.startCreate(ctx, m.o.PoolTemplate)
			}
		}
		return
	}
	m.endDeficit()
	if surplus := c[Ready] - target - int(m.waiting.Load()); surplus > 0 {
		for _, id := range m.ops.OldestReady(m.o.PoolTemplate, surplus) {
			m.destroyInBackground(ctx, id, Ready)
		}
	}
}

// refillDue reports whether creations may start now for a pool below its target that holds
// ready units; otherwise it schedules a reconcile for when they may (see RefillDelay).
func (m *Manager) refillDue(ready int) bool {
	if m.o.RefillDelay <= 0 {
		return true
	}
	m.refillMu.Lock()
	defer m.refillMu.Unlock()
	now := m.o.Clock.Now()
	if m.deficitSince.IsZero() {
		m.deficitSince = now
	}
	wait := m.o.RefillDelay - now.Sub(m.deficitSince)
	if ready == 0 || wait <= 0 {
		m.deficitSince = time.Time{}
		return true
	}
	if !m.refillTimer {
		m.refillTimer = true
		m.o.Clock.AfterFunc(wait, func() {
			m.refillMu.Lock()
			m.refillTimer = false
			m.refillMu.Unlock()
			m.nudge()
		})
	}
	return false
}

// endDeficit notes that the pool is not below its target: the next deficit starts its own
// refill delay.
func (m *Manager) endDeficit() {
	if m.o.RefillDelay <= 0 {
		return
	}
	m.refillMu.Lock()
	m.deficitSince = time.Time{}
	m.refillMu.Unlock()
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
	if m.shared != nil {
		return m.sharedList()
	}
	return m.ops.Snapshot()
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
	c := m.ops.Counts("")
	if m.shared != nil {
		c = map[State]int{}
		for _, u := range m.sharedList() {
			c[u.State]++
		}
	}
	units := map[string]int{}
	for s, n := range c {
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

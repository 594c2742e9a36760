// Package memalloc is an in-memory Allocator: units are records, creation is instant (or
// takes a configured delay), and every call is recorded. It serves the manager's unit tests
// (with injected failures) and the manager benchmark, which measures the control plane alone.
// It never runs code: nothing it "creates" has any isolation.
package memalloc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
)

// Call is one recorded call.
type Call struct {
	Method string // Create, Destroy, List, Annotate, BindEgress, Claim, Pick, ClaimBound
	ID     string
	Arg    any
}

// Allocator is an in-memory manager.Allocator.
type Allocator struct {
	// Delay is how long Create takes.
	Delay time.Duration
	// Fail, if set, is asked before each call; a non-nil error fails the call. Set it
	// before the allocator is in use, or with SetFail.
	Fail func(method, id string) error
	// Templates accepted by Create (default: "default").
	Templates []string

	mu    sync.Mutex // guards units and calls
	units map[string]*manager.UnitInfo
	egr   map[string][]string
	calls []Call
	// Record controls whether calls are recorded (benchmarks turn it off).
	NoRecord bool
	// Caps, if set, is what Capabilities declares.
	Caps *manager.Capabilities
}

var (
	_ manager.Allocator    = (*Allocator)(nil)
	_ manager.Annotator    = (*Allocator)(nil)
	_ manager.EgressBinder = (*Allocator)(nil)
)

// New returns an empty Allocator.
func New() *Allocator {
	return &Allocator{units: map[string]*manager.UnitInfo{}, egr: map[string][]string{}}
}

func (a *Allocator) record(c Call) error {
	a.mu.Lock()
	if !a.NoRecord {
		a.calls = append(a.calls, c)
	}
	fail := a.Fail
	a.mu.Unlock()
	if fail != nil {
		return fail(c.Method, c.ID)
	}
	return nil
}

// SetFail sets Fail while the allocator is in use.
func (a *Allocator) SetFail(fail func(method, id string) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Fail = fail
}

// Calls returns the calls so far.
func (a *Allocator) Calls() []Call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func (a *Allocator) Name() string { return "memory" }

// Capabilities: egress (recorded, see Egress) and leases in annotations. Caps, if set,
// replaces the declaration (tests of the manager's checks).
func (a *Allocator) Capabilities() manager.Capabilities {
	if a.Caps != nil {
		return *a.Caps
	}
	return manager.Capabilities{Egress: true, Adoption: true}
}

func (a *Allocator) Create(ctx context.Context, id, template string) (manager.UnitInfo, error) {
	if err := a.record(Call{Method: "Create", ID: id, Arg: template}); err != nil {
		return manager.UnitInfo{}, err
	}
	ts := a.Templates
	if len(ts) == 0 {
		ts = []string{manager.DefaultTemplate}
	}
	if !slices.Contains(ts, template) {
		return manager.UnitInfo{}, fmt.Errorf("%w: %s", manager.ErrUnknownTemplate, template)
	}
	if a.Delay > 0 {
		select {
		case <-time.After(a.Delay):
		case <-ctx.Done():
			return manager.UnitInfo{}, ctx.Err()
		}
	}
	info := manager.UnitInfo{ID: id, Template: template, InitAddr: "mem://" + id + "/init",
		DataAddr: "mem://" + id + "/data", Created: time.Now()}
	a.mu.Lock()
	a.units[id] = &info
	a.mu.Unlock()
	return info, nil
}

func (a *Allocator) Destroy(ctx context.Context, id string) error {
	if err := a.record(Call{Method: "Destroy", ID: id}); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.units, id)
	delete(a.egr, id)
	a.mu.Unlock()
	return nil
}

func (a *Allocator) List(ctx context.Context) ([]manager.UnitInfo, error) {
	if err := a.record(Call{Method: "List"}); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []manager.UnitInfo
	for _, u := range a.units {
		c := *u
		c.Annotations = maps.Clone(u.Annotations)
		out = append(out, c)
	}
	return out, nil
}

func (a *Allocator) Annotate(ctx context.Context, id string, ann map[string]string) error {
	if err := a.record(Call{Method: "Annotate", ID: id, Arg: maps.Clone(ann)}); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u, ok := a.units[id]
	if !ok {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	u.Annotations = maps.Clone(ann)
	return nil
}

func (a *Allocator) BindEgress(ctx context.Context, id string, allow []string) error {
	if err := a.record(Call{Method: "BindEgress", ID: id, Arg: slices.Clone(allow)}); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.egr[id] = slices.Clone(allow)
	return nil
}

// Units returns the ids of the units that exist now, sorted.
func (a *Allocator) Units() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.units))
}

// Egress returns the allowlist bound to unit id.
func (a *Allocator) Egress(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.egr[id])
}

// Initializer is an in-memory sFuse: it checks nothing about the unit and returns a fresh
// public key, standing in for internal/sfuse.Initialize when no sandbox runs. It answers no
// TLS flight (there is no data plane to continue it).
func Initializer(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return sfuse.Result{}, err
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	return sfuse.Result{SandboxKey: der}, err
}

// Shared is an Allocator whose pool is shared by several managers, as pods in an API server
// are: units wait with state "ready" in their annotations until a manager claims one.
type Shared struct {
	*Allocator
	creating atomic.Int32
	// changed is closed when a unit turns ready (guarded by Allocator.mu).
	changed chan struct{}
	version uint64 // the last Version given (guarded by Allocator.mu)
}

var (
	_ manager.SharedPool      = (*Shared)(nil)
	_ manager.OneWriteClaimer = (*Shared)(nil)
)

// NewShared returns an empty shared-pool allocator.
func NewShared() *Shared { return &Shared{Allocator: New()} }

// Create makes a unit and puts it into the shared pool.
func (s *Shared) Create(ctx context.Context, id, template string) (manager.UnitInfo, error) {
	s.creating.Add(1)
	defer s.creating.Add(-1)
	info, err := s.Allocator.Create(ctx, id, template)
	if err != nil {
		return info, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.units[id]; ok {
		u.Annotations = map[string]string{"fusebox.dev/state": "ready"}
		s.bumpLocked(u)
		info = *u
		if s.changed != nil {
			close(s.changed)
			s.changed = nil
		}
	}
	return info, nil
}

// Capabilities adds the shared pool to the Allocator's declaration.
func (s *Shared) Capabilities() manager.Capabilities {
	c := s.Allocator.Capabilities()
	c.SharedPool = true
	return c
}

// Changed returns a channel closed when a unit (of any template) next turns ready.
func (s *Shared) Changed(template string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// Claim takes the oldest ready unit of template.
func (s *Shared) Claim(ctx context.Context, template string) (manager.UnitInfo, error) {
	if err := s.record(Call{Method: "Claim", Arg: template}); err != nil {
		return manager.UnitInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *manager.UnitInfo
	for _, u := range s.units {
		if readyOf(u, template) && (best == nil || u.Created.Before(best.Created)) {
			best = u
		}
	}
	if best == nil {
		return manager.UnitInfo{}, manager.ErrNoReadyUnit
	}
	best.Annotations = map[string]string{"fusebox.dev/state": "claimed"}
	s.bumpLocked(best)
	c := *best
	c.Annotations = maps.Clone(best.Annotations)
	return c, nil
}

// Annotate is Allocator.Annotate, as a new version of the unit.
func (s *Shared) Annotate(ctx context.Context, id string, ann map[string]string) error {
	if err := s.Allocator.Annotate(ctx, id, ann); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.units[id]; ok {
		s.bumpLocked(u)
	}
	return nil
}

// Pick returns a ready unit of template chosen at random (as replicas of the kube allocator
// pick), not taking it.
func (s *Shared) Pick(template string, skip func(id string) bool) (manager.UnitInfo, error) {
	if err := s.record(Call{Method: "Pick", Arg: template}); err != nil {
		return manager.UnitInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ready []*manager.UnitInfo
	for _, u := range s.units {
		if readyOf(u, template) && !skip(u.ID) {
			ready = append(ready, u)
		}
	}
	if len(ready) == 0 {
		return manager.UnitInfo{}, manager.ErrNoReadyUnit
	}
	c := *ready[mrand.IntN(len(ready))]
	c.Annotations = maps.Clone(c.Annotations)
	return c, nil
}

// ClaimBound binds unit u with ann if it is still ready at u.Version, else ErrUnitTaken.
func (s *Shared) ClaimBound(ctx context.Context, u manager.UnitInfo, ann map[string]string) error {
	if err := s.record(Call{Method: "ClaimBound", ID: u.ID, Arg: maps.Clone(ann)}); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.units[u.ID]
	if !ok || cur.Version != u.Version || cur.Annotations["fusebox.dev/state"] != "ready" {
		return fmt.Errorf("%w: %s", manager.ErrUnitTaken, u.ID)
	}
	cur.Annotations = maps.Clone(ann)
	s.bumpLocked(cur)
	return nil
}

// readyOf reports whether u is a ready unit of template.
func readyOf(u *manager.UnitInfo, template string) bool {
	return u.Template == template && u.Annotations["fusebox.dev/state"] == "ready"
}

// bumpLocked gives unit u a new Version (a write).
func (s *Shared) bumpLocked(u *manager.UnitInfo) {
	s.version++
	u.Version = strconv.FormatUint(s.version, 10)
}

// Counts returns the ready and creating units of template.
func (s *Shared) Counts(template string) (ready, creating int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.units {
		if readyOf(u, template) {
			ready++
		}
	}
	return ready, int(s.creating.Load())
}

// Lookup returns unit id.
func (s *Shared) Lookup(ctx context.Context, id string) (manager.UnitInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[id]
	if !ok {
		return manager.UnitInfo{}, fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	c := *u
	c.Annotations = maps.Clone(u.Annotations)
	return c, nil
}

package manager

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// recAlloc is a recording fake allocator for tests of the pools and of bind's steps alone:
// units are records, every call is recorded ("Create fbx-1"), and fail injects an error per
// method. Its shared pool is its units annotated state "ready".
type recAlloc struct {
	caps Capabilities

	mu    sync.Mutex // guards the fields below
	calls []string
	units map[string]UnitInfo
	fail  map[string]error // method -> the error its calls return
	// gate, if set for a method, is waited on before its calls return (a step held open).
	gate map[string]chan struct{}
}

var (
	_ Allocator       = (*recAlloc)(nil)
	_ Annotator       = (*recAlloc)(nil)
	_ EgressBinder    = (*recAlloc)(nil)
	_ SharedPool      = (*recAlloc)(nil)
	_ OneWriteClaimer = (*recAlloc)(nil)
)

func newRecAlloc(caps Capabilities) *recAlloc {
	return &recAlloc{caps: caps, units: map[string]UnitInfo{}, fail: map[string]error{}, gate: map[string]chan struct{}{}}
}

// call records method on id and returns its injected error, after its gate opens.
func (a *recAlloc) call(method, id string) error {
	a.mu.Lock()
	a.calls = append(a.calls, method+" "+id)
	err, gate := a.fail[method], a.gate[method]
	a.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return err
}

// recorded returns the calls of method so far, as "method id".
func (a *recAlloc) recorded(method string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, c := range a.calls {
		if strings.HasPrefix(c, method+" ") {
			out = append(out, c)
		}
	}
	return out
}

func (a *recAlloc) setFail(method string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail[method] = err
}

func (a *recAlloc) Name() string               { return "recording" }
func (a *recAlloc) Capabilities() Capabilities { return a.caps }

func (a *recAlloc) Create(_ context.Context, id, template string) (UnitInfo, error) {
	if err := a.call("Create", id); err != nil {
		return UnitInfo{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := UnitInfo{ID: id, Template: template, InitAddr: "rec://" + id + "/init", DataAddr: "rec://" + id + "/data",
		Annotations: map[string]string{annState: "ready"}, Version: "1"}
	a.units[id] = u
	return u, nil
}

func (a *recAlloc) Destroy(_ context.Context, id string) error {
	if err := a.call("Destroy", id); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.units, id)
	return nil
}

func (a *recAlloc) List(context.Context) ([]UnitInfo, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]UnitInfo, 0, len(a.units))
	for _, u := range a.units {
		out = append(out, u)
	}
	slices.SortFunc(out, func(x, y UnitInfo) int { return strings.Compare(x.ID, y.ID) })
	return out, nil
}

// put adds a unit as it is, as another replica or a previous manager left it.
func (a *recAlloc) put(u UnitInfo) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.units[u.ID] = u
}

func (a *recAlloc) Annotate(_ context.Context, id string, ann map[string]string) error {
	if err := a.call("Annotate", id); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.units[id]
	u.Annotations = ann
	a.units[id] = u
	return nil
}

func (a *recAlloc) BindEgress(_ context.Context, id string, _ []string) error {
	return a.call("BindEgress", id)
}

func (a *recAlloc) Claim(_ context.Context, template string) (UnitInfo, error) {
	if err := a.call("Claim", template); err != nil {
		return UnitInfo{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range a.sortedLocked() {
		if u.Template == template && u.Annotations[annState] == "ready" {
			u.Annotations = map[string]string{annState: "claimed", AnnotationClaimedAt: time.Now().Format(time.RFC3339Nano)}
			a.units[u.ID] = u
			return u, nil
		}
	}
	return UnitInfo{}, ErrNoReadyUnit
}

func (a *recAlloc) sortedLocked() []UnitInfo {
	out := make([]UnitInfo, 0, len(a.units))
	for _, u := range a.units {
		out = append(out, u)
	}
	slices.SortFunc(out, func(x, y UnitInfo) int { return strings.Compare(x.ID, y.ID) })
	return out
}

func (a *recAlloc) Counts(template string) (ready, creating int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range a.units {
		if u.Template == template && u.Annotations[annState] == "ready" {
			ready++
		}
	}
	return ready, 0
}

func (a *recAlloc) Changed(string) <-chan struct{} { return make(chan struct{}) }

func (a *recAlloc) Lookup(_ context.Context, id string) (UnitInfo, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, ok := a.units[id]
	if !ok {
		return UnitInfo{}, fmt.Errorf("%w: %s", ErrUnitNotFound, id)
	}
	return u, nil
}

func (a *recAlloc) Pick(template string, skip func(id string) bool) (UnitInfo, error) {
	a.call("Pick", template)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range a.sortedLocked() {
		if u.Template == template && u.Annotations[annState] == "ready" && !skip(u.ID) {
			return u, nil
		}
	}
	return UnitInfo{}, ErrNoReadyUnit
}

func (a *recAlloc) ClaimBound(_ context.Context, u UnitInfo, ann map[string]string) error {
	if err := a.call("ClaimBound", u.ID); err != nil {
		return err
	}
	return a.Annotate(context.Background(), u.ID, ann)
}

// recHost is a recording poolHost: it answers target with n and counts what it was asked.
type recHost struct {
	mu      sync.Mutex // guards the fields below
	n       int
	targets [][3]int // ready, creating, bound of each target call
	tmpls   []string // the template of each target call
	follows int
	nudges  int
}

var _ poolHost = (*recHost)(nil)

func (h *recHost) target(_ time.Time, tmpl string, ready, creating, bound int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.targets = append(h.targets, [3]int{ready, creating, bound})
	h.tmpls = append(h.tmpls, tmpl)
	return h.n
}

func (h *recHost) following() { h.mu.Lock(); h.follows++; h.mu.Unlock() }

func (h *recHost) nudge() { h.mu.Lock(); h.nudges++; h.mu.Unlock() }

func (h *recHost) seen() (targets [][3]int, follows, nudges int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.targets), h.follows, h.nudges
}

// testDeps returns a pool's dependencies over alloc and host, with a fake clock, and a
// cleanup that waits for the pool's background work.
func testDeps(t *testing.T, alloc Allocator, host poolHost, mutate func(*Options)) poolDeps {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	o := Options{Allocator: alloc, Clock: clk, AllocateWait: time.Minute, CreateConcurrency: 4}
	if mutate != nil {
		mutate(&o)
	}
	if err := withDefaults(&o); err != nil {
		t.Fatal(err)
	}
	ops := NewStateOperator(clk)
	d := poolDeps{o: o, templates: newTemplateSet(o.Templates, o.Pools), alloc: alloc, ops: ops, log: slog.New(slog.DiscardHandler), tally: &tally{ops: ops},
		creations: &creations{clock: clk}, bg: &background{}, host: host}
	d.annotator, _ = alloc.(Annotator)
	t.Cleanup(d.bg.wg.Wait)
	return d
}

package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/manager/estimator"
)

// These tests drive bind's steps one by one, over a recording allocator.

// bindManager is a Manager over a recording allocator with caps, whose sFuse is initialize.
func bindManager(t *testing.T, caps Capabilities, initialize Initializer) (*Manager, *recAlloc) {
	t.Helper()
	a := newRecAlloc(caps)
	m, err := New(Options{Allocator: a, Estimator: estimator.Fixed{}, Clock: testingclock.NewFakeClock(time.Unix(1_000_000, 0)),
		Initializer: initialize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.bg.wg.Wait)
	return m, a
}

func okInit(context.Context, string, sfuse.Request) (sfuse.Result, error) {
	return sfuse.Result{SandboxKey: []byte("key"), SandboxCertificate: []byte("cert")}, nil
}

// The claim is the lease's write for a unit picked without being taken, and nothing else.
func TestBindClaimStep(t *testing.T) {
	m, a := bindManager(t, Capabilities{Adoption: true, SharedPool: true}, okInit)
	lease := &Lease{Expires: time.Unix(2_000_000, 0), TTL: time.Minute}
	if err := m.claim(context.Background(), Unit{Info: UnitInfo{ID: "taken"}}, lease).wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.recorded("ClaimBound"); len(got) != 0 {
		t.Fatalf("a taken unit was claimed again: %v", got)
	}
	a.put(UnitInfo{ID: "picked"})
	if err := m.claim(context.Background(), Unit{Info: UnitInfo{ID: "picked"}, claimOnBind: true}, lease).wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.recorded("ClaimBound"); !slices.Equal(got, []string{"ClaimBound picked"}) {
		t.Fatalf("claims %v, want the picked unit's", got)
	}
	if u, _ := a.Lookup(context.Background(), "picked"); u.Annotations[annState] != "bound" {
		t.Errorf("the claim wrote %v, want the lease's annotations", u.Annotations)
	}
}

// A shared pool's egress binding waits for the claim and is skipped when the claim is lost;
// a local one is done at once.
func TestBindEgressStep(t *testing.T) {
	allow, _ := egress.ParseAllowlist([]string{"example.com:443"})
	m, a := bindManager(t, Capabilities{Egress: true, Adoption: true, SharedPool: true}, okInit)
	gate := make(chan struct{})
	a.gate["ClaimBound"] = gate
	a.setFail("ClaimBound", ErrUnitTaken)
	claimed := m.claim(context.Background(), Unit{Info: UnitInfo{ID: "u"}, claimOnBind: true}, &Lease{})
	egressed := m.bindEgress(context.Background(), "u", allow, claimed)
	time.Sleep(10 * time.Millisecond) // the binding's goroutine would have bound by now
	if got := a.recorded("BindEgress"); len(got) != 0 {
		t.Fatalf("egress bound before the claim ended: %v", got)
	}
	close(gate)
	if err := egressed.wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.recorded("BindEgress"); len(got) != 0 {
		t.Fatalf("egress bound for a unit whose claim was lost: %v", got)
	}

	m, a = bindManager(t, Capabilities{Egress: true, Adoption: true}, okInit)
	a.setFail("BindEgress", errors.New("injected"))
	p := m.bindEgress(context.Background(), "local", allow, ended(nil))
	if got := a.recorded("BindEgress"); !slices.Equal(got, []string{"BindEgress local"}) {
		t.Fatalf("bindings %v, want the local unit's, done at once", got)
	}
	if err := p.wait(); err == nil {
		t.Fatal("the binding's error was lost")
	}
}

// The lease is annotated unless the claim wrote it.
func TestBindAnnotateStep(t *testing.T) {
	m, a := bindManager(t, Capabilities{Adoption: true}, okInit)
	a.put(UnitInfo{ID: "u"})
	lease := &Lease{Expires: time.Unix(2_000_000, 0), TTL: time.Minute}
	if err := m.annotate(context.Background(), Unit{Info: UnitInfo{ID: "u"}, claimOnBind: true}, lease).wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.recorded("Annotate"); len(got) != 0 {
		t.Fatalf("a unit claimed with its lease was annotated again: %v", got)
	}
	if err := m.annotate(context.Background(), Unit{Info: UnitInfo{ID: "u"}}, lease).wait(); err != nil {
		t.Fatal(err)
	}
	if got := a.recorded("Annotate"); !slices.Equal(got, []string{"Annotate u"}) {
		t.Fatalf("annotations %v, want the lease's", got)
	}
}

// sFuse's failures say whose fault they are.
func TestBindFuseStep(t *testing.T) {
	u := Unit{Info: UnitInfo{ID: "u"}}
	for _, c := range []struct {
		name   string
		answer sfuse.Result
		err    error
		unit   Unit
		want   error // nil: success
	}{
		{"answered", sfuse.Result{SandboxKey: []byte("key"), SandboxCertificate: []byte("cert")}, nil, u, nil},
		{"refused", sfuse.Result{}, fmt.Errorf("bad hello: %w", sfuse.ErrRefused), u, ErrInvalid},
		{"blown, claimed beside", sfuse.Result{}, fmt.Errorf("x: %w", sfuse.ErrBlown), Unit{Info: UnitInfo{ID: "u"}, claimOnBind: true}, ErrUnitTaken},
		{"blown, taken", sfuse.Result{}, fmt.Errorf("x: %w", sfuse.ErrBlown), Unit{Info: UnitInfo{ID: "u"}}, sfuse.ErrBlown},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _ := bindManager(t, Capabilities{}, func(context.Context, string, sfuse.Request) (sfuse.Result, error) { return c.answer, c.err })
			_, err := m.fuse(context.Background(), c.unit, AllocateRequest{}, egress.Allowlist{})
			switch {
			case c.want == nil && err != nil:
				t.Fatalf("err %v, want none", err)
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("err %v, want %v", err, c.want)
			}
		})
	}
}

// A lost claim forgets the unit without destroying it (it is the winner's); a failed step
// destroys it.
func TestBindLostClaimForgetsAndFailureDestroys(t *testing.T) {
	m, a := bindManager(t, Capabilities{Adoption: true, SharedPool: true}, okInit)
	for _, id := range []string{"lost", "failed"} {
		if err := m.ops.Insert(UnitInfo{ID: id, Template: DefaultTemplate}, Initialising, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.lostClaim("lost", ErrUnitTaken); !errors.Is(err, ErrUnitTaken) {
		t.Fatalf("lost claim: %v, want ErrUnitTaken", err)
	}
	if _, ok := m.ops.Get("lost"); ok {
		t.Error("the unit of a lost claim is still tracked")
	}
	if _, err := m.failBind("failed", "egress", errors.New("injected")); err == nil {
		t.Fatal("no error from a failed step")
	}
	m.bg.wg.Wait()
	if got := a.recorded("Destroy"); !slices.Equal(got, []string{"Destroy failed"}) {
		t.Errorf("destroys %v, want the failed unit's alone", got)
	}
	if n := m.tally.failures.Load(); n != 1 {
		t.Errorf("%d failures counted, want 1 (the lost claim is a race)", n)
	}
}

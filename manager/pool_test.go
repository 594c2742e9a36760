package manager

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"
)

// These tests drive each pool alone, through the pool interface, over a recording allocator
// and a recording host: no Manager.

// The warm pool creates up to the host's target, reporting its counts to the host, and
// destroys its oldest ready units when the target falls.
func TestWarmPoolReconcilesToTheHostsTarget(t *testing.T) {
	a, h := newRecAlloc(Capabilities{Adoption: true}), &recHost{n: 3}
	var p pool = newWarmPool(testDeps(t, a, h, nil), a.caps)
	ctx := context.Background()
	p.reconcile(ctx)
	wp := p.(*warmPool)
	wp.bg.wg.Wait()
	if got := len(a.recorded("Create")); got != 3 {
		t.Fatalf("%d creations, want 3", got)
	}
	if c := p.counts()[DefaultTemplate]; c[Ready] != 3 {
		t.Fatalf("counts %v, want 3 ready", c)
	}
	h.mu.Lock()
	h.n = 1
	h.mu.Unlock()
	p.reconcile(ctx)
	wp.bg.wg.Wait()
	if got := a.recorded("Destroy"); len(got) != 2 {
		t.Fatalf("destroyed %v, want the 2 surplus units", got)
	}
	targets, _, _ := h.seen()
	if want := [][3]int{{0, 0, 0}, {3, 0, 0}}; !slices.Equal(targets, want) {
		t.Errorf("target asked with (ready, creating, bound) %v, want %v", targets, want)
	}
	if c := p.counts()[DefaultTemplate]; c[Ready] != 1 {
		t.Errorf("counts %v, want 1 ready", c)
	}
}

// An allocation on an empty warm pool counts a cold wait, asks the host for a reconcile,
// makes a unit of its own whatever the target, and takes it.
func TestWarmPoolTakeOnEmptyMakesItsOwn(t *testing.T) {
	a, h := newRecAlloc(Capabilities{}), &recHost{n: 0}
	d := testDeps(t, a, h, nil)
	var p pool = newWarmPool(d, a.caps)
	u, err := p.take(context.Background(), DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if u.State != Initialising {
		t.Errorf("took a unit %s, want initialising", u.State)
	}
	if got := a.recorded("Create"); !slices.Equal(got, []string{"Create " + u.Info.ID}) {
		t.Errorf("creations %v, want the taken unit's alone", got)
	}
	if n := d.tally.coldWaits.Load(); n != 1 {
		t.Errorf("%d cold waits, want 1", n)
	}
	if _, _, nudges := h.seen(); nudges == 0 {
		t.Error("the host was not nudged")
	}
}

// Renew and release take the lease's token only; renew persists the lease with the unit.
func TestWarmPoolLeaseNeedsItsToken(t *testing.T) {
	a, h := newRecAlloc(Capabilities{Adoption: true}), &recHost{}
	d := testDeps(t, a, h, nil)
	var p pool = newWarmPool(d, a.caps)
	ctx := context.Background()
	now := d.o.Clock.Now()
	lease := &Lease{TokenHash: sha256.Sum256([]byte("right")), Expires: now.Add(time.Minute), TTL: time.Minute}
	if err := d.ops.Insert(UnitInfo{ID: "u1", Template: DefaultTemplate}, Bound, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := p.renew(ctx, "u1", "wrong", 0); !errors.Is(err, ErrBadLeaseToken) {
		t.Fatalf("renew with a wrong token: %v, want ErrBadLeaseToken", err)
	}
	exp, err := p.renew(ctx, "u1", "right", 2*time.Minute)
	if err != nil || !exp.Equal(now.Add(2*time.Minute)) {
		t.Fatalf("renew: %v, %v; want expiry %v", exp, err, now.Add(2*time.Minute))
	}
	if got := a.recorded("Annotate"); !slices.Equal(got, []string{"Annotate u1"}) {
		t.Errorf("annotations %v, want the renewed lease persisted once", got)
	}
	if err := p.release(ctx, "u1", "wrong"); !errors.Is(err, ErrBadLeaseToken) {
		t.Fatalf("release with a wrong token: %v, want ErrBadLeaseToken", err)
	}
	if err := p.release(ctx, "u1", "right"); err != nil {
		t.Fatal(err)
	}
	d.bg.wg.Wait()
	if got := a.recorded("Destroy"); !slices.Equal(got, []string{"Destroy u1"}) {
		t.Errorf("destroys %v, want u1's after its release", got)
	}
}

// A shared pool's follower keeps its prepared connections but neither sizes the pool nor
// expires leases: it tells the host it follows.
func TestSharedPoolFollowerLeavesSizingToTheLeader(t *testing.T) {
	a, h := newRecAlloc(Capabilities{Adoption: true, SharedPool: true}), &recHost{n: 5}
	d := testDeps(t, a, h, func(o *Options) { o.IsLeader = func() bool { return false } })
	expired := leaseAnnotations(&Lease{Expires: d.o.Clock.Now().Add(-time.Second), TTL: time.Minute})
	a.put(UnitInfo{ID: "old", Template: DefaultTemplate, Annotations: expired})
	var p pool = newSharedPool(d, nil)
	p.reconcile(context.Background())
	d.bg.wg.Wait()
	if targets, follows, _ := h.seen(); len(targets) != 0 || follows != 1 {
		t.Errorf("targets %v and %d follows, want none and 1", targets, follows)
	}
	if c, dd := a.recorded("Create"), a.recorded("Destroy"); len(c)+len(dd) != 0 {
		t.Errorf("a follower created %v and destroyed %v", c, dd)
	}
}

// A shared pool's leader destroys units whose lease expired, counts the bound ones for the
// host, and creates toward the target.
func TestSharedPoolLeaderExpiresAndSizes(t *testing.T) {
	a, h := newRecAlloc(Capabilities{Adoption: true, SharedPool: true}), &recHost{n: 2}
	d := testDeps(t, a, h, nil)
	now := d.o.Clock.Now()
	a.put(UnitInfo{ID: "expired", Template: DefaultTemplate, Annotations: leaseAnnotations(&Lease{Expires: now.Add(-time.Second), TTL: time.Minute})})
	a.put(UnitInfo{ID: "live", Template: DefaultTemplate, Annotations: leaseAnnotations(&Lease{Expires: now.Add(time.Minute), TTL: time.Minute})})
	var p pool = newSharedPool(d, nil)
	p.reconcile(context.Background())
	d.bg.wg.Wait()
	if got := a.recorded("Destroy"); !slices.Equal(got, []string{"Destroy expired"}) {
		t.Errorf("destroyed %v, want the expired unit alone", got)
	}
	if targets, _, _ := h.seen(); !slices.Equal(targets, [][3]int{{0, 0, 2}}) {
		t.Errorf("target asked with %v, want 0 ready, 0 creating, 2 bound", targets)
	}
	if got := len(a.recorded("Create")); got != 2 {
		t.Errorf("%d creations, want 2", got)
	}
}

// A shared pool takes a unit by Claim, or, with a one-write claimer, picks it and leaves the
// claim to bind.
func TestSharedPoolTakeClaimsOrPicks(t *testing.T) {
	for _, separate := range []bool{true, false} {
		a := newRecAlloc(Capabilities{Adoption: true, SharedPool: true})
		d := testDeps(t, a, &recHost{}, func(o *Options) { o.SeparateClaim = separate })
		a.put(UnitInfo{ID: "r1", Template: DefaultTemplate, Annotations: map[string]string{annState: "ready"}})
		var p pool = newSharedPool(d, nil)
		u, err := p.take(context.Background(), DefaultTemplate)
		if err != nil {
			t.Fatal(err)
		}
		claims, picks := a.recorded("Claim"), a.recorded("Pick")
		if separate && (len(claims) != 1 || len(picks) != 0 || u.claimOnBind) {
			t.Errorf("separate claim: claims %v, picks %v, claimOnBind %v; want one claim", claims, picks, u.claimOnBind)
		}
		if !separate && (len(claims) != 0 || len(picks) != 1 || !u.claimOnBind) {
			t.Errorf("one write: claims %v, picks %v, claimOnBind %v; want one pick, claimed by bind", claims, picks, u.claimOnBind)
		}
		if got, _ := d.ops.Get("r1"); got.State != Initialising {
			t.Errorf("the taken unit is %s here, want initialising", got.State)
		}
	}
}

// recDrainer records the cut-offs DrainOutdated is called with.
type recDrainer struct{ before []time.Time }

func (r *recDrainer) DrainOutdated(_ context.Context, before time.Time) ([]string, error) {
	r.before = append(r.before, before)
	return nil, nil
}

// A shared pool's leader drains the warm units of another template version on every pass:
// those made before it led (by an earlier leader) at once, and later ones once older than
// ClaimGrace; a follower drains nothing, and leadership regained starts afresh.
func TestSharedPoolLeaderDrainsOutdated(t *testing.T) {
	a, h := newRecAlloc(Capabilities{Adoption: true, SharedPool: true}), &recHost{}
	leading := true
	d := testDeps(t, a, h, func(o *Options) {
		o.IsLeader = func() bool { return leading }
		o.ClaimGrace = time.Minute
	})
	clk := d.o.Clock.(interface{ Step(time.Duration) })
	dr := &recDrainer{}
	p := newSharedPool(d, dr)
	ctx := context.Background()
	start := d.o.Clock.Now()
	p.reconcile(ctx) // leads from start
	clk.Step(30 * time.Second)
	p.reconcile(ctx) // still within ClaimGrace of start: the cut-off stays at start
	clk.Step(2 * time.Minute)
	p.reconcile(ctx) // past ClaimGrace: the cut-off follows now - ClaimGrace
	leading = false
	p.reconcile(ctx) // a follower drains nothing
	clk.Step(time.Second)
	leading = true
	p.reconcile(ctx) // leads again: from now
	d.bg.wg.Wait()
	want := []time.Time{start, start, start.Add(150 * time.Second).Add(-time.Minute), start.Add(151 * time.Second)}
	if !slices.EqualFunc(dr.before, want, time.Time.Equal) {
		t.Errorf("DrainOutdated cut-offs %v, want %v", dr.before, want)
	}
}

package manager

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager/egress"
)

// This file holds bind, the steps that turn an Initialising unit into one bound to an
// agent: the claim (a shared pool's unit picked without being taken), the egress binding, the
// lease's annotation and sFuse (fuse). sFuse is the long step; the others run beside it where
// that shortens the allocation, and all must succeed before the agent hears of the unit
// (nothing in it runs agent code before the agent connects, which it can only do after bind
// returns), so their order does not matter.

// bind binds unit u to the allocation req. On a failure the unit is destroyed (a unit that
// may have been initialised is never handed out again), except after a lost claim, which
// leaves it to the claim's winner.
func (m *Manager) bind(ctx context.Context, u Unit, req AllocateRequest, allow egress.Allowlist, ttl time.Duration) (Allocation, error) {
	id := u.Info.ID
	lease, token, err := m.newLease(req, allow, ttl)
	if err != nil {
		return m.failBind(id, "init", err)
	}
	claimed := m.claim(ctx, u, lease)
	egressed := m.bindEgress(ctx, id, allow, claimed)
	annotated := m.annotate(ctx, u, lease)
	fused, ferr := m.fuse(ctx, u, req, allow)
	cerr, eerr, aerr := claimed.wait(), egressed.wait(), annotated.wait()
	switch {
	case cerr != nil:
		return m.lostClaim(id, cerr)
	case eerr != nil:
		return m.failBind(id, "egress", eerr)
	case ferr != nil:
		return m.failBind(id, "init", ferr)
	case aerr != nil:
		return m.failBind(id, "annotate", aerr)
	}
	endpoint, err := m.endpoint(u, lease)
	if err != nil {
		return m.failBind(id, "init", err)
	}
	if _, err := m.ops.Transition(id, Initialising, Bound, func(x *Unit) { x.Lease = lease }); err != nil {
		return m.failBind(id, "init", err)
	}
	m.tally.publishCounts()
	return m.allocation(u, endpoint, fused, lease, token), nil
}

// endpoint is the data address the agent is told: the unit's own, or the one the allocator
// grants a local caller who is not the manager's user (EndpointGranter).
func (m *Manager) endpoint(u Unit, lease *Lease) (string, error) {
	g, ok := m.alloc.(EndpointGranter)
	if !ok {
		return u.Info.DataAddr, nil
	}
	granted, err := g.GrantEndpoint(u.Info.ID, lease.Owner)
	if err != nil {
		return "", fmt.Errorf("granting the data socket to %s: %w", lease.Owner, err)
	}
	if granted == "" {
		return u.Info.DataAddr, nil
	}
	return granted, nil
}

// newLease makes the allocation's lease and its token; only the token's hash is kept.
func (m *Manager) newLease(req AllocateRequest, allow egress.Allowlist, ttl time.Duration) (*Lease, string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, "", err
	}
	token := base64.RawURLEncoding.EncodeToString(raw[:])
	return &Lease{Owner: req.Owner, TokenHash: sha256.Sum256([]byte(token)), Expires: m.o.Clock.Now().Add(ttl), TTL: ttl,
		Egress: allow.Entries(), Labels: maps.Clone(req.Labels)}, token, nil
}

// claim starts the claim of a unit a shared pool picked without taking it (Unit.claimOnBind):
// the lease's write takes it (OneWriteClaimer.ClaimBound), beside sFuse, so that the answer
// waits for the longer of the two, not their sum. Until the claim succeeds the unit is not
// this replica's: its egress binding waits for the claim, and a lost claim leaves the unit to
// the winner whatever sFuse did. sFuse is exactly once, so of two replicas that picked one
// unit at most one agent key is pinned: if the loser's sFuse blew the fuse, the winner's is
// refused and the winner destroys the unit. A claim whose write may have landed unseen leaves
// the unit to its lease's expiry. Neither is destroyed here, only forgotten (lostClaim).
func (m *Manager) claim(ctx context.Context, u Unit, lease *Lease) *pending {
	if !u.claimOnBind {
		return ended(nil)
	}
	return inBackground(func() error {
		defer m.tally.timeStep("annotate", time.Now())
		return m.claimer.ClaimBound(ctx, u.Info, leaseAnnotations(lease))
	})
}

// bindEgress binds unit id's egress allowlist (EgressBinder), beside sFuse. A shared pool's
// binding is an API write (kube: a CiliumNetworkPolicy named after the unit), worth a
// goroutine of its own, and waits for the claim: a unit not claimed is not this replica's to
// bind. A local one is a map update, cheaper inline than the scheduling a goroutine costs a
// saturated manager.
func (m *Manager) bindEgress(ctx context.Context, id string, allow egress.Allowlist, claimed *pending) *pending {
	bind := func() error {
		defer m.tally.timeStep("egress", time.Now())
		return m.binder.BindEgress(ctx, id, allow.Entries())
	}
	switch {
	case m.binder == nil: // checkEgress has refused an allowlist this allocator cannot enforce
		return ended(nil)
	case m.caps.SharedPool:
		return inBackground(func() error {
			if claimed.wait() != nil {
				return nil // not this replica's unit: nothing to bind
			}
			return bind()
		})
	}
	return ended(bind())
}

// annotate persists the lease with the unit (Annotator), beside sFuse, for the next
// manager's adoption or the other replicas of a shared pool. A unit claimed with the lease's
// write (claim) has it already.
func (m *Manager) annotate(ctx context.Context, u Unit, lease *Lease) *pending {
	if m.annotator == nil || u.claimOnBind {
		return ended(nil)
	}
	return inBackground(func() error {
		defer m.tally.timeStep("annotate", time.Now())
		return m.annotator.Annotate(ctx, u.Info.ID, leaseAnnotations(lease))
	})
}

// fuse performs sFuse on unit u and says what a failure means: a refusal of what the agent
// sent is the request's fault (ErrInvalid: no other unit is tried; the fuse is intact, but
// the unit is destroyed all the same: it has been offered to someone); a blown fuse on a unit
// this replica claimed beside sFuse is a race lost to another replica's sFuse, whose claim
// lost (ErrUnitTaken: retried, and the unit is this replica's to destroy).
func (m *Manager) fuse(ctx context.Context, u Unit, req AllocateRequest, allow egress.Allowlist) (sfuse.Result, error) {
	start := time.Now()
	fused, err := m.initialize(ctx, u.Info.InitAddr, sfuse.Request{AgentKey: req.AgentPublicKey, Egress: allow.Entries(),
		Env: req.Env, Cwd: req.Cwd})
	m.tally.timeStep("init", start)
	switch {
	case errors.Is(err, sfuse.ErrRefused):
		return sfuse.Result{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	case u.claimOnBind && errors.Is(err, sfuse.ErrBlown):
		return sfuse.Result{}, fmt.Errorf("%w: %v", ErrUnitTaken, err)
	}
	return fused, err
}

// allocation is the answer to the agent: the bound unit at endpoint, the sandbox's identity
// and the lease.
func (m *Manager) allocation(u Unit, endpoint string, fused sfuse.Result, lease *Lease, token string) Allocation {
	return Allocation{ID: u.Info.ID, Endpoint: endpoint, SandboxKey: fused.SandboxKey, LeaseExpires: lease.Expires,
		LeaseToken: token, SandboxCertificate: fused.SandboxCertificate}
}

// lostClaim ends an allocation whose claim failed: the unit is forgotten, not destroyed (see
// claim). A claim lost to another replica is a race (ErrUnitTaken, retried by Allocate); any
// other failure is the allocator's.
func (m *Manager) lostClaim(id string, err error) (Allocation, error) {
	m.ops.Transition(id, Initialising, Destroying, nil)
	m.ops.Transition(id, Destroying, Gone, nil)
	if !errors.Is(err, ErrUnitTaken) {
		m.tally.failure("annotate")
		err = fmt.Errorf("%w: %v", ErrAllocator, err)
	}
	return Allocation{}, fmt.Errorf("claiming %s: %w", id, err)
}

// failBind ends an allocation whose step stage failed with err: the unit turns Failed and is
// destroyed in the background (a unit whose destroy fails keeps its remains, destroyed again
// later).
func (m *Manager) failBind(id, stage string, err error) (Allocation, error) {
	if !errors.Is(err, ErrUnitTaken) { // a race, not a failure
		m.tally.failure(stage)
	}
	m.bg.do(func() {
		if _, terr := m.ops.Transition(id, Initialising, Failed, func(x *Unit) { x.Err = fmt.Sprintf("%s: %v", stage, err) }); terr != nil {
			return
		}
		if derr := m.alloc.Destroy(context.Background(), id); derr != nil {
			m.tally.failure("destroy")
			m.ops.MarkRemains(id) // its Err stays the stage's; Remains says the rest
			m.log.Error("destroying failed unit; it is retried", "id", id, "err", derr, "retry_after", RemainsRetry)
		}
	})
	return Allocation{}, fmt.Errorf("%s %s: %w", stage, id, err)
}

// pending is a step of bind that may run beside sFuse.
type pending struct {
	done chan struct{} // closed when the step has ended; nil for a step that ended at once
	err  error         // the step's, once done
}

// inBackground runs step in a goroutine of its own.
func inBackground(step func() error) *pending {
	p := &pending{done: make(chan struct{})}
	go func() { defer close(p.done); p.err = step() }()
	return p
}

// ended is a step that has ended (done inline, or nothing to do) with err.
func ended(err error) *pending { return &pending{err: err} }

// wait returns the step's error once it has ended.
func (p *pending) wait() error {
	if p.done != nil {
		<-p.done
	}
	return p.err
}

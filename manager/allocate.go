package manager

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/internal/cmdenv"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/manager/egress"
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

// AllocateRequest is a validated-at-entry request to bind a sandbox.
type AllocateRequest struct {
	AgentPublicKey []byte
	Template       string
	Egress         []string
	LeaseTTL       time.Duration
	Labels         map[string]string
	// Env and Cwd are the environment variables and working directory the sandbox's
	// commands start with (over the template's), given to the sandbox with sFuse: a warm unit
	// serves them (package cmdenv checks them).
	Env map[string]string
	Cwd string
	// Owner is the caller, stored with the lease (see Lease.Owner).
	Owner string
	// Authorize, if set, is asked whether the caller may have a unit of template with the
	// allowlist, before a unit is taken: first with an empty list, before the request's list
	// is parsed (only its size is checked by then), then with the parsed list. Its error
	// ends the allocation as it is.
	Authorize func(template string, allow egress.Allowlist) error
}

// Allocation is the result of Allocate.
type Allocation struct {
	ID           string
	Endpoint     string
	SandboxKey   []byte
	LeaseExpires time.Time
	LeaseToken   string
	// SandboxCertificate is the sandbox's self-signed certificate (DER), relayed as the
	// sandbox sent it, for agents that pin through a root certificate.
	SandboxCertificate []byte
}

// checked is what Allocate's checks made of a request.
type checked struct {
	template string
	allow    egress.Allowlist
	ttl      time.Duration
}

// Allocate binds a warm unit to the agent whose public key is in req.
func (m *Manager) Allocate(ctx context.Context, req AllocateRequest) (Allocation, error) {
	start := time.Now()
	c, err := m.check(req)
	if err != nil {
		return Allocation{}, err
	}
	a, err := m.takeAndBind(ctx, req, c)
	if err != nil {
		return Allocation{}, err
	}
	d := time.Since(start)
	m.recordAllocation(c.template, d)
	m.log.Debug("allocated", "id", a.ID, "took", d)
	return a, nil
}

// check checks req before a unit is spent on it: the agent's key, the template,
// the egress allowlist (against the caller's authorisation and what the allocator enforces),
// the lease TTL and the labels.
func (m *Manager) check(req AllocateRequest) (checked, error) {
	if _, err := tlspin.ParsePublicKey(req.AgentPublicKey); err != nil {
		return checked{}, fmt.Errorf("%w: agent public key: %v", ErrInvalid, err)
	}
	c := checked{template: req.Template}
	if c.template == "" {
		c.template = m.o.PoolTemplate
	}
	if !m.templates.known(c.template) {
		return checked{}, fmt.Errorf("%w: %q (known: %s)", ErrUnknownTemplate, c.template, strings.Join(m.templates.names(), ", "))
	}
	// The caller's grant is checked before the allowlist is parsed (an empty list is inside
	// every ceiling, so the first Authorize judges the caller and the template alone), and
	// the list's size before both.
	if err := egress.CheckSize(req.Egress); err != nil {
		return checked{}, fmt.Errorf("%w: egress: %v", ErrInvalid, err)
	}
	if req.Authorize != nil {
		if err := req.Authorize(c.template, egress.Allowlist{}); err != nil {
			return checked{}, err
		}
	}
	var err error
	if c.allow, err = egress.ParseAllowlist(req.Egress); err != nil {
		return checked{}, fmt.Errorf("%w: egress: %v", ErrInvalid, err)
	}
	if req.Authorize != nil {
		if err := req.Authorize(c.template, c.allow); err != nil {
			return checked{}, err
		}
	}
	if ec, ok := m.alloc.(EgressChecker); ok {
		if err := ec.CheckEgress(c.allow.Entries()); err != nil {
			return checked{}, fmt.Errorf("egress: %w", err)
		}
	}
	if c.ttl, err = m.leaseTTL(req.LeaseTTL, m.o.DefaultLeaseTTL); err != nil {
		return checked{}, err
	}
	if err := checkLabels(req.Labels); err != nil {
		return checked{}, err
	}
	if err := cmdenv.Check(req.Env, req.Cwd); err != nil {
		return checked{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return c, m.checkEgress(c.allow)
}

// takeAndBind takes a unit from the pool and binds it, trying up to three units: a unit that
// fails to bind is destroyed and another taken, unless the request is at fault. Units lost
// to another replica's claim are not counted, until AllocateWait has passed.
func (m *Manager) takeAndBind(ctx context.Context, req AllocateRequest, c checked) (Allocation, error) {
	var lastErr error
	lostUntil := m.o.Clock.Now().Add(m.o.AllocateWait)
	for attempt := 0; attempt < 3; attempt++ {
		took := time.Now()
		u, err := m.pool.take(ctx, c.template)
		m.tally.timeStep("take", took)
		if err != nil {
			return Allocation{}, err
		}
		a, err := m.bind(ctx, u, req, c.allow, c.ttl)
		switch {
		case err == nil:
			return a, nil
		case errors.Is(err, ErrUnitTaken) && m.o.Clock.Now().Before(lostUntil):
			// Another replica claimed the unit first: a race, not a failure of the unit (the
			// allocator offers that version of it no more), as Claim's lost races are.
			attempt--
			lastErr = err
			continue
		case ctx.Err() != nil:
			return Allocation{}, ctx.Err()
		case errors.Is(err, ErrInvalid):
			return Allocation{}, err // the request's fault: another unit would refuse it too
		}
		lastErr = err
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

// recordAllocation counts an allocation of tmpl served in d, as demand for tmpl's estimator
// too, and nudges the reconciler to refill.
func (m *Manager) recordAllocation(tmpl string, d time.Duration) {
	m.tally.allocated(d)
	if e := m.templates.entry(tmpl); e != nil { // else removed meanwhile
		if e.sizer != nil {
			e.sizer.allocs.Add(1)
		}
		e.demand.add(m.o.Clock.Now())
	}
	m.nudge()
}

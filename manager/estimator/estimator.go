// Package estimator decides how many ready sandboxes the warm pool should hold.
//
// An Estimator turns a sequence of observations into a target pool size. It performs no I/O
// and reads time only from the observation, so it is deterministic: the same observations give
// the same targets (tests drive it with a fake clock). Implementations may keep state between
// observations (a smoothed rate, an integral); they are not safe for concurrent use, and the
// manager calls them from one goroutine.
package estimator

import (
	"fmt"
	"math"
	"time"
)

// Observation is what the manager saw at one reconcile.
type Observation struct {
	Now time.Time
	// Allocations since the previous observation.
	Allocations int
	// Ready and Creating units now; Bound units now.
	Ready, Creating, Bound int
	// ProvisioningLatency is a recent typical time from Creating to Ready.
	ProvisioningLatency time.Duration
}

// Estimator maps observations to a target number of ready units.
type Estimator interface {
	// Name identifies the estimator in metrics and status.
	Name() string
	// Target returns the number of ready (or creating) units the pool should hold, >= 0.
	Target(Observation) int
}

// New returns the estimator called name ("fixed", "ewma" or "pid"). size is the fixed target
// and the floor of the adaptive ones; max caps the adaptive ones.
func New(name string, size, max int) (Estimator, error) {
	if size < 0 || max < size {
		return nil, fmt.Errorf("estimator: need 0 <= pool size (%d) <= max (%d)", size, max)
	}
	switch name {
	case "fixed":
		return Fixed{N: size}, nil
	case "ewma":
		return &EWMA{Min: size, Max: max, HalfLife: 10 * time.Second, Headroom: 2}, nil
	case "pid":
		return &PID{Min: size, Max: max, Kp: 1, Ki: 0.2, Kd: 0.1, HalfLife: 10 * time.Second, Headroom: 2}, nil
	default:
		return nil, fmt.Errorf("estimator: unknown %q (want fixed, ewma or pid)", name)
	}
}

// Fixed always wants N ready units.
type Fixed struct{ N int }

func (f Fixed) Name() string           { return "fixed" }
func (f Fixed) Target(Observation) int { return f.N }
func (f Fixed) String() string         { return fmt.Sprintf("fixed(%d)", f.N) }

var _ Estimator = Fixed{}

// rate smooths an allocation rate with an exponentially weighted moving average whose weight
// halves every halfLife of observation time.
type rate struct {
	last    time.Time
	perSec  float64
	started bool
}

func (r *rate) observe(o Observation, halfLife time.Duration) float64 {
	if !r.started {
		r.started, r.last = true, o.Now
		return r.perSec
	}
	dt := o.Now.Sub(r.last).Seconds()
	if dt <= 0 {
		return r.perSec
	}
	r.last = o.Now
	inst := float64(o.Allocations) / dt
	alpha := 1 - math.Exp2(-dt/halfLife.Seconds())
	r.perSec += alpha * (inst - r.perSec)
	return r.perSec
}

// littles is the number of allocations expected while one unit provisions, times headroom:
// with that many ready, demand at the smoothed rate never waits for a cold start.
func littles(perSec float64, latency time.Duration, headroom float64) float64 {
	return perSec * latency.Seconds() * headroom
}

func clamp(v float64, lo, hi int) int {
	n := int(math.Round(v)) // residue of a decayed rate should not keep a unit warm
	return max(lo, min(hi, n))
}

// EWMA targets the smoothed demand over one provisioning latency, with headroom, between Min
// and Max.
type EWMA struct {
	Min, Max int
	HalfLife time.Duration
	Headroom float64
	r        rate
}

func (e *EWMA) Name() string { return "ewma" }

func (e *EWMA) Target(o Observation) int {
	perSec := e.r.observe(o, e.HalfLife)
	return clamp(float64(e.Min)+littles(perSec, o.ProvisioningLatency, e.Headroom), e.Min, e.Max)
}

var _ Estimator = (*EWMA)(nil)

// PID steers the ready count toward the EWMA estimate with a proportional-integral-derivative
// controller, so that a pool that keeps running dry (ready below the estimate) grows beyond it
// and a pool that sits full shrinks back.
type PID struct {
	Min, Max   int
	Kp, Ki, Kd float64
	HalfLife   time.Duration
	Headroom   float64

	r        rate
	integral float64
	prevErr  float64
	prev     time.Time
}

func (p *PID) Name() string { return "pid" }

func (p *PID) Target(o Observation) int {
	perSec := p.r.observe(o, p.HalfLife)
	setpoint := float64(p.Min) + littles(perSec, o.ProvisioningLatency, p.Headroom)
	e := setpoint - float64(o.Ready+o.Creating)
	dt := 0.0
	if !p.prev.IsZero() {
		dt = o.Now.Sub(p.prev).Seconds()
	}
	deriv := 0.0
	if dt > 0 {
		p.integral += e * dt
		// Anti-windup: the integral alone never asks for more than the whole range.
		limit := float64(p.Max) / max(p.Ki, 1e-9)
		p.integral = math.Max(-limit, math.Min(limit, p.integral))
		deriv = (e - p.prevErr) / dt
	}
	p.prev, p.prevErr = o.Now, e
	return clamp(setpoint+p.Kp*e+p.Ki*p.integral+p.Kd*deriv, p.Min, p.Max)
}

var _ Estimator = (*PID)(nil)

package estimator

import (
	"testing"
	"time"
)

// clock is a fake clock: observations carry its time.
type clock struct{ t time.Time }

func (c *clock) tick(d time.Duration) time.Time { c.t = c.t.Add(d); return c.t }

func TestNew(t *testing.T) {
	for _, name := range []string{"fixed", "ewma", "pid"} {
		e, err := New(name, 2, 10)
		if err != nil || e.Name() != name {
			t.Fatalf("New(%q) = %v, %v", name, e, err)
		}
	}
	if _, err := New("magic", 2, 10); err == nil {
		t.Fatal("unknown estimator accepted")
	}
	if _, err := New("fixed", 5, 2); err == nil {
		t.Fatal("max below size accepted")
	}
}

func TestFixed(t *testing.T) {
	if got := (Fixed{N: 3}).Target(Observation{Allocations: 1000}); got != 3 {
		t.Fatalf("Fixed = %d", got)
	}
}

// run feeds steady demand of perSec allocations per second for d, observing every 100 ms.
func run(e Estimator, c *clock, perSec float64, d time.Duration, ready int) int {
	target := 0
	acc := 0.0
	for range int(d / (100 * time.Millisecond)) {
		acc += perSec / 10
		n := int(acc)
		acc -= float64(n)
		target = e.Target(Observation{Now: c.tick(100 * time.Millisecond), Allocations: n, Ready: ready,
			ProvisioningLatency: 500 * time.Millisecond})
	}
	return target
}

func TestEWMAFollowsDemandWithinBounds(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	e, _ := New("ewma", 2, 50)
	if got := run(e, c, 0, 10*time.Second, 2); got != 2 {
		t.Fatalf("idle target %d, want the floor 2", got)
	}
	// 20/s for a minute: Little's law says 20 * 0.5 s * headroom 2 = 20 above the floor.
	if got := run(e, c, 20, time.Minute, 2); got < 20 || got > 23 {
		t.Fatalf("steady 20/s target %d, want about 22", got)
	}
	if got := run(e, c, 1000, time.Minute, 2); got != 50 {
		t.Fatalf("overload target %d, want the cap 50", got)
	}
	// Demand stops: the target decays back to the floor.
	if got := run(e, c, 0, 2*time.Minute, 2); got != 2 {
		t.Fatalf("after demand stopped target %d, want 2", got)
	}
}

func TestEWMAIsDeterministic(t *testing.T) {
	a, _ := New("ewma", 1, 100)
	b, _ := New("ewma", 1, 100)
	ca, cb := &clock{t: time.Unix(0, 0)}, &clock{t: time.Unix(0, 0)}
	for i := range 50 {
		rate := float64(i % 7 * 3)
		if x, y := run(a, ca, rate, time.Second, 3), run(b, cb, rate, time.Second, 3); x != y {
			t.Fatalf("step %d: %d != %d", i, x, y)
		}
	}
}

func TestPIDGrowsWhenPoolRunsDryAndStaysBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	p, _ := New("pid", 2, 40)
	ewma, _ := New("ewma", 2, 40)
	ce := &clock{t: c.t}
	// The pool keeps running dry (ready stays 0) under 10/s: PID asks for more than the
	// open-loop EWMA estimate.
	pid := run(p, c, 10, 30*time.Second, 0)
	open := run(ewma, ce, 10, 30*time.Second, 0)
	if pid <= open {
		t.Fatalf("pid target %d not above ewma %d while the pool is dry", pid, open)
	}
	if pid > 40 {
		t.Fatalf("pid target %d above the cap", pid)
	}
	// Demand stops and the pool sits full: the target comes back to the floor.
	if got := run(p, c, 0, 5*time.Minute, 40); got != 2 {
		t.Fatalf("pid target %d after demand stopped, want 2", got)
	}
}

func TestTargetsNeverNegative(t *testing.T) {
	for _, name := range []string{"fixed", "ewma", "pid"} {
		e, _ := New(name, 0, 5)
		c := &clock{t: time.Unix(0, 0)}
		for i := range 200 {
			if got := e.Target(Observation{Now: c.tick(time.Duration(i%3) * time.Second), Ready: 100, Allocations: i % 2}); got < 0 || got > 5 {
				t.Fatalf("%s: target %d out of [0,5]", name, got)
			}
		}
	}
}

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// AllocateOptions configure the warm-allocation benchmark.
type AllocateOptions struct {
	Runsc, SandboxBinary string
	Runs                 int // warm allocations measured
	YoungRuns            int // allocations of units younger than their warm-up (default 20)
	ColdRuns             int
	PoolSize             int
	// Settle is how long the pool stays full and idle before each warm allocation
	// (default 100 ms; negative: none).
	Settle time.Duration
	// PoolPing is the manager's ping interval for the pool's next unit (0: none).
	PoolPing time.Duration
	// Trace times each step of the warm allocations (AllocateResult.Steps).
	Trace bool
	Log   *slog.Logger
}

// AllocateResult is the JSON `fusebox bench allocate --json` prints.
type AllocateResult struct {
	Runs          int     `json:"runs"`
	AllocateP50Ms float64 `json:"allocate_p50_ms"`
	AllocateP99Ms float64 `json:"allocate_p99_ms"`
	// Young: the same from a pool of one unit, taken as soon as it is ready and idle for
	// settle_ms, before gVisor's clock calibration (see manager.GVisorWarmUp).
	YoungRuns          int     `json:"young_runs"`
	AllocateYoungP50Ms float64 `json:"allocate_young_p50_ms"`
	AllocateYoungP99Ms float64 `json:"allocate_young_p99_ms"`
	ColdStartP50Ms     float64 `json:"cold_start_p50_ms"`
	ColdRuns           int     `json:"cold_runs"`
	PoolRefillPerS     float64 `json:"pool_refill_per_s"`
	PoolSize           int     `json:"pool_size"`
	SettleMs           float64 `json:"settle_ms"`
	PoolPingMs         float64 `json:"pool_ping_ms"`
	Note               string  `json:"note"`
	// Steps is where the warm allocations' time goes (with Trace).
	Steps *Steps `json:"steps,omitempty"`
}

// Allocate measures allocation against a real manager with the runsc allocator: warm
// allocations (a ready unit waiting; Allocate over gRPC, sFuse, the first data-plane call),
// cold starts (an empty pool) and how fast the pool refills.
func Allocate(ctx context.Context, o AllocateOptions) (*AllocateResult, error) {
	if o.Runs <= 0 {
		o.Runs = 50
	}
	if o.ColdRuns <= 0 {
		o.ColdRuns = 5
	}
	if o.YoungRuns <= 0 {
		o.YoungRuns = 20
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 4
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Settle = settleTime(o.Settle)
	dir, err := os.MkdirTemp("", "fusebox-bench-alloc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	alloc, err := runscalloc.New(runscalloc.Options{Runsc: o.Runsc, StateDir: dir, SandboxBinary: o.SandboxBinary})
	if err != nil {
		return nil, err
	}
	defer alloc.Runtime().ReleaseRoot()
	est := &switchable{n: 0}
	conns := &sfuse.Conns{}
	tr := &tracer{waitForLines: time.Second}
	var initializer manager.Initializer = conns.Initialize
	if o.Trace {
		initializer = tr.initializer(initializer)
	}
	m, err := manager.New(manager.Options{Allocator: alloc, Estimator: est, Clock: manager.RealClock{},
		Initializer: initializer, Prepare: conns.Prepare, Forget: conns.Forget, ReconcileInterval: 20 * time.Millisecond, CreateConcurrency: o.PoolSize,
		RefillDelay: manager.DefaultRefillDelay, WarmUp: manager.GVisorWarmUp, Ping: conns.Ping, PingInterval: o.PoolPing, Logger: o.Log})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	defer m.Close(context.WithoutCancel(ctx))
	mgr, stop, err := ServeManager(m, dir)
	if err != nil {
		return nil, err
	}
	defer stop()
	r := &AllocateResult{Runs: o.Runs, YoungRuns: o.YoungRuns, ColdRuns: o.ColdRuns, PoolSize: o.PoolSize, SettleMs: ms(o.Settle), PoolPingMs: ms(o.PoolPing),
		Note: "warm: the pool is full, has been idle for settle_ms, and its next unit is past gVisor's 1 s clock warm-up (young: it is not); each figure is Allocate over a kept gRPC connection to the manager (sFuse included) with a fresh agent key, then the first data-plane call (Stat) over a fresh pinned-TLS connection"}

	ready := func() int { return m.States().Counts("")[manager.Ready] }
	waitReady := func(n int) error {
		deadline := time.Now().Add(2 * time.Minute)
		for ready() < n {
			if time.Now().After(deadline) {
				return fmt.Errorf("pool did not reach %d ready units (%v)", n, m.Status().Units)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}
	// The agent's side, as in an agent's loop: one kept connection to the manager; each
	// allocation a fresh key, a fresh sandbox connection and its first call.
	agent, err := client.NewManager(mgr, nil)
	if err != nil {
		return nil, err
	}
	defer agent.Close()
	one := func(trace bool) (time.Duration, error) {
		var ct client.AllocateTrace
		ao := client.AllocateOptions{}
		if trace {
			ao.Trace = &ct
		}
		t0 := time.Now()
		a, err := agent.Allocate(ctx, ao)
		if err != nil {
			return 0, err
		}
		if _, err := a.Stat(ctx, ".", false); err != nil {
			a.Close()
			return 0, err
		}
		done := time.Now()
		if trace {
			tr.record(t0, done, ct, alloc.ServerLog(a.ID))
		}
		return done.Sub(t0), a.Close()
	}

	// Cold starts: the pool is empty and kept empty.
	o.Log.Info("cold starts", "runs", o.ColdRuns)
	var cold []float64
	for range o.ColdRuns {
		d, err := one(false)
		if err != nil {
			return nil, fmt.Errorf("cold allocation: %w", err)
		}
		cold = append(cold, ms(d))
		// Units the waiting allocation made beyond its own are trimmed by the reconciler.
		time.Sleep(100 * time.Millisecond)
	}
	r.ColdStartP50Ms = pct(cold, 50)

	// Refill: from empty to PoolSize ready.
	o.Log.Info("pool refill", "size", o.PoolSize)
	if err := waitZero(ready); err != nil {
		return nil, err
	}
	t0 := time.Now()
	est.set(o.PoolSize)
	if err := waitReady(o.PoolSize); err != nil {
		return nil, err
	}
	r.PoolRefillPerS = round(float64(o.PoolSize) / time.Since(t0).Seconds())

	quiet := func(minAge time.Duration) error {
		// Wait until the pool is full and no creation or destruction runs, then a little more
		// (settle) for the aftermath of the last one (the new sandbox's startup work, the
		// manager's connection to it): the figure is the allocation path itself, not a share of
		// a runsc create on a 2-core machine. Then until the next unit is minAge old.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			c := m.States().Counts("")
			if c[manager.Ready] >= est.get() && c[manager.Creating] == 0 && c[manager.Destroying] == 0 {
				time.Sleep(o.Settle)
				if wait := minAge - oldestReadyAge(m); wait > 0 {
					time.Sleep(wait)
				}
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool did not settle (%v)", m.Status().Units)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	measure := func(runs int, trace bool, before func() error) ([]float64, error) {
		var out []float64
		for range runs {
			if err := before(); err != nil {
				return nil, err
			}
			d, err := one(trace)
			if err != nil {
				return nil, fmt.Errorf("warm allocation: %w", err)
			}
			out = append(out, ms(d))
		}
		return out, nil
	}

	// Warm: the next unit (the oldest ready one) is past its warm-up, as in a pool sized for
	// its demand (the manager counts the warm-up in its provisioning latency).
	o.Log.Info("warm allocations", "runs", o.Runs)
	warm, err := measure(o.Runs, o.Trace, func() error { return quiet(manager.GVisorWarmUp + 50*time.Millisecond) })
	if err != nil {
		return nil, err
	}
	r.AllocateP50Ms, r.AllocateP99Ms = pct(warm, 50), pct(warm, 99)
	if o.Trace {
		if r.Steps, err = tr.steps(); err != nil {
			return nil, err
		}
	}

	// Young: a pool of one, its unit taken as soon as it is ready and settled.
	o.Log.Info("allocations of young units", "runs", o.YoungRuns)
	est.set(1)
	young, err := measure(o.YoungRuns, false, func() error { return quiet(0) })
	if err != nil {
		return nil, err
	}
	r.AllocateYoungP50Ms, r.AllocateYoungP99Ms = pct(young, 50), pct(young, 99)
	return r, nil
}

// oldestReadyAge is the age of the unit the next allocation takes (zero if none is ready).
func oldestReadyAge(m *manager.Manager) time.Duration {
	var oldest time.Time
	for _, u := range m.States().Snapshot() {
		if u.State == manager.Ready && (oldest.IsZero() || u.Info.Created.Before(oldest)) {
			oldest = u.Info.Created
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

// settleTime is how long a full pool idles before each measured allocation: d, 100 ms when
// d is 0, none when d is negative.
func settleTime(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return 100 * time.Millisecond
	case d < 0:
		return 0
	}
	return d
}

func waitZero(ready func() int) error {
	deadline := time.Now().Add(time.Minute)
	for ready() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("pool did not drain")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// switchable is a fixed estimator whose target the benchmark changes.
type switchable struct{ n int32 }

func (s *switchable) Name() string                     { return "bench" }
func (s *switchable) Target(estimator.Observation) int { return int(atomicLoad(&s.n)) }
func (s *switchable) set(n int)                        { atomicStore(&s.n, int32(n)) }
func (s *switchable) get() int                         { return int(atomicLoad(&s.n)) }

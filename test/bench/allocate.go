package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/runsc"
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
	// KeepAwake is runscalloc.Options.KeepAwake: without it no arm keeps its sandboxes awake.
	KeepAwake bool
	// Arms are the accelerator settings whose warm allocations are measured, interleaved
	// (default DefaultArms: all, then none); the first is the reference, on which the other
	// phases run.
	Arms []Arm
	// ArmSeed seeds the arms' order in each round (0: from the clock; the result says which).
	ArmSeed uint64
	// Image is runscalloc.Options.Image: the sandbox image as root (empty: a root
	// assembled from the host).
	Image string
	// Trace times each step of the warm allocations (AllocateResult.Steps).
	Trace bool
	// TraceCSV, with Trace, is a file to write each traced allocation's steps to (CSV).
	TraceCSV string
	// Sched records the kernel's context switches during the warm allocations and says who
	// had the CPUs during each (AllocateResult.Sched; root and tracefs).
	Sched bool
	// SchedCSV, with Sched, is a file to write each allocation's CPU time by class to (CSV).
	SchedCSV string
	// DemandRuns allocations arrive at DemandRate per second (0: half the measured refill
	// rate), each released after its first call, with the ewma estimator sizing the pool:
	// how many found no ready unit (default 100; negative: skip this phase).
	DemandRuns int
	DemandRate float64
	Log        *slog.Logger
}

// AllocateResult is the JSON `fusebox-bench allocate --json` prints.
type AllocateResult struct {
	Runs          int     `json:"runs"`
	AllocateP50Ms float64 `json:"allocate_p50_ms"`
	// AllocateP90Ms and AllocateP95Ms: over a hundred runs the p99 is the second slowest
	// allocation; these move less from run to run.
	AllocateP90Ms float64 `json:"allocate_p90_ms"`
	AllocateP95Ms float64 `json:"allocate_p95_ms"`
	AllocateP99Ms float64 `json:"allocate_p99_ms"`
	// Young: the same from a pool of one unit, taken as soon as it is ready and idle for
	// settle_ms, before gVisor's clock calibration (see runscalloc.GVisorWarmUp).
	YoungRuns          int     `json:"young_runs"`
	AllocateYoungP50Ms float64 `json:"allocate_young_p50_ms"`
	AllocateYoungP99Ms float64 `json:"allocate_young_p99_ms"`
	ColdStartP50Ms     float64 `json:"cold_start_p50_ms"`
	ColdRuns           int     `json:"cold_runs"`
	PoolRefillPerS     float64 `json:"pool_refill_per_s"`
	PoolSize           int     `json:"pool_size"`
	SettleMs           float64 `json:"settle_ms"`
	PoolPingMs         float64 `json:"pool_ping_ms"`
	KeepAwake          bool    `json:"keep_sandboxes_awake"`
	Note               string  `json:"note"`
	// Steady demand: DemandRuns allocations at DemandPerS, the ewma estimator sizing the
	// pool; DemandColdWaits of them found no ready unit (the target is none).
	DemandRuns          int     `json:"demand_runs"`
	DemandPerS          float64 `json:"demand_per_s"`
	DemandColdWaits     uint64  `json:"demand_cold_waits"`
	DemandP50Ms         float64 `json:"demand_p50_ms"`
	DemandP99Ms         float64 `json:"demand_p99_ms"`
	DemandPoolTargetMax int     `json:"demand_pool_target_max"`
	// Steps is where the warm allocations' time goes (with Trace; the first arm's).
	Steps *Steps `json:"steps,omitempty"`
	// Sched is who had the CPUs during the warm allocations (with Sched; the first arm's).
	Sched *Sched `json:"sched,omitempty"`
	// FastPath is every arm's warm allocations, measured interleaved, and each against the
	// first arm's (those the warm figures above are).
	FastPath *FastPathResult `json:"fast_path"`
}

// Allocate measures allocation against real managers with the runsc allocator: warm
// allocations (a ready unit waiting; Allocate over gRPC, sFuse, the first data-plane call) in
// each of o.Arms, interleaved, cold starts (an empty pool), how fast the pool refills, young
// units and a steady demand, those on the first arm.
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
	if o.DemandRuns == 0 {
		o.DemandRuns = 100
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if len(o.Arms) == 0 {
		var err error
		if o.Arms, err = ParseArms(DefaultArms); err != nil {
			return nil, err
		}
	}
	if o.ArmSeed == 0 {
		o.ArmSeed = uint64(time.Now().UnixNano())
	}
	o.Settle = settleTime(o.Settle)
	tr := &tracer{waitForLines: time.Second}
	var wrap func(manager.Initializer) manager.Initializer
	if o.Trace {
		wrap = tr.initializer
	}
	// The reference arm's pool serves every phase; the others', only the warm one.
	ref, err := startArmPool(ctx, o, o.Arms[0], wrap)
	if err != nil {
		return nil, err
	}
	defer ref.close(ctx)
	r := &AllocateResult{Runs: o.Runs, YoungRuns: o.YoungRuns, ColdRuns: o.ColdRuns, PoolSize: o.PoolSize, SettleMs: ms(o.Settle), PoolPingMs: ms(o.PoolPing), KeepAwake: o.KeepAwake,
		Note: "warm: the pool is full, has been idle for settle_ms, and its next unit is 1.2 s past its creation's start, so past gVisor's clock warm-up (young: it is not); each figure is Allocate over a kept gRPC connection to the manager (sFuse included) with a fresh agent key, then the first data-plane call (Stat) over a fresh pinned-TLS connection; the warm, young, cold and demand figures are the first fast-path arm's (fast_path.arms[0]), the warm ones measured interleaved with the other arms'"}

	var marks *schedMarks // set during the warm allocations, with o.Sched
	// one makes one measured allocation from p (each a fresh key, a fresh sandbox connection and
	// its first call), with the tracer's hooks if trace; it returns its time.
	one := func(p *armPool, trace bool, marks *schedMarks) (time.Duration, error) {
		var am agentMarks
		var connected atomic.Int64 // set on the connection's dialer
		var ao client.AllocateOptions
		if trace {
			ao.Trace = &client.AllocateTrace{
				Answered:  func(at time.Time) { am.answered = at },
				Connected: func(at time.Time) { connected.Store(at.UnixNano()) },
			}
		}
		a, t0, done, err := timedAllocation(ctx, p.agent, ao, marks)
		if err != nil {
			return 0, err
		}
		if trace {
			if ns := connected.Load(); ns != 0 {
				am.connected = time.Unix(0, ns)
			}
			tr.record(t0, done, am, p.alloc.ServerLog(a.ID))
		}
		return done.Sub(t0), a.Close()
	}

	// Cold starts: the pool is empty and kept empty.
	o.Log.Info("cold starts", "runs", o.ColdRuns)
	var cold []float64
	for range o.ColdRuns {
		d, err := one(ref, false, nil)
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
	if err := waitZero(ref.ready); err != nil {
		return nil, err
	}
	t0 := time.Now()
	ref.est.set(o.PoolSize)
	if err := waitReady(ref, o.PoolSize); err != nil {
		return nil, err
	}
	r.PoolRefillPerS = round(float64(o.PoolSize) / time.Since(t0).Seconds())

	// Warm, interleaved: every arm's pool full, and before each allocation the next unit of its
	// arm (the oldest ready one) past its warm-up, as in a pool sized for its demand (the
	// manager counts the warm-up in its provisioning latency).
	pools := []*armPool{ref}
	for _, arm := range o.Arms[1:] {
		p, err := startArmPool(ctx, o, arm, nil)
		if err != nil {
			return nil, err
		}
		defer p.close(ctx)
		p.est.set(o.PoolSize)
		pools = append(pools, p)
	}
	o.Log.Info("warm allocations", "runs", o.Runs, "arms", len(pools), "seed", o.ArmSeed)
	if o.Sched {
		if marks, err = startSched(); err != nil {
			return nil, err
		}
	}
	order := interleave(len(pools), o.Runs, rand.New(rand.NewPCG(o.ArmSeed, 0)))
	samples, err := runArms(order, len(pools), func(i int) error {
		if err := marks.drain(); err != nil {
			return err
		}
		return quiet(pools, pools[i], o.Settle, warmAge)
	}, func(i int) (time.Duration, error) {
		if i == 0 { // the reference arm: traced, and the scheduler's marks are its alone
			return one(ref, o.Trace, marks)
		}
		return one(pools[i], false, nil)
	})
	if err != nil && len(samples) < len(order) {
		err = fmt.Errorf("warm allocation (arm %s): %w", pools[order[len(samples)]].arm.Name, err)
	}
	warm := armTimes(samples, 0)
	if marks != nil {
		r.Sched, err = marks.finish(warm, err, o.SchedCSV)
		marks = nil
	}
	if err != nil {
		return nil, err
	}
	for _, p := range pools[1:] {
		p.close(ctx) // the other phases have the machine to the reference arm's pool
	}
	effective := make([]string, len(pools))
	for i, p := range pools {
		effective[i] = p.fast.String()
	}
	r.FastPath = &FastPathResult{Rounds: o.Runs, Seed: o.ArmSeed, Arms: summarizeArms(o.Arms, effective, samples),
		Note: "each arm is a manager with a pool of its own in this process, its sandboxes made with the arm's accelerators and its agent's side switched alike (client.FastPath); in each round every arm makes one warm allocation, in an order shuffled afresh, after every arm's pool has been full and idle for settle_ms; relayed counts the allocations the client's trace hooks saw use the relay; vs_reference is against the first arm (positive: slower)"}
	r.AllocateP50Ms, r.AllocateP90Ms, r.AllocateP95Ms, r.AllocateP99Ms = pct(warm, 50), pct(warm, 90), pct(warm, 95), pct(warm, 99)
	if o.Trace {
		if r.Steps, err = tr.steps(); err != nil {
			return nil, err
		}
		if o.TraceCSV != "" {
			if err := writeFile(o.TraceCSV, tr.writeCSV); err != nil {
				return nil, fmt.Errorf("writing the trace: %w", err)
			}
		}
	}

	// Young: a pool of one, its unit taken as soon as it is ready and settled.
	o.Log.Info("allocations of young units", "runs", o.YoungRuns)
	ref.est.set(1)
	var young []float64
	for range o.YoungRuns {
		if err := quiet(pools[:1], ref, o.Settle, 0); err != nil {
			return nil, err
		}
		d, err := one(ref, false, nil)
		if err != nil {
			return nil, fmt.Errorf("young allocation: %w", err)
		}
		young = append(young, ms(d))
	}
	r.AllocateYoungP50Ms, r.AllocateYoungP99Ms = pct(young, 50), pct(young, 99)

	if o.DemandRuns > 0 {
		rate := o.DemandRate
		if rate <= 0 {
			rate = r.PoolRefillPerS / 2
		}
		o.Log.Info("steady demand", "runs", o.DemandRuns, "per_s", rate)
		oneRef := func(trace bool) (time.Duration, error) { return one(ref, trace, nil) }
		if err := demand(ctx, ref.m, ref.est, oneRef, o.DemandRuns, rate, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// waitReady waits until p's pool holds n ready units.
func waitReady(p *armPool, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for p.ready() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("pool did not reach %d ready units (%v)", n, p.m.Status().Units)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// demand runs the steady-demand phase: runs allocations arriving every 1/rate seconds, each
// released after its first call, with the ewma estimator (as fusebox local up --estimator
// ewma) sizing the pool from its two-unit floor.
func demand(ctx context.Context, m *manager.Manager, est *switchable, one func(bool) (time.Duration, error), runs int, rate float64, r *AllocateResult) error {
	ewma, err := estimator.New("ewma", 2, 64)
	if err != nil {
		return err
	}
	est.use(ewma)
	defer est.use(nil)
	deadline := time.Now().Add(2 * time.Minute)
	for m.States().Counts("")[manager.Ready] < 2 {
		if time.Now().After(deadline) {
			return fmt.Errorf("demand: the pool did not reach two ready units (%v)", m.Status().Units)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(runscalloc.GVisorWarmUp)
	before := m.Status().ColdWaits
	var (
		mu    sync.Mutex
		took  []float64
		errs  []error
		wg    sync.WaitGroup
		every = time.Duration(float64(time.Second) / rate)
		tick  = time.NewTicker(every)
	)
	defer tick.Stop()
	start := time.Now()
	for i := range runs {
		if i > 0 {
			<-tick.C
		}
		if t := m.Status().Target; t > r.DemandPoolTargetMax {
			r.DemandPoolTargetMax = t
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := one(false)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			took = append(took, ms(d))
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("demand: %d of %d allocations failed, the first: %w", len(errs), runs, errs[0])
	}
	r.DemandRuns, r.DemandPerS = runs, round(float64(runs-1)/time.Since(start).Seconds())
	r.DemandColdWaits = m.Status().ColdWaits - before
	r.DemandP50Ms, r.DemandP99Ms = pct(took, 50), pct(took, 99)
	return nil
}

// removeContainers kills and deletes every container left under rt's root.
func removeContainers(rt *runsc.Runtime, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	states, err := rt.List(ctx)
	if err != nil {
		log.Error("listing leftover containers", "err", err)
		return
	}
	for _, st := range states {
		log.Warn("removing a leftover container", "id", st.ID, "status", st.Status)
		if err := rt.Remove(ctx, st.ID); err != nil {
			log.Error("deleting a leftover container", "id", st.ID, "err", err)
		}
	}
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

// timedAllocation makes one measured allocation through agent: Allocate (sFuse included), then
// the first data-plane call (Stat), between marks. It returns the allocation, still held for
// the caller to release, and when it began and when the call returned; on an error nothing is
// held.
func timedAllocation(ctx context.Context, agent *client.Manager, ao client.AllocateOptions, marks *schedMarks) (*client.Allocation, time.Time, time.Time, error) {
	marks.start()
	t0 := time.Now()
	a, err := agent.Allocate(ctx, ao)
	if err != nil {
		return nil, t0, t0, err
	}
	if _, err := a.Stat(ctx, ".", false); err != nil {
		a.Close()
		return nil, t0, t0, fmt.Errorf("first call on %s: %w", a.ID, err)
	}
	done := time.Now()
	marks.end()
	return a, t0, done, nil
}

// warmAge is how old, from its creation's start (UnitInfo.Created), a unit must be to count as
// warm: its sandbox boots some 50-100 ms into the creation and calibrates its clock a second
// later (runscalloc.GVisorWarmUp). Measured against fusebox local up (bench allocate --manager,
// 30 allocations each, 2026-12-01): units 1.0 s old gave p50 4.76 and 6.33 ms, 1.05 s 3.77,
// 1.1 s 3.81 and 4.11, 1.2 s 4.25 ms.
const warmAge = runscalloc.GVisorWarmUp + 200*time.Millisecond

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

// switchable is a fixed estimator whose target the benchmark changes, or another estimator it
// hands over to.
type switchable struct {
	n     atomic.Int32
	other atomic.Pointer[estimatorBox]
}

type estimatorBox struct{ estimator.Estimator }

func (s *switchable) Name() string { return "bench" }
func (s *switchable) Target(o estimator.Observation) int {
	if e := s.other.Load(); e != nil {
		return e.Target(o)
	}
	return int(s.n.Load())
}
func (s *switchable) set(n int) { s.n.Store(int32(n)) }
func (s *switchable) get() int  { return int(s.n.Load()) }

// use hands the target over to e (nil: back to the fixed one).
func (s *switchable) use(e estimator.Estimator) {
	if e == nil {
		s.other.Store(nil)
		return
	}
	s.other.Store(&estimatorBox{e})
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

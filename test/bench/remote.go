package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/manager"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// RemoteOptions configure warm allocations against a running manager (fusebox local up, or a
// cluster's manager), as an agent beside it sees them.
type RemoteOptions struct {
	// Manager is the manager's address (unix:///path or tcp://host:port); ManagerOptions
	// secure the connection to it as an agent's (a tcp:// manager: client.WithCAFile and
	// client.WithTokenFile; a unix socket needs none).
	Manager        string
	ManagerOptions []client.ManagerOption
	Runs           int
	// Settle is how long the pool must have been full before each allocation (default 100
	// ms; negative: none).
	Settle time.Duration
	// Busy measures without waiting for the manager's creations and destructions to finish
	// (on a manager that others use too, they may never pause); the pool must still be full.
	Busy bool
	// Wait bounds each wait for a full pool (default 2 minutes).
	Wait time.Duration
	// Sched is AllocateOptions.Sched: who had this machine's CPUs during each allocation
	// (a manager on this machine shows as other fusebox processes).
	Sched bool
	// SchedCSV is AllocateOptions.SchedCSV.
	SchedCSV string
	Log      *slog.Logger
}

// RemoteResult is the JSON `fusebox-bench allocate --manager ADDR --json` prints.
type RemoteResult struct {
	Manager       string  `json:"manager"`
	Allocator     string  `json:"allocator"`
	Runs          int     `json:"runs"`
	AllocateP50Ms float64 `json:"allocate_p50_ms"`
	AllocateP90Ms float64 `json:"allocate_p90_ms"`
	AllocateP95Ms float64 `json:"allocate_p95_ms"`
	AllocateP99Ms float64 `json:"allocate_p99_ms"`
	// AnswerP50Ms and AnswerP99Ms time Allocate until the manager's answer (the caller's
	// authentication, the claim, the sandbox's egress and lease, sFuse); FirstCallP50Ms and
	// FirstCallP99Ms from the answer to the first data-plane call's end (the connection to
	// the sandbox and the call). Each percentile is over its own step, so the two do not add
	// up to the whole's.
	AnswerP50Ms    float64 `json:"answer_p50_ms"`
	AnswerP99Ms    float64 `json:"answer_p99_ms"`
	FirstCallP50Ms float64 `json:"first_call_p50_ms"`
	FirstCallP99Ms float64 `json:"first_call_p99_ms"`
	// The first call split further by client.AllocateTrace's hooks: ConnectP50Ms and
	// ConnectP99Ms from the answer until the data connection was dialed; ReplyP50Ms and
	// ReplyP99Ms from then until the call's end (the TLS handshake, gRPC's transport, the
	// call, the way back).
	ConnectP50Ms float64 `json:"first_call_connect_p50_ms"`
	ConnectP99Ms float64 `json:"first_call_connect_p99_ms"`
	ReplyP50Ms   float64 `json:"first_call_reply_p50_ms"`
	ReplyP99Ms   float64 `json:"first_call_reply_p99_ms"`
	// ColdWaits is how many allocations, this benchmark's or others', found no ready unit
	// while it ran (the manager's cold-wait count, before and after). Behind a Service with
	// several replicas the two counts may come from different replicas: then it says little.
	ColdWaits uint64  `json:"cold_waits"`
	SettleMs  float64 `json:"settle_ms"`
	Busy      bool    `json:"busy"`
	Note      string  `json:"note"`
	// Sched is who had the CPUs during the allocations (with RemoteOptions.Sched).
	Sched *Sched `json:"sched,omitempty"`
}

// ErrNotSettled is returned when the manager's pool did not fill within RemoteOptions.Wait.
var ErrNotSettled = errors.New("the manager's pool did not fill")

// AllocateRemote measures warm allocations against the manager at o.Manager: before each,
// it waits until the pool holds its target of ready units (and, unless o.Busy, nothing is
// being created or destroyed) for o.Settle, and until the unit to be taken (the oldest ready
// one) is past gVisor's clock warm-up (warmAge) by the manager's clock; then Allocate over one kept
// connection (sFuse included) with a fresh agent key, the first data-plane call (Stat), and
// the release. Every allocation is released, also on error.
func AllocateRemote(ctx context.Context, o RemoteOptions) (*RemoteResult, error) {
	if o.Runs <= 0 {
		return nil, errors.New("bench: RemoteOptions.Runs must be positive")
	}
	if o.Settle == 0 {
		o.Settle = 100 * time.Millisecond
	}
	if o.Wait <= 0 {
		o.Wait = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	addr, err := endpoint.Parse(o.Manager)
	if err != nil {
		return nil, fmt.Errorf("manager address: %w", err)
	}
	conn, err := client.DialManager(o.Manager, o.ManagerOptions...)
	if err != nil {
		return nil, fmt.Errorf("dialing manager %s: %w", addr, err)
	}
	defer conn.Close()
	mc := managerv1.NewManagerClient(conn)
	first, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("asking %s for its pool: %w", addr, err)
	}
	agent, err := client.NewManager(o.Manager, nil, o.ManagerOptions...)
	if err != nil {
		return nil, err
	}
	defer agent.Close()

	r := &RemoteResult{Manager: o.Manager, Allocator: first.GetAllocator(), Runs: o.Runs, SettleMs: ms(max(o.Settle, 0)), Busy: o.Busy,
		Note: "warm: the manager's pool is full (and, unless busy, creates and destroys nothing) for settle_ms and its oldest ready unit is 1.2 s past its creation's start by the manager's clock, so past gVisor's clock warm-up; each figure is Allocate over a kept gRPC connection to the manager (sFuse included) with a fresh agent key, then the first data-plane call (Stat) over a fresh pinned-TLS connection"}
	o.Log.Info("warm allocations against a running manager", "manager", o.Manager, "allocator", r.Allocator, "runs", o.Runs)
	var marks *schedMarks
	if o.Sched {
		if marks, err = startSched(); err != nil {
			return nil, err
		}
	}
	lat, split, err := allocateRemote(ctx, agent, mc, o, marks)
	if marks != nil {
		r.Sched, err = marks.finish(lat, err, o.SchedCSV)
	}
	if err != nil {
		return nil, err
	}
	last, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("asking %s for its pool: %w", addr, err)
	}
	r.ColdWaits = last.GetColdWaits() - first.GetColdWaits()
	r.AllocateP50Ms, r.AllocateP90Ms, r.AllocateP95Ms, r.AllocateP99Ms = pct(lat, 50), pct(lat, 90), pct(lat, 95), pct(lat, 99)
	if len(split.answer) > 0 {
		r.AnswerP50Ms, r.AnswerP99Ms = pct(split.answer, 50), pct(split.answer, 99)
		r.FirstCallP50Ms, r.FirstCallP99Ms = pct(split.first, 50), pct(split.first, 99)
	}
	if len(split.connect) > 0 {
		r.ConnectP50Ms, r.ConnectP99Ms = pct(split.connect, 50), pct(split.connect, 99)
		r.ReplyP50Ms, r.ReplyP99Ms = pct(split.reply, 50), pct(split.reply, 99)
	}
	return r, nil
}

// remoteSplit is where each allocation's time went (ms; see RemoteResult): answer and first
// for every allocation the manager answered, connect and reply for those whose data
// connection's time is known too.
type remoteSplit struct{ answer, first, connect, reply []float64 }

// callMarks are one allocation's times, set by client.AllocateTrace's hooks on the client's
// goroutines.
type callMarks struct {
	mu                  sync.Mutex
	answered, connected time.Time
}

func (c *callMarks) trace() *client.AllocateTrace {
	at := func(t *time.Time) func(time.Time) {
		return func(v time.Time) { c.mu.Lock(); *t = v; c.mu.Unlock() }
	}
	return &client.AllocateTrace{Answered: at(&c.answered), Connected: at(&c.connected)}
}

// add adds the allocation that started at t0 and whose first call ended at done to s.
func (c *callMarks) add(s *remoteSplit, t0, done time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered.IsZero() {
		return
	}
	s.answer, s.first = append(s.answer, ms(c.answered.Sub(t0))), append(s.first, ms(done.Sub(c.answered)))
	if !c.connected.IsZero() {
		s.connect, s.reply = append(s.connect, ms(c.connected.Sub(c.answered))), append(s.reply, ms(done.Sub(c.connected)))
	}
}

// allocateRemote makes the o.Runs measured allocations and returns their times (ms) and
// their split.
func allocateRemote(ctx context.Context, agent *client.Manager, mc managerv1.ManagerClient, o RemoteOptions, marks *schedMarks) (lat []float64, split remoteSplit, err error) {
	for i := range o.Runs {
		if err := marks.drain(); err != nil {
			return nil, split, err
		}
		if err := waitFull(ctx, mc, o); err != nil {
			return nil, split, err
		}
		var call callMarks
		ao := client.AllocateOptions{Labels: map[string]string{"via": "fusebox-bench"}, Trace: call.trace()}
		a, t0, done, err := timedAllocation(ctx, agent, ao, marks)
		if err != nil {
			return nil, split, fmt.Errorf("allocation %d: %w", i+1, err)
		}
		if err := a.Close(); err != nil {
			return nil, split, fmt.Errorf("allocation %d (%s): releasing: %w", i+1, a.ID, err)
		}
		lat = append(lat, ms(done.Sub(t0)))
		call.add(&split, t0, done)
	}
	return lat, split, nil
}

// waitFull returns once the manager's pool has been full (and quiet, unless o.Busy) for
// o.Settle and its oldest ready unit is past the warm-up.
func waitFull(ctx context.Context, mc managerv1.ManagerClient, o RemoteOptions) error {
	deadline := time.Now().Add(o.Wait)
	var since time.Time // when the pool was first seen full and quiet, this time round
	for {
		ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		if err != nil {
			return fmt.Errorf("asking for the pool: %w", err)
		}
		u := ps.GetUnits()
		full := u[manager.Ready.String()] >= max(ps.GetTarget(), 1) &&
			(o.Busy || u[manager.Creating.String()] == 0 && u[manager.Destroying.String()] == 0)
		if !full {
			since = time.Time{}
		} else {
			if since.IsZero() {
				since = time.Now()
			}
			if time.Since(since) >= o.Settle {
				return waitWarm(ctx, mc)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w in %v: target %d ready, units %v", ErrNotSettled, o.Wait, ps.GetTarget(), u)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(remotePoll):
		}
	}
}

// remotePoll is how often waitFull asks for the pool. Each answer is garbage in the agent's
// process: at 5 ms, over a refill of about a second per allocation, the polling made 38 % of
// this process's garbage (heap profile, 50 allocations) and so of its collections, some of
// which fall on a measured allocation.
const remotePoll = 20 * time.Millisecond

// waitWarm waits until the oldest ready unit, the one the next allocation takes, is warmAge
// old by the manager's clock (the local one may differ: a wait outside zero to warmAge is not
// made). A manager that lists a caller only its own sandboxes (an authenticated tcp:// one)
// shows no ready unit, and there is no wait.
func waitWarm(ctx context.Context, mc managerv1.ManagerClient) error {
	list, err := mc.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		return fmt.Errorf("listing units: %w", err)
	}
	var oldest time.Time
	for _, s := range list.GetSandboxes() {
		if s.GetState() == managerv1.UnitState_UNIT_STATE_READY && s.GetCreated() != nil {
			if c := s.GetCreated().AsTime(); oldest.IsZero() || c.Before(oldest) {
				oldest = c
			}
		}
	}
	if oldest.IsZero() {
		return nil
	}
	wait := warmAge - time.Since(oldest)
	if wait <= 0 || wait > warmAge {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
		return nil
	}
}

package bench

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// ManagerLevel is the manager benchmark's result at one concurrency.
type ManagerLevel struct {
	Clients         int     `json:"clients"`
	Allocations     int     `json:"allocations"`
	AllocationsPerS float64 `json:"allocations_per_s"`
	AllocateP50Ms   float64 `json:"allocate_p50_ms"`
	AllocateP99Ms   float64 `json:"allocate_p99_ms"`
}

// OpenLoop is the manager benchmark's result at a fixed offered rate.
type OpenLoop struct {
	RatePerS        int     `json:"offered_per_s"`
	AllocationsPerS float64 `json:"allocations_per_s"`
	AllocateP50Ms   float64 `json:"allocate_p50_ms"`
	AllocateP99Ms   float64 `json:"allocate_p99_ms"`
}

// ManagerResult is the JSON `fusebox-bench manager --json` prints.
type ManagerResult struct {
	Levels   []ManagerLevel `json:"levels"`
	OpenLoop *OpenLoop      `json:"open_loop,omitempty"`
	Note     string         `json:"note"`
}

// Manager measures the control plane alone: a real Manager served over gRPC on a unix socket,
// with the in-memory allocator (instant units, an in-memory sFuse that generates the sandbox
// key). Each client allocates and releases in a loop for d.
func Manager(ctx context.Context, clients []int, rate int, d time.Duration) (*ManagerResult, error) {
	dir, err := os.MkdirTemp("", "fusebox-bench-mgr-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	alloc := memalloc.New()
	alloc.NoRecord = true
	m, err := manager.New(manager.Options{Allocator: alloc, Estimator: estimator.Fixed{N: 512}, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, ReconcileInterval: 5 * time.Millisecond, CreateConcurrency: 512})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	defer m.Close(context.WithoutCancel(ctx))
	addr, stop, err := ServeManager(m, dir)
	if err != nil {
		return nil, err
	}
	defer stop()
	key, err := client.NewKey()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	mc := managerv1.NewManagerClient(conn)
	res := &ManagerResult{Note: "in-memory allocator; gRPC over a unix socket; each op is Allocate (timed) then Release"}
	for _, n := range clients {
		deadline := time.Now().Add(2 * time.Second)
		for m.States().Counts("")[manager.Ready] < 512 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		var mu sync.Mutex
		var lat []float64
		var firstErr error
		var wg sync.WaitGroup
		start := time.Now()
		end := start.Add(d)
		for range n {
			wg.Go(func() {
				var mine []float64
				for time.Now().Before(end) {
					t0 := time.Now()
					r, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey()})
					took := time.Since(t0)
					if err == nil {
						_, err = mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: r.SandboxId, LeaseToken: r.LeaseToken})
					}
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					mine = append(mine, ms(took))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		if firstErr != nil {
			return nil, fmt.Errorf("%d clients: %w", n, firstErr)
		}
		el := time.Since(start)
		res.Levels = append(res.Levels, ManagerLevel{Clients: n, Allocations: len(lat),
			AllocationsPerS: round(float64(len(lat)) / el.Seconds()), AllocateP50Ms: pct(lat, 50), AllocateP99Ms: pct(lat, 99)})
	}
	if rate > 0 {
		// Open loop: requests arrive at a fixed rate whatever the latency, as agents do.
		var mu sync.Mutex
		var lat []float64
		var firstErr error
		var wg sync.WaitGroup
		start := time.Now()
		interval := time.Second / time.Duration(rate)
		for i := 0; ; i++ {
			next := start.Add(time.Duration(i) * interval)
			if next.Sub(start) >= d {
				break
			}
			time.Sleep(time.Until(next))
			wg.Go(func() {
				t0 := time.Now()
				r, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey()})
				took := time.Since(t0)
				if err == nil {
					_, err = mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: r.SandboxId, LeaseToken: r.LeaseToken})
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				lat = append(lat, ms(took))
			})
		}
		wg.Wait()
		if firstErr != nil {
			return nil, fmt.Errorf("open loop at %d/s: %w", rate, firstErr)
		}
		res.OpenLoop = &OpenLoop{RatePerS: rate, AllocationsPerS: round(float64(len(lat)) / time.Since(start).Seconds()),
			AllocateP50Ms: pct(lat, 50), AllocateP99Ms: pct(lat, 99)}
	}
	return res, nil
}

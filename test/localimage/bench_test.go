package localimage

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	"github.com/fusebox-dev/fusebox/test/bench"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// BenchmarkColdStart times the runsc allocator's Create of one sandbox (bundle, runsc create
// and start, the server's init socket answering: what a pool unit costs before it is Ready), with the sandbox image as root against a root
// assembled from the host. The unpack of the image happens once, before the timer starts.
// Each iteration's Destroy is outside the timer. Run it short on a shared machine:
//
//	go test -run '^$' -bench ColdStart -benchtime 10x ./test/localimage
func BenchmarkColdStart(b *testing.B) {
	for _, variant := range []string{"host", "image"} {
		b.Run(variant, func(b *testing.B) {
			o := runscalloc.Options{Runsc: runsctest.Binary(b), StateDir: b.TempDir(), IdleTTL: time.Hour}
			if variant == "image" {
				o.Image = sandboxLayout(b)
			} else {
				o.SandboxBinary = sandboxtest.SandboxBinary(b)
			}
			a, err := runscalloc.New(o)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Shutdown(context.Background())
			ctx := context.Background()
			var took []time.Duration
			b.ResetTimer()
			for i := range b.N {
				id := runsc.ID("cold", uint64(i+1))
				start := time.Now()
				if _, err := a.Create(ctx, id, manager.DefaultTemplate); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				b.StopTimer()
				if err := a.Destroy(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "max-ms")
		})
	}
}

// BenchmarkAllocate runs the warm-allocation benchmark of fusebox bench allocate
// (test/bench.Allocate: a manager in this process on the runsc allocator, the pool full and
// idle before each allocation, Allocate then the first data-plane call) once per b.N with
// the sandbox image as root and with the host-derived root, and prints its JSON. Keep it to
// one iteration each on a shared machine:
//
//	go test -run '^$' -bench Allocate -benchtime 1x ./test/localimage
func BenchmarkAllocate(b *testing.B) {
	for _, variant := range []string{"host", "image"} {
		b.Run(variant, func(b *testing.B) {
			o := bench.AllocateOptions{Runsc: runsctest.Binary(b), SandboxBinary: sandboxtest.SandboxBinary(b),
				Runs: 100, ColdRuns: 5, YoungRuns: 5, DemandRuns: -1, KeepAwake: true, PoolPing: time.Second}
			if variant == "image" {
				o.Image = sandboxLayout(b)
			}
			for range b.N {
				r, err := bench.Allocate(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				out, _ := json.Marshal(r)
				b.Logf("%s: %s", variant, out)
				b.ReportMetric(r.AllocateP50Ms, "p50-ms")
				b.ReportMetric(r.AllocateP99Ms, "p99-ms")
				b.ReportMetric(r.ColdStartP50Ms, "cold-p50-ms")
			}
		})
	}
}

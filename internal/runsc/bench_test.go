package runsc_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
)

// reportPercentiles reports the p50 and p90 of d in milliseconds.
func reportPercentiles(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	ms := func(q float64) float64 {
		return float64(d[int(q*float64(len(d)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.9), "p90-ms")
}

// BenchmarkLifecycle measures the runsc calls the allocator makes per
// sandbox. Run with -benchtime=20x: each iteration starts a sandbox.
func BenchmarkLifecycle(b *testing.B) {
	rt := runsctest.Runtime(b)
	// One sanitised /etc for all bundles, as the allocator does.
	etc := filepath.Join(b.TempDir(), "etc")
	if err := runsc.WriteSanitizedEtc(etc); err != nil {
		b.Fatal(err)
	}
	var n uint64
	bundle := func(b *testing.B) (string, string) {
		n++
		dir := filepath.Join(b.TempDir(), fmt.Sprint(n))
		err := runsc.WriteBundle(runsc.BundleSpec{
			Dir: dir, EtcDir: etc, Args: []string{"/bin/sleep", "3600"},
			MemoryLimitBytes: 512 << 20, CPUQuota: 1, PidsLimit: 256,
		})
		if err != nil {
			b.Fatal(err)
		}
		return runsc.ID("bench", n), dir
	}
	ctx := context.Background()
	// running creates and starts a sandbox and returns its id.
	running := func(b *testing.B) string {
		id, dir := bundle(b)
		if err := rt.Create(ctx, id, dir); err != nil {
			b.Fatal(err)
		}
		if err := rt.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		return id
	}

	// From Create to Start returning (status running).
	b.Run("CreateStart", func(b *testing.B) {
		var d []time.Duration
		for range b.N {
			b.StopTimer()
			id, dir := bundle(b)
			b.StartTimer()
			t0 := time.Now()
			if err := rt.Create(ctx, id, dir); err != nil {
				b.Fatal(err)
			}
			if err := rt.Start(ctx, id); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
			b.StopTimer()
			if err := rt.Delete(ctx, id, true); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		reportPercentiles(b, d)
	})

	// `runsc exec ID true` in a running sandbox: the baseline the data
	// plane's command execution is compared with.
	b.Run("ExecTrue", func(b *testing.B) {
		id := running(b)
		b.Cleanup(func() { runsctest.Remove(b, rt, id) })
		b.ResetTimer()
		var d []time.Duration
		for range b.N {
			t0 := time.Now()
			code, err := rt.Exec(ctx, id, []string{"true"}, nil, nil)
			if err != nil || code != 0 {
				b.Fatalf("exec true = %d, %v", code, err)
			}
			d = append(d, time.Since(t0))
		}
		reportPercentiles(b, d)
	})

	// Forced delete of a running sandbox.
	b.Run("Delete", func(b *testing.B) {
		var d []time.Duration
		for range b.N {
			b.StopTimer()
			id := running(b)
			b.StartTimer()
			t0 := time.Now()
			if err := rt.Delete(ctx, id, true); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
		}
		reportPercentiles(b, d)
	})

	// Kill of the init process until runsc reports it stopped. runsc
	// reports "running" until the sandbox process has been reaped, which is
	// done by whichever process it was reparented to (the nearest child
	// subreaper, else pid 1): this measures that reaper as much as gVisor.
	b.Run("KillToStopped", func(b *testing.B) {
		var d []time.Duration
		for range b.N {
			b.StopTimer()
			id := running(b)
			b.StartTimer()
			t0 := time.Now()
			if err := rt.Kill(ctx, id, syscall.SIGKILL, false); err != nil {
				b.Fatal(err)
			}
			for {
				st, err := rt.State(ctx, id)
				if err != nil {
					b.Fatal(err)
				}
				if st.Status == runsc.StatusStopped {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			d = append(d, time.Since(t0))
			b.StopTimer()
			if err := rt.Delete(ctx, id, true); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		reportPercentiles(b, d)
	})
}

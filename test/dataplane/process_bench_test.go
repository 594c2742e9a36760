package dataplane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// p50ms is the median of d, in milliseconds; it sorts d.
func p50ms(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// execTrue runs `true` in c as a one-shot command: the round trip the process benchmarks are
// measured against.
func execTrue(b *testing.B, ctx context.Context, c *client.Sandbox) {
	if res, err := c.Run(ctx, "true"); err != nil || res.ExitCode != 0 {
		b.Fatalf("true: %+v, %v", res, err)
	}
}

// BenchmarkProcessStart times, in turns, a StartProcess of `true` (until it returns the
// process's id: the process runs) and an exec round trip of `true`; it reports both medians
// and their ratio (start/exec). The started process's exit is waited for outside the timings,
// so that it does not run beside the exec timed next.
func BenchmarkProcessStart(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	c := sb.Client
	ctx := context.Background()
	start := func() *client.Process {
		p, err := c.StartProcess(ctx, client.ProcessSpec{Argv: []string{"true"}})
		if err != nil || p.ID() == "" {
			b.Fatalf("StartProcess: %v", err)
		}
		return p
	}
	wait := func(p *client.Process) {
		if info, err := p.Wait(ctx, 0); err != nil || info.Running || info.ExitCode != 0 {
			b.Fatalf("waiting for true: %+v, %v", info, err)
		}
	}
	for range 20 {
		wait(start())
		execTrue(b, ctx, c)
	}
	var startT, execT []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		p := start()
		startT = append(startT, time.Since(t0))
		b.StopTimer()
		wait(p)
		b.StartTimer()
		t0 = time.Now()
		execTrue(b, ctx, c)
		execT = append(execT, time.Since(t0))
	}
	s, e := p50ms(startT), p50ms(execT)
	b.ReportMetric(s, "start-p50-ms")
	b.ReportMetric(e, "exec-p50-ms")
	b.ReportMetric(s/e, "start/exec")
}

// BenchmarkProcessAttachFirstByte times, in turns, an Attach from offset 0 to a running
// process that has written output, until its first byte arrives, and an exec round trip of
// `true`; it reports both medians and their ratio (attach/exec).
func BenchmarkProcessAttachFirstByte(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	c := sb.Client
	ctx := context.Background()
	p, err := c.StartProcess(ctx, client.ProcessSpec{Script: "echo ready; exec sleep 100000"})
	if err != nil {
		b.Fatal(err)
	}
	firstByte := func() {
		o, err := p.Attach(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer o.Close()
		for {
			ev, err := o.Recv()
			if err != nil {
				b.Fatalf("attach: %v", err)
			}
			if ev.Exit != nil {
				b.Fatalf("the process exited: %+v", ev.Exit)
			}
			if len(ev.Data) > 0 {
				return
			}
		}
	}
	for range 20 {
		firstByte()
		execTrue(b, ctx, c)
	}
	var attachT, execT []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		firstByte()
		attachT = append(attachT, time.Since(t0))
		t0 = time.Now()
		execTrue(b, ctx, c)
		execT = append(execT, time.Since(t0))
	}
	a, e := p50ms(attachT), p50ms(execT)
	b.ReportMetric(a, "attach-p50-ms")
	b.ReportMetric(e, "exec-p50-ms")
	b.ReportMetric(a/e, "attach/exec")
	if err := p.Signal(ctx, 9, true); err != nil {
		b.Fatal(err)
	}
}

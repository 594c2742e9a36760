package dataplane

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// BenchmarkExecTrue measures the round trip of `true` and reports the part of it spent outside
// the process itself (fusebox's overhead).
func BenchmarkExecTrue(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	ctx := context.Background()
	for range 20 {
		sb.Client.Run(ctx, "true")
	}
	var proc time.Duration
	b.ResetTimer()
	for b.Loop() {
		res, err := sb.Client.Run(ctx, "true")
		if err != nil {
			b.Fatal(err)
		}
		proc += res.Duration
	}
	b.ReportMetric(float64(proc.Microseconds())/float64(b.N)/1000, "proc-ms/op")
	b.ReportMetric((float64(b.Elapsed().Microseconds())-float64(proc.Microseconds()))/float64(b.N)/1000, "overhead-ms/op")
}

// BenchmarkStat measures the round trip of the cheapest data-plane call.
func BenchmarkStat(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	ctx := context.Background()
	for range 20 {
		sb.Client.Stat(ctx, ".", false)
	}
	for b.Loop() {
		if _, err := sb.Client.Stat(ctx, ".", false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStatAfterIdle measures a Stat on a warm connection after the sandbox sat idle for
// 300 ms, as a pool unit does before its agent's first call.
func BenchmarkStatAfterIdle(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	ctx := context.Background()
	for range 20 {
		sb.Client.Stat(ctx, ".", false)
	}
	var total time.Duration
	for b.Loop() {
		time.Sleep(300 * time.Millisecond)
		t0 := time.Now()
		if _, err := sb.Client.Stat(ctx, ".", false); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "rpc-us/op")
}

func BenchmarkReadStreamSmall(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	ctx := context.Background()
	sb.Client.WriteFile(ctx, "small", []byte("hi"), 0o644)
	for b.Loop() {
		if _, err := sb.Client.ReadFile(ctx, "small"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamWrite64MiB streams one 64 MiB file and reports MiB/s.
func BenchmarkStreamWrite64MiB(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	ctx := context.Background()
	data := make([]byte, 64<<20)
	for i := range data {
		data[i] = byte(i)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := sb.Client.WriteFileFrom(ctx, "big", 0o644, bytes.NewReader(data), int64(len(data))); err != nil {
			b.Fatal(err)
		}
	}
}

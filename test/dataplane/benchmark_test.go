package dataplane

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/test/bench"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// TestDataplaneBenchmarkRuns runs fusebox-bench dataplane's measurement small (few round
// trips, a 4 MiB stream) under gVisor: every workload runs and verifies end to end, the
// streams over bulk connections and over the gRPC streams, and the floors with and without
// the file, and each figure says what it measured. The figures themselves are not judged here
// (benchmarks are run by hand, on a quiet machine).
func TestDataplaneBenchmarkRuns(t *testing.T) {
	runscBin := runsctest.Binary(t)
	floorBin := sandboxtest.StaticBinary(t, "fusebox-floor")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := bench.Dataplane(ctx, bench.DataplaneOptions{Runsc: runscBin, SandboxBinary: sandboxtest.SandboxBinary(t),
		FloorBinary: floorBin, ExecRuns: 5, BaselineRuns: 1, ShellFiles: 2, StreamMiB: 4, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]bench.Figure{"stream_write": r.StreamWrite, "stream_read": r.StreamRead,
		"stream_write_grpc": r.StreamWriteGRPC, "stream_read_grpc": r.StreamReadGRPC,
		"stream_floor_in": r.StreamFloorIn, "stream_floor_out": r.StreamFloorOut,
		"stream_floor_in_file": r.StreamFloorInFile, "stream_floor_out_file": r.StreamFloorOutFile} {
		if f.MiBPerS <= 0 || f.FileBytes != 4<<20 || f.Data != "random" || f.Client == "" {
			t.Errorf("%s = %+v: want a throughput of the 4 MiB random file and its client", name, f)
		}
	}
	if !r.StreamRead.Verified || !r.StreamReadGRPC.Verified {
		t.Error("the streams read back are not marked verified")
	}
	if r.Materialize.RPCs != 4 || r.Materialize.Seconds <= 0 || r.Read.Seconds <= 0 || !r.Read.Verified {
		t.Errorf("small files: write %+v, read %+v; want 4 RPCs and a verified read", r.Materialize, r.Read)
	}
	if r.MaterializeFloor.Seconds <= 0 || r.ReadFloor.Seconds <= 0 || r.ExecRoundtripP50Ms <= 0 {
		t.Errorf("floors %v / %v s, exec p50 %v ms: want all measured", r.MaterializeFloor.Seconds, r.ReadFloor.Seconds, r.ExecRoundtripP50Ms)
	}
}

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/bench/floor"
)

// SDKOptions configure the SDK benchmark: the Go SDK, with its default options, against one
// sandbox allocated from a running manager, as an agent sees it.
type SDKOptions struct {
	// Manager is the manager's address; ManagerOptions secure the connection to it (see
	// RemoteOptions).
	Manager        string
	ManagerOptions []client.ManagerOption
	ExecRuns       int // round trips of `true` (default 300)
	StreamMiB      int // size of the streamed file (default 256)
	Log            *slog.Logger
}

// SDKResult is the JSON `fusebox-bench sdk --json` prints. Its workloads are the data-plane
// benchmark's (DataplaneResult), in a sandbox the manager allocated (its template, limits and
// image), so that another SDK measured against the same manager compares like with like.
type SDKResult struct {
	Manager            string  `json:"manager"`
	ExecRuns           int     `json:"exec_runs"`
	ExecRoundtripP50Ms float64 `json:"exec_roundtrip_p50_ms"`
	ExecRoundtripP99Ms float64 `json:"exec_roundtrip_p99_ms"`
	ExecProcessP50Ms   float64 `json:"exec_process_p50_ms"`
	Materialize        Figure  `json:"materialize"`
	Read               Figure  `json:"read"`
	// StreamRead is ReadFileTo of one file of StreamMiB random bytes (written first with
	// WriteFileFrom), compared as it arrives: the median of streamRounds.
	StreamRead Figure `json:"stream_read"`
}

// SDK allocates one sandbox from o.Manager and measures, over one pinned connection with the
// client's defaults: exec round trips of `true`, then the small-file workload (3,000 random
// files of 4 KiB in floor.Dirs directories) written with WriteFiles and read back through
// the plan with every byte compared, each the median of five rounds into fresh roots, and one
// large file streamed out, compared as it arrives. The sandbox is released, also on error.
func SDK(ctx context.Context, o SDKOptions) (_ *SDKResult, err error) {
	if o.ExecRuns <= 0 {
		o.ExecRuns = 300
	}
	if o.StreamMiB <= 0 {
		o.StreamMiB = 256
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m, err := client.NewManager(o.Manager, nil, o.ManagerOptions...)
	if err != nil {
		return nil, fmt.Errorf("manager %s: %w", o.Manager, err)
	}
	defer m.Close()
	a, err := m.Allocate(ctx, client.AllocateOptions{})
	if err != nil {
		return nil, fmt.Errorf("allocating from %s: %w", o.Manager, err)
	}
	defer func() { err = errors.Join(err, a.Close()) }()

	r := &SDKResult{Manager: o.Manager, ExecRuns: o.ExecRuns}
	o.Log.Info("exec round trips", "sandbox", a.ID, "runs", o.ExecRuns)
	rtts, procs, _, err := execRoundTrips(ctx, a.Sandbox, o.ExecRuns)
	if err != nil {
		return nil, err
	}
	r.ExecRoundtripP50Ms, r.ExecRoundtripP99Ms, r.ExecProcessP50Ms = pct(rtts, 50), pct(rtts, 99), pct(procs, 50)

	o.Log.Info("materialising and reading back 3000 x 4 KiB", "rounds", rounds)
	data := floor.Contents(nFiles, fileSize)
	runs := newSmallRuns("defaults")
	for i := range rounds {
		if err := runs.round(ctx, a.Sandbox, fmt.Sprintf("mat%d", i), data); err != nil {
			return nil, err
		}
	}
	r.Materialize, r.Read = runs.figures()

	o.Log.Info("streaming one file out", "mib", o.StreamMiB, "rounds", streamRounds)
	size := int64(o.StreamMiB) << 20
	big := make([]byte, size)
	rand.NewChaCha8([32]byte{'f', 'u', 's', 'e'}).Read(big)
	if _, err := a.Sandbox.WriteFileFrom(ctx, "big.bin", 0o644, bytes.NewReader(big), size); err != nil {
		return nil, fmt.Errorf("streaming in: %w", err)
	}
	var mibs []float64
	for range streamRounds {
		cmp := &comparer{want: big}
		t0 := time.Now()
		if err := a.Sandbox.ReadFileTo(ctx, "big.bin", cmp); err != nil {
			return nil, fmt.Errorf("streaming out: %w", err)
		}
		d := time.Since(t0)
		if cmp.off != len(big) {
			return nil, fmt.Errorf("streamed back %d bytes, want %d", cmp.off, len(big))
		}
		mibs = append(mibs, float64(o.StreamMiB)/d.Seconds())
	}
	r.StreamRead = Figure{Files: 1, FileBytes: size, Data: "random", Verified: true, Client: "defaults", Rounds: streamRounds, RPCs: 1, MiBPerS: pct(mibs, 50)}
	return r, nil
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
}

// SDK allocates one sandbox from o.Manager and measures, over one pinned connection with the
// client's defaults: exec round trips of `true`, then the small-file workload (3,000 random
// files of 4 KiB in floor.Dirs directories) written with WriteFiles and read back through
// the plan with every byte compared, each the median of five rounds into fresh roots. The
// sandbox is released, also on error.
func SDK(ctx context.Context, o SDKOptions) (_ *SDKResult, err error) {
	if o.ExecRuns <= 0 {
		o.ExecRuns = 300
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
	return r, nil
}

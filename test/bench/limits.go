package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// CPULimitsOptions configure the CPU-limit benchmark.
type CPULimitsOptions struct {
	Runsc         string // path of the pinned runsc
	SandboxBinary string // path of a static fusebox-sandbox
	Rounds        int    // interleaved rounds (default 6)
	RunsPerRound  int    // `true` round trips per sandbox per round (default 100)
	Log           *slog.Logger
}

// CPULimitFigure is one CPU setting's exec round trips of `true`, pooled over the rounds.
type CPULimitFigure struct {
	Setting string  `json:"setting"` // "none", "quota 1 CPU" or "shares 1024"
	Runs    int     `json:"runs"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	// RoundP99Ms are each round's p99, in round order.
	RoundP99Ms []float64 `json:"round_p99_ms"`
	// P99VsNone is P99Ms over the unlimited sandbox's.
	P99VsNone float64 `json:"p99_vs_none"`
}

// CPULimitsResult is the JSON `fusebox-bench cpu-limits --json` prints.
type CPULimitsResult struct {
	Rounds       int              `json:"rounds"`
	RunsPerRound int              `json:"runs_per_round"`
	Client       string           `json:"client"`
	Figures      []CPULimitFigure `json:"figures"`
	RunscVersion string           `json:"runsc"`
}

// CPULimits starts three sandboxes alike but for their CPU setting (none, a CFS quota of one
// CPU, cpu.shares of one CPU's weight), each with the default template's 1 GiB and 512 tasks,
// and times exec round trips of `true` through the client's defaults, the sandboxes taking
// turns in each round (the order rotating) so that the machine's load falls on all alike.
func CPULimits(ctx context.Context, o CPULimitsOptions) (*CPULimitsResult, error) {
	if o.Rounds <= 0 {
		o.Rounds = 6
	}
	if o.RunsPerRound <= 0 {
		o.RunsPerRound = 100
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	dir, err := os.MkdirTemp("", "fusebox-bench-cpu-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rt := &runsc.Runtime{Binary: o.Runsc, Root: filepath.Join(dir, "runsc-root")}
	defer rt.ReleaseRoot()
	etc := filepath.Join(dir, "etc")
	if err := runsc.WriteSanitizedEtc(etc); err != nil {
		return nil, fmt.Errorf("sanitised /etc: %w", err)
	}
	settings := []struct {
		name  string
		quota float64
		share int64
	}{{"none", 0, 0}, {"quota 1 CPU", 1, 0}, {"shares 1024", 0, 1024}}
	clients := make([]*client.Sandbox, len(settings))
	for i, s := range settings {
		o.Log.Info("starting sandbox under gVisor", "cpu", s.name)
		sb, err := localsandbox.Start(ctx, localsandbox.Options{
			Runtime: rt, ID: runsc.ID("benchcpu", uint64(i+1)), Dir: filepath.Join(dir, fmt.Sprintf("sandbox%d", i)),
			SandboxBinary: o.SandboxBinary,
			Bundle: runsc.BundleSpec{EtcDir: etc, MemoryLimitBytes: 1 << 30, CPUQuota: s.quota, CPUShares: s.share,
				WorkspaceSizeBytes: 512 << 20, TmpSizeBytes: 128 << 20, ProcessLimit: 512, PidsLimit: 4*512 + 1024},
		})
		if err != nil {
			return nil, fmt.Errorf("starting the %s sandbox: %w", s.name, err)
		}
		defer sb.Destroy(context.WithoutCancel(ctx))
		key, err := client.NewKey()
		if err != nil {
			return nil, err
		}
		pub, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
		if err != nil {
			return nil, err
		}
		c, err := client.Dial(sb.DataAddr, pub.SandboxKey, key)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		for range 20 { // warm the connection and the sandbox's caches
			if _, err := c.Run(ctx, "true"); err != nil {
				return nil, fmt.Errorf("warm-up exec (%s): %w", s.name, err)
			}
		}
		clients[i] = c
	}
	all := make([][]float64, len(settings))
	r := &CPULimitsResult{Rounds: o.Rounds, RunsPerRound: o.RunsPerRound, Client: "defaults", RunscVersion: o.Runsc}
	r.Figures = make([]CPULimitFigure, len(settings))
	for round := range o.Rounds {
		o.Log.Info("round", "n", round+1, "of", o.Rounds)
		for k := range settings {
			i := (k + round) % len(settings)
			var lat []float64
			for range o.RunsPerRound {
				t0 := time.Now()
				res, err := clients[i].Run(ctx, "true")
				d := time.Since(t0)
				if err != nil {
					return nil, fmt.Errorf("exec (%s): %w", settings[i].name, err)
				}
				if res.ExitCode != 0 {
					return nil, fmt.Errorf("true exited %d (%s)", res.ExitCode, settings[i].name)
				}
				lat = append(lat, ms(d))
			}
			all[i] = append(all[i], lat...)
			r.Figures[i].RoundP99Ms = append(r.Figures[i].RoundP99Ms, pct(lat, 99))
		}
	}
	for i, s := range settings {
		f := &r.Figures[i]
		f.Setting, f.Runs, f.P50Ms, f.P99Ms = s.name, len(all[i]), pct(all[i], 50), pct(all[i], 99)
		f.P99VsNone = round(f.P99Ms / pct(all[0], 99))
	}
	return r, nil
}

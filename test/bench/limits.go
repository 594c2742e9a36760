package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	// ThrottledPeriods and ThrottledMs are what the sandbox's host cgroup counted
	// (cpu.stat nr_throttled, throttled_time) during the timed runs: CFS periods in which the
	// quota ran out and the sandbox's threads waited for the next. Load on the machine
	// cannot fake them, so they tell a quota's cost where a noisy p99 cannot.
	ThrottledPeriods int64   `json:"throttled_periods"`
	ThrottledMs      float64 `json:"throttled_ms"`
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
	ids := make([]string, len(settings))
	for i, s := range settings {
		o.Log.Info("starting sandbox under gVisor", "cpu", s.name)
		ids[i] = runsc.ID("benchcpu", uint64(i+1))
		sb, err := localsandbox.Start(ctx, localsandbox.Options{
			Runtime: rt, ID: ids[i], Dir: filepath.Join(dir, fmt.Sprintf("sandbox%d", i)),
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
	before := make([]cpuStat, len(settings))
	for i := range settings {
		if before[i], err = readCPUStat(ids[i]); err != nil {
			return nil, err
		}
	}
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
		after, err := readCPUStat(ids[i])
		if err != nil {
			return nil, err
		}
		f := &r.Figures[i]
		f.ThrottledPeriods = after.periods - before[i].periods
		f.ThrottledMs = round(float64(after.ns-before[i].ns) / 1e6)
		f.Setting, f.Runs, f.P50Ms, f.P99Ms = s.name, len(all[i]), pct(all[i], 50), pct(all[i], 99)
		f.P99VsNone = round(f.P99Ms / pct(all[0], 99))
	}
	return r, nil
}

// cpuStat is the throttling a host cgroup's cpu.stat counts.
type cpuStat struct{ periods, ns int64 }

// readCPUStat reads the cpu.stat of container id's host cgroup: runsc puts each sandbox in
// /<container id>, cgroup v1's cpu controller, or the unified hierarchy's (throttled_usec).
func readCPUStat(id string) (cpuStat, error) {
	for _, p := range []string{filepath.Join("/sys/fs/cgroup/cpu", id, "cpu.stat"), filepath.Join("/sys/fs/cgroup", id, "cpu.stat")} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var st cpuStat
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, " ")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "nr_throttled":
				st.periods = n
			case "throttled_time":
				st.ns = n
			case "throttled_usec":
				st.ns = n * 1000
			}
		}
		return st, nil
	}
	return cpuStat{}, fmt.Errorf("no cpu.stat for sandbox %s under /sys/fs/cgroup", id)
}

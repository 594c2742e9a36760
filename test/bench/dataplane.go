// Package bench is fusebox's benchmark harness: it drives real sandboxes under the pinned
// gVisor and reports figures as JSON for fusebox-bench.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// DataplaneOptions configure the data-plane benchmark.
type DataplaneOptions struct {
	Runsc         string // path of the pinned runsc
	SandboxBinary string // path of a static fusebox-sandbox
	FloorBinary   string // path of a static fusebox-floor (the in-sandbox floor); required
	ExecRuns      int    // round trips of `true` (at least 500 for the published figure)
	BaselineRuns  int    // `runsc exec true` runs
	ShellFiles    int    // files timed for the shell-per-file baseline (scaled to 3,000)
	StreamMiB     int    // size of the streamed file
	Log           *slog.Logger
}

// DataplaneResult is the JSON `fusebox-bench dataplane --json` prints.
type DataplaneResult struct {
	ExecRuns                 int     `json:"exec_runs"`
	ExecRoundtripP50Ms       float64 `json:"exec_roundtrip_p50_ms"`
	ExecRoundtripP99Ms       float64 `json:"exec_roundtrip_p99_ms"`
	ExecProcessP50Ms         float64 `json:"exec_process_p50_ms"`
	ExecOverheadP50Ms        float64 `json:"exec_overhead_p50_ms"`
	ExecOverheadP99Ms        float64 `json:"exec_overhead_p99_ms"`
	RunscExecRoundtripP50Ms  float64 `json:"runsc_exec_roundtrip_p50_ms"`
	RoundtripSpeedupVsRunsc  float64 `json:"roundtrip_speedup_vs_runsc_exec"`
	Materialize3000x4kS      float64 `json:"materialize_3000x4k_seconds"`
	Materialize3000x4kRPCs   int     `json:"materialize_3000x4k_rpcs"`
	MaterializeFloor3000x4kS float64 `json:"materialize_floor_3000x4k_seconds"`
	MaterializeVsFloor       float64 `json:"materialize_vs_floor"`
	ShellPerFile3000x4kS     float64 `json:"shell_per_file_3000x4k_seconds"`
	ShellPerFileTimedFiles   int     `json:"shell_per_file_timed_files"`
	ShellPerFileScaled       bool    `json:"shell_per_file_scaled_to_3000"`
	MaterializeSpeedupShell  float64 `json:"materialize_speedup_vs_shell_per_file"`
	StreamWriteMiBPerS       float64 `json:"stream_write_mib_per_s"`
	StreamWriteMiB           int     `json:"stream_write_mib"`
	ReadPlan3000x4kS         float64 `json:"read_plan_3000x4k_seconds"`
	ReadPlan3000x4kRPCs      int     `json:"read_plan_3000x4k_rpcs"`
	RunscVersion             string  `json:"runsc"`
	Platform                 string  `json:"platform"`
}

// floorDir is where the floor helper's directory is bound in the benchmark's sandbox.
const floorDir = "/opt/fusebox-floor"

const (
	nFiles   = 3000
	fileSize = 4096
	rounds   = 5 // materialisation rounds; the median is reported
)

// Dataplane starts one sandbox, binds it through sFuse and measures the data plane.
func Dataplane(ctx context.Context, o DataplaneOptions) (*DataplaneResult, error) {
	if o.ExecRuns <= 0 {
		o.ExecRuns = 500
	}
	if o.BaselineRuns <= 0 {
		o.BaselineRuns = 50
	}
	if o.ShellFiles <= 0 {
		o.ShellFiles = 300
	}
	if o.StreamMiB <= 0 {
		o.StreamMiB = 256
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.FloorBinary == "" {
		return nil, fmt.Errorf("dataplane benchmark: FloorBinary (a static fusebox-floor) is required")
	}
	floorBin, err := filepath.Abs(o.FloorBinary)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fusebox-bench-")
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
	o.Log.Info("starting sandbox under gVisor", "runsc", o.Runsc)
	sb, err := localsandbox.Start(ctx, localsandbox.Options{
		Runtime: rt, ID: runsc.ID("bench", 1), Dir: filepath.Join(dir, "sandbox"),
		SandboxBinary: o.SandboxBinary,
		Bundle: runsc.BundleSpec{EtcDir: etc, MemoryLimitBytes: 4 << 30,
			// The floor helper's directory, read-only: the product sandbox binary has no floor.
			Mounts: []runsc.Mount{{Source: filepath.Dir(floorBin), Destination: floorDir, ReadOnly: true}}},
	})
	if err != nil {
		return nil, err
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

	r := &DataplaneResult{ExecRuns: o.ExecRuns, StreamWriteMiB: o.StreamMiB, Platform: "systrap", RunscVersion: o.Runsc}

	// Exec round trips of `true`.
	o.Log.Info("exec round trips", "runs", o.ExecRuns)
	for range 20 { // warm the connection and the sandbox's caches
		if _, err := c.Run(ctx, "true"); err != nil {
			return nil, fmt.Errorf("warm-up exec: %w", err)
		}
	}
	var rtts, procs, over []float64
	for range o.ExecRuns {
		t0 := time.Now()
		res, err := c.Run(ctx, "true")
		rtt := time.Since(t0)
		if err != nil {
			return nil, err
		}
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("true exited %d", res.ExitCode)
		}
		rtts = append(rtts, ms(rtt))
		procs = append(procs, ms(res.Duration))
		over = append(over, ms(rtt-res.Duration))
	}
	r.ExecRoundtripP50Ms, r.ExecRoundtripP99Ms = pct(rtts, 50), pct(rtts, 99)
	r.ExecProcessP50Ms = pct(procs, 50)
	r.ExecOverheadP50Ms, r.ExecOverheadP99Ms = pct(over, 50), pct(over, 99)

	o.Log.Info("runsc exec baseline", "runs", o.BaselineRuns)
	var base []float64
	for range o.BaselineRuns {
		t0 := time.Now()
		code, err := rt.Exec(ctx, sb.ID, []string{"/bin/true"}, io.Discard, io.Discard)
		if err != nil || code != 0 {
			return nil, fmt.Errorf("runsc exec true: code %d: %v", code, err)
		}
		base = append(base, ms(time.Since(t0)))
	}
	r.RunscExecRoundtripP50Ms = pct(base, 50)
	r.RoundtripSpeedupVsRunsc = round(r.RunscExecRoundtripP50Ms / r.ExecRoundtripP50Ms)

	// Materialising 3,000 files of 4 KiB.
	data := bytes.Repeat([]byte("fusebox!"), fileSize/8)
	mkFiles := func(root string) []client.File {
		fs := make([]client.File, nFiles)
		for i := range fs {
			fs[i] = client.File{Path: fmt.Sprintf("%s/d%02d/f%05d.txt", root, i%10, i), Data: data}
		}
		return fs
	}
	o.Log.Info("materialising 3000 x 4 KiB", "rounds", rounds)
	var mats []float64
	for i := range rounds {
		files := mkFiles(fmt.Sprintf("mat%d", i))
		t0 := time.Now()
		st, err := c.WriteFiles(ctx, files, nil, nil)
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("materialising: %w", err)
		}
		if st.Files != nFiles {
			return nil, fmt.Errorf("materialised %d files, want %d", st.Files, nFiles)
		}
		mats = append(mats, d.Seconds())
		r.Materialize3000x4kRPCs = st.Batches + st.Streamed
	}
	r.Materialize3000x4kS = pct(mats, 50)

	o.Log.Info("in-sandbox floor", "rounds", rounds)
	var floors []float64
	for i := range rounds {
		res, err := c.Run(ctx, floorDir+"/"+filepath.Base(floorBin),
			"-dir", fmt.Sprintf("%s/floor%d", localsandbox.WorkspaceDir, i), "-files", strconv.Itoa(nFiles), "-size", strconv.Itoa(fileSize))
		if err != nil {
			return nil, fmt.Errorf("floor program: %w", err)
		}
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("floor program exited %d: %s", res.ExitCode, res.Stderr)
		}
		s, err := strconv.ParseFloat(strings.TrimSpace(string(res.Stdout)), 64)
		if err != nil {
			return nil, fmt.Errorf("floor program printed %q", res.Stdout)
		}
		floors = append(floors, s)
	}
	r.MaterializeFloor3000x4kS = pct(floors, 50)
	r.MaterializeVsFloor = round(r.Materialize3000x4kS / r.MaterializeFloor3000x4kS)

	o.Log.Info("shell-per-file baseline", "files", o.ShellFiles)
	if _, err := c.Run(ctx, "mkdir", "-p", "shell/d"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for i := range o.ShellFiles {
		res, err := c.Exec(ctx, client.Command{Argv: []string{"sh", "-c", fmt.Sprintf("cat > shell/d/f%05d.txt", i)}, Stdin: data})
		if err != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("shell write: %v", err)
		}
	}
	per := time.Since(t0).Seconds() / float64(o.ShellFiles)
	r.ShellPerFile3000x4kS = round(per * nFiles)
	r.ShellPerFileTimedFiles = o.ShellFiles
	r.ShellPerFileScaled = o.ShellFiles != nFiles
	r.MaterializeSpeedupShell = round(r.ShellPerFile3000x4kS / r.Materialize3000x4kS)

	// Reading the materialised tree back through a plan.
	o.Log.Info("read plan 3000 x 4 KiB")
	var reads []float64
	for i := range rounds {
		t0 := time.Now()
		got, st, err := c.ReadFiles(ctx, fmt.Sprintf("mat%d/**", i))
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		if len(got) != nFiles {
			return nil, fmt.Errorf("read %d files, want %d", len(got), nFiles)
		}
		reads = append(reads, d.Seconds())
		r.ReadPlan3000x4kRPCs = 1 + st.Batches + st.Streamed
	}
	r.ReadPlan3000x4kS = pct(reads, 50)

	o.Log.Info("streaming one file", "mib", o.StreamMiB)
	size := int64(o.StreamMiB) << 20
	var speeds []float64
	for i := range 3 {
		t0 := time.Now()
		n, err := c.WriteFileFrom(ctx, fmt.Sprintf("big%d.bin", i), 0o644, io.LimitReader(pattern{}, size), size)
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("streaming: %w", err)
		}
		if n != size {
			return nil, fmt.Errorf("streamed %d bytes, want %d", n, size)
		}
		speeds = append(speeds, float64(o.StreamMiB)/d.Seconds())
		if err := c.Remove(ctx, fmt.Sprintf("big%d.bin", i), false); err != nil {
			return nil, err
		}
	}
	r.StreamWriteMiBPerS = round(pct(speeds, 50))
	return r, nil
}

// pattern is an endless reader of non-zero bytes.
type pattern struct{}

func (pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return len(p), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round(v float64) float64 {
	return float64(int64(v*1000+0.5)) / 1000
}

// pct returns the p-th percentile (nearest rank) of xs.
func pct(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return round(s[i])
}

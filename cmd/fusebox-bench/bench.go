package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/cmd/internal/daemoncmd"
	"github.com/fusebox-dev/fusebox/cmd/internal/managerflags"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/test/bench"
)

func benchDataplaneCmd() *cobra.Command {
	var o bench.DataplaneOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "dataplane",
		Short: "Exec round trips, file materialisation and streaming against one gVisor sandbox",
		Long: `Starts one sandbox under the pinned runsc, binds it through sFuse and measures:
exec round trip and overhead of 'true' (against 'runsc exec' of the same), writing 3,000
files of 4 KiB of random bytes in 50 directories (against the in-sandbox floor and a
shell-per-file baseline), reading them back with every byte compared (against an in-sandbox
read floor), and streaming one large random file in and out, compared as it comes back
(over the client's bulk connections, and over the gRPC streams of a client without them),
against the streaming floors: the same bytes over a raw host unix socket into and out of the
sandbox (fusebox-floor -receive and -send), alone and with the file written and read in the
same loop, and the file sent out under the data plane's pinned TLS 1.3 with no fusebox
framing (fusebox-floor -send-tls).
Every main figure goes through the public client package with its default options, as an
SDK user's code would; the figures labelled "tuned" use --tuned-concurrency. The floors are
plain loops of open, write, close (and open, read, compare, close) run inside the sandbox by
the static fusebox-floor helper (--floor-binary), whose directory is bound read-only into the
benchmark's sandbox. Each figure in --json says what it measured. Needs root.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needFiles(runscFile(o.Runsc), sandboxFile(o.SandboxBinary),
				file{o.FloorBinary, "fusebox-floor", "make build", "--floor-binary"}); err != nil {
				return err
			}
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			r, err := bench.Dataplane(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "exec round trip of true (p50/p99)\t%.3f / %.3f ms\n", r.ExecRoundtripP50Ms, r.ExecRoundtripP99Ms)
			fmt.Fprintf(w, "  process run time inside (p50)\t%.3f ms\n", r.ExecProcessP50Ms)
			fmt.Fprintf(w, "  fusebox overhead (p50/p99)\t%.3f / %.3f ms\n", r.ExecOverheadP50Ms, r.ExecOverheadP99Ms)
			fmt.Fprintf(w, "  runsc exec of true (p50)\t%.3f ms (%.1fx slower)\n", r.RunscExecRoundtripP50Ms, r.RoundtripSpeedupVsRunsc)
			fig := func(name string, f bench.Figure) { printFigure(w, name, f) }
			fig("write small files", r.Materialize)
			fig("  in-sandbox write floor", r.MaterializeFloor)
			fmt.Fprintf(w, "  against the floor\t%.2fx\n", r.MaterializeVsFloor)
			fig("  tuned", r.MaterializeTuned)
			fmt.Fprintf(w, "  shell per file\t%.3f s (%.0fx slower)\n", r.ShellPerFile3000x4kS, r.MaterializeSpeedupShell)
			fig("read them back", r.Read)
			fig("  in-sandbox read floor", r.ReadFloor)
			fmt.Fprintf(w, "  against the floor\t%.2fx\n", r.ReadVsFloor)
			fig("  tuned", r.ReadTuned)
			fig("stream one file in", r.StreamWrite)
			fig("stream it out", r.StreamRead)
			fig("  gRPC streams in (no bulk)", r.StreamWriteGRPC)
			fig("  gRPC streams out (no bulk)", r.StreamReadGRPC)
			fig("  raw unix socket in (floor)", r.StreamFloorIn)
			fig("  raw unix socket out (floor)", r.StreamFloorOut)
			fmt.Fprintf(w, "  streams against the floor\tin %.2fx, out %.2fx\n", r.StreamWriteVsFloor, r.StreamReadVsFloor)
			fig("  raw unix socket into a file (floor)", r.StreamFloorInFile)
			fig("  raw unix socket from the file (floor)", r.StreamFloorOutFile)
			fmt.Fprintf(w, "  streams against the file floor\tin %.2fx, out %.2fx\n", r.StreamWriteVsFileFloor, r.StreamReadVsFileFloor)
			fig("  pinned TLS 1.3 from the file (floor)", r.StreamFloorOutTLS)
			fmt.Fprintf(w, "  stream out against the TLS floor\t%.2fx\n", r.StreamReadVsTLSFloor)
			fmt.Fprintf(w, "  the TLS floor against the file floor\t%.2fx\n", r.TLSFloorVsFileFloor)
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Runsc, "runsc", daemoncmd.EnvOr("FUSEBOX_RUNSC", daemoncmd.DefaultRunsc), "path of the pinned runsc")
	f.StringVar(&o.SandboxBinary, "sandbox-binary", daemoncmd.SiblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox binary")
	f.StringVar(&o.FloorBinary, "floor-binary", daemoncmd.SiblingBinary("fusebox-floor"), "path of the static fusebox-floor binary (the in-sandbox floor)")
	f.IntVar(&o.ExecRuns, "exec-runs", 500, "round trips of true")
	f.IntVar(&o.BaselineRuns, "baseline-runs", 50, "runs of runsc exec true")
	f.IntVar(&o.ShellFiles, "shell-files", 300, "files timed for the shell-per-file baseline (scaled to 3000)")
	f.IntVar(&o.StreamMiB, "stream-mib", 256, "size of the streamed file in MiB")
	f.IntVar(&o.Tuned.Concurrency, "tuned-concurrency", bench.DefaultTuned.Concurrency, "client.Options.Concurrency of the figures labelled tuned")
	f.IntVar(&o.Tuned.BatchBytes, "tuned-batch-bytes", 0, "client.Options.BatchBytes of the figures labelled tuned (0: the client's default)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func benchCPULimitsCmd() *cobra.Command {
	var o bench.CPULimitsOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cpu-limits",
		Short: "Exec round trips of 'true' under no CPU limit, a CFS quota of one CPU, and cpu shares",
		Long: `Starts three gVisor sandboxes alike but for their CPU setting (none; a CFS quota of one
CPU; cpu.shares 1024, one CPU's weight), each with 1 GiB and 512 tasks, and times exec
round trips of 'true' through the client's defaults, the sandboxes taking turns in
interleaved rounds, and reads the CFS periods each sandbox's host cgroup was throttled in. The p99 against the unlimited sandbox's is what the default CPU setting
of fusebox local up (--sandbox-cpus) was chosen from. Needs root.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needFiles(runscFile(o.Runsc), sandboxFile(o.SandboxBinary)); err != nil {
				return err
			}
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			r, err := bench.CPULimits(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "cpu setting\ttrue p50 / p99\tp99 vs none\tthrottled periods (ms)\tper-round p99\n")
			for _, f := range r.Figures {
				fmt.Fprintf(w, "%s\t%.3f / %.3f ms\t%.2fx\t%d (%.1f)\t%v\n", f.Setting, f.P50Ms, f.P99Ms, f.P99VsNone, f.ThrottledPeriods, f.ThrottledMs, f.RoundP99Ms)
			}
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Runsc, "runsc", daemoncmd.EnvOr("FUSEBOX_RUNSC", daemoncmd.DefaultRunsc), "path of the pinned runsc")
	f.StringVar(&o.SandboxBinary, "sandbox-binary", daemoncmd.SiblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox binary")
	f.IntVar(&o.Rounds, "rounds", 6, "interleaved rounds")
	f.IntVar(&o.RunsPerRound, "runs", 100, "round trips of true per sandbox per round")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// allocateLong is fusebox-bench allocate's help.
const allocateLong = `Runs a manager with the runsc allocator in this process and measures, through the
real gRPC API and client SDK: warm allocations (Allocate with a ready sandbox waiting, sFuse and
the first data-plane call included), cold starts (empty pool), and the pool refill rate. Needs root.
The sandboxes' root is assembled from this host, or with --image it is the sandbox image, as
fusebox local up --image gives it (unpacked once into the benchmark's state directory).
The process takes the manager daemon's garbage-collection target (GOGC 400 unless GOGC is set,
daemon.GCPercent), as fusebox local up does; the agent in it shares it.

The warm allocations are measured with the latency accelerators (internal/fastpath) on and
off in one run, interleaved: each of --fast-path-arms (default all,none) is a manager with a
pool of its own in this process, its sandboxes made with the arm's accelerators, as fusebox
local up --fast-path makes them, and its agent's side switched alike (client.FastPath). There
are --runs rounds; in each, every arm makes one warm allocation, in an order shuffled afresh
(--arm-seed), each after every arm's pool has been full and idle for --settle, so that every
arm meets the machine as it is then, and no arm's allocation always follows another's. Each
arm's p50, p90, p99 and count is printed, and its difference from the first arm, the reference:
the difference of the percentiles, and the median over the rounds of the two arms' paired
difference, with how many rounds it was the slower. An arm is "all", "none", "no-NAME" (all
but NAME) or NAME+NAME... (those only), NAME one of keep-awake; an arm
repeated (all,all) shows the noise of the comparison. The warm figures on the first line, and
every other phase, are the reference arm's; the other arms' pools exist only during the warm
phase. Keep-awake needs --keep-sandboxes-awake as well.

Warm allocations take a unit past gVisor's clock warm-up (about a second after its start: before
it, every clock read in the sandbox is a system call); allocations of units younger than that
are measured and reported separately (allocate_young_*).

Then a steady demand: allocations arrive at --demand-rate (by default half the measured
refill rate), each released after its first call, with the ewma estimator sizing the pool
as fusebox local up --estimator ewma would; it reports how many found no ready unit and had
to wait for a creation (demand_cold_waits; the target is none) and their latency under that
load (creations and destructions share the machine with them).

With --trace it also times each step of the warm allocations, from the agent through the
manager into the sandbox and back (the sandbox's steps come from its server log's
"allocation timeline"), and prints each step's median and 90th percentile, and what makes
the slowest tenth slow: each step's mean over them less its median (TAIL +MS). --trace-csv
FILE also writes every traced allocation's steps, one row each, for a closer look.

With --sched (root; tracefs, mounted if it is not) it records the kernel's context switches
during the warm allocations in a tracefs instance of its own and prints who had the CPUs
during each: this process (agent and manager), gVisor (the sandboxes and runsc), other
processes, and nobody; the slowest allocations one by one, and how many of the slowest tenth
had other processes on the CPUs: whether a slow allocation was fusebox's doing or a
neighbour's. --sched-csv FILE writes every allocation's figures, one row each, and its window
(from_s, to_s: seconds on perf's clock, to pick a perf record -a recording's samples that fell
in it).

With --allocator kube it starts a loopback control plane (kube-apiserver, etcd, kwok) and
measures warm allocations through the kube allocator: claim, egress policy and lease written
to the real API server, and the API requests each allocation makes. With --real-node too, the
pods are real gVisor pods on a real node (test/nodetest: kubelet, containerd and the gVisor
shim, bridge CNI, kube-router; make node-bins; root) made from the test sandbox image with
--sandbox-binary as its server, sFuse is real, and each allocation is also timed through a
fresh pinned-TLS connection to the pod IP and a first call; every allocation is released.

With --manager ADDR it starts nothing: it measures warm allocations against a manager that
runs already (fusebox local up's unix socket, or a cluster manager's tcp://host:port over
TLS with --ca-file and --token-file, as fusebox run reaches it), as an agent on this machine
sees them. Before
each allocation it waits until the manager's pool has held its target of ready units for
--settle with nothing being created or destroyed (--busy: full is enough, for a manager that
others use too) and its oldest ready unit is past the warm-up; every allocation is released.
Only --runs, --settle, --busy, --sched, --sched-csv, --json and the manager's --token-file,
--ca-file and --tls-server-name apply (with --sched, a manager on this machine shows as other
fusebox processes). A manager that lists a caller only its own sandboxes (an authenticated
tcp:// one) does not show the ready units' ages: the wait for the warm-up is then not made.`

const allocateExample = `  fusebox-bench allocate --json --runs 100
  fusebox-bench allocate --runs 20 --demand-runs -1 --fast-path-arms all,none,no-keep-awake
  fusebox-bench allocate --runs 100 --fast-path-arms all,all
  fusebox-bench allocate --runs 100 --fast-path-arms all
  fusebox-bench allocate --runs 100 --trace --trace-csv /tmp/steps.csv
  fusebox-bench allocate --runs 100 --sched
  fusebox-bench allocate --runs 100 --image bin/images/sandbox
  fusebox-bench allocate --manager unix:///run/fusebox/manager.sock --runs 50
  fusebox-bench allocate --manager tcp://10.96.0.20:9090 --ca-file ca.crt --token-file token --tls-server-name fusebox-manager.fusebox.svc --runs 50`

func benchAllocateCmd() *cobra.Command {
	a := &allocateRun{}
	cmd := &cobra.Command{
		Use:     "allocate",
		Short:   "Warm and cold allocation latency and pool refill rate with the runsc allocator",
		Long:    allocateLong,
		Example: allocateExample,
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.run(cmd) },
	}
	a.register(cmd.Flags())
	return cmd
}

// allocateRun is one run of fusebox-bench allocate: its flags, and the three benchmarks it
// picks from (a running manager, the kube allocator, the runsc allocator).
type allocateRun struct {
	o                 bench.AllocateOptions
	asJSON            bool
	allocator, remote string
	mgrTLS            managerflags.TLS // with --manager tcp://
	realNode          bool
	busy              bool
	arms              []string
}

func (a *allocateRun) register(f *pflag.FlagSet) {
	f.StringVar(&a.o.Runsc, "runsc", daemoncmd.EnvOr("FUSEBOX_RUNSC", daemoncmd.DefaultRunsc), "path of the pinned runsc")
	f.StringVar(&a.o.SandboxBinary, "sandbox-binary", daemoncmd.SiblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox binary")
	f.IntVar(&a.o.Runs, "runs", 50, "warm allocations per fast-path arm (the interleaved rounds; with --manager, warm allocations)")
	f.StringVar(&a.o.Image, "image", "", "sandbox image as the sandboxes' root, as fusebox local up --image: an OCI image layout directory (fusebox image build writes bin/images/sandbox) or a registry reference; empty: a root assembled from this host")
	f.IntVar(&a.o.ColdRuns, "cold-runs", 5, "cold starts")
	f.IntVar(&a.o.YoungRuns, "young-runs", 20, "allocations of units younger than their warm-up")
	f.DurationVar(&a.o.PoolPing, "pool-ping", daemoncmd.DefaultPoolPing, "the manager's liveness ping of the pool's next sandbox (0: none), as fusebox local up --pool-ping")
	f.BoolVar(&a.o.KeepAwake, "keep-sandboxes-awake", daemoncmd.DefaultKeepAwake, "as fusebox local up --keep-sandboxes-awake")
	f.IntVar(&a.o.PoolSize, "pool-size", 4, "pool size for the refill measurement")
	f.DurationVar(&a.o.Settle, "settle", 100*time.Millisecond, "how long the full pool idles before each warm allocation (negative: none)")
	f.StringVar(&a.allocator, "allocator", "runsc", "runsc (local gVisor) or kube (a loopback kube-apiserver + kwok from make k8s-bins; in-memory sFuse)")
	f.BoolVar(&a.asJSON, "json", false, "print one JSON object")
	f.BoolVar(&a.realNode, "real-node", false, "with --allocator kube: run the pods on a real node (kubelet, containerd and the gVisor shim, bridge CNI, kube-router from make node-bins; root) with real sFuse and a first data-plane call to the pod IP")
	f.IntVar(&a.o.DemandRuns, "demand-runs", 100, "allocations of the steady-demand phase (negative: skip it)")
	f.Float64Var(&a.o.DemandRate, "demand-rate", 0, "their arrivals per second (0: half the measured pool refill rate)")
	f.StringVar(&a.o.TraceCSV, "trace-csv", "", "with --trace: also write each traced allocation's steps (ms) to this CSV file")
	f.StringVar(&a.remote, "manager", "", "measure warm allocations against this running manager (unix:///path or tcp://host:port) instead of starting one")
	f.BoolVar(&a.busy, "busy", false, "with --manager: do not wait for the manager's creations and destructions to pause")
	a.mgrTLS.Register(f) // --token-file, --ca-file, --tls-server-name, as fusebox run's
	f.StringVar(&a.o.SchedCSV, "sched-csv", "", "with --sched: also write each allocation's CPU time by class (ms) to this CSV file")
	f.BoolVar(&a.o.Sched, "sched", false, "also record the kernel's context switches (tracefs; root) and print who had the CPUs during each warm allocation (the first fast-path arm's): this process, gVisor, other processes, nobody")
	f.BoolVar(&a.o.Trace, "trace", false, "also time each step of the warm allocations (the first fast-path arm's; agent, manager, and the sandbox's own log) and print where the time goes")
	f.StringSliceVar(&a.arms, "fast-path-arms", bench.DefaultArms, bench.ArmsHelp)
	f.Uint64Var(&a.o.ArmSeed, "arm-seed", 0, "seed of the arms' order in each round (0: from the clock; the output says which)")
}

// run checks the flags that go together and runs the benchmark they pick.
func (a *allocateRun) run(cmd *cobra.Command) error {
	o := &a.o
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if o.SchedCSV != "" && !o.Sched {
		return fmt.Errorf("--sched-csv needs --sched")
	}
	if a.remote != "" || a.allocator == "kube" {
		if cmd.Flags().Changed("fast-path-arms") || cmd.Flags().Changed("arm-seed") {
			return fmt.Errorf("--fast-path-arms and --arm-seed need --allocator runsc without --manager (the arms are managers this process starts)")
		}
	}
	if a.remote != "" {
		if o.Trace || cmd.Flags().Changed("allocator") || o.Image != "" {
			return fmt.Errorf("--manager measures a running manager: --trace, --allocator and --image do not apply (start it with fusebox local up --image)")
		}
		return a.runRemote(cmd.Context())
	}
	if a.realNode && a.allocator != "kube" {
		return fmt.Errorf("--real-node needs --allocator kube")
	}
	if a.allocator == "kube" {
		if o.Image != "" {
			return fmt.Errorf("--image needs --allocator runsc (the kube benchmark's pods run no sandbox)")
		}
		if o.Trace || o.Sched {
			return fmt.Errorf("--trace and --sched need --allocator runsc (the kube benchmark's pods run no sandbox)")
		}
		daemon.TuneGC() // this process runs the manager
		return a.runKube(cmd.Context())
	}
	if o.TraceCSV != "" && !o.Trace {
		return fmt.Errorf("--trace-csv needs --trace")
	}
	if a.allocator != "runsc" {
		return fmt.Errorf("--allocator %q: want runsc or kube", a.allocator)
	}
	if err := needFiles(runscFile(o.Runsc)); err != nil {
		return err
	}
	var err error
	if o.Arms, err = bench.ParseArms(a.arms); err != nil {
		return fmt.Errorf("--fast-path-arms: %w", err)
	}
	daemon.TuneGC() // this process runs the manager, as fusebox local up does
	return a.runLocal(cmd.Context())
}

// runRemote measures warm allocations against a running manager.
func (a *allocateRun) runRemote(ctx context.Context) error {
	o := &a.o
	r, err := bench.AllocateRemote(ctx, bench.RemoteOptions{Manager: a.remote, ManagerOptions: a.mgrTLS.Options(), Runs: o.Runs,
		Settle: o.Settle, Busy: a.busy, Sched: o.Sched, SchedCSV: o.SchedCSV, Log: o.Log})
	if err != nil {
		return err
	}
	if a.asJSON {
		return printJSON(r)
	}
	fmt.Printf("warm allocation p50 %.2f ms, p90 %.2f ms, p95 %.2f ms, p99 %.2f ms (%d runs, %s allocator at %s); %d allocations waited for a cold start meanwhile\n",
		r.AllocateP50Ms, r.AllocateP90Ms, r.AllocateP95Ms, r.AllocateP99Ms, r.Runs, r.Allocator, r.Manager, r.ColdWaits)
	fmt.Printf("  until the manager's answer p50 %.2f ms, p99 %.2f ms; from it to the first call's end p50 %.2f ms, p99 %.2f ms\n",
		r.AnswerP50Ms, r.AnswerP99Ms, r.FirstCallP50Ms, r.FirstCallP99Ms)
	if r.ConnectP50Ms > 0 {
		fmt.Printf("  first call: from the answer to the data connection p50 %.2f ms, p99 %.2f ms; from then to the call's end p50 %.2f ms, p99 %.2f ms\n",
			r.ConnectP50Ms, r.ConnectP99Ms, r.ReplyP50Ms, r.ReplyP99Ms)
	}
	if r.Sched != nil {
		printSched(r.Sched)
	}
	return nil
}

// runKube measures warm allocations through the kube allocator, on kwok or a real node.
func (a *allocateRun) runKube(ctx context.Context) error {
	o := &a.o
	if a.realNode {
		r, err := bench.KubeRealNodeAllocate(ctx, o.Runs, o.Settle, o.SandboxBinary, o.Log)
		if err != nil {
			return err
		}
		if a.asJSON {
			return printJSON(r)
		}
		fmt.Printf("warm allocation of a real gVisor pod p50 %.2f ms, p99 %.2f ms; with a fresh pinned-TLS connection to the pod and a first call p50 %.2f ms, p99 %.2f ms (%d runs, pool %d), %.1f API writes per allocation\n",
			r.AllocateP50Ms, r.AllocateP99Ms, r.WithFirstCallP50Ms, r.WithFirstCallP99Ms, r.Runs, r.Pool, r.APIWritesPerAllocation)
		return nil
	}
	r, err := bench.KubeAllocate(ctx, o.Runs, o.Settle, o.Log)
	if err != nil {
		return err
	}
	if a.asJSON {
		return printJSON(r)
	}
	fmt.Printf("warm allocation p50 %.2f ms, p99 %.2f ms (%d runs), %.1f API writes per allocation\n",
		r.AllocateP50Ms, r.AllocateP99Ms, r.Runs, r.APIWritesPerAllocation)
	return nil
}

// runLocal measures allocations with the runsc allocator in this process.
func (a *allocateRun) runLocal(ctx context.Context) error {
	o := &a.o
	r, err := bench.Allocate(ctx, *o)
	if err != nil {
		return err
	}
	if a.asJSON {
		return printJSON(r)
	}
	fmt.Printf("warm allocation (fast path %s) p50 %.2f ms, p90 %.2f ms, p95 %.2f ms, p99 %.2f ms (%d runs)\nyoung unit (< 1 s) p50 %.2f ms, p99 %.2f ms (%d runs)\ncold start p50 %.1f ms\npool refill %.1f sandboxes/s\n",
		r.FastPath.Arms[0].Arm, r.AllocateP50Ms, r.AllocateP90Ms, r.AllocateP95Ms, r.AllocateP99Ms, r.Runs, r.AllocateYoungP50Ms, r.AllocateYoungP99Ms, r.YoungRuns, r.ColdStartP50Ms, r.PoolRefillPerS)
	if r.DemandRuns > 0 {
		fmt.Printf("steady demand %.1f/s (ewma estimator, pool target up to %d): %d allocations, %d waited for a cold start, p50 %.2f ms, p99 %.2f ms\n",
			r.DemandPerS, r.DemandPoolTargetMax, r.DemandRuns, r.DemandColdWaits, r.DemandP50Ms, r.DemandP99Ms)
	}
	printArms(r.FastPath)
	if r.Steps != nil {
		fmt.Printf("\nwhere a warm allocation's time goes (%d traced):\n", r.Steps.Runs)
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "STEP\tP50 MS\tP90 MS\tTAIL +MS\t")
		for _, st := range r.Steps.Steps {
			fmt.Fprintf(w, "%s\t%.2f\t%.2f\t%+.2f\t%s\n", st.Name, st.P50Ms, st.P90Ms, st.TailExcessMs, st.What)
		}
		fmt.Fprintf(w, "total\t%.2f\t%.2f\t\t\n", r.Steps.Total, r.Steps.TotalP90)
		w.Flush()
		fmt.Printf("TAIL +MS: over the %d allocations slower than the total's p90, each step's mean less its median\n", r.Steps.TailRuns)
		if o.TraceCSV != "" {
			fmt.Printf("each traced allocation's steps: %s\n", o.TraceCSV)
		}
	}
	if r.Sched != nil {
		printSched(r.Sched)
	}
	return nil
}

func benchManagerCmd() *cobra.Command {
	var clients []int
	var rate int
	var d time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Allocations per second and latency of the control plane alone (in-memory allocator)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			daemon.TuneGC() // this process runs the manager
			r, err := bench.Manager(cmd.Context(), clients, rate, d)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			for _, l := range r.Levels {
				fmt.Printf("%3d clients: %8.0f allocations/s, p50 %.3f ms, p99 %.3f ms\n", l.Clients, l.AllocationsPerS, l.AllocateP50Ms, l.AllocateP99Ms)
			}
			if ol := r.OpenLoop; ol != nil {
				fmt.Printf("offered %d/s: %8.0f allocations/s, p50 %.3f ms, p99 %.3f ms\n", ol.RatePerS, ol.AllocationsPerS, ol.AllocateP50Ms, ol.AllocateP99Ms)
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&clients, "clients", []int{1, 8, 64}, "concurrency levels")
	cmd.Flags().IntVar(&rate, "rate", 1000, "offered allocations per second for the open-loop run (0: skip)")
	cmd.Flags().DurationVar(&d, "duration", 3*time.Second, "time per level")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// printSched prints who had the CPUs during the warm allocations (bench allocate --sched).
func printSched(s *bench.Sched) {
	fmt.Printf("\nwho had the %d CPUs during each warm allocation (%d recorded; ms of CPU time):\n", s.CPUs, s.Runs)
	fusebox := s.FuseboxMs > 0 // another fusebox process ran: a manager apart
	for _, a := range s.Slowest {
		fusebox = fusebox || a.FuseboxMs > 0
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	row := func(first string, a bench.SchedAlloc) {
		fmt.Fprintf(w, "%s\t%.2f\t%.2f\t", first, a.BenchMs, a.GVisorMs)
		if fusebox {
			fmt.Fprintf(w, "%.2f\t", a.FuseboxMs)
		}
		other := fmt.Sprintf("%.2f", a.OtherMs)
		if a.Other != "" {
			other += " (most: " + a.Other + ")"
		}
		fmt.Fprintf(w, "%s\t%.2f\t\n", other, a.IdleMs)
	}
	fmt.Fprint(w, "ALLOCATION MS\tTHIS PROCESS\tGVISOR\t")
	if fusebox {
		fmt.Fprint(w, "OTHER FUSEBOX\t")
	}
	fmt.Fprintln(w, "OTHER\tIDLE\t")
	row("mean", bench.SchedAlloc{BenchMs: s.BenchMs, GVisorMs: s.GVisorMs, FuseboxMs: s.FuseboxMs, OtherMs: s.OtherMs, IdleMs: s.IdleMs})
	for _, a := range s.Slowest {
		row(fmt.Sprintf("%.2f", a.TotalMs), a)
	}
	w.Flush()
	fmt.Printf("of the %d allocations slower than the p90, %d had other processes on the CPUs for %.1f ms or more; the p99 of the %d allocations that did not: %.2f ms\n",
		s.TailRuns, s.TailWithOther, s.OtherThresholdMs, s.WithoutOtherRuns, s.WithoutOtherP99Ms)
	if s.Lost {
		fmt.Println("the kernel lost switches before they were drained (its buffer overflowed): some allocations' figures are incomplete or missing")
	}
}

func benchSDKCmd() *cobra.Command {
	var o bench.SDKOptions
	var mgrTLS managerflags.TLS
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sdk --manager ADDR",
		Short: "The Go SDK's data-plane figures in one sandbox allocated from a running manager",
		Long: `Allocates one sandbox from the manager at --manager (unix:///path or tcp://host:port) and
measures, with the Go SDK's default options over one pinned connection: exec round trips of
'true', and 3,000 files of 4 KiB of random bytes in 50 directories written with WriteFiles and
read back through the plan with every byte compared (each the median of 5 rounds), and one
file of --stream-mib random MiB streamed out with ReadFileTo, compared as it arrives. The
workloads are those of 'fusebox-bench dataplane', in a sandbox of the manager's template,
limits and image, so that another SDK measured against the same manager (client/python's
bench.py) compares like with like. The sandbox is released at the end.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Manager == "" {
				return fmt.Errorf("--manager is required (unix:///path or tcp://host:port)")
			}
			o.ManagerOptions = mgrTLS.Options()
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			r, err := bench.SDK(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "exec round trip of true (p50/p99)\t%.3f / %.3f ms\n", r.ExecRoundtripP50Ms, r.ExecRoundtripP99Ms)
			printFigure(w, "write small files", r.Materialize)
			printFigure(w, "read them back", r.Read)
			printFigure(w, "stream one file out", r.StreamRead)
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Manager, "manager", "", "the running manager's address (unix:///path or tcp://host:port)")
	f.IntVar(&o.ExecRuns, "exec-runs", 300, "round trips of true")
	f.IntVar(&o.StreamMiB, "stream-mib", 256, "size of the file streamed out, in MiB")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	mgrTLS.Register(f)
	return cmd
}

// printFigure writes one figure as a table row: its value and what it measured.
func printFigure(w io.Writer, name string, f bench.Figure) {
	what := fmt.Sprintf("%d x %d B, %s, %d dirs", f.Files, f.FileBytes, f.Data, f.Dirs)
	if f.Files == 1 {
		what = fmt.Sprintf("one %d MiB file, %s", f.FileBytes>>20, f.Data)
	}
	if f.Verified {
		what += ", every byte verified"
	}
	val := fmt.Sprintf("%.3f s", f.Seconds)
	if f.MiBPerS > 0 {
		val = fmt.Sprintf("%.0f MiB/s", f.MiBPerS)
	}
	if f.RPCs > 0 {
		val += fmt.Sprintf(" in %d RPCs", f.RPCs)
	}
	fmt.Fprintf(w, "%s\t%s\t(%s; client %s; median of %d)\n", name, val, what, f.Client, f.Rounds)
}

// file is a file a benchmark needs: its path, what it is, and how to get it.
type file struct{ path, what, build, flag string }

func runscFile(path string) file { return file{path, "runsc", "make runsc", "--runsc"} }

func sandboxFile(path string) file {
	return file{path, "fusebox-sandbox", "make build", "--sandbox-binary"}
}

// needFiles reports the first of files that is not there, with how to build it.
func needFiles(files ...file) error {
	for _, f := range files {
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s not found at %s: build it with `%s` or pass %s", f.what, f.path, f.build, f.flag)
		}
	}
	return nil
}

func benchUnpackCmd() *cobra.Command {
	var o bench.UnpackOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "unpack",
		Short: "Unpacking an image into the template layer store, against tar -x of the same layers",
		Long: `Makes a synthetic image (--mib of files from 1 KiB to 4 MiB, half text-like and half
random bytes, with hard links, symbolic links and whiteouts, in --layers gzip layers) and
unpacks it, in alternating rounds, with fusebox's unpacking into its content-addressed layer
store (what fusebox local up does once per template image: every layer read, decompressed,
checked and written, whiteouts applied, the result synced) and with GNU tar -xzf of the same
layer files in order into a directory on the same disk, followed by a sync of that file
system. Prints the median of each and their ratio. Run as root, as the manager runs (both
keep owners).`,
		Example: `  fusebox-bench unpack --json
  fusebox-bench unpack --mib 300 --layers 6 --rounds 5 --dir /var/tmp`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			r, err := bench.Unpack(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "image\t%.0f MiB (%.0f MiB compressed), %d layers, %d files\n", r.ImageMiB, r.CompressedMiB, r.Layers, r.Files)
			fmt.Fprintf(w, "unpack into the layer store (median of %d)\t%.3f s\n", r.Rounds, r.UnpackS)
			fmt.Fprintf(w, "tar -xzf of the same layers, then sync\t%.3f s\n", r.TarS)
			fmt.Fprintf(w, "  against tar\t%.2fx\n", r.VsTar)
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "/var/tmp", "where the layers are written and both unpack into (one disk for both)")
	f.IntVar(&o.MiB, "mib", 300, "the image's uncompressed size in MiB")
	f.IntVar(&o.Layers, "layers", 6, "its layers")
	f.IntVar(&o.Rounds, "rounds", 3, "unpacks of each side, alternating which goes first")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func benchTemplatesCmd() *cobra.Command {
	var o bench.TemplatesOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "templates --image LAYOUT --template-image IMAGE@sha256:...",
		Short: "A template's pool against the default template's: cold starts and warm allocations",
		Long: `Starts one manager with the runsc allocator in this process, with two pools: the default
template's, from --image (the sandbox image, as fusebox local up --image), and a template's,
from --template-image (an image pinned by digest that holds nothing of fusebox: the sandbox
server is bound into it read-only, as for every template). It measures cold starts of each
(an empty pool; the allocation waits for its sandbox's creation), alternating, then warm
allocations of each (both pools full and idle, the next sandbox past gVisor's warm-up), one of
each per round in a shuffled order. Every figure is Allocate over gRPC with sFuse and the first
data-plane call, as an agent sees it. Reading and unpacking the images happens at the start
and is shown apart. Needs root.`,
		Example: `  fusebox-bench templates --image bin/images/sandbox --template-image /srv/layouts/python@sha256:... --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needFiles(runscFile(o.Runsc), sandboxFile(o.SandboxBinary)); err != nil {
				return err
			}
			if o.Image == "" || o.TemplateImage == "" {
				return fmt.Errorf("--image and --template-image are both required")
			}
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			daemon.TuneGC() // this process runs the manager, as fusebox local up does
			r, err := bench.Templates(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(r)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(w, "start: both images read and unpacked\t%.3f s\n", r.StartS)
			fmt.Fprintf(w, "cold start p50, default / template (%d each)\t%.1f / %.1f ms (%.2fx)\n", r.ColdRuns, r.ColdDefaultP50Ms, r.ColdTemplateP50Ms, r.ColdVsDefault)
			fmt.Fprintf(w, "warm allocation p50, default / template (%d each)\t%.2f / %.2f ms (%.2fx)\n", r.Runs, r.WarmDefaultP50Ms, r.WarmTemplateP50Ms, r.WarmVsDefault)
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Runsc, "runsc", daemoncmd.EnvOr("FUSEBOX_RUNSC", daemoncmd.DefaultRunsc), "path of the pinned runsc")
	f.StringVar(&o.SandboxBinary, "sandbox-binary", daemoncmd.SiblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox binary")
	f.StringVar(&o.Image, "image", "", "the default template's image: an OCI image layout directory (fusebox image build writes bin/images/sandbox) or a registry reference")
	f.StringVar(&o.TemplateImage, "template-image", "", "the template's image, pinned by digest: REGISTRY/PATH@sha256:HEX or /ABS/LAYOUT@sha256:HEX")
	f.IntVar(&o.Runs, "runs", 30, "warm allocations of each template")
	f.IntVar(&o.ColdRuns, "cold-runs", 5, "cold starts of each template")
	f.DurationVar(&o.Settle, "settle", 100*time.Millisecond, "how long both pools idle, full, before each warm allocation")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

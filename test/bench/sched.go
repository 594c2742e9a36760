package bench

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/internal/schedtrace"
)

// Sched is who had the machine's CPUs during each warm allocation (fusebox-bench allocate
// --sched), from the kernel's context switches: this process (the agent and the manager),
// gVisor (the sandboxes and runsc), other processes, and nobody (idle). It tells an
// allocation that was slow because something else on the machine ran from one that was slow
// on its own.
type Sched struct {
	Runs int `json:"runs"`
	CPUs int `json:"cpus"`
	// Means over the allocations of CPU time per class (summed over CPUs), ms.
	BenchMs  float64 `json:"bench_ms"`
	GVisorMs float64 `json:"gvisor_ms"`
	// FuseboxMs is other fusebox processes: a manager running apart (--manager), or the
	// process allocator's sandboxes.
	FuseboxMs float64 `json:"fusebox_ms"`
	OtherMs   float64 `json:"other_ms"`
	IdleMs    float64 `json:"idle_ms"`
	// TailRuns allocations were slower than the p90; TailWithOther of them had other
	// processes on the CPUs for at least OtherThresholdMs.
	TailRuns         int     `json:"tail_runs"`
	TailWithOther    int     `json:"tail_with_other"`
	OtherThresholdMs float64 `json:"other_threshold_ms"`
	// WithoutOtherP99Ms is the p99 of the allocations that had other processes on the CPUs
	// for less than OtherThresholdMs (WithoutOtherRuns of them): what this machine's
	// neighbours cost the figure, not a figure to quote alone.
	WithoutOtherRuns  int          `json:"without_other_runs"`
	WithoutOtherP99Ms float64      `json:"without_other_p99_ms"`
	Slowest           []SchedAlloc `json:"slowest"`
	// allocs are every recorded allocation, in order (WriteCSV).
	allocs []SchedAlloc
	// Lost: the kernel lost switches before they were drained; some allocations' figures are
	// incomplete or missing.
	Lost bool   `json:"lost,omitempty"`
	Note string `json:"note"`
}

// SchedAlloc is one allocation's CPU time by class.
type SchedAlloc struct {
	TotalMs   float64 `json:"total_ms"`
	BenchMs   float64 `json:"bench_ms"`
	GVisorMs  float64 `json:"gvisor_ms"`
	FuseboxMs float64 `json:"fusebox_ms"`
	OtherMs   float64 `json:"other_ms"`
	IdleMs    float64 `json:"idle_ms"`
	// Other names the other task that ran longest ("" if none did).
	Other string `json:"other,omitempty"`
	// From and To are the allocation's window on the recording's clock (perf's, see
	// schedtrace.Start), for lining it up with a perf recording.
	From, To time.Duration `json:"-"`
}

// otherThreshold is how much CPU time of other processes marks an allocation as disturbed.
const otherThreshold = 500 * time.Microsecond

// schedPrefix starts the marks of a warm allocation: "fusebox-alloc:start N", ":end N".
const schedPrefix = "fusebox-alloc:"

// schedMarks records a run of allocations (--sched): startSched before them, start and end
// around each, drain between them (outside the timed window: a drain is work for a CPU),
// finish after. Each drain attributes the allocations that ended and forgets their switches,
// so the benchmark's process does not hold a whole run's worth (which its collector would
// then mark). A nil *schedMarks does nothing.
type schedMarks struct {
	rec    *schedtrace.Recorder
	n      int
	err    error              // the first failed mark or drain
	allocs map[int]SchedAlloc // by allocation, without TotalMs
	cpus   int
}

func startSched() (*schedMarks, error) {
	rec, err := schedtrace.Start(0)
	if err != nil {
		return nil, fmt.Errorf("--sched: %w", err)
	}
	return &schedMarks{rec: rec, allocs: map[int]SchedAlloc{}}, nil
}

func (s *schedMarks) start() {
	if s != nil && s.err == nil {
		s.err = s.rec.Mark(schedPrefix + "start " + strconv.Itoa(s.n))
	}
}

func (s *schedMarks) end() {
	if s != nil && s.err == nil {
		s.err = s.rec.Mark(schedPrefix + "end " + strconv.Itoa(s.n))
		s.n++
	}
}

// drain moves the kernel's buffer into memory and attributes the allocations that ended.
func (s *schedMarks) drain() error {
	if s == nil {
		return nil
	}
	t, err := s.rec.Drain()
	if err != nil {
		return err
	}
	return s.collect(t)
}

// collect attributes the allocations whose windows t holds, then forgets t up to the end of
// the last of them.
func (s *schedMarks) collect(t *schedtrace.Trace) error {
	self, err := schedtrace.SelfThreads()
	if err != nil {
		return err
	}
	s.cpus = max(s.cpus, t.CPUs())
	t.Forget(attributeWindows(t, self, s.allocs))
	return nil
}

// attributeWindows attributes every marked allocation's window in t into allocs (by
// allocation number) and returns the end of the last of them.
func attributeWindows(t *schedtrace.Trace, self map[int]bool, allocs map[int]SchedAlloc) time.Duration {
	var last time.Duration
	for key, w := range t.Windows(schedPrefix) {
		if i, err := strconv.Atoi(key); err == nil {
			allocs[i] = attribute(t, w, self)
			last = max(last, w.To)
		}
	}
	return last
}

// finish stops the recording and attributes the allocations whose times are totals (ms, in
// order), writing them to csvPath if it is set; runErr is the run's own error, returned as it
// is (the recording is dropped).
func (s *schedMarks) finish(totals []float64, runErr error, csvPath string) (*Sched, error) {
	t, err := s.rec.Stop()
	if runErr != nil {
		return nil, runErr
	}
	if err := errors.Join(s.err, err); err != nil {
		return nil, fmt.Errorf("--sched: %w", err)
	}
	if err := s.collect(t); err != nil {
		return nil, err
	}
	sum, err := summarize(totals, s.allocs, s.cpus, t.Lost)
	if err != nil || csvPath == "" {
		return sum, err
	}
	if err := writeFile(csvPath, sum.WriteCSV); err != nil {
		return nil, fmt.Errorf("writing the scheduler's figures: %w", err)
	}
	return sum, nil
}

// attribute splits the CPU time of window w between the classes (TotalMs left 0).
func attribute(t *schedtrace.Trace, w schedtrace.Window, self map[int]bool) SchedAlloc {
	a := SchedAlloc{From: w.From, To: w.To}
	var other, top time.Duration
	for task, d := range t.Usage(w.From, w.To) {
		switch {
		case task.PID == 0:
			a.IdleMs += ms(d)
		case self[task.PID]:
			a.BenchMs += ms(d)
		case gvisorTask(task.Comm):
			a.GVisorMs += ms(d)
		case strings.HasPrefix(task.Comm, "fusebox"):
			a.FuseboxMs += ms(d)
		default:
			other += d
			if d > top {
				top, a.Other = d, task.Comm
			}
		}
	}
	a.OtherMs = ms(other)
	return a
}

// summarize puts the attributed allocations (by index into totals, the measured times in ms)
// together; an allocation without a window (lost) is left out.
func summarize(totals []float64, allocs map[int]SchedAlloc, cpus int, lost bool) (*Sched, error) {
	s := &Sched{CPUs: cpus, Lost: lost, OtherThresholdMs: ms(otherThreshold),
		Note: "CPU time (summed over CPUs) during each warm allocation, from the kernel's sched_switch events: bench is this process (the agent, and the manager unless it runs apart), gvisor the sandboxes' and runsc's processes, fusebox other fusebox processes (a manager running apart), other every other task, idle nobody"}
	var all []SchedAlloc
	for i, total := range totals {
		a, ok := allocs[i]
		if !ok {
			continue // lost in an overflowed buffer
		}
		a.TotalMs = total
		all = append(all, a)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("the scheduler trace holds none of the %d allocations' marks (lost: %v)", len(totals), lost)
	}
	s.Runs = len(all)
	s.allocs = slices.Clone(all)
	p90 := pct(totals, 90)
	var clean []float64
	for _, a := range all {
		s.BenchMs += a.BenchMs / float64(len(all))
		s.GVisorMs += a.GVisorMs / float64(len(all))
		s.FuseboxMs += a.FuseboxMs / float64(len(all))
		s.OtherMs += a.OtherMs / float64(len(all))
		s.IdleMs += a.IdleMs / float64(len(all))
		disturbed := a.OtherMs >= ms(otherThreshold)
		if a.TotalMs > p90 {
			s.TailRuns++
			if disturbed {
				s.TailWithOther++
			}
		}
		if !disturbed {
			clean = append(clean, a.TotalMs)
		}
	}
	s.WithoutOtherRuns = len(clean)
	if len(clean) > 0 {
		s.WithoutOtherP99Ms = pct(clean, 99)
	}
	s.BenchMs, s.GVisorMs, s.FuseboxMs, s.OtherMs, s.IdleMs = round(s.BenchMs), round(s.GVisorMs), round(s.FuseboxMs), round(s.OtherMs), round(s.IdleMs)
	sort.Slice(all, func(i, j int) bool { return all[i].TotalMs > all[j].TotalMs })
	for _, a := range all[:min(5, len(all))] {
		a.BenchMs, a.GVisorMs, a.FuseboxMs, a.OtherMs, a.IdleMs = round(a.BenchMs), round(a.GVisorMs), round(a.FuseboxMs), round(a.OtherMs), round(a.IdleMs)
		s.Slowest = append(s.Slowest, a)
	}
	return s, nil
}

// WriteCSV writes every recorded allocation's CPU time by class, one row each, in order.
func (s *Sched) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"total_ms", "bench_ms", "gvisor_ms", "fusebox_ms", "other_ms", "idle_ms", "other", "from_s", "to_s"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 6, 64) }
	for _, a := range s.allocs {
		if err := cw.Write([]string{f(a.TotalMs), f(a.BenchMs), f(a.GVisorMs), f(a.FuseboxMs), f(a.OtherMs), f(a.IdleMs), a.Other, sec(a.From), sec(a.To)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// gvisorTask reports whether a task named comm is gVisor's: runsc re-executes itself
// (/proc/self/exe) for the sandbox, the gofer and the platform's stub processes, all "exe".
func gvisorTask(comm string) bool {
	return comm == "exe" || strings.HasPrefix(comm, "runsc")
}

package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/schedtrace"
)

// Two allocations on two CPUs: in the first (1 ms) this process (tid 7) and gVisor ("exe")
// share the CPUs; in the second (2 ms) a neighbour ("noisy") takes CPU 1 for 1.5 ms and
// another fusebox process (a manager apart, tid 70) CPU 0 for its last 0.2 ms.
const schedSample = `
 a-7 [000] d..2. 10.000000: sched_switch: prev_comm=x prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=fusebox next_pid=7 next_prio=120
 a-0 [001] d..2. 10.000000: sched_switch: prev_comm=x prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=exe next_pid=30 next_prio=120
 a-7 [000] ...1. 10.000000: tracing_mark_write: fusebox-alloc:start 0
 a-7 [000] d..2. 10.000600: sched_switch: prev_comm=fusebox prev_pid=7 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
 a-7 [000] ...1. 10.001000: tracing_mark_write: fusebox-alloc:end 0
 a-7 [000] ...1. 10.100000: tracing_mark_write: fusebox-alloc:start 1
 a-0 [001] d..2. 10.100000: sched_switch: prev_comm=exe prev_pid=30 prev_prio=120 prev_state=S ==> next_comm=noisy next_pid=50 next_prio=120
 a-0 [001] d..2. 10.101500: sched_switch: prev_comm=noisy prev_pid=50 prev_prio=120 prev_state=S ==> next_comm=runsc next_pid=60 next_prio=120
 a-0 [000] d..2. 10.101800: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=fusebox next_pid=70 next_prio=120
 a-7 [000] ...1. 10.102000: tracing_mark_write: fusebox-alloc:end 1
`

func TestSchedSummary(t *testing.T) {
	tr, err := schedtrace.Parse(strings.NewReader(schedSample))
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedSummary(tr, []float64{1, 2}, map[int]bool{7: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Runs != 2 || s.CPUs != 2 || len(s.Slowest) != 2 {
		t.Fatalf("summary %+v", s)
	}
	slow, fast := s.Slowest[0], s.Slowest[1]
	if fast != (SchedAlloc{TotalMs: 1, BenchMs: 0.6, GVisorMs: 1, IdleMs: 0.4, From: 10 * time.Second, To: 10001 * time.Millisecond}) {
		t.Errorf("first allocation %+v", fast)
	}
	// CPU 0: idle 1.8 ms, then the other fusebox 0.2; CPU 1: noisy 1.5 ms, then runsc 0.5 ms.
	if slow != (SchedAlloc{TotalMs: 2, GVisorMs: 0.5, FuseboxMs: 0.2, OtherMs: 1.5, IdleMs: 1.8, Other: "noisy",
		From: 10100 * time.Millisecond, To: 10102 * time.Millisecond}) {
		t.Errorf("second allocation %+v", slow)
	}
	// The p90 of two is the slower: no allocation is slower, so no tail; the disturbed one
	// is left out of the p99 without neighbours.
	if s.TailRuns != 0 || s.WithoutOtherRuns != 1 || s.WithoutOtherP99Ms != 1 {
		t.Errorf("tail %d, without other %d (p99 %v)", s.TailRuns, s.WithoutOtherRuns, s.WithoutOtherP99Ms)
	}
	var csv strings.Builder
	if err := s.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	wantCSV := "total_ms,bench_ms,gvisor_ms,fusebox_ms,other_ms,idle_ms,other,from_s,to_s\n" +
		"1.000,0.600,1.000,0.000,0.000,0.400,,10.000000,10.001000\n" +
		"2.000,0.000,0.500,0.200,1.500,1.800,noisy,10.100000,10.102000\n"
	if csv.String() != wantCSV {
		t.Errorf("CSV:\n%s\nwant:\n%s", csv.String(), wantCSV)
	}
	if _, err := schedSummary(tr, []float64{1, 2, 3}, nil); err != nil {
		t.Errorf("an allocation without marks (lost) failed the summary: %v", err)
	}
	if _, err := schedSummary(&schedtrace.Trace{}, []float64{1}, nil); err == nil {
		t.Error("a trace without any allocation's marks gave a summary")
	}
}

// schedSummary attributes each marked allocation's window in t, as a run's drains and finish
// do; totals[i] is allocation i's measured time (ms). self are this process's thread ids.
func schedSummary(t *schedtrace.Trace, totals []float64, self map[int]bool) (*Sched, error) {
	allocs := map[int]SchedAlloc{}
	attributeWindows(t, self, allocs)
	return summarize(totals, allocs, t.CPUs(), t.Lost)
}

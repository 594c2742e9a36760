package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/sandbox-server/server"
)

// Steps is where warm allocations' time goes (fusebox-bench allocate --trace): each step's
// median and 90th percentile over the traced allocations, and which steps make the slowest
// ones slow.
type Steps struct {
	Runs     int     `json:"runs"`
	Steps    []Step  `json:"steps"`
	Note     string  `json:"note"`
	Total    float64 `json:"total_p50_ms"`
	TotalP90 float64 `json:"total_p90_ms"`
	// TailRuns is how many allocations took longer than TotalP90 (the tail Step.TailExcessMs
	// describes).
	TailRuns int `json:"tail_runs"`
}

// Step is one step of an allocation.
type Step struct {
	Name  string  `json:"step"`
	What  string  `json:"what"`
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	// TailExcessMs is, over the allocations slower than the total's 90th percentile, the mean
	// of this step's time less its median: the step's share of what makes them slow.
	TailExcessMs float64 `json:"tail_excess_ms"`
}

// stepNames are the steps between consecutive marks of a traced allocation, in order.
var stepNames = []struct{ name, what string }{
	{"agent_to_manager", "the agent's Allocate reaching the manager's sFuse call"},
	{"manager_to_sandbox", "InitializeTLS reaching its handler in the sandbox"},
	{"sandbox_init", "the sandbox's handler: pinning the key, starting the data plane"},
	{"sandbox_to_manager", "InitializeTLS's answer reaching the manager"},
	{"manager_to_agent", "the manager's answer reaching the agent"},
	{"agent_connect", "the agent's data connection, dialed"},
	{"handshake", "the TLS handshake, up to its end on the sandbox's side"},
	{"sandbox_transport", "the sandbox's gRPC server transport, up to the first call's handler"},
	{"sandbox_call", "the first call's handler (Stat)"},
	{"sandbox_to_agent", "the first call's answer reaching the agent"},
}

// tracer collects the marks of one allocation at a time: the agent's and the manager's (in
// this process) and the sandbox's (from its log's "allocation timeline").
type tracer struct {
	mu           sync.Mutex
	sfuse        [2]time.Time // the manager's sFuse call: start, end
	marks        [][]int64    // per traced allocation: Unix ns of each mark
	missing      int          // allocations without a complete timeline
	waitForLines time.Duration
}

// initializer wraps the manager's sFuse call to time it.
func (t *tracer) initializer(init manager.Initializer) manager.Initializer {
	return func(ctx context.Context, addr string, req sfuse.Request) (sfuse.Result, error) {
		start := time.Now()
		r, err := init(ctx, addr, req)
		t.mu.Lock()
		t.sfuse = [2]time.Time{start, time.Now()}
		t.mu.Unlock()
		return r, err
	}
}

// agentMarks are when the agent's steps happened (see client.AllocateTrace).
type agentMarks struct{ answered, connected time.Time }

// record adds one allocation: it began at start, the agent's steps are in ct, its first call
// returned at done, and its sandbox's log is at logPath (read while the sandbox exists).
func (t *tracer) record(start, done time.Time, ct agentMarks, logPath string) {
	tl, ok := t.readTimeline(logPath)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !ok || ct.answered.IsZero() || ct.connected.IsZero() {
		t.missing++
		return
	}
	t.marks = append(t.marks, []int64{start.UnixNano(), t.sfuse[0].UnixNano(), tl.InitReceived, tl.InitAnswered,
		t.sfuse[1].UnixNano(), ct.answered.UnixNano(), ct.connected.UnixNano(), tl.HandshakeDone,
		tl.FirstCallStart, tl.FirstCallEnd, done.UnixNano()})
}

// readTimeline waits for the sandbox's timeline in its log (written a few ms after the first
// call) and returns it.
func (t *tracer) readTimeline(path string) (server.Timeline, bool) {
	deadline := time.Now().Add(t.waitForLines)
	for {
		if b, err := os.ReadFile(path); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if tl, ok := server.ParseTimeline(sc.Bytes()); ok && tl.InitReceived != 0 && tl.FirstCallEnd != 0 {
					return tl, true
				}
			}
		}
		if time.Now().After(deadline) {
			return server.Timeline{}, false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// steps summarises the recorded allocations.
func (t *tracer) steps() (*Steps, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.marks) == 0 {
		return nil, fmt.Errorf("trace: no allocation with a complete timeline (%d without)", t.missing)
	}
	s := &Steps{Runs: len(t.marks), Note: "consecutive marks of each allocation: the agent's and the manager's in the bench process, the sandbox's from its server log (its clock, which gVisor keeps in step with the host's once the sandbox has warmed up; a step across the boundary may be off by some microseconds, and may be negative by as much); tail_excess_ms: over the allocations slower than total_p90_ms, the mean of each step less its median"}
	rows := t.rowsLocked()
	total := column(rows, 0)
	s.Total, s.TotalP90 = round(pct(total, 50)), round(pct(total, 90))
	var tail [][]float64
	for _, r := range rows {
		if r[0] > s.TotalP90 {
			tail = append(tail, r)
		}
	}
	s.TailRuns = len(tail)
	for i, n := range stepNames {
		d := column(rows, i+1)
		st := Step{Name: n.name, What: n.what, P50Ms: round(pct(d, 50)), P90Ms: round(pct(d, 90))}
		if len(tail) > 0 {
			var excess float64
			for _, r := range tail {
				excess += r[i+1] - st.P50Ms
			}
			st.TailExcessMs = round(excess / float64(len(tail)))
		}
		s.Steps = append(s.Steps, st)
	}
	if t.missing > 0 {
		s.Note += fmt.Sprintf("; %d allocations had no complete timeline and are left out", t.missing)
	}
	return s, nil
}

// rowsLocked returns one row per traced allocation, in milliseconds: its total, then each
// step of stepNames.
func (t *tracer) rowsLocked() [][]float64 {
	rows := make([][]float64, 0, len(t.marks))
	for _, m := range t.marks {
		r := []float64{float64(m[len(m)-1]-m[0]) / 1e6}
		for i := 1; i < len(m); i++ {
			r = append(r, float64(m[i]-m[i-1])/1e6)
		}
		rows = append(rows, r)
	}
	return rows
}

func column(rows [][]float64, i int) []float64 {
	c := make([]float64, len(rows))
	for j, r := range rows {
		c[j] = r[i]
	}
	return c
}

// writeCSV writes every traced allocation as a row: its total and each step, in
// milliseconds, with a header naming them (fusebox-bench allocate --trace-csv).
func (t *tracer) writeCSV(w io.Writer) error {
	t.mu.Lock()
	rows := t.rowsLocked()
	t.mu.Unlock()
	cw := csv.NewWriter(w)
	header := []string{"total_ms"}
	for _, n := range stepNames {
		header = append(header, n.name+"_ms")
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, r := range rows {
		rec := make([]string, len(r))
		for i, v := range r {
			rec[i] = strconv.FormatFloat(v, 'f', 3, 64)
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

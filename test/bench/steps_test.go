package bench

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	"github.com/fusebox-dev/fusebox/sandbox-server/server"
)

// at is ms milliseconds into a traced allocation (of the tests' fixed clock).
func at(ms float64) time.Time {
	return time.Unix(1_800_000_000, 0).Add(time.Duration(ms * float64(time.Millisecond)))
}

// traceFixture is a tracer that saw the manager's sFuse call from 0.5 to 2.5 ms, and a
// sandbox log whose timeline has InitializeTLS from 1 to 2 ms, the handshake done at 5 and the
// first call from 6 to 7 (the data connection accepted at 3.5), after the lines before.
func traceFixture(t *testing.T, before string) (tr *tracer, log string) {
	t.Helper()
	ns := func(ms float64) int64 { return at(ms).UnixNano() }
	log = filepath.Join(t.TempDir(), "server.log")
	var line bytes.Buffer
	server.LogTimeline(slog.New(slog.NewJSONHandler(&line, nil)), server.Timeline{InitReceived: ns(1), InitAnswered: ns(2),
		DataAccepted: ns(3.5), HandshakeDone: ns(5), FirstCallStart: ns(6), FirstCallEnd: ns(7)})
	if err := os.WriteFile(log, append([]byte(before), line.Bytes()...), 0o600); err != nil {
		t.Fatal(err)
	}
	tr = &tracer{waitForLines: 10 * time.Millisecond}
	tr.sfuse = [2]time.Time{at(0.5), at(2.5)}
	return tr, log
}

// agentAt are the agent's marks of the fixture: the answer at 3 ms, the data connection at 4.
var agentAt = agentMarks{at(3), at(4)}

// The tracer reads the sandbox's timeline from its log and reports each step between
// consecutive marks; an allocation without a timeline is counted and left out.
func TestTracerSteps(t *testing.T) {
	tr, log := traceFixture(t, "{\"msg\":\"sandbox server waiting\"}\nnot json\n")
	tr.record(at(0), at(8), agentAt, log)
	tr.record(at(0), at(8), agentAt, filepath.Join(filepath.Dir(log), "missing.log"))
	s, err := tr.steps()
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.5, 0.5, 1, 0.5, 0.5, 1, 1, 1, 1, 1}
	if s.Runs != 1 || len(s.Steps) != len(want) || s.Total != 8 {
		t.Fatalf("steps %+v, want 1 run of %d steps, 8 ms in all", s, len(want))
	}
	for i, st := range s.Steps {
		if st.P50Ms != want[i] || st.P90Ms != want[i] {
			t.Errorf("%s: p50 %v p90 %v, want %v", st.Name, st.P50Ms, st.P90Ms, want[i])
		}
	}
	if tr.missing != 1 {
		t.Errorf("missing = %d, want 1", tr.missing)
	}
	if _, err := (&tracer{}).steps(); err == nil {
		t.Error("steps of nothing: no error")
	}
}

// The slowest tenth of the allocations is put down to the steps that made it slow, and the
// CSV has one row per allocation: its total, then each step.
func TestTracerTailAndCSV(t *testing.T) {
	tr, log := traceFixture(t, "")
	for i := range 10 {
		done := at(8)
		if i == 3 {
			done = at(13) // the first call's answer took 5 ms longer
		}
		tr.record(at(0), done, agentAt, log)
	}
	s, err := tr.steps()
	if err != nil {
		t.Fatal(err)
	}
	if s.Total != 8 || s.TotalP90 != 8 || s.TailRuns != 1 {
		t.Fatalf("total p50 %v p90 %v, %d in the tail; want 8, 8, 1", s.Total, s.TotalP90, s.TailRuns)
	}
	for _, st := range s.Steps {
		want := 0.0
		if st.Name == "sandbox_to_agent" {
			want = 5
		}
		if st.TailExcessMs != want {
			t.Errorf("%s: tail excess %v ms, want %v", st.Name, st.TailExcessMs, want)
		}
	}
	var b strings.Builder
	if err := tr.writeCSV(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 11 {
		t.Fatalf("%d CSV lines, want a header and 10 rows:\n%s", len(lines), b.String())
	}
	if want := "total_ms,agent_to_manager_ms,"; !strings.HasPrefix(lines[0], want) || !strings.HasSuffix(lines[0], ",sandbox_to_agent_ms") {
		t.Errorf("header %q", lines[0])
	}
	if want := "13.000,0.500,0.500,1.000,0.500,0.500,1.000,1.000,1.000,1.000,6.000"; lines[4] != want {
		t.Errorf("slow row %q, want %q", lines[4], want)
	}
}

// The steady-demand phase drives a real manager (here on the in-memory allocator) open loop
// and counts the allocations that found no ready unit: with creations slower than the
// demand, some must have.
func TestDemandCountsColdWaits(t *testing.T) {
	alloc := memalloc.New()
	alloc.Delay = 300 * time.Millisecond
	est := &switchable{}
	m, err := manager.New(manager.Options{Allocator: alloc, Estimator: est, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, ReconcileInterval: 20 * time.Millisecond, CreateConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	one := func(bool) (time.Duration, error) {
		start := time.Now()
		a, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
		if err != nil {
			return 0, err
		}
		return time.Since(start), m.Release(ctx, a.ID, a.LeaseToken)
	}
	var r AllocateResult
	if err := demand(ctx, m, est, one, 20, 40, &r); err != nil {
		t.Fatal(err)
	}
	if r.DemandRuns != 20 || r.DemandPerS <= 0 || r.DemandP50Ms <= 0 || r.DemandP99Ms < r.DemandP50Ms {
		t.Errorf("result %+v: want 20 runs with a rate and latencies", r)
	}
	if r.DemandColdWaits == 0 || r.DemandColdWaits > 20 {
		t.Errorf("%d cold waits: 20 allocations at 40/s on a pool of 2 refilled in 300 ms must find it empty sometimes", r.DemandColdWaits)
	}
	if r.DemandPoolTargetMax < 2 {
		t.Errorf("pool target max %d, want at least the ewma floor of 2", r.DemandPoolTargetMax)
	}
}

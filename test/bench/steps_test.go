package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
)

// The tracer reads the sandbox's timeline from its log and reports each step between
// consecutive marks; an allocation without a timeline is counted and left out.
func TestTracerSteps(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	at := func(ms float64) time.Time { return base.Add(time.Duration(ms * float64(time.Millisecond))) }
	ns := func(ms float64) int64 { return at(ms).UnixNano() }
	dir := t.TempDir()
	log := filepath.Join(dir, "server.log")
	line := fmt.Sprintf(`{"time":"x","level":"INFO","msg":"allocation timeline","init_received_ns":%d,"init_answered_ns":%d,"data_accepted_ns":%d,"handshake_done_ns":%d,"first_call_start_ns":%d,"first_call_end_ns":%d}`,
		ns(1), ns(2), ns(3.5), ns(5), ns(6), ns(7))
	if err := os.WriteFile(log, []byte("{\"msg\":\"sandbox server waiting\"}\nnot json\n"+line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := &tracer{waitForLines: 10 * time.Millisecond}
	tr.sfuse = [2]time.Time{at(0.5), at(2.5)}
	tr.record(at(0), at(8), client.AllocateTrace{Answered: at(3), Finished: at(4)}, log)
	tr.record(at(0), at(8), client.AllocateTrace{Answered: at(3), Finished: at(4)}, filepath.Join(dir, "missing.log"))
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

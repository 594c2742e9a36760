package daemon

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	debug.SetGCPercent(100)
	if got := TuneGC(); got != GCPercent || debug.SetGCPercent(100) != GCPercent {
		t.Fatalf("without GOGC: TuneGC = %d, want %d in effect", got, GCPercent)
	}
	// GOGC set: the runtime read it at start; TuneGC leaves the value in effect alone.
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	if got := TuneGC(); got != 150 || debug.SetGCPercent(150) != 150 {
		t.Fatalf("with GOGC=150: TuneGC = %d, want 150 left in effect", got)
	}
}

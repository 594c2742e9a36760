package daemon

import (
	"os"
	"runtime/debug"
)

// GCPercent is the manager's garbage-collection target (GOGC) unless GOGC is set. The
// manager is on every allocation's path and its live heap is small (some 4 MiB), so at Go's
// default of 100 it collects every few seconds while the pool refills (each creation's runsc
// calls make garbage); a collection's mark workers then take both CPUs of a small node for a
// few milliseconds, and an allocation that meets one is that much slower (docs/performance.md).
// At 400 it collects a quarter as often, for a few MiB more memory.
const GCPercent = 400

// TuneGC sets the garbage collector's target to GCPercent unless the GOGC environment
// variable chooses one, and returns the target in effect. It is process-wide: call it from a
// process that runs a manager (fusebox local up, fusebox manager, the allocation benchmark).
func TuneGC() int {
	if v, ok := os.LookupEnv("GOGC"); ok && v != "" {
		p := debug.SetGCPercent(-1) // read the value GOGC set...
		debug.SetGCPercent(p)       // ...and put it back
		return p
	}
	debug.SetGCPercent(GCPercent)
	return GCPercent
}

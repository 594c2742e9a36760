// Package leakcheck fails a test that leaves goroutines behind.
package leakcheck

import (
	"runtime"
	"testing"
	"time"
)

// Check fails t if, once its cleanups have run, more goroutines are left than when it started
// (it waits up to 5 s for them to end). Call it first in the test, so that its cleanup runs
// last.
func Check(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutine leak: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// Package testenv holds what tests of several packages need to know of the environment they
// run in: where the module's source is, and a context that bounds a test.
package testenv

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// ModuleRoot is the directory of the module's go.mod, found from this file's location (a test
// runs in its package's directory, which may be anywhere below it).
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Context returns a context that ends when the test ends or after d, whichever comes first.
// The deadline only keeps a broken server or tool from hanging the test binary; no test
// asserts on how long anything takes.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Package runsctest runs real gVisor containers for integration tests and
// benchmarks: it locates the pinned runsc binary and guarantees that every
// container a test starts is gone when the test ends.
package runsctest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// DefaultBinary is where `make runsc` installs the pinned runsc.
const DefaultBinary = "/var/cache/fusebox/runsc-v0.0.0-20260905035102-160fafc42237/runsc"

// cleanupTimeout bounds the kill, delete and list of a test's cleanup.
const cleanupTimeout = 30 * time.Second

// next numbers the containers of this test binary.
var next atomic.Uint64

// Binary returns the path of the pinned runsc: $FUSEBOX_RUNSC if set, else
// DefaultBinary. If it is missing, or the test does not run as root (runsc
// needs root here), the test fails with instructions, so that CI cannot
// silently skip the gVisor tests; it is skipped instead only when
// FUSEBOX_SKIP_RUNSC=1.
func Binary(t testing.TB) string {
	t.Helper()
	skip := os.Getenv("FUSEBOX_SKIP_RUNSC") == "1"
	fail := func(format string, args ...any) {
		t.Helper()
		if skip {
			t.Skipf(format+" (skipped: FUSEBOX_SKIP_RUNSC=1)", args...)
		}
		t.Fatalf(format+"; set FUSEBOX_SKIP_RUNSC=1 to skip the gVisor tests", args...)
	}
	bin := os.Getenv("FUSEBOX_RUNSC")
	if bin == "" {
		bin = DefaultBinary
	}
	info, err := os.Stat(bin)
	if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
		fail("runsc binary %s is missing or not executable: build the pinned one with `make runsc`, or point $FUSEBOX_RUNSC at it", bin)
	}
	if os.Geteuid() != 0 {
		fail("the gVisor tests need root (runsc is run without --rootless)")
	}
	return bin
}

// Runtime returns a Runtime for the pinned runsc whose state directory is a
// fresh temporary directory of the test; a cleanup releases it (see
// runsc.Runtime.ReleaseRoot) once the test's containers are gone.
func Runtime(t testing.TB) *runsc.Runtime {
	t.Helper()
	rt := &runsc.Runtime{Binary: Binary(t), Root: filepath.Join(t.TempDir(), "runsc-root")}
	// Runs after the cleanups of the containers started later, and before
	// the temporary directory is removed.
	t.Cleanup(func() {
		if err := rt.ReleaseRoot(); err != nil {
			t.Errorf("releasing runsc root: %v", err)
		}
	})
	return rt
}

// Start writes spec's bundle (in a temporary directory if spec.Dir is
// empty), then creates and starts a container from it under a fresh Runtime
// (see Runtime) and returns the Runtime and the container id. A cleanup
// kills and deletes the container and fails the test if `runsc list` still
// shows it.
func Start(t testing.TB, spec runsc.BundleSpec) (*runsc.Runtime, string) {
	t.Helper()
	rt := Runtime(t)
	return rt, StartIn(t, rt, spec)
}

// idPrefix names this process's test containers: runsc makes each container's host cgroup
// from its id, so two test processes at once (two trees tested side by side) must not share
// ids, or one's container takes the other's cgroup and its limits.
var idPrefix = "test" + strconv.FormatInt(int64(os.Getpid()), 36)

// StartIn is Start under a given Runtime, for tests that run several
// containers under one runsc root.
func StartIn(t testing.TB, rt *runsc.Runtime, spec runsc.BundleSpec) string {
	t.Helper()
	if spec.Dir == "" {
		spec.Dir = filepath.Join(t.TempDir(), "bundle")
	}
	if err := runsc.WriteBundle(spec); err != nil {
		t.Fatalf("writing bundle: %v", err)
	}
	id := runsc.ID(idPrefix, next.Add(1))
	// Registered before Create, so that a half-created container is
	// removed too (Delete is idempotent).
	t.Cleanup(func() { Remove(t, rt, id) })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.Create(ctx, id, spec.Dir); err != nil {
		t.Fatalf("creating container %s: %v", id, err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("starting container %s: %v", id, err)
	}
	return id
}

// Remove kills every process of container id, deletes it, and fails the
// test if `runsc list` still shows it. It does nothing to a container that
// does not exist, so tests may remove containers themselves.
func Remove(t testing.TB, rt *runsc.Runtime, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := rt.Remove(ctx, id); err != nil {
		t.Errorf("deleting container %s: %v", id, err)
	}
	states, err := rt.List(ctx)
	if err != nil {
		t.Errorf("listing containers after deleting %s: %v", id, err)
		return
	}
	if slices.ContainsFunc(states, func(s runsc.State) bool { return s.ID == id }) {
		t.Errorf("container %s is still listed after delete: %+v", id, states)
	}
}

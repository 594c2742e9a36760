package managere2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mgr "github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// processesUnder returns the pids whose command line mentions dir.
func processesUnder(t *testing.T, dir string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

// A creation whose context ends part-way (the manager closing while it refills its pool)
// leaves no container, no sandbox process and no directory behind, wherever it was cut.
func TestCancelledCreationLeavesNothing(t *testing.T) {
	e := newEnv(t)
	a, err := runscalloc.New(runscalloc.Options{Runsc: e.Runsc, StateDir: e.StateDir, SandboxBinary: e.Sandbox})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	// A busy core, as when a manager refills its pool under load, stretches runsc's steps so
	// that the cuts land inside them (without it, the leak this guards against was not seen).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	for i := range 40 {
		after := time.Duration(i*4) * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), after)
		id := fmt.Sprintf("fbx-%012d", 900000000000+i)
		info, err := a.Create(ctx, id, mgr.DefaultTemplate)
		cancel()
		if err == nil {
			t.Logf("cancelled after %v: the creation finished first", after)
			if err := a.Destroy(context.Background(), info.ID); err != nil {
				t.Fatalf("destroying %s: %v", id, err)
			}
		}
		if ids := e.containers(t); len(ids) > 0 {
			t.Errorf("cancelled after %v: containers left: %v", after, ids)
		}
		if dirs := e.sandboxDirs(t); len(dirs) > 0 {
			t.Errorf("cancelled after %v: directories left: %v", after, dirs)
		}
		if pids := processesUnder(t, e.StateDir); len(pids) > 0 {
			t.Errorf("cancelled after %v: processes left: %v", after, pids)
		}
		if t.Failed() {
			return
		}
	}
}

// A sandbox that runsc does not record (a creation cut off with its SIGKILLed manager, before
// runsc wrote the container's state) is killed when the next manager's allocator starts on the
// state directory: no adoption or destroy could find it.
func TestNextManagerKillsUnrecordedSandboxes(t *testing.T) {
	e := newEnv(t)
	a, err := runscalloc.New(runscalloc.Options{Runsc: e.Runsc, StateDir: e.StateDir, SandboxBinary: e.Sandbox})
	if err != nil {
		t.Fatal(err)
	}
	const id = "fbx-000000000077"
	if _, err := a.Create(context.Background(), id, mgr.DefaultTemplate); err != nil {
		t.Fatal(err)
	}
	a.Shutdown(context.Background()) // as a manager killed now would: the sandbox stays
	if err := os.Remove(filepath.Join(e.RT.Root, id+"_sandbox:"+id+".state")); err != nil {
		t.Fatal(err)
	}
	if ids := e.containers(t); len(ids) != 0 {
		t.Fatalf("runsc still lists %v", ids)
	}
	if pids := processesUnder(t, filepath.Join(e.StateDir, "sandboxes", id)); len(pids) == 0 {
		t.Fatal("the sandbox's processes ended with the allocator: nothing to find")
	}
	next, err := runscalloc.New(runscalloc.Options{Runsc: e.Runsc, StateDir: e.StateDir, SandboxBinary: e.Sandbox})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Shutdown(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := processesUnder(t, filepath.Join(e.StateDir, "sandboxes", id))
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the unrecorded sandbox still run after the next allocator started: %v", pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

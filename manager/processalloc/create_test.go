package processalloc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/test/procstat"
)

// A creation cut short (its sandbox never listened) kills the process it started and removes
// its directory, even when the process is not the sandbox binary itself (a wrapper script
// that execs something else, which the pid file's check would not recognise).
func TestCancelledCreateLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "started.pid")
	script := filepath.Join(dir, "never-listens")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho $$ > "+pidFile+"\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	a, err := New(Options{Insecure: true, StateDir: state, SandboxBinary: script})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := a.Create(ctx, "unit-0001", manager.DefaultTemplate); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Create = %v, want the deadline's error", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the script did not start: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	deadline := time.Now().Add(5 * time.Second)
	for procstat.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs after the failed creation", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", "unit-0001")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unit's directory: %v, want it removed", err)
	}
	units, err := a.List(context.Background())
	if err != nil || len(units) != 0 {
		t.Errorf("List = %v, %v; want nothing", units, err)
	}
}

package sandboxtest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/syncbuf"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// ManagerOptions adjust an in-process manager.
type ManagerOptions struct {
	PoolSize int
	LeaseTTL time.Duration
	// Limits are the sandboxes' limits (zero fields: runscalloc.DefaultLimits).
	Limits runscalloc.Limits
}

// Manager is an in-process manager, daemon.Run with the runsc allocator and the fixed
// estimator, serving on a unix socket under a fresh state directory: what `fusebox local up`
// runs.
type Manager struct {
	StateDir string
	Socket   string // host path of the manager's socket
	Addr     string // unix:// address of Socket
	Log      *syncbuf.Buffer
	rt       *runsc.Runtime
	stop     context.CancelFunc
	done     chan error
}

// StartManager starts a manager that serves until the test ends, and returns once it serves.
// When the test ends it stops the manager, then removes whatever containers remain under its
// state directory (bound sandboxes outlive daemon.Run) and the directory itself.
func StartManager(t testing.TB, o ManagerOptions) *Manager {
	t.Helper()
	bin := runsctest.Binary(t)
	sb := SandboxBinary(t)
	// Short paths: a sandbox's socket path must fit sun_path (108 bytes).
	base, err := os.MkdirTemp("", "fbxm-")
	if err == nil {
		// Searchable, as the parents of a real state directory are: what keeps other host
		// users out is then the manager's own permissions.
		err = os.Chmod(base, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{StateDir: filepath.Join(base, "state"), Socket: filepath.Join(base, "run", "manager.sock"),
		Log: &syncbuf.Buffer{}, done: make(chan error, 1)}
	m.Addr = "unix://" + m.Socket
	m.rt = &runsc.Runtime{Binary: bin, Root: filepath.Join(m.StateDir, "runsc")}
	// Registered first, so it runs after the manager has stopped.
	t.Cleanup(func() { m.removeLeftovers(t, base) })

	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	ready := make(chan struct{}, 1)
	cfg := daemon.Config{Listen: m.Addr, Allocator: "runsc", StateDir: m.StateDir, Runsc: bin, SandboxBinary: sb,
		Estimator: "fixed", PoolSize: o.PoolSize, LeaseTTL: o.LeaseTTL, Limits: o.Limits,
		Ready: func(string) { ready <- struct{}{} }}
	go func() {
		m.done <- daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(m.Log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
		if t.Failed() {
			t.Logf("manager log:\n%s", m.Log)
		}
	})
	select {
	case <-ready:
	case err := <-m.done:
		m.done <- err
		t.Fatalf("daemon.Run returned before serving: %v\n%s", err, m.Log)
	case <-time.After(2 * time.Minute):
		t.Fatalf("the manager did not serve within 2 minutes\n%s", m.Log)
	}
	return m
}

// Stop ends daemon.Run and returns its error. It is idempotent.
func (m *Manager) Stop() error {
	m.stop()
	select {
	case err := <-m.done:
		m.done <- err
		return err
	case <-time.After(2 * time.Minute):
		return errors.New("daemon.Run did not return within 2 minutes of its context ending")
	}
}

// Containers returns the ids of the containers runsc lists under the state directory.
func (m *Manager) Containers(ctx context.Context) ([]string, error) {
	states, err := m.rt.List(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range states {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// removeLeftovers removes every container under the state directory, releases runsc's root
// and removes base.
func (m *Manager) removeLeftovers(t testing.TB, base string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A runsc create cut off by the manager's end records its container late, or never.
	killed, err := m.rt.KillOrphans(ctx, time.Minute)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, p := range killed {
		t.Logf("cleanup: killed runsc %s process %d, which runsc does not record", p.Command, p.Pid)
	}
	if states, err := m.rt.List(ctx); err == nil {
		for _, s := range states {
			if err := m.rt.Remove(ctx, s.ID); err != nil {
				t.Errorf("cleanup: deleting container %s: %v", s.ID, err)
			}
		}
	}
	if err := m.rt.ReleaseRoot(); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if err := os.RemoveAll(base); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

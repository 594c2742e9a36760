// Package processalloc runs each unit's fusebox-sandbox as a plain host process: no kernel
// boundary, no network isolation, no egress control. It exists for development on machines
// without gVisor, refuses to start unless explicitly allowed, and makes the manager log a
// warning on every allocation.
package processalloc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fusebox-dev/fusebox/internal/jsonfile"
	"github.com/fusebox-dev/fusebox/manager"
)

// ErrNotAllowed is returned by New without Insecure.
var ErrNotAllowed = errors.New("the process runtime has no kernel boundary: it runs generated code directly on this host; start it only with --insecure-process-runtime, for development")

// Options configure the allocator.
type Options struct {
	// Insecure must be set: it is the explicit acknowledgement that sandboxes are plain processes.
	Insecure      bool
	StateDir      string
	SandboxBinary string
	Logger        *slog.Logger
}

// Allocator runs units as host processes.
type Allocator struct {
	o    Options
	mu   sync.Mutex // guards cmds
	cmds map[string]*exec.Cmd
}

var (
	_ manager.Allocator = (*Allocator)(nil)
	_ manager.Annotator = (*Allocator)(nil)
)

// New refuses to return an allocator unless o.Insecure is set.
func New(o Options) (*Allocator, error) {
	if !o.Insecure {
		return nil, ErrNotAllowed
	}
	if o.StateDir == "" || o.SandboxBinary == "" {
		return nil, errors.New("processalloc: StateDir and SandboxBinary are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Join(o.StateDir, "sandboxes"), 0o700); err != nil {
		return nil, err
	}
	o.Logger.Warn("INSECURE: the process runtime runs generated code on this host without gVisor")
	return &Allocator{o: o, cmds: map[string]*exec.Cmd{}}, nil
}

func (a *Allocator) Name() string { return "process" }

// Capabilities: leases beside each process's records, creations on this host, and no
// isolation: the manager warns on every allocation that nothing, egress included, is enforced.
func (a *Allocator) Capabilities() manager.Capabilities {
	return manager.Capabilities{Adoption: true, NoIsolation: true, CreatesOnHost: true}
}

func (a *Allocator) dir(id string) string { return filepath.Join(a.o.StateDir, "sandboxes", id) }

func (a *Allocator) info(id, template string, created time.Time) manager.UnitInfo {
	d := a.dir(id)
	return manager.UnitInfo{ID: id, Template: template, Created: created,
		InitAddr: "unix://" + filepath.Join(d, "init.sock"), DataAddr: "unix://" + filepath.Join(d, "data.sock")}
}

func validID(id string) bool {
	return id != "" && !strings.ContainsAny(id, "/\\.\x00") && len(id) < 64
}

func (a *Allocator) Create(ctx context.Context, id, template string) (_ manager.UnitInfo, err error) {
	if !validID(id) {
		return manager.UnitInfo{}, fmt.Errorf("processalloc: bad id %q", id)
	}
	if template != manager.DefaultTemplate {
		return manager.UnitInfo{}, fmt.Errorf("%w: %q", manager.ErrUnknownTemplate, template)
	}
	d := a.dir(id)
	ws := filepath.Join(d, "workspace")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return manager.UnitInfo{}, err
	}
	defer func() {
		if err != nil {
			if derr := a.Destroy(context.WithoutCancel(ctx), id); derr != nil {
				err = fmt.Errorf("%w (%w: %v)", err, manager.ErrRemains, derr)
			}
		}
	}()
	info := a.info(id, template, time.Now().UTC())
	log, err := os.Create(filepath.Join(d, "server.log"))
	if err != nil {
		return manager.UnitInfo{}, err
	}
	defer log.Close()
	cmd := exec.Command(a.o.SandboxBinary, "-init-listen="+info.InitAddr, "-data-listen="+info.DataAddr,
		"-workspace="+ws, "-idle-ttl=24h")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // survives a manager restart
	if err := cmd.Start(); err != nil {
		return manager.UnitInfo{}, fmt.Errorf("starting %s: %w", a.o.SandboxBinary, err)
	}
	a.mu.Lock()
	a.cmds[id] = cmd
	a.mu.Unlock()
	go cmd.Wait() // reap it whenever it ends
	if err := os.WriteFile(filepath.Join(d, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return manager.UnitInfo{}, err
	}
	if err := jsonfile.Write(filepath.Join(d, "unit.json"), info); err != nil {
		return manager.UnitInfo{}, err
	}
	if err := jsonfile.Prepare(filepath.Join(d, "annotations.json")); err != nil { // as runscalloc does
		return manager.UnitInfo{}, err
	}
	initPath := strings.TrimPrefix(info.InitAddr, "unix://")
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("unix", initPath); err == nil {
			c.Close()
			return info, nil
		}
		if time.Now().After(deadline) {
			return manager.UnitInfo{}, fmt.Errorf("sandbox %s did not listen within 30s", id)
		}
		select {
		case <-ctx.Done():
			return manager.UnitInfo{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (a *Allocator) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("processalloc: bad id %q", id)
	}
	d := a.dir(id)
	a.mu.Lock()
	cmd := a.cmds[id]
	delete(a.cmds, id)
	a.mu.Unlock()
	if cmd != nil {
		// Started by this allocator: whatever the binary turned into, it is ours. The
		// process itself through its handle (safe once reaped), then its group.
		cmd.Process.Signal(syscall.SIGKILL)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	} else if b, err := os.ReadFile(filepath.Join(d, "pid")); err == nil {
		// Adopted from an earlier manager: only if the pid still runs the sandbox binary.
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && isOurs(pid, a.o.SandboxBinary) {
			syscall.Kill(-pid, syscall.SIGKILL) // its session and process group
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return os.RemoveAll(d)
}

// isOurs checks that pid still runs the sandbox binary (pids are reused).
func isOurs(pid int, bin string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	want, _ := filepath.EvalSymlinks(bin)
	return exe == want || exe == bin
}

func (a *Allocator) List(ctx context.Context) ([]manager.UnitInfo, error) {
	entries, err := os.ReadDir(filepath.Join(a.o.StateDir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	var out []manager.UnitInfo
	for _, e := range entries {
		var info manager.UnitInfo
		if jsonfile.Read(filepath.Join(a.dir(e.Name()), "unit.json"), &info) != nil {
			info = a.info(e.Name(), "", time.Time{})
		}
		var ann map[string]string
		if jsonfile.Read(filepath.Join(a.dir(e.Name()), "annotations.json"), &ann) == nil {
			info.Annotations = ann
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(x, y manager.UnitInfo) int { return strings.Compare(x.ID, y.ID) })
	return out, nil
}

func (a *Allocator) Annotate(ctx context.Context, id string, ann map[string]string) error {
	if _, err := os.Stat(a.dir(id)); err != nil {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	return jsonfile.Write(filepath.Join(a.dir(id), "annotations.json"), maps.Clone(ann))
}

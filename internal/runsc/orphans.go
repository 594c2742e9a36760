package runsc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a host process of runsc that runs under a Runtime's Root.
type Process struct {
	Pid int
	// Command is the runsc subcommand: "create", "start", "boot" (a sandbox's process, which
	// holds gVisor's kernel), "gofer", ...
	Command string
	// Bundle is its --bundle flag ("" without one).
	Bundle string
}

// Processes returns the runsc processes whose --root is r.Root, read from /proc. A process that
// ends while it is read is left out.
func (r *Runtime) Processes() ([]Process, error) {
	if r.Root == "" {
		return nil, errors.New("runsc: Runtime.Root is required")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue // ended, or a kernel thread
		}
		if p, ok := parseProcess(pid, strings.Split(string(bytes.TrimSuffix(raw, []byte{0})), "\x00"), r.Root); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// parseProcess reads argv as a runsc command line (global flags, the subcommand, its flags)
// and reports whether its --root is root. The program's name is not checked: runsc re-executes
// itself as runsc-sandbox and runsc-gofer, and its binary may have any name; a root directory
// is runsc's own.
func parseProcess(pid int, argv []string, root string) (Process, bool) {
	if len(argv) < 2 {
		return Process{}, false
	}
	p := Process{Pid: pid}
	rooted := false
	args := argv[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			if p.Command == "" {
				p.Command = a
			}
			continue
		}
		if !hasValue && (name == "root" || name == "bundle") && i+1 < len(args) {
			i++
			value = args[i]
		}
		switch name {
		case "root":
			rooted = filepath.Clean(value) == filepath.Clean(root)
		case "bundle":
			p.Bundle = value
		}
	}
	return p, rooted && p.Command != ""
}

// KillOrphans kills the sandbox and gofer processes under r.Root that belong to no container
// runsc lists: what a runsc create cut off before it recorded the container leaves (its
// caller SIGKILLed with it, or its state removed under it), which no Delete can reach. It first
// waits, up to wait, for runsc create and start processes under r.Root to end (a killed
// manager's creations finish on their own and record their containers). It returns the
// processes it killed. Call it only while nothing else creates containers under r.Root.
func (r *Runtime) KillOrphans(ctx context.Context, wait time.Duration) ([]Process, error) {
	deadline := time.Now().Add(wait)
	var procs []Process
	for {
		var err error
		if procs, err = r.Processes(); err != nil {
			return nil, err
		}
		busy := false
		for _, p := range procs {
			busy = busy || p.Command == "create" || p.Command == "start"
		}
		if !busy || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	states, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, s := range states {
		known[filepath.Clean(s.Bundle)] = true
	}
	// The processes read last, with no creation running: a container listed since had its
	// processes then already.
	var killed []Process
	for _, p := range procs {
		if (p.Command != "boot" && p.Command != "gofer") || p.Bundle == "" || known[filepath.Clean(p.Bundle)] {
			continue
		}
		if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return killed, fmt.Errorf("killing orphaned runsc %s process %d: %w", p.Command, p.Pid, err)
		}
		killed = append(killed, p)
	}
	return killed, nil
}

package runsc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Stdio is the standard input and outputs of a container's init process.
// runsc hands these files to the sandbox, which holds them for the sandbox's
// whole life: use files the host can afford to have written without bound
// (or /dev/null), never a pipe nobody drains. Nil files mean /dev/null.
type Stdio struct {
	Stdin, Stdout, Stderr *os.File
}

// Create runs `runsc create` for the bundle in bundleDir (see WriteBundle)
// and returns once the sandbox exists and the container is in StatusCreated;
// its process starts with Start. The init process's stdio is /dev/null; use
// CreateWithStdio to keep its output.
//
// On error, runsc's messages are in the returned *CommandError. A failed or
// cancelled Create may leave a container behind: callers clean up with
// Remove, which is idempotent. Create does not do that itself because the id
// might belong to an existing container. Cancelling ctx does not cut runsc
// short (see runWhole): Create then returns ctx's error once runsc is done.
//
// The sandbox process outlives runsc create and is reparented to the
// caller's nearest child subreaper, or pid 1; see State.Pid for why that
// process should reap it promptly.
func (r *Runtime) Create(ctx context.Context, id, bundleDir string) error {
	return r.CreateWithStdio(ctx, id, bundleDir, Stdio{})
}

// CreateWithStdio is Create with the init process's stdio given.
func (r *Runtime) CreateWithStdio(ctx context.Context, id, bundleDir string, stdio Stdio) error {
	if err := checkID(id); err != nil {
		return err
	}
	bundleDir, err := filepath.Abs(bundleDir)
	if err != nil {
		return fmt.Errorf("creating container %s: %w", id, err)
	}
	if orDefault(r.Network, DefaultNetwork) == "sandbox" {
		if err := checkNetNS(bundleDir); err != nil {
			return fmt.Errorf("creating container %s: %w", id, err)
		}
	}
	c := call{
		command:     "create",
		id:          id,
		args:        []string{"--bundle=" + bundleDir, "--pid-file=" + SandboxPIDFile(bundleDir), id},
		sharedStdio: true,
	}
	// Assign only non-nil files: a nil *os.File in an interface is not nil.
	if stdio.Stdin != nil {
		c.stdin = stdio.Stdin
	}
	if stdio.Stdout != nil {
		c.stdout = stdio.Stdout
	}
	if stdio.Stderr != nil {
		c.stderr = stdio.Stderr
	}
	return r.runWhole(ctx, c)
}

// SandboxPIDFile is the file in bundleDir where Create has runsc write the host pid of the
// sandbox process (State.Pid): the process holding gVisor's kernel, which exits when the
// container's init process does.
func SandboxPIDFile(bundleDir string) string { return filepath.Join(bundleDir, "sandbox.pid") }

// ReadSandboxPID returns the pid Create wrote to SandboxPIDFile(bundleDir).
func ReadSandboxPID(bundleDir string) (int, error) {
	b, err := os.ReadFile(SandboxPIDFile(bundleDir))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad sandbox pid file %s: %q", SandboxPIDFile(bundleDir), b)
	}
	return pid, nil
}

// wholeTimeout bounds a runsc create or start that its caller's context no longer bounds.
const wholeTimeout = time.Minute

// runWhole runs c (a create or start) to its end even if ctx ends first, then reports ctx's
// error. Killed part-way, runsc can leave a sandbox's processes running with no container
// state to find them by, so that no delete removes them (seen: a creation cancelled early,
// under load, left its gofer and sandbox running).
func (r *Runtime) runWhole(ctx context.Context, c call) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wholeTimeout)
	defer cancel()
	if _, _, err := r.run(wctx, c); err != nil {
		return err
	}
	return ctx.Err()
}

// checkNetNS refuses a bundle without a network namespace path: with
// --network=sandbox and no such path runsc would run the sandbox's network
// stack in the caller's (the host's) network namespace.
func checkNetNS(bundleDir string) error {
	data, err := os.ReadFile(filepath.Join(bundleDir, "config.json"))
	if err != nil {
		return fmt.Errorf("reading bundle config: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("parsing bundle config: %w", err)
	}
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				return nil
			}
		}
	}
	return fmt.Errorf("--network=sandbox needs a network namespace path in %s/config.json (BundleSpec.NetNSPath)", bundleDir)
}

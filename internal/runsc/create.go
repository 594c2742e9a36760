package runsc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

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
// cancelled Create may leave a partially created container behind: callers
// clean up with Delete(ctx, id, true), which is idempotent. Create does not
// do that itself because the id might belong to an existing container.
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
		args:        []string{"--bundle=" + bundleDir, id},
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
	_, _, err = r.run(ctx, c)
	return err
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

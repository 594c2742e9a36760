package runsc

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Run runs `runsc run` for the bundle in bundleDir: it creates the container, starts its
// init process, waits for it to exit and deletes the container (its sandbox's processes
// die with the init process), and returns the init process's exit code (128+n if it was
// killed by signal n). stdout and stderr receive the process's output (nil discards it);
// its stdin is /dev/null. It is a one-shot command in a fresh sandbox, such as a build
// step.
//
// err is non-nil only when the process could not be run (a *CommandError with runsc's
// messages, for example an executable missing from the root, or the context's error);
// exitCode is then -1 or runsc's status. Cancelling ctx kills runsc, which can leave the
// container behind: callers call Remove, which is idempotent, whatever Run returned.
func (r *Runtime) Run(ctx context.Context, id, bundleDir string, stdout, stderr io.Writer) (exitCode int, err error) {
	if err := checkID(id); err != nil {
		return -1, err
	}
	bundleDir, err = filepath.Abs(bundleDir)
	if err != nil {
		return -1, fmt.Errorf("running container %s: %w", id, err)
	}
	if orDefault(r.Network, DefaultNetwork) == "sandbox" {
		if err := checkNetNS(bundleDir); err != nil {
			return -1, fmt.Errorf("running container %s: %w", id, err)
		}
	}
	if stdout == nil {
		// A file, not io.Discard: see Exec.
		devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return -1, fmt.Errorf("running container %s: %w", id, err)
		}
		defer devNull.Close()
		stdout = devNull
	}
	_, code, err := r.run(ctx, call{
		command:       "run",
		id:            id,
		args:          []string{"--bundle=" + bundleDir, id},
		sharedStdio:   true,
		exitIsProcess: true,
		stdout:        stdout,
		stderr:        stderr,
	})
	if err != nil {
		return code, fmt.Errorf("running container %s: %w", id, err)
	}
	return code, nil
}

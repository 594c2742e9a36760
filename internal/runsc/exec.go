package runsc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// Exec runs `runsc exec id argv...`: argv runs inside the container with the
// init process's user, environment, working directory and capabilities, and
// stdin from /dev/null. It waits for the process and returns its exit code
// (128+n if it was killed by signal n). stdout and stderr may be nil
// (discarded); runsc's own error messages also go to stderr.
//
// err is non-nil only when the process could not be run (ErrNotFound for a
// missing container, a *CommandError with runsc's message otherwise, or the
// context's error); exitCode is then -1 or runsc's status. Cancelling ctx
// kills the runsc exec process, which does not by itself stop the process
// inside the sandbox.
//
// Output written after argv exits by processes it left behind is not
// collected: Exec stops reading pipes shortly after runsc exits.
func (r *Runtime) Exec(ctx context.Context, id string, argv []string, stdout, stderr io.Writer) (exitCode int, err error) {
	if err := checkID(id); err != nil {
		return -1, err
	}
	if len(argv) == 0 {
		return -1, errors.New("runsc exec: empty argv")
	}
	if stdout == nil {
		// A file, not io.Discard: an io.Writer that is not a file costs a
		// pipe and a copying goroutine.
		devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return -1, fmt.Errorf("runsc exec: %w", err)
		}
		defer devNull.Close()
		stdout = devNull
	}
	args := append([]string{id}, argv...)
	_, code, err := r.run(ctx, call{
		command:       "exec",
		id:            id,
		args:          args,
		sharedStdio:   true,
		exitIsProcess: true,
		stdout:        stdout,
		stderr:        stderr,
	})
	if err != nil {
		return code, fmt.Errorf("executing %q: %w", argv[0], err)
	}
	return code, nil
}

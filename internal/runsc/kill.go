package runsc

import (
	"context"
	"strconv"
	"syscall"
)

// Kill runs `runsc kill`: it sends sig to the container's init process, or
// with all to every process in the container. ErrNotFound if the container
// does not exist; runsc reports an error for a container that is not running.
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := checkID(id); err != nil {
		return err
	}
	args := []string{id, strconv.Itoa(int(sig))}
	if all {
		args = append([]string{"--all"}, args...)
	}
	_, _, err := r.run(ctx, call{command: "kill", id: id, args: args})
	return err
}

package runsc

import (
	"context"
	"errors"
	"syscall"
)

// Delete runs `runsc delete`, releasing everything runsc holds for the
// container (the sandbox processes, cgroups, state files); it does not touch
// the bundle directory. Without force runsc refuses a container that is
// running; with force it kills it first.
//
// Delete is idempotent: if no container with id exists it returns nil, so a
// second Delete, or one after a failed Create, is not an error.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	if err := checkID(id); err != nil {
		return err
	}
	args := []string{id}
	if force {
		args = []string{"--force", id}
	}
	_, _, err := r.run(ctx, call{command: "delete", id: id, args: args})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// Remove kills every process of container id and deletes it: the way to be rid of a container
// in any state. Like Delete, it returns nil if no container with id exists.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	// The kill fails for a container that is stopped or gone; the forced delete handles both.
	_ = r.Kill(ctx, id, syscall.SIGKILL, true)
	return r.Delete(ctx, id, true)
}

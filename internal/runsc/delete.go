package runsc

import (
	"context"
	"errors"
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

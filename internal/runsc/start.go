package runsc

import "context"

// Start runs `runsc start`: the container created by Create starts its
// process. It returns once the process has been started, not when it is
// ready to serve. ErrNotFound if the container does not exist. Like Create, it
// is not cut short by ctx (see runWhole).
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return r.runWhole(ctx, call{command: "start", id: id, args: []string{id}})
}

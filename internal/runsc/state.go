package runsc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Status is a container's lifecycle status as runsc reports it.
type Status string

// The statuses runsc reports (the OCI runtime states plus "paused").
const (
	StatusCreating Status = "creating"
	StatusCreated  Status = "created"
	StatusRunning  Status = "running"
	StatusStopped  Status = "stopped"
	StatusPaused   Status = "paused"
)

// State is one container's state.
type State struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Pid is the host pid of the sandbox process (the container's init
	// process exists only inside gVisor); -1 once stopped. runsc reports
	// the container running for as long as this process exists, zombies
	// included: it is reparented, when runsc create exits, to the nearest
	// child subreaper (else pid 1), and the container shows as stopped only
	// once that process has reaped it.
	Pid    int    `json:"pid"`
	Bundle string `json:"bundle"`
	// Created is when runsc created the container. The OCI state runsc
	// prints has no creation time, so it is read from runsc's own state file
	// under Root (format of the pinned runsc); zero if that fails.
	Created     time.Time         `json:"created,omitzero"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// State runs `runsc state` and returns the container's state, or an error
// wrapping ErrNotFound if runsc has no container with this id.
func (r *Runtime) State(ctx context.Context, id string) (State, error) {
	if err := checkID(id); err != nil {
		return State{}, err
	}
	out, _, err := r.run(ctx, call{command: "state", id: id, args: []string{id}})
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(out, &s); err != nil {
		return State{}, fmt.Errorf("runsc state %s: parsing output: %w", id, err)
	}
	// runsc resolves ids by prefix. Valid ids are never prefixes of each
	// other, but a foreign container under Root could still match.
	if s.ID != id {
		return State{}, fmt.Errorf("runsc state %s: got container %q: %w", id, s.ID, ErrNotFound)
	}
	s.Created = r.createdAt(id)
	return s, nil
}

// List runs `runsc list --format=json` and returns the state of every
// container under Root (none: a nil slice and no error).
func (r *Runtime) List(ctx context.Context) ([]State, error) {
	out, _, err := r.run(ctx, call{command: "list", args: []string{"--format=json"}})
	if err != nil {
		return nil, err
	}
	var states []State // runsc prints "null" when there are none
	if err := json.Unmarshal(out, &states); err != nil {
		return nil, fmt.Errorf("runsc list: parsing output: %w", err)
	}
	for i := range states {
		states[i].Created = r.createdAt(states[i].ID)
	}
	return states, nil
}

// createdAt reads the creation time from runsc's state file for a container
// that is its own sandbox ("<id>_sandbox:<id>.state" under Root), or returns
// the zero time.
func (r *Runtime) createdAt(id string) time.Time {
	if checkID(id) != nil {
		return time.Time{}
	}
	data, err := os.ReadFile(filepath.Join(r.Root, id+"_sandbox:"+id+".state"))
	if err != nil {
		return time.Time{}
	}
	var f struct {
		CreatedAt time.Time `json:"createdAt"`
	}
	if json.Unmarshal(data, &f) != nil {
		return time.Time{}
	}
	return f.CreatedAt
}

// Package envstate keeps the environment and working directory that sandbox commands start from,
// and merges the changes of concurrent commands deterministically ("lazy commits").
//
// Every command belongs to a task group and carries a logical order, assigned by the client when
// it issued the command. All commands of a group start from the group's base snapshot, which is
// never mutated (copy-on-write: a commit builds a new snapshot). When a command finishes, its
// delta is written into an overlay keyed by variable; an entry is replaced only by a delta of a
// higher logical order. When a command of another group arrives, the overlay is applied to the
// base to form the next group's base, and the overlay starts empty. No sort, no per-change log,
// and no lock is held while commands run: the logically last write wins whatever the order in
// which the commands completed.
package envstate

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"sync"
)

// ErrDuplicateOrder reports a second command with the same logical order in one group.
var ErrDuplicateOrder = errors.New("logical order already used in this task group")

// Snapshot is an immutable view of the state a command starts from. Callers must not modify
// Env.
type Snapshot struct {
	Env map[string]string
	Cwd string
}

// Delta is what one command changed: variables set, variables removed, and the final working
// directory (empty: unchanged).
type Delta struct {
	Set   map[string]string
	Unset []string
	Cwd   string
}

// Ticket identifies a started command to Record.
type Ticket struct {
	group string
	order uint64
}

type entry struct {
	order   uint64
	value   string
	removed bool
}

// State is safe for concurrent use.
type State struct {
	mu sync.Mutex // guards every field below

	group   string
	base    *Snapshot
	overlay map[string]entry
	cwd     *entry // nil: no command of the group changed the working directory
	orders  map[uint64]struct{}
	anon    uint64 // counter for commands without a group
}

// New returns a State whose first base is env and cwd (env is copied).
func New(env map[string]string, cwd string) *State {
	return &State{
		base:    &Snapshot{Env: maps.Clone(env), Cwd: cwd},
		overlay: map[string]entry{},
		orders:  map[uint64]struct{}{},
	}
}

// Begin registers a command of group with the given logical order and returns the snapshot it
// starts from. A group different from the current one first commits the current overlay. An
// empty group forms a group of its own (order is ignored). Begin fails with ErrDuplicateOrder
// when the order was already used in the group.
func (s *State) Begin(group string, order uint64) (*Snapshot, Ticket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if group == "" {
		s.anon++
		// The NUL byte keeps anonymous groups apart from every client-chosen id.
		group, order = "\x00anon-"+strconv.FormatUint(s.anon, 10), 0
	}
	if group != s.group {
		s.commitLocked()
		s.group = group
	}
	if _, dup := s.orders[order]; dup {
		return nil, Ticket{}, fmt.Errorf("%w: group %q order %d", ErrDuplicateOrder, group, order)
	}
	s.orders[order] = struct{}{}
	return s.base, Ticket{group: group, order: order}, nil
}

// Record writes a finished command's delta into its group's overlay and reports whether it did:
// a command whose group has already been committed is too late and changes nothing.
func (s *State) Record(t Ticket, d Delta) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.group != s.group {
		return false
	}
	put := func(k string, e entry) {
		if old, ok := s.overlay[k]; !ok || old.order <= e.order {
			s.overlay[k] = e
		}
	}
	for k, v := range d.Set {
		put(k, entry{order: t.order, value: v})
	}
	for _, k := range d.Unset {
		put(k, entry{order: t.order, removed: true})
	}
	if d.Cwd != "" && (s.cwd == nil || s.cwd.order <= t.order) {
		s.cwd = &entry{order: t.order, value: d.Cwd}
	}
	return true
}

// AddBase adds vars to the base environment, each one the base does not hold yet, without
// touching the overlay: set-up known only once the sandbox is initialised (its proxy
// variables), before any command has run.
func (s *State) AddBase(vars map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := &Snapshot{Env: maps.Clone(s.base.Env), Cwd: s.base.Cwd}
	if next.Env == nil {
		next.Env = map[string]string{}
	}
	for k, v := range vars {
		if _, ok := next.Env[k]; !ok {
			next.Env[k] = v
		}
	}
	s.base = next
}

// Override sets vars over the base environment and, if cwd is not empty, the base working
// directory (a relative one under the current base directory): an allocation's own, given at
// initialisation, before any command.
func (s *State) Override(vars map[string]string, cwd string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := &Snapshot{Env: maps.Clone(s.base.Env), Cwd: s.base.Cwd}
	if next.Env == nil {
		next.Env = map[string]string{}
	}
	maps.Copy(next.Env, vars)
	if cwd != "" {
		if !filepath.IsAbs(cwd) {
			cwd = filepath.Join(next.Cwd, cwd)
		}
		next.Cwd = filepath.Clean(cwd)
	}
	s.base = next
}

// Current returns the snapshot the next group would start from, without committing anything.
func (s *State) Current() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked()
}

// commitLocked makes base' = apply(overlay, base) and resets the overlay.
func (s *State) commitLocked() {
	s.base = s.applyLocked()
	clear(s.overlay)
	s.cwd = nil
	clear(s.orders)
}

func (s *State) applyLocked() *Snapshot {
	if len(s.overlay) == 0 && s.cwd == nil {
		return s.base
	}
	next := &Snapshot{Env: maps.Clone(s.base.Env), Cwd: s.base.Cwd}
	if next.Env == nil {
		next.Env = map[string]string{}
	}
	for k, e := range s.overlay {
		if e.removed {
			delete(next.Env, k)
		} else {
			next.Env[k] = e.value
		}
	}
	if s.cwd != nil {
		next.Cwd = s.cwd.value
	}
	return next
}

// Diff returns the delta that turns before into after, ignoring the variables in skip.
func Diff(before, after map[string]string, skip func(string) bool) Delta {
	d := Delta{Set: map[string]string{}}
	for k, v := range after {
		if skip(k) {
			continue
		}
		if old, ok := before[k]; !ok || old != v {
			d.Set[k] = v
		}
	}
	for k := range before {
		if skip(k) {
			continue
		}
		if _, ok := after[k]; !ok {
			d.Unset = append(d.Unset, k)
		}
	}
	return d
}

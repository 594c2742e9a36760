package manager

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// State is where a unit is in its life.
type State int32

// The states of a unit. Gone units are forgotten; Failed units are kept (briefly) for
// visibility after their resources were cleaned up, or, when cleaning up failed (Remains),
// until a retried destroy succeeds.
const (
	Creating State = iota + 1
	Ready
	Initialising
	Bound
	Destroying
	Gone
	Failed
)

var stateNames = map[State]string{Creating: "creating", Ready: "ready", Initialising: "initialising",
	Bound: "bound", Destroying: "destroying", Gone: "gone", Failed: "failed"}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// transitions lists the legal moves; anything else is a bug or a race lost, and is refused.
var transitions = map[State][]State{
	Creating:     {Ready, Failed},
	Ready:        {Initialising, Destroying},
	Initialising: {Bound, Destroying, Failed},
	Bound:        {Destroying, Failed}, // Failed: its sandbox ended on its own (ExitWatcher)
	Destroying:   {Gone, Failed},
	Failed:       {Destroying}, // a retried destroy of a unit whose destroy failed (Remains)
}

// Lease is a bound unit's lease. Only a hash of the token is kept.
type Lease struct {
	// Owner is the caller that allocated the unit (auth.Identity.Owner); List shows the unit
	// to it alone (and to operators).
	Owner     string
	TokenHash [32]byte
	Expires   time.Time
	TTL       time.Duration
	Egress    []string
	Labels    map[string]string
}

// Unit is a snapshot of one unit.
type Unit struct {
	Info    UnitInfo
	State   State
	Err     string
	Since   time.Time // when it entered State
	ReadyAt time.Time
	Lease   *Lease
	// Remains marks a Failed unit whose destroy failed: the allocator may still hold its
	// resources (a running sandbox), so the manager destroys it again later.
	Remains bool

	// claimOnBind marks a unit a shared pool picked without claiming it: bind claims it
	// with the lease's write (OneWriteClaimer).
	claimOnBind bool
}

type unit struct {
	Unit
}

// StateOperator holds the state of every unit and the warm pool: a FIFO of Ready units per
// template. Its lock guards only in-memory data and is never held across I/O; each transition
// is atomic (compare-and-set on the unit's state).
type StateOperator struct {
	clock PassiveClock

	mu     sync.Mutex // guards units, pool, notify, failed, counts, bound
	units  map[string]*unit
	counts map[string]map[State]int // template -> state -> units, kept on every change
	bound  map[string]*unit         // the Bound units, for lease expiry
	pool   map[string][]*unit       // template -> Ready units, oldest first
	notify chan struct{}            // closed and replaced when a unit becomes Ready
	failed []string                 // ids of Failed units, oldest first (bounded)
}

// maxFailedKept bounds how many Failed units stay visible.
const maxFailedKept = 50

// NewStateOperator returns an empty StateOperator.
func NewStateOperator(clock PassiveClock) *StateOperator {
	return &StateOperator{clock: clock, units: map[string]*unit{}, pool: map[string][]*unit{}, notify: make(chan struct{}),
		counts: map[string]map[State]int{}, bound: map[string]*unit{}}
}

// Insert adds a unit in state st (Creating for new units, Bound for adopted ones).
func (s *StateOperator) Insert(info UnitInfo, st State, lease *Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.units[info.ID]; dup {
		return fmt.Errorf("unit %s already exists", info.ID)
	}
	u := &unit{Unit{Info: info, State: st, Since: s.clock.Now(), Lease: lease}}
	s.units[info.ID] = u
	s.enterLocked(u)
	if st == Ready {
		s.pushReadyLocked(u)
	}
	return nil
}

// enterLocked and leaveLocked keep counts and bound in step with a unit's state.
func (s *StateOperator) enterLocked(u *unit) {
	c := s.counts[u.Info.Template]
	if c == nil {
		c = map[State]int{}
		s.counts[u.Info.Template] = c
	}
	c[u.State]++
	if u.State == Bound {
		s.bound[u.Info.ID] = u
	}
}

func (s *StateOperator) leaveLocked(u *unit) {
	s.counts[u.Info.Template][u.State]--
	if u.State == Bound {
		delete(s.bound, u.Info.ID)
	}
}

// Transition moves unit id from one state to another, atomically. It fails with
// ErrBadTransition if the unit is not in state from (someone else moved it first) or the move
// is not legal, and with ErrUnitNotFound if there is no such unit. update, if not nil, runs
// under the lock to change the unit's fields along with its state.
func (s *StateOperator) Transition(id string, from, to State, update func(*Unit)) (Unit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[id]
	if !ok {
		return Unit{}, fmt.Errorf("%w: %s", ErrUnitNotFound, id)
	}
	if u.State != from || !slices.Contains(transitions[from], to) {
		return u.Unit, fmt.Errorf("%w: %s is %s, not %s (wanted %s)", ErrBadTransition, id, u.State, from, to)
	}
	if from == Ready {
		s.removeReadyLocked(u)
	}
	s.leaveLocked(u)
	u.State, u.Since = to, s.clock.Now()
	if update != nil {
		update(&u.Unit) // may change Info (Create fills it in), so count after
	}
	s.enterLocked(u)
	switch to {
	case Ready:
		u.ReadyAt = u.Since
		s.pushReadyLocked(u)
	case Gone:
		s.leaveLocked(u)
		delete(s.units, id)
	case Failed:
		if !slices.Contains(s.failed, id) { // a retried destroy fails again: listed already
			s.failed = append(s.failed, id)
		}
		s.trimFailedLocked()
	}
	return u.Unit, nil
}

// trimFailedLocked forgets the oldest Failed units beyond maxFailedKept, except those whose
// remains are still to be destroyed.
func (s *StateOperator) trimFailedLocked() {
	for i := 0; len(s.failed) > maxFailedKept && i < len(s.failed); {
		u, ok := s.units[s.failed[i]]
		switch {
		case ok && u.State == Failed && u.Remains:
			i++ // kept: forgetting it would leak what it holds
			continue
		case ok && u.State == Failed:
			s.leaveLocked(u)
			delete(s.units, s.failed[i])
		}
		s.failed = slices.Delete(s.failed, i, i+1)
	}
}

// MarkRemains marks Failed unit id as holding remains to destroy again (see Unit.Remains).
func (s *StateOperator) MarkRemains(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.units[id]; ok && u.State == Failed {
		u.Remains = true
	}
}

// RemainsDue returns the Failed units with remains that have been Failed for at least after.
func (s *StateOperator) RemainsDue(now time.Time, after time.Duration) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, id := range s.failed {
		if u, ok := s.units[id]; ok && u.State == Failed && u.Remains && !now.Before(u.Since.Add(after)) {
			ids = append(ids, id)
		}
	}
	return ids
}

// TakeReady pops the oldest Ready unit of template and moves it to Initialising, or returns
// false when the pool is empty. The returned channel is closed when the next unit becomes
// Ready, for callers that want to wait.
func (s *StateOperator) TakeReady(template string) (Unit, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.pool[template]
	if len(q) == 0 {
		return Unit{}, false, s.notify
	}
	u := q[0]
	s.pool[template] = q[1:]
	s.leaveLocked(u)
	u.State, u.Since = Initialising, s.clock.Now()
	s.enterLocked(u)
	return u.Unit, true, nil
}

// OldestReady returns up to n Ready units of template, oldest first, without taking them.
func (s *StateOperator) OldestReady(template string, n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, u := range s.pool[template] {
		if len(ids) == n {
			break
		}
		ids = append(ids, u.Info.ID)
	}
	return ids
}

func (s *StateOperator) pushReadyLocked(u *unit) {
	t := u.Info.Template
	s.pool[t] = append(s.pool[t], u)
	close(s.notify)
	s.notify = make(chan struct{})
}

func (s *StateOperator) removeReadyLocked(u *unit) {
	t := u.Info.Template
	if i := slices.Index(s.pool[t], u); i >= 0 {
		s.pool[t] = slices.Delete(s.pool[t], i, i+1)
	}
}

// Get returns a snapshot of unit id.
func (s *StateOperator) Get(id string) (Unit, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[id]
	if !ok {
		return Unit{}, false
	}
	return u.copy(), true
}

func (u *unit) copy() Unit {
	c := u.Unit
	if u.Lease != nil {
		l := *u.Lease
		l.Labels = maps.Clone(l.Labels)
		l.Egress = slices.Clone(l.Egress)
		c.Lease = &l
	}
	return c
}

// UpdateLease changes a Bound unit's lease under the lock; fn may refuse with an error.
func (s *StateOperator) UpdateLease(id string, fn func(*Lease) error) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[id]
	if !ok {
		return Lease{}, fmt.Errorf("%w: %s", ErrUnitNotFound, id)
	}
	if u.State != Bound || u.Lease == nil {
		return Lease{}, fmt.Errorf("%w: %s is %s", ErrLeaseEnded, id, u.State)
	}
	if err := fn(u.Lease); err != nil {
		return Lease{}, err
	}
	return *u.Lease, nil
}

// Expired returns the Bound units whose lease ended before now.
func (s *StateOperator) Expired(now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, u := range s.bound {
		if u.Lease != nil && !now.Before(u.Lease.Expires) {
			ids = append(ids, id)
		}
	}
	return ids
}

// Counts returns the number of units per template and state.
func (s *StateOperator) Counts(template string) map[State]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := map[State]int{}
	for t, byState := range s.counts {
		if template == "" || t == template {
			for st, n := range byState {
				c[st] += n
			}
		}
	}
	return c
}

// CountsByTemplate counts the units of each template by state.
func (s *StateOperator) CountsByTemplate() map[string]map[State]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := map[string]map[State]int{}
	for t, byState := range s.counts {
		c[t] = maps.Clone(byState)
	}
	return c
}

// Snapshot returns every unit, ordered by id.
func (s *StateOperator) Snapshot() []Unit {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Unit, 0, len(s.units))
	for _, u := range s.units {
		out = append(out, u.copy())
	}
	slices.SortFunc(out, byID)
	return out
}

// byID orders units by id.
func byID(a, b Unit) int { return strings.Compare(a.Info.ID, b.Info.ID) }

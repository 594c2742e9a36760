package manager

import (
	"context"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// UnitInfo describes one execution unit as its allocator knows it.
type UnitInfo struct {
	ID       string
	Template string
	// InitAddr is where the manager calls InitializeTLS (unix:// or tcp://).
	InitAddr string
	// DataAddr is the endpoint the agent dials.
	DataAddr string
	Created  time.Time
	// Annotations are what the manager stored with Annotate (lease data for adoption).
	Annotations map[string]string
}

// Allocator manages the lifecycle of execution units. Implementations are safe for
// concurrent use.
type Allocator interface {
	// Name identifies the allocator ("runsc", "process", "kube", "memory").
	Name() string
	// Create provisions unit id from template and returns once its init endpoint accepts
	// connections. On error nothing of the unit is left behind, or the error wraps
	// ErrRemains (then Destroy is retried later). ErrUnknownTemplate if the template does not
	// exist.
	Create(ctx context.Context, id, template string) (UnitInfo, error)
	// Destroy removes unit id and everything it holds. A unit that does not exist is not an
	// error: Destroy is idempotent.
	Destroy(ctx context.Context, id string) error
	// List returns every unit the allocator's backend holds, including units created by an
	// earlier manager process, so that they can be adopted or destroyed.
	List(ctx context.Context) ([]UnitInfo, error)
}

// Annotator is implemented by allocators that can store small key-value data with a unit
// (a file beside a runsc bundle, annotations on a pod). The manager stores the lease there so
// that a restarted manager can adopt bound units.
type Annotator interface {
	// Annotate replaces unit id's annotations. ErrUnitNotFound if the unit is gone.
	Annotate(ctx context.Context, id string, annotations map[string]string) error
}

// EgressBinder is implemented by allocators that enforce egress allowlists. BindEgress must
// have taken effect when it returns; a unit whose binding fails is not handed out.
type EgressBinder interface {
	// BindEgress sets unit id's allowlist (entries as "host:port", "*.domain:port"). An empty
	// list denies all egress.
	BindEgress(ctx context.Context, id string, allow []string) error
}

// EgressChecker is implemented by egress binders that cannot enforce every allowlist (a
// cluster whose network policies take IP addresses only): the manager asks before it spends
// a unit on an allocation.
type EgressChecker interface {
	// CheckEgress returns an error wrapping ErrInvalid, naming the entry, if BindEgress
	// would refuse allow.
	CheckEgress(allow []string) error
}

// Handoffer is implemented by allocators that open a unit's data connection ahead of time
// and hold it for the agent to collect (see internal/handoff): an agent on the same machine
// then skips the sandbox's accept, the slowest step of a first connection into gVisor.
type Handoffer interface {
	// Handoff grants unit id's held connection and returns where the agent collects it and
	// the one-time token that does; ok is false when none is held (the agent dials the
	// unit's DataAddr).
	Handoff(id string) (addr string, token []byte, ok bool)
}

// Warner is implemented by allocators without a kernel boundary: the manager logs the
// warning on every allocation.
type Warner interface {
	AllocationWarning() string
}

// Initializer performs sFuse on a unit's init endpoint and returns the sandbox's answer
// (internal/sfuse.Initialize in production; an in-memory fake in benchmarks).
type Initializer func(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error)

// Clock tells the time; tests pass a fake.
type Clock interface {
	Now() time.Time
}

// RealClock is the system clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// SharedPool is implemented by allocators whose warm pool is shared by several manager
// replicas: the ready units live in an API server, not in this process. The manager then
// claims units from the allocator instead of keeping its own FIFO, reads leases from the
// units' annotations (so that any replica can renew or release any lease), and leaves pool
// sizing and lease expiry to the replica that holds leadership.
//
// A unit's state is carried in its annotations under "fusebox.dev/state": "ready", "claimed"
// (taken by a replica, being initialised) or "bound" (with the lease annotations the manager
// writes through Annotate).
type SharedPool interface {
	// Claim takes one ready unit of template for this replica, atomically across replicas: no
	// two calls anywhere return the same unit (e.g. an update with a resourceVersion
	// precondition). ErrNoReadyUnit when none is ready now.
	Claim(ctx context.Context, template string) (UnitInfo, error)
	// Counts returns the ready and creating units of template as the allocator sees them.
	Counts(template string) (ready, creating int)
	// Changed returns a channel that is closed the next time a unit of template may have
	// become claimable (a unit turned ready; spurious wake-ups are allowed, missed ones are
	// not). Each call after a close returns a new channel. Take the channel before the Claim
	// whose ErrNoReadyUnit you will wait on: a unit that turns ready between the two then
	// still closes it. Waiting on it makes no request to the backend.
	Changed(template string) <-chan struct{}
	// Lookup returns unit id as it is now: it reflects every write any replica had acknowledged
	// before the call (a read from the store of record, not a cache that may lag), because a
	// lease bound through one replica may be renewed through another a moment later.
	// ErrUnitNotFound if there is no such unit.
	Lookup(ctx context.Context, id string) (UnitInfo, error)
}

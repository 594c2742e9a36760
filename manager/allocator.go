package manager

import (
	"context"
	"time"

	"k8s.io/utils/clock"

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
	// Version is the backend's version of the unit when it was read (kube: the pod's
	// resourceVersion), where the allocator has one: OneWriteClaimer.ClaimBound's guard.
	Version string
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
	// Capabilities declares what the allocator supports beyond creating, destroying and
	// listing units. It returns the same value on every call.
	Capabilities() Capabilities
}

// Capabilities is what an allocator declares it supports, as Nomad's task drivers do. The
// manager decides by the declaration, never by probing for interfaces: New refuses an
// allocator that declares a feature without implementing its interface, and a request that
// needs a feature the allocator does not declare fails closed (ErrUnsupported), never
// "succeeds" without it. The zero value declares nothing and is the strictest.
type Capabilities struct {
	// Egress: the allocator enforces egress allowlists (it implements EgressBinder). An
	// allocator without it must give its units no network at all: an allocation that names
	// any egress destination is refused, unless NoIsolation.
	Egress bool
	// Adoption: the allocator stores a lease with its unit (it implements Annotator), so that
	// a restarted manager adopts the bound units it finds, and so that a shared pool's
	// replicas read each other's leases.
	Adoption bool
	// SharedPool: the warm pool lives in a backend shared by several manager replicas (it
	// implements SharedPool; Adoption is required too).
	SharedPool bool
	// Exits: the allocator reports units that end on their own (it implements ExitWatcher).
	// Not with SharedPool: a shared pool's units are the allocator's to replace.
	Exits bool
	// NoIsolation: units run code on this host with no kernel boundary and no network
	// control (the process runtime, which only starts behind its explicit insecure flag).
	// Nothing is enforced for them, egress allowlists included: the manager hands them out
	// anyway, and logs a warning saying so on every allocation.
	NoIsolation bool
	// CreatesOnHost: units are made on the manager's own host, so that a creation takes CPU
	// from the allocations and sandboxes beside it. The manager then lets a pool that still
	// holds a ready unit wait DefaultRefillDelay before it refills (see refillDue).
	CreatesOnHost bool
	// Versions: a shared pool's templates can change between manager replicas (a new
	// template rolls them, one at a time), and the allocator tells the units made from
	// another version of a template from its own: it never counts, claims or picks them, and
	// drains the ready ones on the leader's request (it implements OutdatedDrainer). Only
	// with SharedPool.
	Versions bool
	// WarmUp is how long a unit takes, after it turns ready, to serve at full speed (zero:
	// at once). It counts in the provisioning latency the estimator sizes the pool by, so
	// that at a steady demand the unit an allocation takes (the oldest ready one) has warmed
	// up; an allocation never waits for it.
	WarmUp time.Duration
}

// Annotator is implemented by allocators that can store small key-value data with a unit
// (a file beside a runsc bundle, annotations on a pod; Capabilities.Adoption). The manager stores the lease there so
// that a restarted manager can adopt bound units.
type Annotator interface {
	// Annotate replaces unit id's annotations. ErrUnitNotFound if the unit is gone.
	Annotate(ctx context.Context, id string, annotations map[string]string) error
}

// EgressBinder is implemented by allocators that enforce egress allowlists (Capabilities.Egress).
// BindEgress must have taken effect when it returns; a unit whose binding fails is not handed
// out.
type EgressBinder interface {
	// BindEgress sets unit id's allowlist (entries as "host:port", "*.domain:port"). An empty
	// list denies all egress.
	BindEgress(ctx context.Context, id string, allow []string) error
}

// EndpointGranter is implemented by allocators that can make a bound unit's data socket
// usable by the local user who allocated it, when that is not the manager's own user (the
// runsc allocator for a --listen-group manager). The pinned key still decides who may talk on
// it; the grant only lets the caller's process reach it.
type EndpointGranter interface {
	// GrantEndpoint returns unit id's data address for the caller recorded as owner
	// ("uid:N"), reachable by that user and the manager's alone, or "" when the unit's own
	// address serves (the caller is not a local user, or is the manager's user).
	GrantEndpoint(id, owner string) (string, error)
}

// EgressChecker is implemented by egress binders that cannot enforce every allowlist (a
// cluster whose network policies take IP addresses only): the manager asks before it spends
// a unit on an allocation.
type EgressChecker interface {
	// CheckEgress returns an error wrapping ErrInvalid, naming the entry, if BindEgress
	// would refuse allow.
	CheckEgress(allow []string) error
}

// Initializer performs sFuse on a unit's init endpoint and returns the sandbox's answer
// (internal/sfuse.Initialize in production; an in-memory fake in benchmarks).
type Initializer func(ctx context.Context, initAddr string, req sfuse.Request) (sfuse.Result, error)

// PassiveClock tells the time.
type PassiveClock interface {
	Now() time.Time
}

// Clock is the manager's time: the time of leases and records (Now), and every wait of its
// control loop (the reconcile and ping tickers, the refill delay, the creation backoff, an
// allocation's deadline and retries), so that tests step a fake clock
// (k8s.io/utils/clock/testing.FakeClock) instead of sleeping. Timeouts of single I/O calls
// (a ping's, a creation's) stay on the system clock, as context deadlines do.
type Clock interface {
	PassiveClock
	// NewTimer returns a timer that fires once, d from now.
	NewTimer(d time.Duration) clock.Timer
	// NewTicker returns a ticker that fires every d; a tick nobody took is dropped.
	NewTicker(d time.Duration) clock.Ticker
	// AfterFunc calls f in its own goroutine d from now, unless the timer is stopped.
	AfterFunc(d time.Duration, f func()) clock.Timer
}

// RealClock is the system clock.
type RealClock = clock.RealClock

var _ Clock = RealClock{}

// SharedPool is implemented by allocators whose warm pool is shared by several manager
// replicas (Capabilities.SharedPool): the ready units live in an API server, not in this process. The manager then
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

// OneWriteClaimer is implemented by SharedPool allocators that can claim a unit with the
// write that binds it, so that an allocation makes one write to the backend where Claim then
// Annotate make two. The manager picks a unit without taking it and claims it with the lease
// beside sFuse; it binds the unit's egress only once the claim has succeeded. A replica that
// loses the claim leaves the unit to the winner: if its sFuse blew the unit's fuse (sFuse
// works once), the winner's sFuse is refused and the winner destroys the unit.
type OneWriteClaimer interface {
	// Pick returns a ready unit of template as the allocator last saw it, without taking
	// it, passing over the units skip reports; its Version says which state of it was seen.
	// ErrNoReadyUnit when there is none. Pick makes no request to the backend.
	Pick(template string, skip func(id string) bool) (UnitInfo, error)
	// ClaimBound takes unit u, as Pick returned it, and binds it with annotations (what
	// Annotate would write) in one atomic write that succeeds only while the unit is still
	// at u.Version: of all ClaimBound and Claim calls anywhere for one version, at most one
	// succeeds. ErrUnitTaken when the unit changed or is gone; any other error leaves it
	// unknown whether the write landed (if it did, the unit's lease expires unrenewed).
	ClaimBound(ctx context.Context, u UnitInfo, annotations map[string]string) error
}

// OutdatedDrainer is implemented by SharedPool allocators whose units carry the version of
// their template (Capabilities.Versions). The leader calls it on every pass, so that after an
// upgrade (a manager started with a new sandbox image: a CVE fix) no warm unit of the old
// template stays in the pool, and the pool refills with the new one; bound units live out
// their leases.
type OutdatedDrainer interface {
	// DrainOutdated destroys the ready units made from another version of their template
	// than this replica's, created before before, each only while it is still ready (a
	// replica still running that version may take it meanwhile: it is then left to its
	// lease). It never touches a claimed or bound unit. It returns the ids destroyed; an
	// error for units it could not destroy (a later call tries again).
	DrainOutdated(ctx context.Context, before time.Time) ([]string, error)
}

// ExitWatcher is implemented by allocators that learn when a unit ends on its own (its
// sandbox exited, crashed or was killed; Capabilities.Exits) rather than through Destroy.
// The manager then marks a bound unit Failed with the reason, which List and status show,
// and destroys what remains of it; a ready unit is destroyed and replaced.
type ExitWatcher interface {
	// WatchExits makes the allocator call exited once for each unit that ends on its own from
	// now on, with a reason for people ("sandbox exited: status 137"), including units it
	// lists (List) that had ended already. exited may be called from any goroutine and must
	// not block; units removed by Destroy are not reported. The manager calls it once, before
	// it adopts units.
	WatchExits(exited func(id, reason string))
}

package manager

import "errors"

// Sentinel errors. The gRPC service maps them to status codes in one place (service.go).
var (
	ErrUnknownTemplate = errors.New("unknown template")
	ErrUnitNotFound    = errors.New("sandbox not found")
	ErrBadLeaseToken   = errors.New("lease token does not match")
	ErrLeaseEnded      = errors.New("lease expired or released")
	ErrNoCapacity      = errors.New("no ready sandbox within the deadline")
	ErrInvalid         = errors.New("invalid request")
	ErrAllocator       = errors.New("allocator failed")
	ErrBadTransition   = errors.New("unit is not in the expected state")
	ErrNoReadyUnit     = errors.New("no ready unit")
	// ErrUnitTaken is OneWriteClaimer.ClaimBound's answer for a unit another replica took
	// first (or that is gone): the allocation tries another unit and leaves that one alone.
	ErrUnitTaken = errors.New("unit taken by another replica")
	// ErrUnsupported: the request needs a feature the allocator does not declare (see
	// Capabilities); the manager refuses rather than hand out a unit without it.
	ErrUnsupported = errors.New("not supported by this manager's allocator")
	// ErrRemains is wrapped by an allocator's Create error when cleaning up the failed unit
	// failed too: something of it may be left, and the manager destroys it again later.
	ErrRemains = errors.New("the failed unit's cleanup failed")
)

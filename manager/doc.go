// Package manager is fusebox's control plane: it keeps a warm pool of single-use sandboxes,
// binds one to an agent on Allocate (sFuse: the agent's key is pinned into the sandbox, the
// manager keeps no key material), holds the lease, and destroys the sandbox on release or
// expiry. It is never on the data path.
//
// Three parts, each behind a small interface:
//   - an Allocator creates, destroys and lists execution units (runsc, kube, process);
//   - the StateOperator holds each unit's state (Creating -> Ready -> Initialising -> Bound ->
//     Destroying -> Gone, or Failed) with atomic per-unit transitions and a FIFO warm pool,
//     and never holds its lock across I/O;
//   - an Estimator (package estimator) sets the pool's target size from observed demand.
//
// An allocator declares what it supports (Capabilities: egress enforcement, adoption,
// a shared pool, no isolation, creations on this host, its units' warm-up); the manager picks
// its behaviour from the declaration, never from the allocator's name, and fails closed on a request that needs a feature
// its allocator lacks. Every wait of the control loop runs on the injected Clock, so tests
// step a fake one.
//
// A reconciler loop creates and destroys units toward the target and expires leases; on start
// the manager adopts the bound units a previous manager left behind and destroys the rest.
// Units are never reused: a released or expired unit is destroyed.
//
// The units live in one of two pools behind one interface (pool.go): a warm pool the manager
// owns alone (warmPool: its StateOperator is the truth, leases are persisted for adoption), or
// a shared pool that several replicas share through the allocator (shared.go; the leader sizes
// it and expires leases). A pool is made of its dependencies (poolDeps) and asks the manager
// only for the estimator's target and a reconcile pass (poolHost), so that each is tested
// alone. Files: manager.go (New, Start, Close, Renew, Release, List, Status), allocate.go
// (Allocate's checks and attempts), bind.go (binding a unit: claim, egress, annotate, fuse),
// conns.go (the optional connections to units' init listeners), pool.go (the interfaces and
// the warm pool), shared.go, reconcile.go, adopt.go, exits.go, ping.go, units.go (the warm
// pool's destroys), leases.go (the lease's codec and checks), accounting.go (counts,
// creations and their backoff, background work, for both pools).
package manager

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
// An allocator declares what it supports (Capabilities: egress enforcement, adoption, handoff,
// a shared pool, no isolation); the manager fails closed on a request that needs a feature
// its allocator lacks. Every wait of the control loop runs on the injected Clock, so tests
// step a fake one.
//
// A reconciler loop creates and destroys units toward the target and expires leases; on start
// the manager adopts the bound units a previous manager left behind and destroys the rest.
// Units are never reused: a released or expired unit is destroyed.
//
// The units live in one of two pools behind one interface (pool.go): a local pool the manager
// owns alone (its StateOperator is the truth, leases are persisted for adoption), or a shared
// pool that several replicas share through the allocator (shared.go; the leader sizes it and
// expires leases). Files: manager.go (Allocate, Renew, Release, List, Status), pool.go (the
// interface and the local pool), shared.go, reconcile.go, adopt.go, leases.go (the lease's
// codec and checks), units.go (creation, destruction and counting, for both pools).
package manager
